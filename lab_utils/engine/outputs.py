"""What the engine hands back: vLLM's `RequestOutput` and `CompletionOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One generated sequence (vLLM returns a list of these; the course engine makes one)."""

    index: int
    text: str
    token_ids: list[int]
    # None while running; "stop" (EOS, stop token or stop string) or "length" when done.
    finish_reason: str | None = None
    # The stop token id or stop string that ended the output, if any.
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """True once finish_reason is set."""
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Per-request timestamps (time.monotonic seconds) and counters."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """The state of one request after a step: cumulative text and token ids so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = field(default=None, repr=False)
