"""The batching policies the simulator knows, as validated config dataclasses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StaticBatching:
    """Form a batch from whoever is waiting, run it until its longest request is done, then admit.

    `pad_finished=True` is how `transformers.generate` on a padded batch behaves: a row that is
    finished keeps computing (pad tokens) until the whole batch stops, so every step pays for
    `len(batch)` rows.
    """

    batch_size: int = 8
    pad_finished: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"StaticBatching.batch_size must be at least 1, got {self.batch_size}")

    @property
    def num_slots(self) -> int:
        return self.batch_size

    @property
    def name(self) -> str:
        return f"static(batch_size={self.batch_size})"


@dataclass(frozen=True)
class ContinuousBatching:
    """Iteration-level scheduling as in vLLM: the batch is re-formed before every step.

    Args:
        max_num_seqs: most requests running at once (vLLM `--max-num-seqs`).
        max_num_batched_tokens: token budget of one step, prefill and decode together
            (vLLM `--max-num-batched-tokens`); must be >= max_num_seqs so every running
            request can always decode.
        enable_chunked_prefill: split a long prompt over several steps to fit the budget.
        num_kv_blocks: KV cache size in blocks; None means unlimited (never preempts).
        block_size: tokens per KV block (vLLM: 16 on GPU, 128 on CPU).
        long_prefill_token_threshold: most new tokens one request gets in a step, so one long
            prompt cannot take the whole budget (vLLM `--long-prefill-token-threshold`; 0 = no cap).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    num_kv_blocks: int | None = None
    block_size: int = 16
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): each running request needs one token of budget per decode step "
                "(vLLM refuses this configuration too)"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1 token, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(
                f"num_kv_blocks must be at least 1 (or None for unlimited), got {self.num_kv_blocks}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                "long_prefill_token_threshold must be >= 0 (0 = no cap), "
                f"got {self.long_prefill_token_threshold}"
            )

    @property
    def num_slots(self) -> int:
        return self.max_num_seqs

    @property
    def name(self) -> str:
        return f"continuous(max_num_seqs={self.max_num_seqs})"


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's dynamic batcher for a one-shot (non-autoregressive) model, one model instance.

    When the instance is free the batcher sends the largest preferred batch size it can form
    from the queue; when it can form none, it waits until the oldest request has waited
    `max_queue_delay_microseconds`, then sends the largest batch it has (up to `max_batch_size`).
    With no preferred sizes, `max_batch_size` plays the preferred size.
    """

    max_batch_size: int = 8
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        object.__setattr__(self, "preferred_batch_size", tuple(int(s) for s in self.preferred_batch_size))
        bad = [s for s in self.preferred_batch_size if not 1 <= s <= self.max_batch_size]
        if bad:
            raise ValueError(
                f"preferred_batch_size {bad} must lie in 1..max_batch_size ({self.max_batch_size}); "
                "Triton rejects such a config"
            )
        if self.max_queue_delay_microseconds < 0:
            raise ValueError("max_queue_delay_microseconds must be >= 0")

    @property
    def num_slots(self) -> int:
        return self.max_batch_size

    @property
    def name(self) -> str:
        return (
            f"dynamic(max_batch_size={self.max_batch_size}, preferred={list(self.preferred_batch_size)}, "
            f"delay={self.max_queue_delay_microseconds}us)"
        )
