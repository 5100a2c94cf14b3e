"""Clients for the servers the course starts: an async load generator for OpenAI-compatible
endpoints (`loadgen`) and a Prometheus `/metrics` scraper and sampler (`metrics`)."""

from .loadgen import LoadResult, LoadSummary, RequestRecord, percentile, run_load, run_load_async, summarize
from .metrics import MetricsSampler, Sample, histogram_quantile, metric_value, parse_prometheus, scrape

__all__ = [
    "LoadResult",
    "LoadSummary",
    "MetricsSampler",
    "RequestRecord",
    "Sample",
    "histogram_quantile",
    "metric_value",
    "parse_prometheus",
    "percentile",
    "run_load",
    "run_load_async",
    "scrape",
    "summarize",
]
