"""Read one scrape of vLLM's /metrics: the prefix-cache counters, by name.

The prefix-cache counters of vLLM 0.32 (`vllm/v1/metrics/loggers.py`; Prometheus adds `_total`):

    vllm:prompt_tokens_total                    prompt tokens of the requests that were scheduled
    vllm:prefix_cache_queries_total             tokens looked up in the engine's own (device) cache
    vllm:prefix_cache_hits_total                ... and found there
    vllm:external_prefix_cache_queries_total    tokens the KV connector was asked about
    vllm:external_prefix_cache_hits_total       ... and supplied (loaded instead of computed)

Each has one series per engine (label `engine`). One scrape is a snapshot; what a run did is the
difference between two, and a series that went down belongs to an engine that restarted. Turning
snapshots into shares is the lab's question; this module only reads a page.
"""

from __future__ import annotations

import urllib.request

from ..kv.metrics import parse_prometheus

PREFIX_CACHE_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
)


def scrape(url: str, timeout: float = 10) -> str:
    """The /metrics page of a server (its base URL, without /metrics), as text."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


def counters(text: str, names: tuple[str, ...] = PREFIX_CACHE_COUNTERS) -> dict[str, float]:
    """{name: value summed over its series} for the counters `names` in one scrape's text."""
    values = parse_prometheus(text)
    return {n: values.get(n, 0.0) for n in names}


__all__ = ["PREFIX_CACHE_COUNTERS", "scrape", "counters"]
