"""The smallest request the KV cache manager understands: an id and its token ids."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    """A request as the KV cache manager sees it (vLLM's `Request`, cut down).

    The manager only reads `request_id`, `all_token_ids` and `num_computed_tokens`; any object with
    those three attributes works (the batching simulator and the course engine bring their own).
    """

    request_id: str
    # The prompt's token ids, fixed when the request arrives.
    prompt_token_ids: list[int]
    # Tokens generated so far; `append_output` adds one per decode step.
    output_token_ids: list[int] = field(default_factory=list)
    # How many of `all_token_ids` already have their K and V in the cache.
    num_computed_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty str, got {self.request_id!r}")
        self.prompt_token_ids = [int(t) for t in self.prompt_token_ids]
        self.output_token_ids = [int(t) for t in self.output_token_ids]
        if self.num_computed_tokens < 0 or self.num_computed_tokens > self.num_tokens:
            raise ValueError(
                f"num_computed_tokens={self.num_computed_tokens} must lie in 0..{self.num_tokens} "
                f"(the request has {self.num_tokens} tokens)"
            )

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by the output generated so far."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        """len(all_token_ids)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def append_output(self, token_id: int) -> None:
        """Add one generated token (its K/V is computed by the next step)."""
        self.output_token_ids.append(int(token_id))

    def fork(self, request_id: str) -> Request:
        """A copy with a new id, for parallel sampling (n > 1): same tokens, same progress."""
        return Request(
            request_id, list(self.prompt_token_ids), list(self.output_token_ids), self.num_computed_tokens
        )
