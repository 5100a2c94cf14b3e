"""What a simulation (or a measured run) produced: per request times, per step batch composition."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Residency:
    """One stay of a request in a batch slot (a preempted request has several)."""

    slot: int
    start: float  # admitted into the slot
    prefill_end: float  # its prefill (or recompute) finished; == end if preempted before that
    end: float  # finished or preempted
    held_until: float | None = None  # static batching: the slot stays taken (padding) until here

    @property
    def release(self) -> float:
        """When the slot becomes free again."""
        return self.end if self.held_until is None else max(self.end, self.held_until)


@dataclass
class RequestRecord:
    """One request's life: arrival, first scheduling, first token, finish."""

    request_id: int | str
    arrival_time: float
    prompt_len: int
    output_len: int
    scheduled_time: float | None = None  # first admission into a batch
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    residencies: list[Residency] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        """Seconds between arrival and first admission."""
        return None if self.scheduled_time is None else self.scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        """Arrival to last token."""
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for one-token answers)."""
        if self.finish_time is None or self.first_token_time is None or self.output_len < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.output_len - 1)


class StepBatch:
    """The batch of one step, counted: what a simulated `StepRecord` and a measured engine
    `StepSnapshot` share. A subclass has `prefill` (request_id -> prompt or recompute tokens) and
    `decode` (request_ids that decoded one token)."""

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt (and recompute) tokens in the step."""
        return sum(self.prefill.values())

    @property
    def num_tokens(self) -> int:
        """Tokens scheduled in this step (padding rows not counted)."""
        return self.num_prefill_tokens + len(self.decode)

    @property
    def num_active(self) -> int:
        """Requests doing useful work in this step."""
        return len(self.prefill) + len(self.decode)


@dataclass
class StepRecord(StepBatch):
    """One engine step's plan and timing (a SchedulerOutput with a clock attached)."""

    start: float
    end: float
    prefill: dict  # request_id -> prompt (or recompute) tokens computed in this step
    decode: tuple  # request_ids that decoded one token in this step
    preempted: tuple = ()  # request_ids preempted (by recompute) while planning this step
    num_padding: int = 0  # static batching: finished rows still computing pad tokens
    prefill_sampled: tuple = ()  # prefill requests whose last prompt chunk produced a token

    @property
    def sampled(self) -> tuple:
        """Request ids that produced an output token in this step (decodes + completed prefills)."""
        return self.decode + self.prefill_sampled


@dataclass
class SimResult:
    """Everything a run produced; the input of metrics and of the timeline plot."""

    policy: str
    num_slots: int
    requests: list[RequestRecord]
    steps: list[StepRecord] = field(default_factory=list)
    measured: bool = False  # True for traces of a real server (no step records)
    num_steps: int = 0  # steps run (kept when simulate(..., keep_steps=False) drops the records)

    def request(self, request_id) -> RequestRecord:
        """The record of one request by id."""
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise KeyError(f"no request {request_id!r} in this result")
