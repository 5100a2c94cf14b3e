"""Measuring a running Triton: concurrent load, the statistics extension, Prometheus metrics.

The statistics extension (`GET /v2/models/<name>/stats`) counts per model:
- `inference_count`: requests' batch rows served (a request of batch 1 counts 1);
- `execution_count`: times the model actually ran. Dynamic batching makes it smaller;
- `batch_stats`: how many executions ran at each batch size: the batch-size histogram.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    """Latencies of one load run, in seconds, and its wall time."""

    latencies_s: list[float]
    wall_s: float
    errors: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        """Completed requests per second over the whole run."""
        return len(self.latencies_s) / self.wall_s if self.wall_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """The q-th latency percentile in milliseconds (q in 0..100)."""
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s else float("nan")

    def summary(self) -> dict[str, float]:
        """mean/p50/p90 latency in ms, throughput in requests/s, and error count."""
        mean = float(np.mean(self.latencies_s) * 1e3) if self.latencies_s else float("nan")
        return {"mean_ms": round(mean, 2), "p50_ms": round(self.percentile_ms(50), 2),
                "p90_ms": round(self.percentile_ms(90), 2), "req_per_s": round(self.throughput, 2),
                "errors": len(self.errors)}


def run_load(send: Callable[[int], object], num_requests: int, concurrency: int) -> LoadResult:
    """Call send(i) for i in range(num_requests) from `concurrency` threads (closed loop)."""
    if num_requests < 1 or concurrency < 1:
        raise ValueError(f"num_requests and concurrency must be >= 1, got {num_requests}, {concurrency}")
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            send(i)
        except Exception as exc:  # count it, keep the load going
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
            return
        with lock:
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(num_requests)))
    return LoadResult(latencies, time.perf_counter() - start, errors)


@dataclass
class BatchCounts:
    """What the statistics extension says one model did (or did between two snapshots)."""

    inference_count: int
    execution_count: int
    batch_sizes: dict[int, int]  # batch size -> number of executions at that size

    @property
    def average_batch(self) -> float:
        """Inferences per execution: 1.0 means no batching happened."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def __sub__(self, earlier: "BatchCounts") -> "BatchCounts":
        sizes = {b: n - earlier.batch_sizes.get(b, 0) for b, n in self.batch_sizes.items()}
        return BatchCounts(self.inference_count - earlier.inference_count,
                           self.execution_count - earlier.execution_count,
                           {b: n for b, n in sorted(sizes.items()) if n > 0})


def batch_counts(stats: dict, model: str, version: str | None = None) -> BatchCounts:
    """Pull one model's counts out of a /v2/models/<name>/stats answer."""
    for entry in stats.get("model_stats", []):
        if entry["name"] == model and (version is None or entry["version"] == str(version)):
            sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in entry.get("batch_stats", [])}
            return BatchCounts(int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0)),
                               dict(sorted(sizes.items())))
    raise KeyError(f"no statistics for model {model!r} in this answer; is it loaded?")


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> (metric name, labels, value) per sample line."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` whose labels include `labels` (0.0 when none)."""
    return sum(v for n, lab, v in parse_metrics(text)
               if n == name and all(lab.get(k) == str(want) for k, want in labels.items()))


class MetricsSampler:
    """Scrape a metrics URL every `interval_s` in a background thread while a load test runs."""

    def __init__(self, url: str, names: list[str], interval_s: float = 0.25, **labels: str):
        self.url, self.names, self.interval_s, self.labels = url, names, interval_s, labels
        self.samples: list[tuple[float, dict[str, float]]] = []  # (seconds since start, values)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        import urllib.request

        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    text = resp.read().decode()
                self.samples.append((time.perf_counter() - t0,
                                     {n: metric_value(text, n, **self.labels) for n in self.names}))
            except OSError:
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "MetricsSampler":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
