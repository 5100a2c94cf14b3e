"""Read the KV-cache numbers a real vLLM server publishes on /metrics (Prometheus text format)."""

from __future__ import annotations

import math

# The vLLM v1 names this lab reads. The counters are in tokens; the gauge is a fraction 0..1
# despite the "_perc" in its name.
KV_METRICS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value, summing samples that differ only in labels; comments skipped.

    `vllm:prefix_cache_hits_total{engine="0",model_name="m"} 256.0` becomes
    {"vllm:prefix_cache_hits_total": 256.0}.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            rest = rest.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name.strip()] = out.get(name.strip(), 0.0) + value
    return out


def vllm_kv_metrics(source: str) -> dict[str, float]:
    """The KV-cache metrics of a vLLM server: `source` is its base URL or a /metrics page's text."""
    text = source
    if source.startswith("http://") or source.startswith("https://"):
        import httpx

        text = httpx.get(source.rstrip("/") + "/metrics", timeout=10).text
    values = parse_prometheus(text)
    return {name: values.get(name, 0.0) for name in KV_METRICS}


def kv_cache_usage(source: str) -> float:
    """The fraction of KV blocks in use (vLLM's `vllm:kv_cache_usage_perc`, a fraction despite its name)."""
    return vllm_kv_metrics(source)["vllm:kv_cache_usage_perc"]
