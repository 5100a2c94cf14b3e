"""Serving metrics from a SimResult (simulated or measured): throughput, TTFT, TPOT, latency, goodput."""

from __future__ import annotations

from dataclasses import dataclass

from lab_utils.mathutils import percentile

from .results import RequestRecord, SimResult


@dataclass(frozen=True)
class SLO:
    """A latency objective per request; a request meets it when every set bound holds."""

    ttft_s: float | None = None  # time to first token
    tpot_s: float | None = None  # time per output token after the first
    e2e_s: float | None = None  # arrival to last token

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SLO.{name} must be positive seconds (or None), got {v}")

    def met_by(self, r: RequestRecord) -> bool:
        """True when request `r` finished within every bound."""
        if r.finish_time is None:
            return False
        if self.ttft_s is not None and (r.ttft is None or r.ttft > self.ttft_s):
            return False
        if self.tpot_s is not None and r.tpot is not None and r.tpot > self.tpot_s:
            return False
        return self.e2e_s is None or r.e2e_latency <= self.e2e_s


@dataclass
class Metrics:
    """One run summarised (times in seconds, throughput per second of wall time)."""

    num_requests: int
    duration_s: float  # first arrival to last finish
    output_tokens_per_s: float
    requests_per_s: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    e2e_p50: float
    e2e_p90: float
    e2e_p99: float
    queue_mean: float
    slot_utilisation: float | None  # useful slot-steps / (slots x steps); None without step records
    goodput_rps: float | None  # requests per second meeting the SLO; None without an SLO
    slo_attainment: float | None  # fraction of requests meeting the SLO

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def slot_utilisation(result: SimResult) -> float | None:
    """Fraction of slot-steps doing useful work: idle and padding slots count against it."""
    if not result.steps:
        return None
    active = sum(s.num_active for s in result.steps)
    return active / (result.num_slots * len(result.steps))


def goodput(result: SimResult, slo: SLO) -> float:
    """Requests per second that met `slo` (finished requests that missed it do not count)."""
    done = [r for r in result.requests if r.finish_time is not None]
    if not done:
        return 0.0
    span = max(r.finish_time for r in done) - min(r.arrival_time for r in result.requests)
    good = sum(1 for r in done if slo.met_by(r))
    return good / span if span > 0 else float("inf")


def summarize(result: SimResult, slo: SLO | None = None) -> Metrics:
    """Throughput, latency percentiles, utilisation and (with an SLO) goodput of one run."""
    reqs = result.requests
    done = [r for r in reqs if r.finish_time is not None]
    if not done:
        raise ValueError("no request finished in this result")
    start = min(r.arrival_time for r in reqs)
    duration = max(r.finish_time for r in done) - start
    tokens = sum(r.output_len for r in done)
    queue = [r.queue_time for r in done if r.queue_time is not None]
    return Metrics(
        num_requests=len(reqs),
        duration_s=duration,
        output_tokens_per_s=tokens / duration if duration > 0 else float("inf"),
        requests_per_s=len(done) / duration if duration > 0 else float("inf"),
        ttft_p50=percentile([r.ttft for r in done], 50),
        ttft_p99=percentile([r.ttft for r in done], 99),
        tpot_p50=percentile([r.tpot for r in done], 50),
        tpot_p99=percentile([r.tpot for r in done], 99),
        e2e_p50=percentile([r.e2e_latency for r in done], 50),
        e2e_p90=percentile([r.e2e_latency for r in done], 90),
        e2e_p99=percentile([r.e2e_latency for r in done], 99),
        queue_mean=sum(queue) / len(queue) if queue else float("nan"),
        slot_utilisation=slot_utilisation(result),
        goodput_rps=goodput(result, slo) if slo is not None else None,
        slo_attainment=sum(1 for r in done if slo.met_by(r)) / len(reqs) if slo is not None else None,
    )


def sweep_load(
    make_workload, policies: dict, rates: list[float], cost=None, slo: SLO | None = None
) -> list[dict]:
    """Simulate every policy at every arrival rate; one row per (policy, rate) for throughput-latency plots.

    Args:
        make_workload: rate -> workload (use a fixed seed so policies see the same requests).
        policies: label -> policy config.
        rates: arrival rates in requests per second.
    """
    from .simulator import simulate

    rows = []
    for rate in rates:
        workload = make_workload(rate)
        for label, policy in policies.items():
            m = summarize(simulate(workload, policy, cost), slo)
            rows.append({"policy": label, "rate": float(rate), **m.as_dict()})
    return rows
