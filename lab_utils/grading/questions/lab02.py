"""Lab 02 — KV cache and PagedAttention: graded questions.

Public checks run one or two small fixed cases and a few properties. Hidden checks (the grader's)
replay random operation sequences against the course's own block manager
(`lab_utils.kv.KVCacheManager`), and recompute value answers from the scenario drawn from the
notebook's SEED. The block-id rules a learner's manager must follow are stated in the notebook:
blocks leave from the front of the free queue, a freed request's blocks rejoin at the back last
block first, and a copy-on-write copy is the next block from the front.
"""

from __future__ import annotations

import math

from lab_utils.grading.registry import hidden, question, scenario

_KV = "lab_utils.kv.kv_cache_manager:KVCacheManager"
_POOL = "lab_utils.kv.block_pool:BlockPool"


@scenario("02")
def _(rng):
    """Block size, a shared system prompt and its users (prefix caching), and a request mix."""
    block_size = rng.choice([4, 8, 16])
    num_users = rng.randint(3, 8)
    return {
        "block_size": block_size,
        "system_prompt_tokens": rng.randint(2 * block_size, 6 * block_size),
        "user_tokens": [rng.randint(1, 2 * block_size) for _ in range(num_users)],
        "prompt_len": rng.randint(20, 300),
        "output_len": rng.randint(10, 200),
        "max_tokens": rng.choice([256, 512, 1024, 2048]),
        "capacity_tokens": rng.choice([4096, 8192, 16384, 32768]),
    }


def _ids(value) -> list[int] | None:
    return None if value is None else [int(x) for x in value]


def _fraction(passed: int, total: int, what: str) -> float | None:
    if passed == total:
        return None
    if passed == 0:
        raise AssertionError(f"wrong on all {total} unseen {what}")
    return passed / total


# --- a reference driver: the course's KVCacheManager behind the notebook's small API -----------


class _Reference:
    """lab_utils.kv.KVCacheManager (no prefix caching) with the notebook manager's methods."""

    def __init__(self, num_blocks: int, block_size: int):
        from lab_utils.kv import KVCacheManager

        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=False)
        self.reqs: dict = {}

    def allocate(self, rid: str, n: int):
        from lab_utils.kv import Request

        req = Request(rid, list(range(n)))
        got = self.kv.allocate_slots(req, n)
        if got is None:
            return None
        req.num_computed_tokens = n
        self.reqs[rid] = req
        return [b.block_id for b in got]

    def append(self, rid: str):
        req = self.reqs[rid]
        req.append_output(0)
        got = self.kv.allocate_slots(req, 1)
        if got is None:
            req.output_token_ids.pop()
            return None
        req.num_computed_tokens += 1
        return [b.block_id for b in got]

    def fork(self, parent: str, child: str) -> None:
        self.reqs[child] = self.reqs[parent].fork(child)
        self.kv.fork(self.reqs[parent], self.reqs[child])

    def free(self, rid: str) -> None:
        self.kv.free(self.reqs.pop(rid))

    def state(self) -> tuple:
        pool = self.kv.block_pool
        tables = {rid: list(self.kv.get_block_ids(rid)) for rid in self.reqs}
        return (
            tables,
            {rid: r.num_tokens for rid, r in self.reqs.items()},
            pool.free_block_queue.block_ids(),
            [b.ref_cnt for b in pool.blocks],
        )


def _learner_state(m, num_blocks: int) -> tuple:
    tables = {str(rid): _ids(t) for rid, t in dict(m.block_tables).items()}
    tokens = {str(rid): int(n) for rid, n in dict(m.num_tokens).items()}
    return tables, tokens, _ids(list(m.free_queue)), [int(m.ref_cnt[b]) for b in range(num_blocks)]


def _random_ops(rng, kinds: tuple[str, ...], num_ops: int) -> list[tuple]:
    """A random operation script; ids are resolved against the live requests when replayed."""
    return [(rng.choice(kinds), rng.randint(1, 23), rng.random()) for _ in range(num_ops)]


def _replay(cls, rng, kinds: tuple[str, ...], num_traces: int = 12) -> float | None:
    passed = 0
    for _ in range(num_traces):
        num_blocks, block_size = rng.randint(4, 12), rng.choice([2, 3, 4, 5, 8])
        ref, mine = _Reference(num_blocks, block_size), cls(num_blocks, block_size)
        script = _random_ops(rng, kinds, rng.randint(8, 30))
        ok, counter = True, 0
        for kind, n, pick in script:
            live = sorted(ref.reqs)
            if kind != "allocate" and not live:
                kind = "allocate"
            if kind == "allocate":
                rid = f"r{counter}"
                counter += 1
                want, got = ref.allocate(rid, n), mine.allocate(rid, n)
                if want is None:
                    ref.reqs.pop(rid, None)
            elif kind == "append":
                rid = live[int(pick * len(live))]
                want, got = ref.append(rid), mine.append(rid)
            elif kind == "fork":
                rid = live[int(pick * len(live))]
                child = f"r{counter}"
                counter += 1
                want, got = ref.fork(rid, child), mine.fork(rid, child)
                want = got = None
            else:
                rid = live[int(pick * len(live))]
                want, got = ref.free(rid), mine.free(rid)
                want = got = None
            if _ids(got) != want or _learner_state(mine, num_blocks) != ref.state():
                ok = False
                break
        passed += ok
    return _fraction(passed, num_traces, "operation sequences")


# --- 02.contiguous_waste ---------------------------------------------------------------------


@question(
    "02.contiguous_waste",
    points=2,
    answers=["contiguous_waste"],
    forbid=["lab_utils.kv.workload:never_used_fraction"],
)
def _(contiguous_waste):
    """Fraction of a contiguous allocator's reserved slots that never hold a token."""
    from lab_utils.kv import WorkloadRequest

    full = [WorkloadRequest("a", 0, 10, 90, 90)]
    assert abs(float(contiguous_waste(full))) < 1e-9, (
        "a request that uses its whole reservation wastes nothing"
    )
    two = [WorkloadRequest("a", 0, 10, 30, 90), WorkloadRequest("b", 2, 50, 5, 90)]
    got = float(contiguous_waste(two))
    assert 0 < got < 1, "a fraction of the reserved slots: between 0 and 1"
    assert abs(got - float(contiguous_waste(list(reversed(two))))) < 1e-12, (
        "the order of requests does not matter"
    )


@hidden("02.contiguous_waste")
def _(contiguous_waste, rng, scenario):
    from lab_utils.kv import make_workload
    from lab_utils.kv.workload import never_used_fraction

    passed = 0
    for _ in range(10):
        wl = make_workload(
            rng.randint(1, 40),
            seed=rng.randint(0, 10**6),
            max_tokens=rng.choice([64, 256, 1024]),
            mean_output_len=rng.choice([5, 40, 200]),
        )
        passed += math.isclose(
            float(contiguous_waste(wl)), never_used_fraction(wl), rel_tol=1e-9, abs_tol=1e-12
        )
    return _fraction(passed, 10, "workloads")


# --- 02.allocate / 02.append / 02.free ---------------------------------------------------------


@question("02.allocate", points=2, answers=["PagedBlockManager"], forbid=[_KV, _POOL])
def _(PagedBlockManager):
    """allocate: whole blocks from the front of the free queue, or None and no change."""
    m = PagedBlockManager(8, 4)
    first, second = _ids(m.allocate("a", 10)), _ids(m.allocate("b", 4))
    assert first == [0, 1, 2] and second == [3], (
        "a request gets just enough whole blocks for its tokens, taken in queue order"
    )
    assert _ids(m.block_tables["a"]) == first and int(m.num_free_blocks) == 4
    assert [int(m.ref_cnt[b]) for b in range(5)] == [1, 1, 1, 1, 0], "a block a table holds has one reference"
    assert m.allocate("c", 17) is None, "more blocks than are free: refuse"
    assert int(m.num_free_blocks) == 4 and "c" not in m.block_tables, "a refused allocate changes nothing"


@hidden("02.allocate")
def _(PagedBlockManager, rng, scenario):
    return _replay(PagedBlockManager, rng, ("allocate",))


@question("02.append", points=2, answers=["PagedBlockManager"], forbid=[_KV, _POOL])
def _(PagedBlockManager):
    """append: a new block only when the last one is full; None when none is free."""
    m = PagedBlockManager(2, 4)
    m.allocate("a", 3)
    got = [_ids(m.append("a")) for _ in range(6)]
    assert got[0] == [] and got[1] == [1], (
        "a token goes into the last block while it has room, else into a new one"
    )
    assert got[2:5] == [[], [], []], "a token goes into the last block while it has room"
    assert got[5] is None, "when a new block is needed and none is free, say so with None"
    assert int(m.num_tokens["a"]) == 8 and _ids(m.block_tables["a"]) == [0, 1], (
        "an append that does not fit must leave the request unchanged"
    )


@hidden("02.append")
def _(PagedBlockManager, rng, scenario):
    return _replay(PagedBlockManager, rng, ("allocate", "append", "append", "append"))


@question("02.free", points=2, answers=["PagedBlockManager"], forbid=[_KV, _POOL])
def _(PagedBlockManager):
    """free: blocks rejoin the back of the queue, last block first, and are reused in that order."""
    m = PagedBlockManager(6, 2)
    m.allocate("a", 5)
    m.allocate("b", 2)
    m.free("a")
    assert "a" not in m.block_tables and int(m.num_free_blocks) == 5
    assert _ids(m.free_queue)[:2] == [4, 5], "freed blocks join the queue behind the never-used ones"
    assert _ids(m.free_queue) != [4, 5, 0, 1, 2], "in which order does a request give back its blocks?"
    m.free("b")
    assert int(m.num_free_blocks) == 6 and all(int(r) == 0 for r in m.ref_cnt)


@hidden("02.free")
def _(PagedBlockManager, rng, scenario):
    return _replay(PagedBlockManager, rng, ("allocate", "allocate", "append", "append", "free"))


# --- 02.prefix_lookup ----------------------------------------------------------------------------


def _cached_table(block_size: int, prompts: list[list[int]]) -> dict:
    from lab_utils.kv import KVCacheManager, Request

    kv = KVCacheManager(num_blocks=256, block_size=block_size)
    for i, tokens in enumerate(prompts):
        req = Request(f"p{i}", tokens)
        hits, n = kv.get_computed_blocks(req)
        kv.allocate_slots(req, req.num_tokens - n, hits)
    return {h: b.block_id for h, b in kv.block_pool.cached_block_hash_to_block.items()}


def _reference_lookup(tokens: list[int], block_size: int, cached: dict) -> list[int]:
    from lab_utils.kv import KVCacheManager, Request

    kv = KVCacheManager(num_blocks=1, block_size=block_size)
    for h, block_id in cached.items():  # only the lookup is used: point the index at stand-in blocks
        from lab_utils.kv import KVCacheBlock

        kv.block_pool.cached_block_hash_to_block[h] = KVCacheBlock(block_id)
    hits, _ = kv.get_computed_blocks(Request("q", tokens))
    return [b.block_id for b in hits]


@question(
    "02.prefix_lookup",
    points=3,
    answers=["cached_prefix_blocks"],
    forbid=[
        "lab_utils.kv.kv_cache_manager:KVCacheManager.get_computed_blocks",
        "lab_utils.kv.block_pool:hash_request_blocks",
    ],
)
def _(cached_prefix_blocks):
    """Prefix-cache lookup: chained hashes of whole blocks, stop at the first miss, never the last token."""
    system = [11, 12, 13, 14, 15, 16, 17, 18]
    cached = _cached_table(4, [system + [90, 91, 92, 93, 1]])

    def ask(tokens):
        return _ids(cached_prefix_blocks(list(tokens), 4, dict(cached)))

    assert ask(system + [90, 91, 92, 93, 7]) == [0, 1, 2], (
        "every full block of this prompt was computed before"
    )
    assert ask(system) != [0, 1], "the model must still run on the prompt's last token"
    assert ask([90, 91, 92, 93, 1, 2, 3, 4, 5]) == [], (
        "equal tokens in another position are not the same block"
    )


@hidden("02.prefix_lookup")
def _(cached_prefix_blocks, rng, scenario):
    passed, total = 0, 20
    for _ in range(total):
        bs = rng.choice([2, 3, 4, 8])
        vocab = rng.choice([3, 50])  # a tiny vocabulary makes equal blocks at other positions likely
        base = [rng.randrange(vocab) for _ in range(bs * rng.randint(1, 6))]
        prompts = [
            base[: rng.randint(1, len(base))] + [rng.randrange(vocab) for _ in range(rng.randint(1, 2 * bs))]
            for _ in range(rng.randint(1, 4))
        ]
        cached = _cached_table(bs, prompts)
        query = base[: rng.randint(0, len(base))] + [
            rng.randrange(vocab) for _ in range(rng.randint(0, 2 * bs))
        ]
        if not query:
            query = [0]
        want = _reference_lookup(query, bs, cached)
        passed += _ids(cached_prefix_blocks(list(query), bs, dict(cached))) == want
    return _fraction(passed, total, "prompts")


# --- 02.fork_cow ---------------------------------------------------------------------------------


@question("02.fork_cow", points=3, answers=["ForkingBlockManager"], forbid=[_KV, _POOL])
def _(ForkingBlockManager):
    """fork shares every block; the first append into a shared partial block copies it (copy-on-write)."""
    m = ForkingBlockManager(8, 4)
    m.allocate("a", 6)
    m.fork("a", "a.1")
    assert _ids(m.block_tables["a.1"]) == _ids(m.block_tables["a"]), (
        "the child starts with the parent's table"
    )
    assert int(m.num_free_blocks) == 6, "a fork copies no memory"
    new = _ids(m.append("a"))
    assert len(new) == 1 and len(m.copies) == 1, (
        "writing into a block someone else also holds needs a copy first"
    )
    assert _ids(m.append("a.1")) == [], "after the copy, the other sequence owns the original alone"
    m.free("a")
    m.free("a.1")
    assert int(m.num_free_blocks) == 8 and all(int(r) == 0 for r in m.ref_cnt), (
        "every reference is given back"
    )


@hidden("02.fork_cow")
def _(ForkingBlockManager, rng, scenario):
    result = _replay(ForkingBlockManager, rng, ("allocate", "append", "append", "append", "fork", "free"))
    m = ForkingBlockManager(8, 4)  # the copies are recorded too, in order
    ref = _Reference(8, 4)
    for obj in (m, ref):
        obj.allocate("a", 6)
        obj.fork("a", "b")
        obj.append("a")
        obj.fork("b", "c")
        obj.append("c")
    assert [(int(s), int(d)) for s, d in m.copies] == ref.kv.pop_pending_copies(), (
        "the list of copies (source, destination) is not right on an unseen trace"
    )
    return result


# --- 02.max_concurrent ---------------------------------------------------------------------------


@question(
    "02.max_concurrent",
    points=2,
    answers=["max_concurrent"],
    forbid=["lab_utils.kv.workload:max_concurrent_requests"],
)
def _(max_concurrent):
    """Requests that fit at once in one KV budget: contiguous slabs vs paged blocks."""
    got = tuple(int(x) for x in max_concurrent(100, 50, 500, 6000, 16))
    assert len(got) == 2 and got[0] < got[1], (
        "(contiguous, paged): paged should fit more when answers stop early"
    )
    assert tuple(int(x) for x in max_concurrent(1, 1, 1, 16, 16))[1] == 1, (
        "a paged request holds whole blocks, however few tokens it has"
    )


@hidden("02.max_concurrent")
def _(max_concurrent, rng, scenario):
    from lab_utils.kv.workload import max_concurrent_requests

    cases = [
        (
            scenario["prompt_len"],
            scenario["output_len"],
            scenario["max_tokens"],
            scenario["capacity_tokens"],
            scenario["block_size"],
        )
    ]
    for _ in range(15):
        out = rng.randint(1, 600)
        cases.append(
            (
                rng.randint(1, 600),
                out,
                out + rng.randint(0, 1500),
                rng.randint(256, 65536),
                rng.choice([1, 8, 16, 32, 128]),
            )
        )
    passed = 0
    for args in cases:
        want = max_concurrent_requests(*args)
        passed += tuple(int(x) for x in max_concurrent(*args)) == (want["contiguous"], want["paged"])
    return _fraction(passed, len(cases), "cases")


# --- 02.prefix_saving (predict, then measure) ------------------------------------------------------


def blocks_saved(scenario: dict) -> int:
    """The reference: KV blocks in use for all users at once without prefix caching, minus with it."""
    from lab_utils.kv import KVCacheManager, Request

    used = []
    system = list(range(1000, 1000 + scenario["system_prompt_tokens"]))
    for caching in (False, True):
        kv = KVCacheManager(num_blocks=4096, block_size=scenario["block_size"], enable_caching=caching)
        for i, n in enumerate(scenario["user_tokens"]):
            req = Request(f"u{i}", system + [10_000 * (i + 1) + t for t in range(n)])
            hits, cached = kv.get_computed_blocks(req)
            kv.allocate_slots(req, req.num_tokens - cached, hits)
        used.append(kv.num_blocks - kv.num_free_blocks)
    return used[0] - used[1]


@question("02.prefix_saving", points=2, answers=["PREDICTED_BLOCKS_SAVED"], predict=True)
def _(PREDICTED_BLOCKS_SAVED):
    """Predict the KV blocks prefix caching saves for the scenario's users (graded exactly: it is a count)."""
    got = float(PREDICTED_BLOCKS_SAVED)
    assert math.isfinite(got) and got == int(got) and got >= 0, (
        "a number of blocks: a whole number, not negative"
    )


@hidden("02.prefix_saving")
def _(PREDICTED_BLOCKS_SAVED, rng, scenario):
    assert int(PREDICTED_BLOCKS_SAVED) == blocks_saved(scenario), (
        "the prediction does not match the block pool for the grader's scenario"
    )


# --- 02.vllm_hits ----------------------------------------------------------------------------------


def _hits_by_manager(shared: int, num_requests: int, block_size: int) -> int:
    from lab_utils.kv import KVCacheManager, Request

    kv = KVCacheManager(num_blocks=4096, block_size=block_size)
    for i in range(num_requests):  # one after the other: each finishes before the next arrives
        req = Request(f"q{i}", list(range(shared)) + [50_000 + 97 * i + t for t in range(block_size + 3)])
        hits, cached = kv.get_computed_blocks(req)
        kv.allocate_slots(req, req.num_tokens - cached, hits)
        kv.free(req)
    return kv.prefix_cache_hits


@question("02.vllm_hits", points=1, answers=["predicted_prefix_hits"])
def _(predicted_prefix_hits):
    """Prefix-cache hit tokens vLLM should report for N requests sharing a prefix, sent one by one."""
    assert int(predicted_prefix_hits(300, 1, 128)) == 0, "a single request has nobody to share with"
    assert int(predicted_prefix_hits(100, 5, 128)) == 0, "what is the smallest unit a prefix cache reuses?"


@hidden("02.vllm_hits")
def _(predicted_prefix_hits, rng, scenario):
    cases = [(scenario["system_prompt_tokens"], len(scenario["user_tokens"]), scenario["block_size"])]
    cases += [(rng.randint(0, 700), rng.randint(1, 9), rng.choice([4, 16, 128])) for _ in range(12)]
    passed = sum(int(predicted_prefix_hits(*c)) == _hits_by_manager(*c) for c in cases)
    return _fraction(passed, len(cases), "cases")
