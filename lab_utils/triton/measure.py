"""Measuring a running Triton: concurrent load, the statistics extension, Prometheus metrics.

The statistics extension (`GET /v2/models/<name>/stats`) counts per model:
- `inference_count`: requests' batch rows served (a request of batch 1 counts 1);
- `execution_count`: times the model actually ran. Dynamic batching makes it smaller;
- `batch_stats`: how many executions ran at each batch size: the batch-size histogram, with the
  time Triton measured those executions taking (`compute_infer`).

Two ways to load a server: `run_load` is closed loop (N threads, each sends its next request when
the previous one is answered, so a slow server is sent less); `run_open_loop` sends at given
arrival times whatever the server does, as independent users do, which is what a simulator with
Poisson arrivals assumes.
"""

from __future__ import annotations

import gc
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
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
        return {
            "mean_ms": round(mean, 2),
            "p50_ms": round(self.percentile_ms(50), 2),
            "p90_ms": round(self.percentile_ms(90), 2),
            "req_per_s": round(self.throughput, 2),
            "errors": len(self.errors),
        }


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
    # batch size -> seconds Triton timed those executions taking in the model (compute_infer)
    compute_s: dict[int, float] = field(default_factory=dict, compare=False)

    @property
    def average_batch(self) -> float:
        """Inferences per execution: 1.0 means no batching happened."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def mean_compute_s(self, batch_size: int) -> float:
        """Mean time one execution at this batch size spent in the model (nan when none ran)."""
        n = self.batch_sizes.get(batch_size, 0)
        return self.compute_s.get(batch_size, 0.0) / n if n else float("nan")

    def __sub__(self, earlier: BatchCounts) -> BatchCounts:
        sizes = {b: n - earlier.batch_sizes.get(b, 0) for b, n in self.batch_sizes.items()}
        kept = {b: n for b, n in sorted(sizes.items()) if n > 0}
        return BatchCounts(
            self.inference_count - earlier.inference_count,
            self.execution_count - earlier.execution_count,
            kept,
            {b: self.compute_s.get(b, 0.0) - earlier.compute_s.get(b, 0.0) for b in kept},
        )


def batch_counts(stats: dict, model: str, version: str | None = None) -> BatchCounts:
    """Pull one model's counts out of a /v2/models/<name>/stats answer."""
    for entry in stats.get("model_stats", []):
        if entry["name"] == model and (version is None or entry["version"] == str(version)):
            batches = sorted(entry.get("batch_stats", []), key=lambda b: int(b["batch_size"]))
            sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in batches}
            compute = {int(b["batch_size"]): int(b["compute_infer"].get("ns", 0)) * 1e-9 for b in batches}
            return BatchCounts(
                int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0)), sizes, compute
            )
    raise KeyError(f"no statistics for model {model!r} in this answer; is it loaded?")


# -- open loop ---------------------------------------------------------------------------------

Done = Callable[[object], None]  # done(None) on an answer, done(error) on a failure


@dataclass
class OpenLoopResult:
    """One open-loop run, per request in arrival order: seconds from the start of the run."""

    scheduled_s: list[float]  # when the request was due (its arrival time)
    sent_s: list[float]  # when the client actually sent it: later than due when the client lags
    done_s: list[float]  # when its answer or error came back; nan when none came before the timeout
    errors: dict[int, str] = field(default_factory=dict)  # request index -> what went wrong

    @property
    def latencies_s(self) -> list[float]:
        """Answer time minus arrival time of every request answered without error.

        Measured from the *due* time, not the send time, as the simulator measures from arrival: a
        client that falls behind shows up here instead of being hidden (coordinated omission).
        """
        return [
            d - s
            for i, (s, d) in enumerate(zip(self.scheduled_s, self.done_s))
            if i not in self.errors and not math.isnan(d)
        ]

    @property
    def latencies_from_send_s(self) -> list[float]:
        """Answer time minus the actual send time: the latency without the client's own lateness."""
        return [
            d - s
            for i, (s, d) in enumerate(zip(self.sent_s, self.done_s))
            if i not in self.errors and not math.isnan(d)
        ]

    @property
    def lag_s(self) -> list[float]:
        """How late the client sent each request (0 when it kept to the schedule)."""
        return [max(0.0, sent - due) for due, sent in zip(self.scheduled_s, self.sent_s)]

    def percentile_ms(self, q: float) -> float:
        """The q-th latency percentile in milliseconds (q in 0..100)."""
        lat = self.latencies_s
        return float(np.percentile(lat, q) * 1e3) if lat else float("nan")

    def summary(self) -> dict[str, float]:
        """Latency p50/p99/mean (ms; p99 also from the send), client lateness (p99, max), answers/s, errors."""
        lat, lag, from_send = self.latencies_s, self.lag_s, self.latencies_from_send_s
        span = max((d for d in self.done_s if not math.isnan(d)), default=0.0) - min(
            self.scheduled_s, default=0.0
        )
        return {
            "p50_ms": round(self.percentile_ms(50), 2),
            "p99_ms": round(self.percentile_ms(99), 2),
            "mean_ms": round(float(np.mean(lat)) * 1e3, 2) if lat else float("nan"),
            "p99_from_send_ms": round(float(np.percentile(from_send, 99)) * 1e3, 2)
            if from_send
            else float("nan"),
            "send_lag_p99_ms": round(float(np.percentile(lag, 99)) * 1e3, 2) if lag else 0.0,
            "send_lag_max_ms": round(max(lag, default=0.0) * 1e3, 2),
            "answers_per_s": round(len(lat) / span, 1) if span > 0 else 0.0,
            "errors": len(self.errors),
        }


def run_open_loop(
    send_async: Callable[[int, Done], object],
    arrival_times: Sequence[float],
    *,
    timeout_s: float = 60.0,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> OpenLoopResult:
    """Send request i at arrival_times[i] (seconds from now) without waiting for answers (open loop).

    Args:
        send_async: send_async(i, done) starts request i and returns at once; the client calls
            done(None) when the answer arrives or done(error) when it fails, from any thread
            (`grpc_async_sender` makes one for tritonclient's gRPC client).
        arrival_times: ascending, >= 0; the simulator's `w.arrival_time` of a workload.
        timeout_s: how long to wait for the last answers once everything is sent.
        clock, sleep: the time source (tests pass a fake one).
    Returns:
        due, sent and answered times per request; latencies count from the due time.
    """
    due = [float(t) for t in arrival_times]
    if any(t < 0 for t in due) or any(b < a for a, b in zip(due, due[1:])):
        raise ValueError("arrival_times must be >= 0 and ascending (sort the workload by arrival)")
    n = len(due)
    sent, done_at = [math.nan] * n, [math.nan] * n
    errors: dict[int, str] = {}
    lock, all_done = threading.Lock(), threading.Event()
    left = [n]

    def finisher(i: int) -> Done:
        def done(error: object = None) -> None:
            t = clock() - t0
            with lock:
                if not math.isnan(done_at[i]):
                    return  # a client that reports twice is counted once
                done_at[i] = t
                if error is not None:
                    errors[i] = str(error)
                left[0] -= 1
                if left[0] == 0:
                    all_done.set()

        return done

    if n == 0:
        all_done.set()
    # A full garbage collection of a notebook's big heap can pause this loop for milliseconds, which
    # would be charged to the server as latency: collect now, not while sending.
    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        t0 = clock()
        for i, at in enumerate(due):
            wait = at - (clock() - t0)
            if wait > 0:
                sleep(wait)
            sent[i] = clock() - t0
            try:
                send_async(i, finisher(i))
            except Exception as exc:  # a refused send is that request's error; the schedule goes on
                finisher(i)(f"{type(exc).__name__}: {exc}")
        all_done.wait(timeout_s)
    finally:
        if gc_was_on:
            gc.enable()
    with lock:
        for i in range(n):
            if math.isnan(done_at[i]):
                errors[i] = f"no answer within {timeout_s:g} s of the last send"
        return OpenLoopResult(due, sent, list(done_at), dict(sorted(errors.items())))


def grpc_async_sender(client, model: str, inputs: list) -> Callable[[int, Done], object]:
    """A send_async for `run_open_loop`: the same inputs to `model` through tritonclient.grpc's async_infer."""

    def send(i: int, done: Done) -> object:
        return client.async_infer(model, inputs, callback=lambda result, error: done(error))

    return send


def settled_counts(server, model: str, inferences: int, timeout_s: float = 5.0) -> BatchCounts:
    """The model's counts once they include `inferences` inferences (or after timeout_s).

    Triton sends a response before it records the request's statistics, so a snapshot taken the
    moment the last answer arrives can miss the last few requests.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        counts = batch_counts(server.statistics(model), model)
        if counts.inference_count >= inferences or time.monotonic() > deadline:
            return counts
        time.sleep(0.01)


def measure_batcher(
    server,
    model: str,
    config: dict,
    arrival_times: Sequence[float],
    send_async: Callable[[int, Done], object],
    *,
    warmup: int = 4,
    timeout_s: float = 60.0,
) -> tuple[OpenLoopResult, BatchCounts]:
    """(Re)load `model` with `config`, warm it up, run one open-loop load; the client's and Triton's view.

    `server` is a running `TritonServer` in explicit model-control mode. The warm-up opens the
    connection and runs the model before anything is counted; the counts are the difference of
    two statistics snapshots around the measured run.
    """
    server.load_model(model, config)
    start = batch_counts(server.statistics(model), model).inference_count
    warm = run_open_loop(send_async, [0.0] * warmup, timeout_s=timeout_s)
    if warm.errors:
        raise RuntimeError(f"warm-up requests to {model} failed: {next(iter(warm.errors.values()))}")
    before = settled_counts(server, model, start + warmup)
    result = run_open_loop(send_async, arrival_times, timeout_s=timeout_s)
    after = settled_counts(server, model, before.inference_count + len(result.latencies_s))
    return result, after - before


# -- Prometheus metrics --------------------------------------------------------------------------

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
    return sum(
        v
        for n, lab, v in parse_metrics(text)
        if n == name and all(lab.get(k) == str(want) for k, want in labels.items())
    )


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
                self.samples.append(
                    (time.perf_counter() - t0, {n: metric_value(text, n, **self.labels) for n in self.names})
                )
            except OSError:
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MetricsSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
