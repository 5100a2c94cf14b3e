"""What one engine step did, as plain data: batch composition, block tables, timings.

`LLMEngine` keeps one `StepSnapshot` per step in `engine.snapshots`. Lab 02's block plots draw
`snapshot.frame` (a `lab_utils.kv.Frame`, recorded with `record_frames=True`); lab 03's timeline
draws `to_sim_result(engine.snapshots, ...)`, which turns the steps into the simulator's records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lab_utils.sim.results import StepBatch


@dataclass
class StepSnapshot(StepBatch):
    """One step of the engine loop, measured."""

    step: int
    start: float  # seconds since the engine was created
    schedule_s: float  # time spent planning
    execute_s: float  # time in the model runner (inputs, forward, sampling)
    update_s: float  # time appending tokens, checking stops, detokenizing
    # request_id -> new tokens in this step, split by kind.
    prefill: dict[str, int]
    decode: list[str]
    # request_id -> tokens in the cache after the step.
    num_computed_tokens: dict[str, int]
    # request_id -> block table after the step's allocation (every request holding blocks).
    block_tables: dict[str, list[int]]
    new_req_ids: list[str]
    preempted_req_ids: list[str]
    finished_req_ids: list[str]
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks in use after the step
    num_free_blocks: int
    frame: Any = field(default=None, repr=False)  # lab_utils.kv.Frame when record_frames=True
    # Draft tokens the decodes checked in this step (speculative decoding), and how many of
    # them the model agreed with.
    num_spec_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens scheduled in this step, drafts included."""
        return super().num_tokens + self.num_spec_tokens

    @property
    def end(self) -> float:
        """When the step finished, seconds since the engine was created."""
        return self.start + self.schedule_s + self.execute_s + self.update_s


def to_sim_result(
    snapshots: Sequence[StepSnapshot],
    arrivals: dict[str, float] | None = None,
    prompt_lens: dict[str, int] | None = None,
    output_lens: dict[str, int] | None = None,
    policy: str = "course engine",
    num_slots: int | None = None,
):
    """Turn measured steps into lab 03's `SimResult`, so its timeline plot draws a real run.

    Batch slots are handed out as the simulator does: a request admitted takes the lowest free
    slot and gives it back when it finishes or is preempted.
    """
    import heapq

    from lab_utils.sim.results import RequestRecord, Residency, SimResult, StepRecord

    arrivals = arrivals or {}
    prompt_lens = prompt_lens or {}
    output_lens = output_lens or {}
    slots_needed = num_slots or max((s.num_running for s in snapshots), default=1)
    free = list(range(max(slots_needed, 1)))
    records: dict[str, RequestRecord] = {}
    slot_of: dict[str, int] = {}
    steps: list[StepRecord] = []
    t0 = snapshots[0].start if snapshots else 0.0

    def record(rid: str) -> RequestRecord:
        if rid not in records:
            records[rid] = RequestRecord(
                rid,
                max(arrivals.get(rid, 0.0) - t0, 0.0),
                int(prompt_lens.get(rid, 0)),
                int(output_lens.get(rid, 0)),
            )
        return records[rid]

    def close(rid: str, when: float) -> None:
        res = records[rid].residencies[-1]
        res.end = when
        if res.prefill_end < 0:
            res.prefill_end = when
        heapq.heappush(free, slot_of.pop(rid))

    for s in snapshots:
        start, end = s.start - t0, s.end - t0
        for rid in s.preempted_req_ids:
            if rid in slot_of:
                records[rid].num_preemptions += 1
                close(rid, start)
        for rid in s.new_req_ids:
            rec = record(rid)
            if rec.scheduled_time is None:
                rec.scheduled_time = start
            if not free:
                free.append(len(slot_of))
            slot_of[rid] = heapq.heappop(free)
            rec.residencies.append(Residency(slot_of[rid], start, -1.0, -1.0))
        for rid in list(s.prefill) + list(s.decode):
            rec = record(rid)
            res = rec.residencies[-1] if rec.residencies else None
            done_prefill = rid in s.decode or s.num_computed_tokens.get(rid, 0) >= prompt_lens.get(rid, 0)
            if res is not None and res.prefill_end < 0 and done_prefill:
                res.prefill_end = end
                if rec.first_token_time is None:
                    rec.first_token_time = end
        for rid in s.finished_req_ids:
            if rid in slot_of:
                records[rid].finish_time = end
                close(rid, end)
        steps.append(StepRecord(start, end, dict(s.prefill), tuple(s.decode), tuple(s.preempted_req_ids)))
    return SimResult(policy, slots_needed, list(records.values()), steps, measured=False)
