"""A request inside the engine: its tokens, its progress through the cache, and its state."""

from __future__ import annotations

import enum
import time

from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is in its life (vllm/v1/request.py)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # its blocks were taken back; it waits to be recomputed
    FINISHED_STOPPED = "stop"  # EOS, a stop token or a stop string
    FINISHED_LENGTH_CAPPED = "length"  # max_tokens or max_model_len
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        """True for the three FINISHED_* states."""
        return self.name.startswith("FINISHED")


class TokenProgress:
    """What a scheduler reads of any request (the engine's `Request`, the simulator's `SimRequest`).

    A subclass has `num_tokens` (prompt + outputs so far), `num_computed_tokens` (K/V in the cache)
    and `num_output_tokens`.
    """

    __slots__ = ()

    @property
    def is_decoding(self) -> bool:
        """True when one more computed token produces the next output token (lab 03's name)."""
        return self.num_output_tokens >= 1 and self.num_computed_tokens == self.num_tokens - 1


class Request(TokenProgress):
    """One prompt being served.

    The KV cache manager reads `request_id`, `all_token_ids` and `num_computed_tokens`, so this
    works with `lab_utils.kv.KVCacheManager` and with a learner's own manager.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        prompt: str | None = None,
        arrival_time: float | None = None,
        eos_token_id: int | None = None,
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        # vLLM's convention: a lower number is served first (--scheduling-policy priority); the
        # engine's own policy is first come first served and does not read it.
        self.priority = int(priority)
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.status = RequestStatus.WAITING
        # Prompt then output, one list that grows in place (the cache manager reads it every step).
        self._all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        # Tokens whose K and V are in the cache. Reset to 0 when the request is preempted.
        self.num_computed_tokens = 0
        # Draft tokens for the next step (speculative decoding, engine/spec_decode.py): guesses
        # that the step computing them also checks. Empty unless the engine speculates.
        self.spec_token_ids: list[int] = []
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache, first schedule
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by the output so far (the live list; do not modify)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        """len(all_token_ids)."""
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """True once the request has stopped for any reason."""
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        """Add one sampled token; its K/V is computed by the next step."""
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
