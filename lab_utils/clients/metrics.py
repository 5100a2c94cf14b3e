"""Read a server's Prometheus `/metrics` page, once or sampled through a load test.

The text format is one sample per line, `name{label="value",...} number [timestamp]`, with
`# HELP` / `# TYPE` comments. A histogram `h` appears as cumulative `h_bucket{le="..."}` lines
plus `h_sum` and `h_count`.

    vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
    vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 12.0

    with MetricsSampler(srv.url, interval=0.25) as sampler:
        run_load(...)
    sampler.times, sampler.values("vllm:num_requests_waiting")
"""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


@dataclass(frozen=True)
class Sample:
    """One line of a /metrics page."""

    name: str
    labels: dict[str, str]
    value: float


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(text: str, lineno: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y"}` starting at text[0] == '{'; return labels and the index after '}'."""
    labels: dict[str, str] = {}
    i = 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i >= len(text):
            raise ValueError(f"line {lineno}: unclosed '{{' in labels")
        if text[i] == "}":
            return labels, i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise ValueError(f'line {lineno}: expected name="value" in labels, got {text[i : i + 30]!r}')
        key = text[i:eq].strip()
        i = eq + 2
        value = []
        while True:
            if i >= len(text):
                raise ValueError(f"line {lineno}: unterminated label value for {key!r}")
            ch = text[i]
            if ch == "\\" and i + 1 < len(text):
                value.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                value.append(ch)
                i += 1
        labels[key] = "".join(value)


def _parse_value(token: str, lineno: int) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf, "NaN": math.nan}
    if token in special:
        return special[token]
    try:
        return float(token)
    except ValueError:
        raise ValueError(f"line {lineno}: {token!r} is not a number") from None


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample in a Prometheus text-format page, in order (comments skipped)."""
    samples: list[Sample] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _parse_labels(line[brace:], lineno)
            rest = line[brace + end :].split()
        else:
            name, _, tail = line.partition(" ")
            labels, rest = {}, tail.split()
        if not name or not rest:
            raise ValueError(f"line {lineno}: expected 'name[{{labels}}] value', got {raw!r}")
        samples.append(Sample(name, labels, _parse_value(rest[0], lineno)))  # rest[1]: optional timestamp
    return samples


def metric_value(samples: Sequence[Sample], name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (nan when none match)."""
    hits = [
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(hits) if hits else math.nan


def histogram_buckets(samples: Sequence[Sample], name: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of histogram `name`, summed over other labels."""
    counts: dict[float, float] = {}
    for s in samples:
        if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
            le = _parse_value(s.labels["le"], 0)
            counts[le] = counts.get(le, 0.0) + s.value
    return sorted(counts.items())


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding rank q·n."""
    if not 0 <= q <= 1:
        raise ValueError(f"q is a quantile between 0 and 1, got {q}")
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):  # rank falls in the +Inf bucket: the best bound is the last finite one
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def histogram_mean(samples: Sequence[Sample], name: str, **labels: str) -> float:
    """Mean of histogram `name`: its _sum divided by its _count (nan when empty)."""
    count = metric_value(samples, name + "_count", **labels)
    return metric_value(samples, name + "_sum", **labels) / count if count and count > 0 else math.nan


def _metrics_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    return url if url.endswith("/metrics") else url + "/metrics"


def scrape(url: str, timeout: float = 5.0) -> list[Sample]:
    """GET a /metrics page (the server URL, its /v1 base URL, or the /metrics URL) and parse it."""
    with urllib.request.urlopen(_metrics_url(url), timeout=timeout) as resp:
        return parse_prometheus(resp.read().decode("utf-8", "replace"))


class MetricsSampler:
    """Scrape /metrics every `interval` seconds in a background thread, as a time series."""

    def __init__(self, url: str, names: Sequence[str] = DEFAULT_GAUGES, interval: float = 0.5):
        if interval <= 0:
            raise ValueError(f"interval must be positive seconds, got {interval}")
        if isinstance(names, str):
            raise TypeError("names must be a list of metric names, not one string")
        self.url = _metrics_url(url)
        self.names = tuple(names)
        self.interval = float(interval)
        self.times: list[float] = []  # time.time() half-way through each scrape
        self.rows: list[dict[str, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> dict[str, float]:
        """Scrape now and append one row of the chosen metrics."""
        t0 = time.time()
        samples = scrape(self.url)
        row = {name: metric_value(samples, name) for name in self.names}
        self.times.append((t0 + time.time()) / 2)  # a slow scrape is stamped at its middle, not its end
        self.rows.append(row)
        return row

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                self.sample_once()
            except Exception as exc:  # a missed scrape is a gap in the plot, not a crash
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def start(self) -> MetricsSampler:
        """Start sampling in the background."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (takes one last sample so the end of the run is in the series)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.sample_once()
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> MetricsSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def values(self, name: str) -> list[float]:
        """The sampled values of one metric, aligned with `times`."""
        if name not in self.names:
            raise KeyError(f"{name!r} was not sampled; sampled: {list(self.names)}")
        return [row[name] for row in self.rows]

    def series(self, t0: float | None = None) -> dict[str, list[float]]:
        """{"t": seconds since t0 (default: the first sample), name: values, ...}."""
        base = t0 if t0 is not None else (self.times[0] if self.times else 0.0)
        out: dict[str, list[float]] = {"t": [t - base for t in self.times]}
        for name in self.names:
            out[name] = self.values(name)
        return out
