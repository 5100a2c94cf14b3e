"""The paged KV cache manager: block tables (allocate_slots, free), prefix caching, fork + CoW.

Follows vLLM v1's `KVCacheManager` (vllm/v1/core/kv_cache_manager.py) for one attention type,
plus the fork/copy-on-write that vLLM v0's block manager used for parallel sampling. The members
the engine calls are the Protocol in interface.py; a learner's manager with them plugs in too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lab_utils.mathutils import cdiv

from .block_pool import BlockHash, BlockPool, KVCacheBlock, hash_block_tokens


class RequestLike(Protocol):
    """What the manager reads from a request (lab_utils.kv.Request, the simulator's, the engine's)."""

    request_id: str
    num_computed_tokens: int

    @property
    def all_token_ids(self) -> Sequence[int]: ...


class KVCacheManager:
    """Hands out fixed-size KV blocks to requests and keeps each request's block table.

    Args:
        num_blocks: physical blocks in the cache (the KV budget divided by the block size).
        block_size: tokens per block (vLLM: 16 on GPU, 128 on CPU).
        enable_caching: automatic prefix caching; turn it off when token ids are placeholders
            (a simulator that gives every request the same dummy ids would otherwise "hit").
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if int(block_size) < 1:
            raise ValueError(f"block_size must be at least 1 token, got {block_size}")
        self.block_size = int(block_size)
        self.enable_caching = bool(enable_caching)
        self.block_pool = BlockPool(num_blocks, enable_caching)
        # request_id -> its block table: logical block i lives in physical block req_to_blocks[id][i].
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request_id -> chained hashes of its full blocks, extended as the request grows.
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        # request_id -> how many of its blocks are registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        # Copy-on-write work for the model runner: (src_block_id, dst_block_id) pairs.
        self.pending_copies: list[tuple[int, int]] = []
        # Prefix-cache counters, in tokens (as vLLM's prefix_cache_queries/hits_total).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ------------------------------------------------------------------ state
    @property
    def num_blocks(self) -> int:
        """Physical blocks in the cache."""
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (cached free blocks included)."""
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vLLM's `vllm:kv_cache_usage_perc`)."""
        return self.block_pool.get_usage()

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached tokens ÷ tokens looked up, 0 before any lookup."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as physical block ids (empty for an unknown request)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def block_table(self, request_id: str) -> list[int]:
        """Alias of get_block_ids."""
        return self.get_block_ids(request_id)

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """The request's blocks (a copy of the list; the blocks themselves are live)."""
        return list(self.req_to_blocks.get(request_id, []))

    def pop_pending_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write copies to perform before the next forward pass: (src, dst) block ids."""
        out, self.pending_copies = self.pending_copies, []
        return out

    # ------------------------------------------------------------------ hashing
    def _block_hashes(self, request: RequestLike) -> list[BlockHash]:
        """Chained hashes of the request's full blocks, computed once and extended as it grows."""
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        bs = self.block_size
        while (len(hashes) + 1) * bs <= len(tokens):
            start = len(hashes) * bs
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, tokens[start : start + bs]))
        return hashes

    # ------------------------------------------------------------------ prefix cache
    def get_computed_blocks(self, request: RequestLike) -> tuple[list[KVCacheBlock], int]:
        """Longest run of the request's leading full blocks already in the cache.

        Returns (blocks, num_cached_tokens). Whole blocks only, and never the prompt's last token:
        the model must run on at least one token to produce the next token's logits, so a prompt
        of exactly 2 blocks can hit at most 1.
        """
        if not self.enable_caching:
            return [], 0
        if request.request_id not in self.req_to_blocks:
            # a request holding no blocks starts afresh (an id may come back with other tokens)
            self.req_to_block_hashes.pop(request.request_id, None)
        num_tokens = len(request.all_token_ids)
        max_hit_blocks = (num_tokens - 1) // self.block_size if num_tokens else 0
        hits: list[KVCacheBlock] = []
        for block_hash in self._block_hashes(request)[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        num_cached_tokens = len(hits) * self.block_size
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_cached_tokens
        return hits, num_cached_tokens

    # ------------------------------------------------------------------ allocate / append
    def allocate_slots(
        self, request: RequestLike, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None
    ) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens of `request`; the same call prefills and appends.

        Block layout of a request after the call (block_size 4, `|` = block edge):

            | computed (old) | new_computed (cache hits) |  new tokens ...  |
            | c c c c | c c  | h h h h | h h h h         | n n n n | n .    |
                                          └ num_computed_tokens + num_new_tokens ┘

        The request's own progress is `request.num_computed_tokens` (plus the hit blocks, for a
        new request). A shared last block that is only partly full is written to by this call,
        so it is copied first (copy-on-write); the copy is recorded in `pending_copies`.

        Returns:
            the blocks newly taken from the pool (fresh ones and copy-on-write copies), or None
            when they do not fit, in which case nothing changed.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        new_computed_blocks = list(new_computed_blocks or [])
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id, [])
        if new_computed_blocks and req_blocks:
            raise ValueError(f"request {req_id} already has blocks; cache hits only apply to new requests")
        bs = self.block_size
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * bs
        num_required = cdiv(num_computed + num_new_tokens, bs)
        num_new_blocks = max(0, num_required - len(req_blocks) - len(new_computed_blocks))

        # Blocks this call writes into that other block tables also hold: copy them first.
        first_written = num_computed // bs
        cow_index = (
            [i for i in range(first_written, min(len(req_blocks), num_required)) if req_blocks[i].ref_cnt > 1]
            if num_new_tokens > 0
            else []
        )

        # Hits that sit in the free queue stop being free once touched.
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks + len(cow_index) > self.num_free_blocks - num_revived:
            return None

        self.block_pool.touch(new_computed_blocks)
        req_blocks = self.req_to_blocks.setdefault(req_id, [])
        req_blocks.extend(new_computed_blocks)
        taken: list[KVCacheBlock] = []
        for i in cow_index:
            (copy,) = self.block_pool.get_new_blocks(1)
            old = req_blocks[i]
            self.pending_copies.append((old.block_id, copy.block_id))
            self.block_pool.free_blocks([old])  # ref_cnt > 1, so it stays in use by the others
            req_blocks[i] = copy
            taken.append(copy)
        fresh = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(fresh)
        taken.extend(fresh)

        # Register the blocks that are full once this step's tokens are computed. Like vLLM we do
        # it now: the engine computes them in this very step, before anyone can read them.
        num_tokens_to_cache = min(num_computed + num_new_tokens, len(request.all_token_ids))
        self.cache_blocks(request, num_tokens_to_cache)
        return taken

    def cache_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """Register the request's blocks that are full within its first `num_computed_tokens` tokens."""
        if not self.enable_caching:
            return
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id, [])
        num_full = min(num_computed_tokens // self.block_size, len(blocks))
        num_cached = self.num_cached_block.get(req_id, 0)
        if num_full <= num_cached:
            return
        hashes = self._block_hashes(request)
        num_full = min(num_full, len(hashes))
        self.block_pool.cache_full_blocks(blocks, hashes, num_cached, num_full)
        self.num_cached_block[req_id] = max(num_cached, num_full)

    def cache_full_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """Alias of cache_blocks, named after vLLM's BlockPool.cache_full_blocks."""
        self.cache_blocks(request, num_computed_tokens)

    # ------------------------------------------------------------------ free / fork
    def free(self, request: RequestLike) -> None:
        """Return the request's blocks to the pool, tail first (tail blocks are evicted first)."""
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.req_to_block_hashes.pop(req_id, None)
        self.num_cached_block.pop(req_id, None)

    def fork(self, parent_request: RequestLike, child_request: RequestLike) -> None:
        """Give the child the parent's block table; every block gains one reference.

        No memory is copied now. The first time either request writes into a shared, partly full
        last block, `allocate_slots` copies that one block (copy-on-write).
        """
        parent_id, child_id = parent_request.request_id, child_request.request_id
        if parent_id not in self.req_to_blocks:
            raise ValueError(f"cannot fork {parent_id!r}: it holds no blocks")
        if child_id in self.req_to_blocks:
            raise ValueError(f"cannot fork into {child_id!r}: it already holds blocks")
        blocks = list(self.req_to_blocks[parent_id])
        self.block_pool.touch(blocks)
        self.req_to_blocks[child_id] = blocks
        self.req_to_block_hashes[child_id] = list(self.req_to_block_hashes.get(parent_id, []))
        self.num_cached_block[child_id] = self.num_cached_block.get(parent_id, 0)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash (only when no request holds blocks); True when done."""
        return self.block_pool.reset_prefix_cache()
