"""The simulator's side of the scheduling policy: requests as token counts, a block-counting KV
budget, and the state a schedule function sees.

The engine loop is schedule -> run -> update. The "schedule" part is vLLM v1's policy,
`reference_schedule(state)`, which lives in one place for the whole course: the engine's
`lab_utils/engine/scheduler.py` (read it there, with its NOTE on the algorithm). The simulator
drives that same function; `SchedulerState` below is its adapter, the simulator's version of the
engine's `Scheduler`: it keeps `SimRequest`s (token counts only), gives each running request a
batch slot for the timeline, and stamps the clock on every admission and preemption. A learner's
own schedule function with the same signature plugs into `simulate(..., schedule_fn=...)` and
into the engine (`LLMEngine(schedule_fn=...)`).
"""

from __future__ import annotations

import heapq
from collections import deque

from lab_utils.engine.request import TokenProgress
from lab_utils.engine.scheduler import SchedulerOutput, reference_schedule
from lab_utils.mathutils import cdiv

from .policies import ContinuousBatching
from .results import RequestRecord, Residency

# The plan type and the policy are the engine's, re-exported here for lab 03.
__all__ = ["BlockCounter", "SchedulerOutput", "SchedulerState", "SimRequest", "reference_schedule"]


class SimRequest(TokenProgress):
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

    def get_computed_blocks(self, request) -> tuple[list, int]:
        """No prefix caching (placeholder token ids would all "hit"): no cached blocks, 0 tokens."""
        return [], 0

    def allocate_slots(
        self, request, num_new_tokens: int, new_computed_blocks: list | None = None
    ) -> list | None:
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


class SchedulerState:
    """What a schedule function sees and may change in the simulator (a `SchedulingState`).

    The same members as the engine's `Scheduler`: config, kv, running list, waiting queue,
    `admit` and `preempt_last`; plus the clock (`now`) and batch slots for the timeline.
    """

    def __init__(self, config: ContinuousBatching, kv) -> None:
        self.config = config
        self.kv = kv  # BlockCounter, or lab 02's KVCacheManager with prefix caching off
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
