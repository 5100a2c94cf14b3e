"""Measuring a batching gain on the simulator, as an object that keeps its raw samples.

    gain = measure_batching_gain(workload, batch_size=8, cost=StepCostModel(0.02, 0.001))
    gain.ratio          # continuous / static output tokens per second
    gain.raw_samples()  # every request's (output_len, arrival, finish) under both policies

The lab's graded analysis reads the raw samples; the grader tests it on samples of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cost import StepCostModel
from .policies import ContinuousBatching, StaticBatching
from .simulator import simulate
from .workload import WorkloadRequest


def _throughput(samples: list[list[float]]) -> float:
    """Output tokens per second over the run: all tokens / (last finish - first arrival)."""
    tokens = sum(s[0] for s in samples)
    span = max(s[2] for s in samples) - min(s[1] for s in samples)
    return tokens / span


@dataclass
class BatchingGain:
    """Static vs continuous batching on the same requests: the raw per-request samples of both runs."""

    batch_size: int
    # (output tokens, arrival s, finish s) per request, in request order
    static: list[list[float]]
    continuous: list[list[float]]

    def raw_samples(self) -> dict:
        return {"batch_size": self.batch_size, "static": self.static, "continuous": self.continuous}

    @property
    def static_tokens_per_s(self) -> float:
        return _throughput(self.static)

    @property
    def continuous_tokens_per_s(self) -> float:
        return _throughput(self.continuous)

    @property
    def ratio(self) -> float:
        """Continuous over static output tokens per second."""
        return self.continuous_tokens_per_s / self.static_tokens_per_s


def measure_batching_gain(
    workload: list[WorkloadRequest], batch_size: int, cost: StepCostModel
) -> BatchingGain:
    """Run `workload` with static batches of `batch_size` (padded rows compute, as in
    `transformers.generate`) and with continuous batching (`max_num_seqs=batch_size`, a budget
    large enough for every prompt at once); return both runs' samples."""

    budget = max(2048, batch_size, sum(w.prompt_len for w in workload))
    runs = {}
    for name, policy in (
        ("static", StaticBatching(batch_size, pad_finished=True)),
        ("continuous", ContinuousBatching(batch_size, budget)),
    ):
        result = simulate(workload, policy, cost)
        runs[name] = [
            [float(r.output_len), float(r.arrival_time), float(r.finish_time)]
            for r in sorted(result.requests, key=lambda r: r.request_id)
        ]
    return BatchingGain(int(batch_size), runs["static"], runs["continuous"])
