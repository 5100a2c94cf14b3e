"""Priority scheduling in the simulator: the same overload served `fcfs` or `priority`, as vLLM's
`--scheduling-policy` does.

The model is continuous batching with `max_num_seqs` slots and the step cost of lab 03
(`StepCostModel`). Before every step the scheduler fills free slots from the waiting queue, in
arrival order (fcfs) or by (priority, arrival) with the lower number first (priority, vLLM's
convention). A full batch does not preempt: as in vLLM's V1 scheduler, an urgent request waits
for the next free slot at the head of the queue; vLLM preempts the lowest-ranked running request
only when the KV cache has no room for a request it schedules, and this model's KV cache is
unlimited. A request's prompt is prefilled in the step it is admitted; its first token comes out
at the end of that step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cost import StepCostModel


@dataclass(frozen=True)
class PriorityRequest:
    """One request of a priority workload; lower `priority` is served first (vLLM's convention)."""

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    priority: int = 0

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len and output_len must be >= 1")
        if self.arrival_time < 0:
            raise ValueError(f"request {self.request_id}: arrival_time must be >= 0")


@dataclass(frozen=True)
class PriorityRun:
    """What happened to each request: first-token and finish times."""

    policy: str
    ttft: dict[int, float]
    finish: dict[int, float]

    def ttfts(self, requests: list[PriorityRequest], priority: int) -> list[float]:
        """TTFTs of the requests of one priority class, in request order."""
        return [self.ttft[r.request_id] for r in requests if r.priority == priority]


def simulate_priority(
    requests: list[PriorityRequest],
    policy: str = "fcfs",
    max_num_seqs: int = 4,
    cost: StepCostModel | None = None,
) -> PriorityRun:
    """Serve `requests` with `policy` ("fcfs" or "priority") and return every request's timings."""
    if policy not in ("fcfs", "priority"):
        raise ValueError(f"policy must be 'fcfs' or 'priority' (vLLM --scheduling-policy), got {policy!r}")
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    cost = cost or StepCostModel()
    order = (
        (lambda r: (r.arrival_time, r.request_id))
        if policy == "fcfs"
        else (lambda r: (r.priority, r.arrival_time, r.request_id))
    )
    pending = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
    waiting: list[PriorityRequest] = []
    running: dict[int, int] = {}  # request_id -> tokens still to generate
    ttft: dict[int, float] = {}
    finish: dict[int, float] = {}
    now = 0.0
    while pending or waiting or running:
        while pending and pending[0].arrival_time <= now:
            waiting.append(pending.pop(0))
        if not waiting and not running:
            now = pending[0].arrival_time
            continue
        waiting.sort(key=order)
        prefill: list[PriorityRequest] = []
        while waiting and len(running) < max_num_seqs:
            head = waiting.pop(0)
            running[head.request_id] = head.output_len
            prefill.append(head)
        decoding = [i for i in running if i not in {r.request_id for r in prefill}]
        tokens = sum(r.prompt_len for r in prefill) + len(decoding)
        now += cost.step_time(tokens)
        for r in prefill:
            ttft.setdefault(r.request_id, now - r.arrival_time)
            running[r.request_id] -= 1
        for i in decoding:
            running[i] -= 1
        for i in [i for i, left in running.items() if left <= 0]:
            del running[i]
            finish[i] = now
    return PriorityRun(policy, ttft, finish)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


__all__ = ["PriorityRequest", "PriorityRun", "percentile", "simulate_priority"]
