"""Run one workload through a contiguous and a paged KV cache and measure where memory goes.

The model of time is deliberately plain, so the numbers can be checked by hand: one step is one
decode iteration. In each step, in this order:

1. requests whose arrival step has come join the waiting queue (first come, first served);
2. requests that stored their last token in the previous step finish and free their memory;
3. every running request stores one more token (paged: may need a new block, and when none is
   free the most recently admitted request is preempted and goes back to the front of the queue,
   as vLLM's recompute preemption does);
4. waiting requests are admitted in order while their prompt fits (a request that does not fit
   blocks the ones behind it; paged admits nobody in a step that preempted);
5. the step is recorded.

Paged steps 3 and 4 are `reference_schedule`, the policy the course engine and the batching
simulator use; a preempted request keeps its outputs and prefills prompt and outputs again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from lab_utils.mathutils import cdiv

from .contiguous import ContiguousAllocator
from .kv_cache_manager import KVCacheManager
from .request import Request


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: when it arrives, its prompt, what it will and might generate."""

    request_id: str
    arrival_step: int
    prompt_len: int
    # Tokens it will actually generate before it stops (unknown to the server in advance).
    output_len: int
    # The cap the client sent; a contiguous allocator must reserve prompt_len + max_tokens.
    max_tokens: int

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"{self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if not 1 <= self.output_len <= self.max_tokens:
            raise ValueError(
                f"{self.request_id}: need 1 <= output_len ({self.output_len}) "
                f"<= max_tokens ({self.max_tokens})"
            )
        if self.arrival_step < 0:
            raise ValueError(f"{self.request_id}: arrival_step must be >= 0")


def make_workload(
    num_requests: int,
    *,
    seed: int = 0,
    max_tokens: int = 512,
    prompt_len: tuple[int, int] = (16, 256),
    mean_output_len: float = 100.0,
    arrivals_per_step: float = 0.5,
) -> list[WorkloadRequest]:
    """A reproducible random workload: uniform prompts, geometric outputs capped at max_tokens.

    Outputs are geometric because most answers stop early (an end-of-sequence token) while a few
    run to the cap, which is exactly the case where reserving max_tokens is wasteful.
    """
    import numpy as np

    if num_requests < 1 or mean_output_len < 1 or arrivals_per_step <= 0:
        raise ValueError("need num_requests >= 1, mean_output_len >= 1, arrivals_per_step > 0")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / arrivals_per_step, num_requests)
    arrivals = np.floor(np.cumsum(gaps) - gaps[0]).astype(int)
    prompts = rng.integers(prompt_len[0], prompt_len[1] + 1, num_requests)
    outputs = np.minimum(rng.geometric(1.0 / mean_output_len, num_requests), max_tokens)
    return [
        WorkloadRequest(f"r{i}", int(arrivals[i]), int(prompts[i]), int(outputs[i]), max_tokens)
        for i in range(num_requests)
    ]


@dataclass
class MemoryTimeline:
    """Per-step memory accounting of one allocator on one workload (all counts in token slots)."""

    allocator: str
    capacity_tokens: int
    stored_tokens: list[int] = field(default_factory=list)
    reserved_tokens: list[int] = field(default_factory=list)
    # Reserved slots the request will never fill (contiguous: max_tokens - output_len; paged:
    # the empty tail of each request's last block).
    internal_fragmentation: list[int] = field(default_factory=list)
    # Reserved slots waiting for tokens not generated yet (contiguous only; paged reserves none).
    reservation_waste: list[int] = field(default_factory=list)
    # Free slots outside the largest hole (contiguous only; any free block fits in a paged cache).
    external_fragmentation: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    finish_step: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    # (step, request_id, why) for every admission that failed: "reservation" or "external".
    failures: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        """Steps until the last request finished."""
        return len(self.stored_tokens)

    @property
    def utilisation(self) -> list[float]:
        """Tokens stored ÷ memory reserved, per step (1.0 when nothing is reserved)."""
        return [s / r if r else 1.0 for s, r in zip(self.stored_tokens, self.reserved_tokens)]

    @property
    def mean_utilisation(self) -> float:
        """Stored ÷ reserved over the whole run (steps weighted by what they reserved)."""
        reserved = sum(self.reserved_tokens)
        return sum(self.stored_tokens) / reserved if reserved else 1.0

    @property
    def peak_running(self) -> int:
        """Most requests holding KV memory at once."""
        return max(self.running, default=0)

    def summary(self) -> dict[str, float]:
        """The headline numbers as a flat dict (picklable, easy to print or check)."""
        n = max(self.num_steps, 1)
        return {
            "steps": self.num_steps,
            "mean_utilisation": round(self.mean_utilisation, 4),
            "peak_running": self.peak_running,
            "mean_running": round(sum(self.running) / n, 3),
            "mean_internal_fragmentation": round(sum(self.internal_fragmentation) / n, 2),
            "mean_reservation_waste": round(sum(self.reservation_waste) / n, 2),
            "mean_external_fragmentation": round(sum(self.external_fragmentation) / n, 2),
            "blocked_admission_steps": len(self.failures),
            "blocked_by_external_fragmentation": sum(1 for f in self.failures if f[2] == "external"),
            "preemptions": self.preemptions,
        }


def _check_fits(workload: list[WorkloadRequest], need: int, capacity: int, what: str) -> None:
    if need > capacity:
        raise ValueError(
            f"a request needs {need} {what} but the cache holds {capacity}: "
            f"raise the KV budget or lower max_tokens"
        )


def simulate_contiguous(
    workload: list[WorkloadRequest], capacity_tokens: int, max_steps: int = 100_000
) -> MemoryTimeline:
    """Run the workload with one first-fit slab of prompt_len + max_tokens per request."""
    for r in workload:
        _check_fits(workload, r.prompt_len + r.max_tokens, capacity_tokens, "slots")
    alloc = ContiguousAllocator(capacity_tokens)
    tl = MemoryTimeline("contiguous", capacity_tokens)
    pending = deque(sorted(workload, key=lambda r: r.arrival_step))
    waiting: deque[WorkloadRequest] = deque()
    running: dict[str, WorkloadRequest] = {}  # insertion order = admission order
    generated: dict[str, int] = {}
    step = 0
    while (pending or waiting or running) and step < max_steps:
        while pending and pending[0].arrival_step <= step:
            waiting.append(pending.popleft())
        for rid in [rid for rid, r in running.items() if generated[rid] == r.output_len]:
            alloc.free(rid)
            del running[rid]
            tl.finish_step[rid] = step
        for rid in running:
            alloc.append(rid)
            generated[rid] += 1
        while waiting:
            r = waiting[0]
            if alloc.allocate(r.request_id, r.prompt_len + r.max_tokens, r.prompt_len) is None:
                tl.failures.append((step, r.request_id, alloc.failures[-1][1]))
                break
            waiting.popleft()
            running[r.request_id] = r
            generated[r.request_id] = 0
        tl.stored_tokens.append(alloc.num_stored_tokens)
        tl.reserved_tokens.append(alloc.num_reserved_slots)
        tl.internal_fragmentation.append(sum(r.max_tokens - r.output_len for r in running.values()))
        tl.reservation_waste.append(sum(r.output_len - generated[rid] for rid, r in running.items()))
        tl.external_fragmentation.append(alloc.num_free_slots - alloc.largest_hole)
        tl.running.append(len(running))
        tl.waiting.append(len(waiting))
        step += 1
    return tl


class _PagedState:
    """The `SchedulingState` that `reference_schedule` plans on: lab 02's manager and plain requests."""

    def __init__(self, kv: KVCacheManager, max_num_seqs: int) -> None:
        from lab_utils.engine.scheduler import SchedulerConfig

        # No step limit but the KV cache: every prompt fits the budget and nobody waits for a seat.
        big = 1 << 30
        self.config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=big, max_model_len=big
        )
        self.kv = kv
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()

    def admit(self, request: Request) -> None:
        self.waiting.remove(request)
        self.running.append(request)

    def preempt_last(self) -> Request:
        request = self.running.pop()
        self.kv.free(request)
        request.num_computed_tokens = 0  # recompute: prompt and kept outputs are prefilled again
        self.waiting.appendleft(request)
        return request


def simulate_paged(
    workload: list[WorkloadRequest], capacity_tokens: int, block_size: int = 16, max_steps: int = 100_000
) -> MemoryTimeline:
    """Run the workload on a KVCacheManager with capacity_tokens // block_size blocks.

    Each step is planned by the course's one scheduling policy, `reference_schedule` (the engine's
    and the batching simulator's): running requests first, the newest preempted by recompute when
    a block runs out (it keeps its outputs and prefills them again), and nobody admitted in a step
    that preempted. Its token budget here is unlimited, so a step is one decode for each running
    request and a whole prefill for each admitted one.
    """
    from lab_utils.engine.scheduler import reference_schedule

    num_blocks = capacity_tokens // block_size
    for r in workload:
        _check_fits(workload, cdiv(r.prompt_len + r.output_len, block_size), num_blocks, "blocks")
    kv = KVCacheManager(num_blocks, block_size, enable_caching=False)
    state = _PagedState(kv, max_num_seqs=max(len(workload), 1))
    target = {r.request_id: r.output_len for r in workload}
    tl = MemoryTimeline("paged", num_blocks * block_size)
    pending = deque(sorted(workload, key=lambda r: r.arrival_step))
    step = 0
    while (pending or state.waiting or state.running) and step < max_steps:
        while pending and pending[0].arrival_step <= step:
            w = pending.popleft()
            state.waiting.append(Request(w.request_id, [0] * w.prompt_len))
        for q in [q for q in state.running if len(q.output_token_ids) == target[q.request_id]]:
            state.running.remove(q)  # its last token is stored: it finishes and frees its blocks
            kv.free(q)
            tl.finish_step[q.request_id] = step
        for q in state.running:
            q.append_output(0)  # the token sampled last step; this step stores its K/V
        plan = reference_schedule(state)
        tl.preemptions += len(plan.preempted_req_ids)
        for q in state.running:  # every scheduled request is running once the plan is made
            q.num_computed_tokens += plan.num_scheduled_tokens.get(q.request_id, 0)
        if state.waiting and not plan.preempted_req_ids and len(state.running) < state.config.max_num_seqs:
            tl.failures.append((step, state.waiting[0].request_id, "reservation"))
        stored = sum(q.num_computed_tokens for q in state.running)
        reserved = (kv.num_blocks - kv.num_free_blocks) * block_size
        tl.stored_tokens.append(stored)
        tl.reserved_tokens.append(reserved)
        tl.internal_fragmentation.append(reserved - stored)
        tl.reservation_waste.append(0)
        tl.external_fragmentation.append(0)
        tl.running.append(len(state.running))
        tl.waiting.append(len(state.waiting))
        step += 1
    return tl


def max_concurrent_requests(
    prompt_len: int, output_len: int, max_tokens: int, capacity_tokens: int, block_size: int = 16
) -> dict[str, int]:
    """Identical requests, all at their full length: how many fit contiguous vs paged."""
    return {
        "contiguous": capacity_tokens // (prompt_len + max_tokens),
        "paged": (capacity_tokens // block_size) // cdiv(prompt_len + output_len, block_size),
    }
