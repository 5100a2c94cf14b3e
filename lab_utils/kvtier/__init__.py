"""KV cache beyond one engine (lab 14): vLLM's KV connectors on the course model.

- `connector`: the disk connector's `--kv-transfer-config`, a vLLM engine that uses it, and what
  its store holds on disk;
- `metrics`: one scrape of vLLM's /metrics read into counters (the prefix-cache ones by name);
- `client`: a streamed completion recorded as raw timestamps (TTFT and TPOT are the learner's);
- `proxy`: a prefill/decode proxy (`python -m lab_utils.kvtier.proxy`) and its launcher.

Nothing here imports vLLM at import time.
"""

from .connector import ConnectorEngine, StoreUsage, disk_connector_config, store_usage

__all__ = ["ConnectorEngine", "StoreUsage", "disk_connector_config", "store_usage"]
