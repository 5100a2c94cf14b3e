"""Continuous batching, one step at a time: the readable reference scheduler.

The engine loop is schedule -> run -> update. `reference_schedule(state)` is the "schedule" part:
it looks at the running and waiting requests and returns a `SchedulerOutput` (request -> tokens
to compute in this step). The simulator then advances the clock by the step's cost and updates
every request. A learner's own schedule function with the same signature plugs into
`simulate(..., schedule_fn=...)`.

NOTE on the algorithm (vLLM v1's, the same as the course engine's `lab_utils/engine/scheduler.py`):
there is no separate "prefill phase". Every request just has `num_tokens` (prompt + tokens
generated so far) and `num_computed_tokens` (tokens whose KV is in the cache); a step computes some
of the difference, out of ONE token budget shared by everyone. The running requests are served
first, in the order they were admitted: a decode takes 1 token, a request still in its prompt takes
a chunk of what is left of the budget (chunked prefill). Then waiting requests are admitted, first
come first served, while budget, sequence slots and KV blocks last. There is no "decodes first"
rule (that was vLLM v0's): a running decode is never starved anyway, because a prompt that gets only
part of the budget is always the last request admitted, so everything before it fits first.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from .policies import ContinuousBatching
from .results import RequestRecord, Residency


def cdiv(a: int, b: int) -> int:
    """Ceiling division: KV blocks needed for `a` tokens at `b` tokens per block."""
    return -(-a // b)


class SimRequest:
    """A request's live state inside the simulator (vLLM's `Request`, reduced to token counts)."""

    __slots__ = (
        "request_id",
        "arrival_time",
        "prompt_len",
        "output_len",
        "num_computed_tokens",
        "num_output_tokens",
        "slot",
        "record",
        "num_blocks",
    )

    def __init__(self, request_id: int, arrival_time: float, prompt_len: int, output_len: int) -> None:
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_output_tokens = 0  # tokens generated so far (kept across a preemption)
        self.slot = -1  # batch slot while running, for the timeline
        self.num_blocks = 0  # KV blocks held (block-counting KV manager)
        self.record = RequestRecord(request_id, arrival_time, prompt_len, output_len)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what must be in the KV cache before the next sample."""
        return self.prompt_len + self.num_output_tokens

    @property
    def is_decoding(self) -> bool:
        """True when one more computed token produces the next output token."""
        return self.num_output_tokens >= 1 and self.num_computed_tokens == self.num_tokens - 1

    @property
    def all_token_ids(self) -> range:
        """Placeholder token ids (only their count matters here), for lab 02's KVCacheManager."""
        return range(self.num_tokens)

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.request_id}, computed={self.num_computed_tokens}, "
            f"tokens={self.num_tokens}, outputs={self.num_output_tokens}/{self.output_len})"
        )


class BlockCounter:
    """A KV budget that only counts blocks; same semantics as `lab_utils.kv.KVCacheManager`
    with prefix caching off (`allocate_slots`, `free`, `num_free_blocks`), at a fraction of the cost.
    """

    def __init__(self, num_blocks: int | None, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free = float("inf") if num_blocks is None else num_blocks
        self._held: dict = {}

    @property
    def num_free_blocks(self) -> float:
        return self._free

    def allocate_slots(self, request, num_new_tokens: int) -> list | None:
        """Reserve blocks for `num_new_tokens` more tokens; None (and no change) when they do not fit."""
        held = self._held.get(request.request_id, 0)
        need = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - held
        if need <= 0:
            return []
        if need > self._free:
            return None
        self._free -= need
        self._held[request.request_id] = held + need
        return [None] * need

    def free(self, request) -> None:
        """Give back every block the request holds."""
        self._free += self._held.pop(request.request_id, 0)

    def get_num_blocks(self, request_id) -> int:
        return self._held.get(request_id, 0)


@dataclass
class SchedulerOutput:
    """The plan for one step: how many tokens each request computes, who was preempted."""

    num_scheduled_tokens: dict = field(default_factory=dict)  # request_id -> tokens this step
    preempted_req_ids: list = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class SchedulerState:
    """What a schedule function sees and may change: config, running list, waiting queue, KV."""

    def __init__(self, config: ContinuousBatching, kv) -> None:
        self.config = config
        self.kv = kv  # allocate_slots(req, n) -> list | None, free(req), num_free_blocks
        self.running: list[SimRequest] = []  # in admission order; the last one is preempted first
        self.waiting: deque[SimRequest] = deque()  # arrival order; preempted requests go to the front
        self.now = 0.0  # start time of the step being planned
        self._free_slots = list(range(config.max_num_seqs))

    def admit(self, request: SimRequest) -> None:
        """Move `request` from the waiting queue into the running batch (it takes the lowest free slot)."""
        self.waiting.remove(request)
        self.running.append(request)
        if not self._free_slots:
            raise RuntimeError(f"admitted more than max_num_seqs={self.config.max_num_seqs} requests")
        request.slot = heapq.heappop(self._free_slots)
        rec = request.record
        if rec.scheduled_time is None:
            rec.scheduled_time = self.now
        rec.residencies.append(Residency(request.slot, self.now, -1.0, -1.0))

    def preempt_last(self) -> SimRequest:
        """Preempt (by recompute) the most recently admitted running request and return it.

        Its KV blocks are freed and it goes back to the front of the waiting queue with
        `num_computed_tokens = 0`; the tokens it already generated are kept and recomputed later.
        """
        request = self.running.pop()
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.record.num_preemptions += 1
        self._close(request, self.now)
        self.waiting.appendleft(request)
        return request

    def finish(self, request: SimRequest, when: float) -> None:
        """Remove a finished request from the batch and free its KV blocks."""
        self.running.remove(request)
        self.kv.free(request)
        request.record.finish_time = when
        self._close(request, when)

    def _close(self, request: SimRequest, when: float) -> None:
        res = request.record.residencies[-1]
        res.end = when
        if res.prefill_end < 0:
            res.prefill_end = when
        heapq.heappush(self._free_slots, request.slot)
        request.slot = -1


def reference_schedule(state: SchedulerState) -> SchedulerOutput:
    """Plan one continuous-batching step as vLLM v1 does: running requests in order, then waiting ones.

    1. running requests, oldest admission first, each get `min(tokens left to compute, budget
       left)` (1 for a decode, a chunk for a prompt); when a request's KV blocks cannot be
       allocated, preempt the last running request (possibly itself) until they fit; a request
       that preempted itself ends the pass;
    2. if nobody was preempted, admit waiting requests (FIFO) while there is budget, a free
       sequence slot (`max_num_seqs`) and KV room; without chunked prefill a prompt must fit whole.
    """
    cfg = state.config
    out = SchedulerOutput()
    scheduled = out.num_scheduled_tokens
    budget = cfg.max_num_batched_tokens

    i = 0
    while i < len(state.running) and budget > 0:
        req = state.running[i]
        num_new = min(req.num_tokens - req.num_computed_tokens, budget)
        while state.kv.allocate_slots(req, num_new) is None:
            # the victim is the most recently admitted request: it sits at or after position i,
            # so nothing already in this plan is undone
            victim = state.preempt_last()
            out.preempted_req_ids.append(victim.request_id)
            if victim is req:
                break
        else:
            scheduled[req.request_id] = num_new
            budget -= num_new
            i += 1
            continue
        break  # the request preempted itself: KV is full
    if out.preempted_req_ids:
        return out  # KV is short: admitting now would only cause more preemptions
    while state.waiting and budget > 0 and len(state.running) < cfg.max_num_seqs:
        req = state.waiting[0]
        num_new = req.num_tokens - req.num_computed_tokens
        if not cfg.enable_chunked_prefill and num_new > budget:
            break
        num_new = min(num_new, budget)
        if state.kv.allocate_slots(req, num_new) is None:
            break
        state.admit(req)
        scheduled[req.request_id] = num_new
        budget -= num_new
    return out
