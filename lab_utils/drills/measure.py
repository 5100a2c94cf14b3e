"""Lab 11's quick measurement: static vs continuous batching on the course simulator.

`measure_batching_gain` runs one workload (every request arrives at t=0) through lab 03's
simulator twice, with the same step cost model, and keeps each request's finish time. The gain is
the ratio of the two makespans: the same tokens, delivered in less time. The object keeps
the finish times, from which the lab's graded analysis derives the gain.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BatchingMeasurement:
    """Finish times of every request under static and continuous batching of the same workload."""

    batch_size: int
    prompt_len: int
    output_lens: list[int]
    static_finish_s: list[float]  # request i's finish time, static batching
    continuous_finish_s: list[float]  # request i's finish time, continuous batching
    cost: dict  # the step cost model's parameters

    def raw_samples(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "prompt_len": self.prompt_len,
            "output_lens": self.output_lens,
            "static_finish_s": self.static_finish_s,
            "continuous_finish_s": self.continuous_finish_s,
            "cost": self.cost,
        }

    @property
    def gain(self) -> float:
        """Throughput of continuous over static: static makespan / continuous makespan."""
        return max(self.static_finish_s) / max(self.continuous_finish_s)

    def tokens_per_s(self) -> dict[str, float]:
        total = sum(self.output_lens)
        return {
            "static": total / max(self.static_finish_s),
            "continuous": total / max(self.continuous_finish_s),
        }


def measure_batching_gain(
    output_lens: list[int],
    batch_size: int,
    prompt_len: int = 32,
    fixed_s: float = 0.025,
    per_token_s: float = 0.001,
) -> BatchingMeasurement:
    """Simulate the workload under StaticBatching and ContinuousBatching and return the finish times."""
    from lab_utils.sim import ContinuousBatching, StaticBatching, StepCostModel, fixed_workload, simulate

    lens = [int(x) for x in output_lens]
    cost = StepCostModel(fixed_s=fixed_s, per_token_s=per_token_s)
    work = fixed_workload([int(prompt_len)] * len(lens), lens)
    budget = max(2048, int(batch_size) * (int(prompt_len) + 1))
    runs = {}
    for name, policy in (
        ("static", StaticBatching(batch_size=int(batch_size))),
        ("continuous", ContinuousBatching(max_num_seqs=int(batch_size), max_num_batched_tokens=budget)),
    ):
        result = simulate(work, policy, cost)
        finish = {r.request_id: r.finish_time for r in result.requests}
        runs[name] = [float(finish[i]) for i in range(len(lens))]
    m = BatchingMeasurement(
        int(batch_size),
        int(prompt_len),
        lens,
        runs["static"],
        runs["continuous"],
        {"fixed_s": fixed_s, "per_token_s": per_token_s},
    )
    return m


def measure_workload(batching: dict) -> BatchingMeasurement:
    """Lab 11's measurement: a workload dict (`batch_size`, `output_lens`, `prompt_len`) through the
    simulator at the lab's step cost (25 ms per step plus 1 ms per scheduled token)."""
    return measure_batching_gain(
        list(batching["output_lens"]), int(batching["batch_size"]), int(batching.get("prompt_len", 32))
    )
