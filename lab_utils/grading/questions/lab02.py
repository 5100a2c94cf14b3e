"""Lab 02 — KV cache and PagedAttention: graded questions.

The block-manager checks pin exact physical block ids on small traces. The rules that make ids
predictable are stated in the notebook: blocks leave from the front of the free queue, a freed
request's blocks rejoin at the back last block first, and a copy-on-write copy is the next block
from the front.
"""

from __future__ import annotations

from lab_utils.grading.registry import question


def _ids(value) -> list[int] | None:
    return None if value is None else [int(x) for x in value]


@question("02.contiguous_waste", points=2, answers=["contiguous_waste"])
def _(contiguous_waste):
    """Fraction of a contiguous allocator's reserved slots that never hold a token."""
    from lab_utils.kv import WorkloadRequest

    one = [WorkloadRequest("a", 0, 10, 30, 90)]                  # slab 100, 60 never used
    got = float(contiguous_waste(one))
    assert abs(got - 0.6) < 1e-9, "a slab is prompt_len + max_tokens; which of those slots never fill?"
    three = [WorkloadRequest("a", 0, 10, 30, 90), WorkloadRequest("b", 2, 50, 90, 90),
             WorkloadRequest("c", 5, 20, 1, 90)]
    got = float(contiguous_waste(three))
    assert abs(got - (60 + 0 + 89) / (100 + 140 + 110)) < 1e-9, \
        "sum the never-used slots over all requests, then divide by all reserved slots"


def _trace_allocate(cls):
    m = cls(8, 4)
    first = _ids(m.allocate("a", 10))
    second = _ids(m.allocate("b", 4))
    return m, first, second


@question("02.allocate", points=2, answers=["PagedBlockManager"])
def _(PagedBlockManager):
    """allocate: ceil(tokens / block_size) blocks from the front of the free queue, or None."""
    m, first, second = _trace_allocate(PagedBlockManager)
    assert first == [0, 1, 2], "10 tokens at 4 per block need 3 blocks, taken from the queue's front"
    assert second == [3], "a 4-token prompt fills exactly one block"
    assert _ids(m.block_tables["a"]) == [0, 1, 2] and _ids(m.block_tables["b"]) == [3]
    assert int(m.num_free_blocks) == 4
    assert [int(m.ref_cnt[b]) for b in range(5)] == [1, 1, 1, 1, 0], "each taken block gets ref_cnt 1"
    assert m.allocate("c", 17) is None, "17 tokens need 5 blocks; only 4 are free"
    assert int(m.num_free_blocks) == 4 and "c" not in m.block_tables, "a failed allocate changes nothing"


@question("02.append", points=2, answers=["PagedBlockManager"])
def _(PagedBlockManager):
    """append: a new block only when the last one is full; None when none is free."""
    m = PagedBlockManager(3, 4)
    assert _ids(m.allocate("a", 3)) == [0]
    assert _ids(m.append("a")) == [], "token 4 still fits in block 0"
    assert _ids(m.append("a")) == [1], "token 5 starts a new block"
    assert _ids(m.block_tables["a"]) == [0, 1] and int(m.num_tokens["a"]) == 5
    assert _ids(m.allocate("b", 4)) == [2]
    for _ in range(3):
        assert _ids(m.append("a")) == []
    assert m.append("a") is None, "the 9th token needs a 4th block and the cache has 3"
    assert int(m.num_tokens["a"]) == 8 and _ids(m.block_tables["a"]) == [0, 1], \
        "an append that does not fit must leave the request unchanged"


@question("02.free", points=2, answers=["PagedBlockManager"])
def _(PagedBlockManager):
    """free: blocks rejoin the back of the queue, last block first, and are reused in that order."""
    m = PagedBlockManager(6, 2)
    m.allocate("a", 5)          # 0 1 2
    m.allocate("b", 2)          # 3
    m.free("a")
    assert _ids(m.free_queue) == [4, 5, 2, 1, 0], "freed blocks go to the back, the request's last block first"
    assert "a" not in m.block_tables and int(m.num_free_blocks) == 5
    assert _ids(m.allocate("c", 7)) == [4, 5, 2, 1], "new blocks come from the front of the queue"
    m.free("b")
    m.free("c")
    assert int(m.num_free_blocks) == 6 and all(int(r) == 0 for r in m.ref_cnt)


@question("02.prefix_lookup", points=3, answers=["cached_prefix_blocks"])
def _(cached_prefix_blocks):
    """Prefix-cache lookup: chained hashes of whole blocks, stop at the first miss, never the last token."""
    from lab_utils.kv import KVCacheManager, Request

    kv = KVCacheManager(num_blocks=10, block_size=4)
    system = [11, 12, 13, 14, 15, 16, 17, 18]
    for rid, tail in (("x", [90, 91, 92, 93, 1]), ("y", [5])):
        req = Request(rid, system + tail)
        hits, n = kv.get_computed_blocks(req)
        kv.allocate_slots(req, req.num_tokens - n, hits)
    # x: blocks 0 1 (system) 2 (90..93) 3 (partial); y: hits 0 1, then block 4 (partial)
    cached = {h: b.block_id for h, b in kv.block_pool.cached_block_hash_to_block.items()}

    def ask(tokens):
        return _ids(cached_prefix_blocks(list(tokens), 4, dict(cached)))

    assert ask(system + [90, 91, 92, 93, 7]) == [0, 1, 2], "all three full blocks of this prompt are cached"
    assert ask(system + [2, 3]) == [0, 1], "the shared system prompt is two blocks"
    assert ask(system) == [0], "never reuse the block holding the prompt's last token: the model must run on it"
    assert ask([90, 91, 92, 93, 1, 2, 3, 4, 5]) == [], "a block matches only with the same tokens before it (chain the hashes)"
    assert ask([11, 12, 13, 14, 0, 0, 0, 0, 90, 91, 92, 93, 1]) == [0], "stop at the first miss"
    assert ask([1, 2]) == [], "a prompt shorter than a block has no full block to look up"


@question("02.fork_cow", points=3, answers=["ForkingBlockManager"])
def _(ForkingBlockManager):
    """fork shares every block; the first append into a shared partial block copies it (copy-on-write)."""
    m = ForkingBlockManager(8, 4)
    assert _ids(m.allocate("a", 6)) == [0, 1]
    m.fork("a", "a.1")
    assert _ids(m.block_tables["a.1"]) == [0, 1], "the child starts with the parent's block table"
    assert [int(m.ref_cnt[b]) for b in (0, 1)] == [2, 2], "fork adds one reference per shared block"
    assert int(m.num_free_blocks) == 6, "fork copies no memory"
    assert _ids(m.append("a")) == [2], "a writes into shared block 1: copy it to the next free block"
    assert [(int(s), int(d)) for s, d in m.copies] == [(1, 2)], "record the copy as (source, destination)"
    assert _ids(m.block_tables["a"]) == [0, 2] and _ids(m.block_tables["a.1"]) == [0, 1]
    assert _ids(m.append("a.1")) == [], "block 1 is the child's alone now: write in place"
    assert [int(m.ref_cnt[b]) for b in (0, 1, 2)] == [2, 1, 1]
    assert _ids(m.append("a")) == [] and _ids(m.append("a")) == [3]
    assert len(m.copies) == 1, "a full shared block is never written, so it is never copied"
    m.free("a")
    m.free("a.1")
    assert int(m.num_free_blocks) == 8 and all(int(r) == 0 for r in m.ref_cnt)


@question("02.max_concurrent", points=2, answers=["max_concurrent"])
def _(max_concurrent):
    """Requests that fit at once in one KV budget: contiguous slabs vs paged blocks."""
    got = tuple(int(x) for x in max_concurrent(100, 50, 500, 6000, 16))
    assert got[0] == 10, "a contiguous slab is prompt_len + max_tokens slots"
    assert got[1] == 37, "paged: whole blocks per request (round up), whole requests per cache (round down)"
    assert tuple(int(x) for x in max_concurrent(1, 1, 1, 16, 16)) == (8, 1)


@question("02.vllm_hits", points=1, answers=["predicted_prefix_hits"])
def _(predicted_prefix_hits):
    """Prefix-cache hit tokens vLLM should report for N requests sharing a prefix (128-token blocks)."""
    assert int(predicted_prefix_hits(300, 4, 128)) == 3 * 256, \
        "the first request computes everything; each later one reuses whole blocks of the shared part"
    assert int(predicted_prefix_hits(127, 5, 128)) == 0, "a prefix shorter than one block is never reused"
    assert int(predicted_prefix_hits(256, 2, 16)) == 256
