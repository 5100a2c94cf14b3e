"""The course's TGI-protocol stand-in: TGI's HTTP API and admission rules over the course engine.

Hugging Face TGI cannot run on this kind of machine (it needs Docker and a GPU or Intel image),
and it is in maintenance mode since December 2025. This package lets the official clients
(`text_generation.Client`, `huggingface_hub.InferenceClient`, the openai SDK on the Messages
API) talk to something that speaks TGI's protocol for real, and says in every response that it
is the course's stand-in (`/info["router"]`, header `x-served-by`).

    python -m lab_utils.tgi --port 8080                   # or lab_utils.servers.TGIServer()

Modules: `admission` (TGI's batching loop as a schedule function, shared with the simulator),
`protocol` (validation and errors), `grammar` (xgrammar token masks), `worker` (the engine
thread), `server` and `chat` (the routes), `metrics` (`tgi_*` series).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .admission import AdmissionRecord, TGIAdmission, TGIConfig, min_batch_size, next_batch, reserved_tokens
from .protocol import STAND_IN

__all__ = [
    "AdmissionRecord",
    "STAND_IN",
    "TGIAdmission",
    "TGIConfig",
    "create_service",
    "min_batch_size",
    "next_batch",
    "reserved_tokens",
]


def create_service(
    config: TGIConfig,
    model: str | Path | None = None,
    api_key: str | None = None,
    num_threads: int | None = None,
    engine: Any = None,
    payload_limit: int | None = None,
    request_timeout: float | None = None,
):
    """Load the course engine under TGI's admission policy and start its worker thread."""
    from lab_utils.engine import LLMEngine

    from .metrics import Metrics
    from .server import Service
    from .worker import EngineWorker

    block = 16
    if engine is None:
        # KV for max_batch_total_tokens, plus a block per possible request for rounding.
        blocks = math.ceil(config.max_batch_total_tokens / block) + config.max_concurrent_requests
        engine = LLMEngine(
            model,
            max_num_seqs=config.max_concurrent_requests,
            max_num_batched_tokens=max(config.max_batch_prefill_tokens, config.max_concurrent_requests),
            block_size=block,
            num_kv_blocks=blocks,
            max_model_len=config.max_total_tokens,
            enable_prefix_caching=False,
            num_threads=num_threads,
            schedule_fn=TGIAdmission(config),
            record_steps=False,
        )
    model_id = str(engine.model_path)
    worker = EngineWorker(engine, config, Metrics())
    worker.start()
    from .protocol import PAYLOAD_LIMIT
    from .server import REQUEST_TIMEOUT

    return Service(
        worker,
        config,
        model_id,
        api_key,
        payload_limit=PAYLOAD_LIMIT if payload_limit is None else payload_limit,
        request_timeout=REQUEST_TIMEOUT if request_timeout is None else request_timeout,
    )
