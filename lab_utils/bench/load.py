"""Benchmarking a server properly: load sweeps, percentiles, goodput, the knee, coordinated omission.

Built on the course load generator (`lab_utils.clients.loadgen`), whose `LoadResult` keeps every
request's raw timings. A sweep runs one load level after another against one server while a
`MetricsSampler` scrapes its `/metrics` and a `CpuSampler` reads the server's CPU use:

    sweep = run_sweep(srv, prompts, levels=[1.0, 2.0, 4.0], kind="open", num_requests=12, max_tokens=16)
    rows = sweep_table(sweep, SLO(ttft_s=1.0, tpot_s=0.2))     # one row per level
    knee_index([r["offered"] for r in rows], [r["e2e_p95"] for r in rows])

Definitions used everywhere in lab 09 (times in seconds):

- percentiles interpolate linearly between sorted ranks (numpy's default);
- a request meets the SLO when it finished, its TTFT <= slo.ttft_s and its TPOT <= slo.tpot_s
  (a one-token answer has no TPOT and meets that half); goodput = such requests / run duration;
- the knee of a sweep is the last level whose p95 latency stays within `factor` (2x) of the
  lowest level's: past it, adding load buys queueing, not throughput;
- coordinated omission: a generator that waits for a free slot before sending measures latency
  from when it *did* send, not from when the request was *due*; the wait it hides is the queueing
  a real user would have seen. `intended_starts` rebuilds the due times of an open-loop run.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from lab_utils.clients.loadgen import LoadResult, percentile, run_load


@dataclass(frozen=True)
class SLO:
    """Per-request latency targets: time to first token and time per output token (seconds)."""

    ttft_s: float
    tpot_s: float

    def met(self, ttft: float | None, tpot: float | None, ok: bool = True) -> bool:
        """True when a finished request met both targets (no TPOT: that half is met)."""
        if not ok or ttft is None:
            return False
        return ttft <= self.ttft_s and (tpot is None or tpot <= self.tpot_s)


def goodput_rps(records: Sequence, slo: SLO, duration_s: float) -> float:
    """Requests per second that met the SLO (records: loadgen RequestRecords or dicts)."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be positive seconds, got {duration_s}")
    good = 0
    for r in records:
        if isinstance(r, dict):
            ok, ttft, tpot = r.get("ok", True), r.get("ttft"), r.get("tpot")
        else:
            ok, ttft, tpot = r.ok, r.ttft, r.tpot
        good += slo.met(ttft, tpot, ok)
    return good / duration_s


def knee_index(load: Sequence[float], latency: Sequence[float], factor: float = 2.0) -> int:
    """Index of the last load level whose latency is within `factor` of the lowest level's."""
    if len(load) != len(latency) or not load:
        raise ValueError("load and latency need the same, non-zero length")
    order = sorted(range(len(load)), key=lambda i: load[i])
    base = latency[order[0]]
    best = order[0]
    for i in order:
        if latency[i] <= factor * base:
            best = i
        else:
            break
    return best


def intended_starts(num_requests: int, rate: float, seed: int = 0) -> list[float]:
    """When each request of an open-loop run was due (s after the start): the loadgen's Poisson gaps."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(num_requests):
        out.append(t)
        if i < num_requests - 1:
            t += rng.expovariate(rate)
    return out


def latency_from_intended(result: LoadResult) -> list[float | None]:
    """Each request's end-to-end latency counted from when it was due, not when it was sent."""
    s = result.settings
    if s.get("rate") is None:
        raise ValueError("a closed-loop run has no intended send times: it sends when a slot frees")
    due = intended_starts(s["num_requests"], s["rate"], s.get("seed", 0))
    return [None if r.finish is None else r.finish - due[r.request_id] for r in result.records]


# --- predicting the knee from the per-step cost ---------------------------------------------------


def fit_step_cost(batch_sizes: Sequence[float], step_times: Sequence[float]) -> tuple[float, float]:
    """Least-squares (fixed_s, per_seq_s) of step_time = fixed_s + per_seq_s * batch (both >= 0)."""
    n = len(batch_sizes)
    if n < 2 or len(step_times) != n:
        raise ValueError("need at least two (batch, step time) points")
    mx, my = sum(batch_sizes) / n, sum(step_times) / n
    sxx = sum((x - mx) ** 2 for x in batch_sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(batch_sizes, step_times)) / sxx if sxx else 0.0
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def knee_rate_model(fixed_s: float, per_seq_s: float, output_tokens: int, max_seqs: int) -> float:
    """Requests/s one replica sustains: max_seqs slots, each busy output_tokens steps of t(max_seqs)."""
    step = fixed_s + per_seq_s * max_seqs
    return max_seqs / (output_tokens * step)


# --- a CPU sampler (the "GPU utilisation" stand-in) -----------------------------------------------


class CpuSampler:
    """Sample a process tree's CPU use (percent of one core, summed) every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid, self.interval = int(pid), float(interval)
        self.times: list[float] = []
        self.percent: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _procs(self):
        import psutil

        root = psutil.Process(self.pid)
        return [root] + root.children(recursive=True)

    def _loop(self) -> None:
        import psutil

        procs = {p.pid: p for p in self._procs()}
        for p in procs.values():
            try:
                p.cpu_percent(None)
            except psutil.Error:
                pass
        while not self._stop.wait(self.interval):
            total = 0.0
            for p in list(procs.values()):
                try:
                    total += p.cpu_percent(None)
                except psutil.Error:
                    procs.pop(p.pid, None)
            self.times.append(time.time())
            self.percent.append(total)

    def __enter__(self) -> CpuSampler:
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


# --- a sweep -----------------------------------------------------------------------------------

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


@dataclass
class Sweep:
    """One sweep: a LoadResult per level, and the server's gauges and CPU sampled over all of it."""

    kind: str  # "open" (levels are request rates) or "closed" (levels are concurrencies)
    levels: list[float]
    runs: list[LoadResult]
    metric_times: list[float] = field(default_factory=list)  # time.time() of each scrape
    metric_rows: list[dict] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)
    cpu_percent: list[float] = field(default_factory=list)
    metric_errors: list[str] = field(default_factory=list)  # scrapes that failed (a gap in the series)

    def raw_samples(self) -> dict:
        """Everything measured, as plain data (what a grader re-derives figures from)."""
        return {
            "kind": self.kind,
            "levels": list(self.levels),
            "runs": [r.raw_samples() for r in self.runs],
            "metric_times": list(self.metric_times),
            "metric_rows": [dict(r) for r in self.metric_rows],
            "cpu_times": list(self.cpu_times),
            "cpu_percent": list(self.cpu_percent),
            "metric_errors": list(self.metric_errors),
        }

    @classmethod
    def from_raw(cls, raw: dict) -> Sweep:
        """Rebuild a sweep from `raw_samples()`."""
        return cls(
            raw["kind"],
            list(raw["levels"]),
            [LoadResult.from_raw(r) for r in raw["runs"]],
            list(raw["metric_times"]),
            [dict(r) for r in raw["metric_rows"]],
            list(raw["cpu_times"]),
            list(raw["cpu_percent"]),
            list(raw.get("metric_errors", [])),
        )

    def window(self, i: int) -> tuple[float, float]:
        """(start, end) wall-clock time of level i's run."""
        run = self.runs[i]
        return run.started_at, run.started_at + run.settings["duration_s"]

    def gauge_means(self, i: int) -> dict[str, float]:
        """Mean of every sampled gauge (and CPU %) inside level i's run."""
        a, b = self.window(i)
        rows = [r for t, r in zip(self.metric_times, self.metric_rows) if a <= t <= b]
        out = {name: (sum(r[name] for r in rows) / len(rows) if rows else math.nan) for name in GAUGES}
        cpu = [c for t, c in zip(self.cpu_times, self.cpu_percent) if a <= t <= b]
        out["cpu_percent"] = sum(cpu) / len(cpu) if cpu else math.nan
        out["samples"] = len(rows)
        return out


def run_sweep(
    server,
    prompts: Sequence[str],
    levels: Sequence[float],
    *,
    kind: str = "open",
    num_requests: int = 12,
    max_tokens: int = 16,
    interval: float = 0.2,
    seed: int = 0,
    concurrency_cap: int | None = None,
    output_lens: Sequence[int] | None = None,
    progress: str | None = None,
) -> Sweep:
    """Run one load level after another against `server` (a VLLMServer), sampling its gauges and CPU.

    kind "open": levels are Poisson request rates; "closed": levels are fixed concurrencies.
    Every request generates exactly `max_tokens` tokens (ignore_eos), so levels differ only in load;
    `output_lens` gives each request its own length instead (a length mix, reused in turn).
    `progress`: print `progress, level L: i/n done, ...` as each level's requests finish (run_load's).
    """
    from lab_utils.clients.metrics import MetricsSampler

    if kind not in ("open", "closed"):
        raise ValueError(f"kind must be 'open' or 'closed', got {kind!r}")
    runs = []
    with (
        MetricsSampler(server.url, names=GAUGES, interval=interval) as ms,
        CpuSampler(server.pid, interval=interval) as cpu,
    ):
        for lvl in levels:
            kw = (
                dict(rate=float(lvl), concurrency=concurrency_cap)
                if kind == "open"
                else dict(concurrency=int(lvl))
            )
            runs.append(
                run_load(
                    server.base_url,
                    server.model_name,
                    prompts,
                    num_requests=num_requests,
                    max_tokens=max_tokens,
                    ignore_eos=True,
                    api_key=server.api_key,
                    seed=seed,
                    output_lens=output_lens,
                    progress=f"{progress}, level {float(lvl):.3g}" if progress else None,
                    **kw,
                )
            )
    return Sweep(
        kind,
        [float(x) for x in levels],
        runs,
        list(ms.times),
        [dict(r) for r in ms.rows],
        list(cpu.times),
        list(cpu.percent),
        list(ms.errors),
    )


def level_row(run: LoadResult, slo: SLO) -> dict:
    """One level's figures: throughput, TTFT / TPOT / ITL / e2e percentiles, goodput, SLO violations."""
    recs = [r for r in run.records if r.ok]
    dur = run.settings["duration_s"]
    ttft = [r.ttft for r in recs]
    tpot = [r.tpot for r in recs if r.tpot is not None]
    itl = [g for r in recs for g in r.itl]
    e2e = [r.e2e for r in recs]
    # one `percentile` per figure: lab 09 asks for the many-at-once `percentiles`, so the library has none
    p = {
        f"{name}_p{q}": percentile(xs, q)
        for name, xs in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))
        for q in (50, 95, 99)
    }
    p["itl_p50"], p["itl_p95"] = percentile(itl, 50), percentile(itl, 95)
    good = goodput_rps(run.records, slo, dur)
    return {
        "requests": len(run.records),
        "errors": len(run.records) - len(recs),
        "duration_s": dur,
        "throughput_rps": len(recs) / dur,
        "output_tok_s": sum(r.output_tokens for r in recs) / dur,
        "goodput_rps": good,
        "slo_violations": 1 - good * dur / max(len(run.records), 1),
        **p,
    }


def sweep_table(sweep: Sweep, slo: SLO) -> list[dict]:
    """One row per level: the offered load, the level's figures and the server's mean gauges."""
    rows = []
    for i, (lvl, run) in enumerate(zip(sweep.levels, sweep.runs)):
        rows.append({"offered": lvl, **level_row(run, slo), **sweep.gauge_means(i)})
    return rows


def level_tails(sweeps: Sequence[Sweep], metric: str, qs: Sequence[float] = (50, 90)) -> list[list[tuple]]:
    """Repeated sweeps of the same levels: per level, per percentile in `qs`, the (median, min, max)
    over the repeats of that percentile of `metric` ("ttft", "e2e", "tpot") over finished requests."""
    levels = {len(sw.runs) for sw in sweeps}
    if len(levels) != 1:
        raise ValueError("the sweeps must have the same levels")
    out = []
    for i in range(levels.pop()):
        per_q = []
        for q in qs:
            vals = []
            for sw in sweeps:
                xs = [
                    getattr(r, metric) for r in sw.runs[i].records if r.ok and getattr(r, metric) is not None
                ]
                vals.append(percentile(xs, q))
            vals.sort()
            mid = (vals[(len(vals) - 1) // 2] + vals[len(vals) // 2]) / 2  # the median, even counts too
            per_q.append((mid, vals[0], vals[-1]))
        out.append(per_q)
    return out


def littles_law(run: LoadResult, metric_times: Sequence[float], metric_rows: Sequence[dict]) -> dict:
    """Little's law on one run: the client's lambda * W against vLLM's running + waiting.

    lambda = finished requests / run duration, W = their mean end-to-end latency (client side);
    L_server = mean of num_requests_running + num_requests_waiting over the scrapes inside the run.
    """
    recs = [r for r in run.records if r.ok]
    dur = run.settings["duration_s"]
    lam = len(recs) / dur
    w = sum(r.e2e for r in recs) / len(recs)
    a, b = run.started_at, run.started_at + dur
    inside = [r for t, r in zip(metric_times, metric_rows) if a <= t <= b]
    l_server = (
        sum(r["vllm:num_requests_running"] + r["vllm:num_requests_waiting"] for r in inside) / len(inside)
        if inside
        else math.nan
    )
    return {
        "lambda_rps": lam,
        "W_s": w,
        "L_client": lam * w,
        "L_server": l_server,
        "samples": len(inside),
        "ratio": l_server / (lam * w) if lam * w > 0 else math.nan,
    }


__all__ = [
    "GAUGES",
    "SLO",
    "CpuSampler",
    "Sweep",
    "fit_step_cost",
    "goodput_rps",
    "intended_starts",
    "knee_index",
    "knee_rate_model",
    "latency_from_intended",
    "level_row",
    "level_tails",
    "littles_law",
    "run_sweep",
    "sweep_table",
]
