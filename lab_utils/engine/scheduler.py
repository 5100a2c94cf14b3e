"""Continuous batching: each step, decide which requests run and how many of their tokens.

NOTE on the algorithm (after vLLM v1's scheduler): there is no separate "prefill phase" and
"decode phase". Every request simply has `num_computed_tokens` (K/V already in the cache) and
`num_tokens` (prompt + output so far); each step gives it up to `num_tokens - num_computed_tokens`
new tokens out of one shared token budget. A decode is a request that is one token behind; a
prompt too long for the budget is cut into chunks (chunked prefill) and catches up over several
steps. Running requests are served first; waiting ones are admitted while the budget, the
`max_num_seqs` limit and the KV cache allow. When a running request cannot get a block for its
next token, the most recently admitted running request is *preempted by recompute*: its blocks
are freed and it goes back to the front of the queue, to be prefilled again later.

That policy is `reference_schedule(state)` below, the course's one copy of it. Two things drive
it: the engine's `Scheduler` (real requests, lab 02's paged KV manager) and lab 03's simulator
(`lab_utils.sim.scheduler.SchedulerState`: token counts, a clock, batch slots). Both hand it the
same small `SchedulingState`, so a learner's own policy plugs into either.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """The plan for one step: plain data that the model runner executes and plots can draw.

    A schedule function (the reference below, or a lab 03/04 learner's) fills the first two
    fields; `Scheduler.schedule()` then describes the plan completely for the model runner.
    """

    # request_id -> new tokens this step (1 for a decode, up to the budget for a prompt chunk).
    num_scheduled_tokens: dict = field(default_factory=dict)
    # Requests preempted while making this plan (their blocks are already free).
    preempted_req_ids: list = field(default_factory=list)
    step: int = 0
    # Scheduled requests, in the order they were scheduled (running first, then newly admitted).
    req_ids: list = field(default_factory=list)
    # request_id -> tokens already in the cache before this step.
    num_computed_tokens: dict = field(default_factory=dict)
    # request_id -> its block table (physical block ids) after this step's allocation.
    block_tables: dict = field(default_factory=dict)
    # Requests scheduled for the first time, or again after a preemption.
    new_req_ids: list = field(default_factory=list)
    # Scheduled requests that decode: one token behind, so this step samples their next token
    # from a computed prompt (`Request.is_decoding`). Every other scheduled request computes
    # prompt (or recompute) tokens. Recording and plots take the split from here.
    decode_req_ids: list = field(default_factory=list)
    # request_id -> the draft tokens scheduled after its last token (speculative decoding): the
    # forward pass computes them and checks them against what the model itself predicts.
    scheduled_spec_tokens: dict = field(default_factory=dict)
    # Copy-on-write block copies (src, dst) the runner must do before the forward pass.
    blocks_to_copy: list = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    token_budget: int = 0

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Tokens in this step's batch."""
        return sum(self.num_scheduled_tokens.values())


@dataclass
class SchedulerConfig:
    """The scheduler's limits (vLLM's SchedulerConfig, the fields the course uses)."""

    max_num_seqs: int = 32  # most requests running at once
    max_num_batched_tokens: int = 512  # token budget per step
    max_model_len: int = 2048  # a request stops ("length") when prompt + output reaches this
    enable_chunked_prefill: bool = True  # a prompt may be split across steps
    long_prefill_token_threshold: int = 0  # cap on one request's new tokens per step (0 = no cap)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0 (0 = no cap), got {self.long_prefill_token_threshold}"
            )


class SchedulingState(Protocol):
    """What a schedule function sees and may change (the engine's `Scheduler`, the simulator's state).

    Requests in `running` and `waiting` have `request_id`, `num_tokens` and `num_computed_tokens`.
    """

    # max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, long_prefill_token_threshold
    config: Any
    # the KV cache manager (lab_utils.kv.interface.KVCacheManagerInterface)
    kv: Any
    # running requests in admission order: the last one is preempted first
    running: list
    # waiting requests, first come first served; preempted ones go back to the front
    waiting: deque

    def admit(self, request: Any) -> None:
        """Move `request` from the front of the waiting queue into the running batch."""
        ...

    def preempt_last(self) -> Any:
        """Preempt (by recompute) the most recently admitted running request and return it."""
        ...


def num_tokens_with_spec(request: Any) -> int:
    """The request's tokens plus the draft tokens waiting to be checked (vLLM's name).

    Requests that never speculate (the simulator's, lab 02's) have no `spec_token_ids`: none.
    """
    return request.num_tokens + len(getattr(request, "spec_token_ids", ()))


def _num_new_tokens(config: Any, num_uncomputed: int, budget: int) -> int:
    """Tokens a request gets this step: all it lacks, capped per request and by the budget left."""
    if config.long_prefill_token_threshold:
        num_uncomputed = min(num_uncomputed, config.long_prefill_token_threshold)
    return min(num_uncomputed, budget)


def reference_schedule(state: SchedulingState) -> SchedulerOutput:
    """Plan one step with vLLM v1's policy: running requests in order, then waiting ones.

    1. Running requests, oldest admission first, each get the tokens they lack up to what is left
       of the token budget (1 for a decode, a chunk for a prompt; a decode with draft tokens from
       speculative decoding also gets its drafts, as far as the budget goes). When a request's KV
       blocks do not fit, preempt the most recently admitted running request (possibly itself)
       until they do; a request that preempted itself ends the pass.
    2. Only if nobody was preempted (memory is short: admitting now would only cause more
       preemptions), admit waiting requests first come first served while there is budget, a free
       sequence slot (`max_num_seqs`) and KV room. A new request starts after its prefix-cache
       hits; without chunked prefill its whole remaining prompt must fit the budget.

    Admissions and preemptions go through `state.admit` and `state.preempt_last`.
    """
    cfg, kv = state.config, state.kv
    plan = SchedulerOutput()
    budget = cfg.max_num_batched_tokens

    # 1. Running requests: decodes (1 token) and unfinished prompt chunks.
    i = 0
    while i < len(state.running) and budget > 0:
        req = state.running[i]
        n = _num_new_tokens(cfg, num_tokens_with_spec(req) - req.num_computed_tokens, budget)
        if n <= 0:  # cannot happen for a healthy request; skip rather than schedule nothing
            i += 1
            continue
        while kv.allocate_slots(req, n) is None:
            # The victim is the most recently admitted request. It always sits at or after
            # position i, so nothing already planned is undone.
            victim = state.preempt_last()
            plan.preempted_req_ids.append(victim.request_id)
            if victim is req:
                break
        else:
            plan.num_scheduled_tokens[req.request_id] = n
            budget -= n
            i += 1
            continue
        break  # the request preempted itself: the KV cache is full

    if plan.preempted_req_ids:
        return plan

    # 2. Waiting requests in arrival order (preempted ones sit at the front).
    while state.waiting and budget > 0 and len(state.running) < cfg.max_num_seqs:
        req = state.waiting[0]
        hits, num_cached = kv.get_computed_blocks(req)
        num_uncomputed = req.num_tokens - num_cached
        n = _num_new_tokens(cfg, num_uncomputed, budget)
        if not cfg.enable_chunked_prefill and n < num_uncomputed:
            break  # the whole prompt must fit in one step
        if kv.allocate_slots(req, n, hits) is None:
            break
        req.num_computed_tokens = num_cached
        state.admit(req)
        plan.num_scheduled_tokens[req.request_id] = n
        budget -= n
    return plan


# A plan made by a lab 03/04 schedule function: anything with these two attributes.
class _Plan(Protocol):
    num_scheduled_tokens: dict
    preempted_req_ids: list


class Scheduler:
    """vLLM-style scheduler over any KV cache manager with lab 02's API.

    Args:
        kv_cache_manager: has get_computed_blocks, allocate_slots, free, get_block_ids.
        config: the limits (max_num_seqs, token budget, max_model_len, chunked prefill).
        schedule_fn: optional lab 03/04 policy, `schedule_fn(state) -> plan`. The scheduler passes
            itself as the state (a `SchedulingState`: `config`, `kv`, `running`, `waiting`,
            `admit(req)`, `preempt_last()`). The plan needs `num_scheduled_tokens`
            (request_id -> tokens) and `preempted_req_ids`. None uses `reference_schedule`.
    """

    def __init__(
        self,
        kv_cache_manager: Any,
        config: SchedulerConfig | None = None,
        schedule_fn: Callable[[Scheduler], _Plan] | None = None,
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.config = config or SchedulerConfig()
        self.schedule_fn = schedule_fn
        self.now = 0.0  # lab 03 policies read the clock from the state
        self._admitted: list[str] = []
        self._preempted: list[str] = []
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_steps = 0
        self.num_preemptions = 0

    # ------------------------------------------------------------------ queue
    def add_request(self, request: Request) -> None:
        """Queue a new request (it waits until a step admits it)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        """True while anything is waiting or running."""
        return bool(self.waiting or self.running)

    def get_num_unfinished_requests(self) -> int:
        """Waiting plus running."""
        return len(self.waiting) + len(self.running)

    # ------------------------------------------------------------------ the SchedulingState
    @property
    def kv(self) -> Any:
        """The KV cache manager (the name schedule functions use)."""
        return self.kv_cache_manager

    def admit(self, request: Request) -> None:
        """Move `request` from the front of the waiting queue into the running batch."""
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.monotonic()
        if request.num_preemptions == 0:  # prefix-cache hits of its first admission (vLLM's metric)
            request.num_cached_tokens = request.num_computed_tokens
        self.running.append(request)
        self._admitted.append(request.request_id)

    def preempt_last(self) -> Request:
        """Preempt (by recompute) the most recently admitted running request and return it."""
        return self.preempt(self.running[-1])

    def preempt(self, request: Request) -> Request:
        """Preempt (by recompute) the running `request` and return it.

        Its blocks are freed, `num_computed_tokens` drops to 0, and it goes back to the front of
        the waiting queue; the tokens it already generated are kept and recomputed later. A plan
        must not schedule it in the step that preempted it.
        """
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.spec_token_ids = []  # drafts are proposed again once it decodes
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self._preempted.append(request.request_id)
        return request

    # ------------------------------------------------------------------ schedule
    def reference_schedule(self) -> SchedulerOutput:
        """Plan one step of this scheduler with the reference policy (`reference_schedule(self)`)."""
        return reference_schedule(self)

    def _check_plan(self, scheduled: dict[str, int]) -> None:
        """Refuse a plan the model runner cannot execute, with a message that says why."""
        running = {r.request_id for r in self.running}
        total = 0
        for rid, n in scheduled.items():
            if rid not in running:
                raise RuntimeError(f"plan schedules {rid!r}, which is not running (admit it first)")
            req = self.requests[rid]
            left = num_tokens_with_spec(req) - req.num_computed_tokens
            if not 1 <= n <= left:
                raise RuntimeError(f"plan gives {rid!r} {n} tokens; it has {left} uncomputed tokens")
            held = len(self.kv_cache_manager.get_block_ids(rid)) * self.kv_cache_manager.block_size
            if held < req.num_computed_tokens + n:
                raise RuntimeError(
                    f"plan gives {rid!r} {n} tokens but its blocks hold only {held} "
                    "tokens: call kv.allocate_slots before scheduling"
                )
            total += n
        if total > self.config.max_num_batched_tokens:
            raise RuntimeError(
                f"plan schedules {total} tokens, over the budget of {self.config.max_num_batched_tokens}"
            )
        if len(self.running) > self.config.max_num_seqs:
            raise RuntimeError(
                f"{len(self.running)} requests running, over max_num_seqs={self.config.max_num_seqs}"
            )

    def schedule(self) -> SchedulerOutput:
        """Plan one step with `schedule_fn` (default: `reference_schedule`), and describe it as data."""
        self._admitted, self._preempted = [], []
        if self.schedule_fn is None:
            plan = reference_schedule(self)
            scheduled = plan.num_scheduled_tokens
        else:  # a learner's plan is checked before the model runner sees it
            plan = self.schedule_fn(self)
            scheduled = {rid: int(n) for rid, n in plan.num_scheduled_tokens.items() if int(n) > 0}
            self._check_plan(scheduled)
        kv = self.kv_cache_manager
        pop_copies = getattr(kv, "pop_pending_copies", None)
        self.num_steps += 1
        return SchedulerOutput(
            num_scheduled_tokens=scheduled,
            preempted_req_ids=list(self._preempted),
            step=self.num_steps,
            req_ids=list(scheduled),
            num_computed_tokens={rid: self.requests[rid].num_computed_tokens for rid in scheduled},
            block_tables={rid: list(kv.get_block_ids(rid)) for rid in scheduled},
            new_req_ids=[r for r in self._admitted if r in scheduled],
            decode_req_ids=[rid for rid in scheduled if self.requests[rid].is_decoding],
            scheduled_spec_tokens=self._scheduled_spec_tokens(scheduled),
            blocks_to_copy=pop_copies() if pop_copies else [],
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            token_budget=self.config.max_num_batched_tokens,
        )

    def _scheduled_spec_tokens(self, scheduled: dict[str, int]) -> dict[str, list[int]]:
        """The drafts each request got this step: all of them, or as many as the budget left room for."""
        out = {}
        for rid, n in scheduled.items():
            req = self.requests[rid]
            num_spec = req.num_computed_tokens + n - req.num_tokens
            if req.spec_token_ids and num_spec > 0:
                out[rid] = list(req.spec_token_ids[:num_spec])
        return out

    # ------------------------------------------------------------------ update
    def _check_stop(self, request: Request) -> bool:
        params = request.sampling_params
        token = request.output_token_ids[-1]
        if not params.ignore_eos and request.eos_token_id is not None and token == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
        elif token in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = token
        elif (
            request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.max_model_len
        ):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return request.is_finished

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: dict[str, int | list[int]]
    ) -> list[Request]:
        """Record the step's work: advance progress, append sampled tokens, finish and free.

        `sampled_token_ids[rid]` is one token, or a list of them when the request's drafts were
        checked: the drafts the model agreed with, then the model's own next token. Drafts it
        rejected are not in the cache's count, so their slots are written over later.

        Returns the requests that finished in this step.
        """
        finished: list[Request] = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status != RequestStatus.RUNNING:
                continue
            req.spec_token_ids = []  # checked in this step (or not scheduled): proposed afresh
            sampled = sampled_token_ids.get(rid)
            tokens = (
                [] if sampled is None else list(sampled) if isinstance(sampled, (list, tuple)) else [sampled]
            )
            num_drafts = len(scheduler_output.scheduled_spec_tokens.get(rid, ()))
            num_rejected = num_drafts - (len(tokens) - 1) if tokens and num_drafts else 0
            req.num_computed_tokens += n - num_rejected  # their K/V are in the cache now
            for token in tokens:  # a prompt chunk that does not reach the end yet has none
                req.append_output_token(int(token))
                if self._check_stop(req):  # later tokens of the same step are dropped
                    finished.append(req)
                    break
        for req in finished:
            self._free(req)
        return finished

    def finish_requests(self, request_ids: list[str] | str, status: RequestStatus) -> list[Request]:
        """Finish requests from outside (stop strings, aborts); frees their blocks."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        done = []
        for rid in ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            req.status = status
            self._free(req)
            done.append(req)
        return done

    def _free(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv_cache_manager.free(request)
        self.requests.pop(request.request_id, None)
