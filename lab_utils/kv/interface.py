"""What the course engine needs from a KV cache manager: the interface lab 02's learner implements.

The engine's scheduler and `LLMEngine` call only the members below (vLLM v1 names, as in
vllm/v1/core/kv_cache_manager.py). `lab_utils.kv.KVCacheManager` implements them with prefix
caching and copy-on-write; a learner's manager from lab 02 implements them without caching, and
`LLMEngine(kv_cache_manager=TheirClass)` serves the course model with it (lab 04).

Optional members, used when present: `usage` (fraction of blocks in use, for plots; the engine
assumes 0 without it), `pop_pending_copies()` (copy-on-write copies for the model runner) and
`block_pool` (lab 02's block-by-block frames).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .kv_cache_manager import RequestLike


@runtime_checkable
class KVCacheManagerInterface(Protocol):
    """The KV cache manager as the engine sees it: block tables handed out in whole blocks.

    A request's progress lives on the request (`request.num_computed_tokens`, advanced by the
    scheduler after each step), not in the manager: the manager only keeps block tables.
    """

    # Tokens per block.
    block_size: int
    # Physical blocks in the cache (the engine sizes its K/V tensors from it).
    num_blocks: int

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any request."""
        ...

    def get_computed_blocks(self, request: RequestLike) -> tuple[Sequence[Any], int]:
        """Prefix-cache hits for a new request: (blocks, num_cached_tokens).

        A manager without prefix caching returns `([], 0)`: no hits, every prompt is computed.
        """
        ...

    def allocate_slots(
        self, request: RequestLike, num_new_tokens: int, new_computed_blocks: Sequence[Any] | None = None
    ) -> Sequence[Any] | None:
        """Make the request's block table cover `request.num_computed_tokens + num_new_tokens` tokens.

        One call serves a whole prompt, a prompt chunk or one decode token. Returns the blocks it
        took from the pool (possibly none), or None when they do not fit, changing nothing.
        """
        ...

    def free(self, request: RequestLike) -> None:
        """Give back every block of the request (it finished, or it is preempted)."""
        ...

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table: physical block ids in logical order (empty if unknown)."""
        ...


# Every member a manager must have; the engine names the missing ones when one is absent.
REQUIRED_MEMBERS = (
    "block_size",
    "num_blocks",
    "num_free_blocks",
    "get_computed_blocks",
    "allocate_slots",
    "free",
    "get_block_ids",
)


def missing_members(manager: object) -> list[str]:
    """Names of `KVCacheManagerInterface` members that `manager` (an instance) lacks."""
    return [name for name in REQUIRED_MEMBERS if not hasattr(manager, name)]
