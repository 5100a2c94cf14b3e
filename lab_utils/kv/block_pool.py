"""Physical KV blocks, the free queue, and the pool that hands blocks out and caches full ones.

Names follow vLLM v1 (vllm/v1/core/block_pool.py, kv_cache_utils.py): `KVCacheBlock`, `ref_cnt`,
`block_hash`, `BlockPool.get_new_blocks`, `touch`, `free_blocks`, `cache_full_blocks`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# A block's hash: hex digest covering its tokens and, through the parent hash, every token before.
BlockHash = str


def hash_block_tokens(parent_block_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash of one full block, chained with its parent's hash so equal hashes mean equal prefixes.

    Two blocks holding the same 16 tokens at different places in different prompts must not
    match: the K/V of a token depends on every token before it. Chaining the parent's hash makes
    the hash of block i a fingerprint of tokens 0 .. (i+1)*block_size - 1.
    """
    h = hashlib.sha256()
    h.update((parent_block_hash or "root").encode())
    h.update(b"|")
    h.update(",".join(str(int(t)) for t in token_ids).encode())
    return h.hexdigest()[:16]


def hash_request_blocks(
    token_ids: Sequence[int], block_size: int, parent_block_hash: BlockHash | None = None
) -> list[BlockHash]:
    """Chained hashes of every full block of `token_ids` (a partial last block has none)."""
    hashes: list[BlockHash] = []
    parent = parent_block_hash
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


@dataclass(eq=False)
class KVCacheBlock:
    """One physical block: room for `block_size` tokens' keys and values in every layer."""

    # Index into the KV tensors; fixed for the block's life.
    block_id: int
    # How many requests' block tables hold this block (0 = free, possibly still cached).
    ref_cnt: int = 0
    # Set once the block is full and registered in the prefix cache; None otherwise.
    block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        tag = f", hash={self.block_hash[:6]}" if self.block_hash else ""
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}{tag})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: the front is taken first, freed blocks join the back.

    vLLM keeps a doubly linked list so a cached block can leave the middle of the queue in O(1)
    when a prefix-cache hit revives it; an OrderedDict keyed by block id does the same here.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.block_id in self._queue

    def popleft(self) -> KVCacheBlock:
        """Take the block at the front (the least recently freed)."""
        if not self._queue:
            raise ValueError("no free blocks left")
        return self._queue.popitem(last=False)[1]

    def remove(self, block: KVCacheBlock) -> None:
        """Take a block out of the middle (a cached free block that got a hit)."""
        del self._queue[block.block_id]

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the back (most recently freed: evicted last)."""
        self._queue[block.block_id] = block

    def block_ids(self) -> list[int]:
        """Block ids front to back."""
        return list(self._queue)


class BlockPool:
    """All physical blocks of the cache, the free queue, and the prefix-cache index.

    A block is in exactly one of two states: in use (ref_cnt > 0, on at least one block table) or
    free (ref_cnt == 0, in the free queue). A free block may still carry a hash: its K/V is valid,
    and a later request with the same prefix can take it back (`touch`) until the block is
    evicted, which happens when it reaches the front of the free queue and is reused.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if int(num_blocks) < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = int(num_blocks)
        self.enable_caching = bool(enable_caching)
        self.blocks = [KVCacheBlock(i) for i in range(self.num_blocks)]
        # Ids 0, 1, 2, ... come out first, so a fresh pool hands out predictable ids.
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        # Block ids of cached blocks that were evicted, oldest first (for tests and plots).
        self.evicted: list[int] = []

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue, cached ones included (they can be evicted on demand)."""
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        """Fraction of blocks in use, 0..1 (what vLLM reports as kv_cache_usage_perc)."""
        return 1.0 - self.get_num_free_blocks() / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The block registered under `block_hash`, in use or free, or None."""
        return self.cached_block_hash_to_block.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the front of the free queue, evicting cached ones."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"asked for {num_blocks} blocks, only {self.get_num_free_blocks()} free")
        out = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._maybe_evict(block)
            block.ref_cnt += 1
            out.append(block)
        return out

    def _maybe_evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        self.evicted.append(block.block_id)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add one reference to each block; a free (cached) block leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the back of the free queue.

        Pass them in the order they should be evicted: the manager frees a request's blocks
        tail first, because a prompt's last blocks are the least likely to be shared.
        """
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than it was taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if not self.enable_caching:
                    block.block_hash = None
                self.free_block_queue.append(block)

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under their hashes.

        When the same hash is already cached by another block (two requests computed the same
        prefix at once), the index keeps the first block; the new one still records its hash.
        """
        if not self.enable_caching:
            return
        for i in range(num_cached_blocks, num_full_blocks):
            block, block_hash = blocks[i], block_hashes[i]
            if block.block_hash is not None:
                continue  # a block taken from the cache is registered already
            block.block_hash = block_hash
            self.cached_block_hash_to_block.setdefault(block_hash, block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no block is in use."""
        if self.get_num_free_blocks() != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True
