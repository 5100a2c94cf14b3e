"""TGI's admission loop as a readable policy: when does a waiting request join the running batch?

Checked against huggingface/text-generation-inference at v3.3.7 (2025-12-18, the last release;
the project is in maintenance mode since 2025-12-11): `backends/v3/src/backend.rs`
(`batching_task`) and `backends/v3/src/queue.rs` (`next_batch`). The loop, for a model that does
NOT support chunked prefill (TGI logs "waiting_served_ratio and max_waiting_tokens will be
ignored" when it does):

    batch = next_batch(min_size=None, max_size=max_batch_size, prefill budget, total budget)
    prefill(batch); waiting_tokens = 1
    while batch:
        min_size = None if waiting_tokens >= max_waiting_tokens
                   else floor(len(batch) * waiting_served_ratio)
        token_budget = max_batch_total_tokens - tokens reserved by the running batch
        new = next_batch(min_size, max_batch_size - len(batch), max_batch_prefill_tokens, token_budget)
        if new:                       # the running batch PAUSES while the new one is prefilled
            prefill(new); batch += new; waiting_tokens = 1
        decode(batch)                 # one token for everyone
        waiting_tokens += 1

`next_batch` takes waiting requests in arrival order and stops at the first that does not fit:
the sum of their prompt tokens must stay within the prefill budget, and each must reserve
`prompt + max_new_tokens - 1` tokens (rounded up to KV blocks) out of what the running batch
leaves of `max_batch_total_tokens`. It then refuses the whole batch if it has fewer than
`min_size` requests. The reservation is for `max_new_tokens`, not for what the request will
really generate: TGI never preempts, so it must know up front that the batch fits.

`TGIAdmission` is a schedule function for both the course engine (`LLMEngine(schedule_fn=...)`)
and lab 03's simulator (`simulate(..., schedule_fn=...)`): one step of either is one forward
pass, so TGI's "prefill new, then decode all" is two steps here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab_utils.engine.scheduler import SchedulerOutput


@dataclass
class TGIConfig:
    """The launcher flags that decide admission (names and defaults as `text-generation-launcher`).

    Args:
        max_input_tokens: longest prompt accepted (422 beyond it).
        max_total_tokens: prompt + max_new_tokens limit of ONE request (422 beyond it).
        max_batch_prefill_tokens: prompt tokens one prefill forward pass may hold.
        max_batch_total_tokens: tokens reserved by all requests in the batch together.
        max_concurrent_requests: requests in flight (queued + running); more get 429 (default 128).
        waiting_served_ratio: admit a new batch only if it has at least floor(running x ratio)
            requests (default 0.3) ...
        max_waiting_tokens: ... unless this many decode steps passed since the last admission
            (default 20).
        max_batch_size: most requests running at once (None = no limit, as on GPUs).
        block_size: KV block size used to round reservations (1 = count tokens exactly).
    """

    max_input_tokens: int = 1024
    max_total_tokens: int = 2048
    max_batch_prefill_tokens: int | None = None  # None = max_input_tokens + 50, as the launcher
    max_batch_total_tokens: int = 16384
    max_concurrent_requests: int = 128
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    max_batch_size: int | None = None
    block_size: int = 1
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5

    def __post_init__(self) -> None:
        if self.max_batch_prefill_tokens is None:
            self.max_batch_prefill_tokens = self.max_input_tokens + 50
        for name in (
            "max_input_tokens",
            "max_total_tokens",
            "max_batch_prefill_tokens",
            "max_batch_total_tokens",
            "max_concurrent_requests",
            "max_waiting_tokens",
            "block_size",
        ):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        # The launcher's own checks (launcher/src/main.rs), with its wording.
        if self.max_input_tokens >= self.max_total_tokens:
            raise ValueError(
                f"`max_input_tokens`({self.max_input_tokens}) must be < "
                f"`max_total_tokens`({self.max_total_tokens})"
            )
        if self.max_batch_prefill_tokens < self.max_input_tokens:
            raise ValueError(
                f"`max_batch_prefill_tokens` ({self.max_batch_prefill_tokens}) must be >= "
                f"`max_input_tokens` ({self.max_input_tokens}): a longest prompt could never be prefilled"
            )
        if self.max_total_tokens > self.max_batch_total_tokens:
            raise ValueError(
                f"`max_total_tokens` must be <= `max_batch_total_tokens`. Given: "
                f"{self.max_total_tokens} and {self.max_batch_total_tokens}"
            )
        if not self.waiting_served_ratio >= 0:
            raise ValueError(f"waiting_served_ratio must be >= 0, got {self.waiting_served_ratio!r}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {self.max_batch_size!r}")

    def launcher_args(self) -> list[str]:
        """These settings as `text-generation-launcher` flags (for the real container)."""
        args = [
            "--max-input-tokens",
            self.max_input_tokens,
            "--max-total-tokens",
            self.max_total_tokens,
            "--max-batch-prefill-tokens",
            self.max_batch_prefill_tokens,
            "--max-batch-total-tokens",
            self.max_batch_total_tokens,
            "--max-concurrent-requests",
            self.max_concurrent_requests,
            "--waiting-served-ratio",
            self.waiting_served_ratio,
            "--max-waiting-tokens",
            self.max_waiting_tokens,
        ]
        if self.max_batch_size is not None:
            args += ["--max-batch-size", self.max_batch_size]
        return [str(a) for a in args]


def reserved_tokens(input_len: int, max_new_tokens: int, block_size: int = 1) -> int:
    """Tokens a request reserves from max_batch_total_tokens while it is in the batch.

    The last generated token's K/V is never stored, hence the -1; TGI allocates whole blocks.
    """
    return math.ceil((input_len + max_new_tokens - 1) / block_size) * block_size


def min_batch_size(
    running: int, waiting_tokens: int, waiting_served_ratio: float, max_waiting_tokens: int
) -> int | None:
    """The smallest new batch TGI accepts while `running` requests decode (None = any size)."""
    if waiting_tokens >= max_waiting_tokens:
        return None
    return math.floor(running * waiting_served_ratio)


def next_batch(
    waiting: list[tuple[int, int]],
    *,
    min_size: int | None,
    max_size: int | None,
    prefill_token_budget: int,
    token_budget: int,
    block_size: int = 1,
) -> int:
    """How many requests from the front of the queue form the next batch (0 = none).

    Args:
        waiting: (input_len, max_new_tokens) per waiting request, in arrival order.
        min_size: refuse a batch smaller than this (None = any size).
        max_size: at most this many (None = no limit).
        prefill_token_budget: the prompt tokens of the batch must stay within this.
        token_budget: their reservations must stay within this.
    """
    if not waiting or prefill_token_budget <= 0 or token_budget <= 0:
        return 0
    if min_size is not None and len(waiting) < min_size:
        return 0
    if max_size is not None and max_size <= 0:
        return 0
    prefill_budget = math.ceil(prefill_token_budget / block_size) * block_size
    prefill = reserved = taken = 0
    for input_len, max_new in waiting:
        r = reserved_tokens(input_len, max_new, block_size)
        if reserved + r > token_budget or prefill + input_len > prefill_budget:
            break  # FIFO: the first request that does not fit stops the batch
        prefill += input_len
        reserved += r
        taken += 1
        if max_size is not None and taken == max_size:
            break
    if min_size is not None and taken < min_size:
        return 0
    return taken


@dataclass
class AdmissionRecord:
    """What the policy decided at one step (for plots and tests)."""

    step: int
    kind: str  # "prefill" (new requests only, the batch paused) or "decode"
    batch_size: int  # requests holding a place in the batch after this step's admissions
    admitted: int  # requests admitted by this step
    waiting: int  # queue length when the step was planned
    min_size: int | None
    reason: str  # "empty" | "backpressure" | "wait_exceeded" | "" (no admission)
    reserved: int  # tokens reserved by the batch after admission


def _default_max_new(req: Any) -> int:
    params = getattr(req, "sampling_params", None)
    if params is not None:
        return int(params.max_tokens)
    return int(req.output_len)  # a simulator request: its real output length


def _input_len(req: Any) -> int:
    return int(getattr(req, "num_prompt_tokens", None) or req.prompt_len)


class TGIAdmission:
    """TGI's batching loop as a schedule function: `plan = policy(state)` once per forward pass.

    Args:
        config: the TGI limits.
        max_new_tokens: what each request asked for: None reads it from the request
            (`sampling_params.max_tokens` in the engine, the real `output_len` in the simulator),
            an int gives every request that value, a callable maps a request to it.
    """

    def __init__(
        self, config: TGIConfig | None = None, max_new_tokens: int | Callable[[Any], int] | None = None
    ) -> None:
        self.config = config or TGIConfig()
        if max_new_tokens is None:
            self._max_new = _default_max_new
        elif callable(max_new_tokens):
            self._max_new = max_new_tokens
        else:
            self._max_new = lambda req, n=int(max_new_tokens): n
        self.waiting_tokens = 0
        self._decode_next = False  # after a concatenating prefill the next pass decodes everyone
        self.records: list[AdmissionRecord] = []  # a long-running server trims the oldest
        self._steps = 0

    def _reserved(self, reqs) -> int:
        bs = self.config.block_size
        return sum(reserved_tokens(_input_len(r), self._max_new(r), bs) for r in reqs)

    def __call__(self, state: Any) -> SchedulerOutput:
        cfg = self.config
        plan = SchedulerOutput()  # the plan type every schedule function returns
        running = list(state.running)
        n_waiting = len(state.waiting)
        admitted: list = []
        min_size, reason = None, ""
        if not running or not self._decode_next:
            if running:
                min_size = min_batch_size(
                    len(running), self.waiting_tokens, cfg.waiting_served_ratio, cfg.max_waiting_tokens
                )
            max_size = None if cfg.max_batch_size is None else cfg.max_batch_size - len(running)
            queue = [(_input_len(r), self._max_new(r)) for r in state.waiting]
            n = next_batch(
                queue,
                min_size=min_size,
                max_size=max_size,
                prefill_token_budget=cfg.max_batch_prefill_tokens,
                token_budget=cfg.max_batch_total_tokens - self._reserved(running),
                block_size=cfg.block_size,
            )
            for req in list(state.waiting)[:n]:
                new_tokens = req.num_tokens - req.num_computed_tokens
                if state.kv.allocate_slots(req, new_tokens) is None:
                    break  # the KV pool is smaller than max_batch_total_tokens promised
                state.admit(req)
                plan.num_scheduled_tokens[req.request_id] = new_tokens
                admitted.append(req)
        if admitted:
            reason = "empty" if not running else ("backpressure" if min_size is not None else "wait_exceeded")
            self.waiting_tokens = 1
            self._decode_next = bool(running)
            kind = "prefill"
        elif running:
            self._decode_next = False
            for req in running:
                if req not in state.running:
                    continue  # preempted below by an earlier request of this step
                while state.kv.allocate_slots(req, 1) is None:
                    victim = state.preempt_last()  # only when the KV pool is smaller than promised
                    plan.preempted_req_ids.append(victim.request_id)
                    plan.num_scheduled_tokens.pop(victim.request_id, None)
                    if victim is req:
                        break
                else:
                    plan.num_scheduled_tokens[req.request_id] = 1
            self.waiting_tokens += 1
            kind = "decode"
        else:
            kind = "idle"
        self.records.append(
            AdmissionRecord(
                self._steps,
                kind,
                len(state.running),
                len(admitted),
                n_waiting,
                min_size,
                reason,
                self._reserved(state.running),
            )
        )
        self._steps += 1
        return plan
