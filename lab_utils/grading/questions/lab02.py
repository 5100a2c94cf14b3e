"""Lab 02 — KV cache and PagedAttention: graded questions.

Public checks run one or two small fixed cases and a few properties. Hidden checks (the grader's)
replay random operation sequences against the course's own manager (`lab_utils.kv.KVCacheManager`,
prefix caching off), and recompute value answers from the scenario drawn from the notebook's SEED.
The learner's manager speaks the engine's interface (`lab_utils.kv.interface`: `allocate_slots`,
`free`, `get_block_ids`, ...), so lab 04 serves the course model with it. The block-id rules it
must follow are stated in the notebook: blocks leave from the front of the free queue, a freed
request's blocks rejoin at the back last block first, and a copy-on-write copy is the next block
from the front.
"""

from __future__ import annotations

import math

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario


@scenario("02")
def _(rng):
    """Block size, a shared system prompt and its users (prefix caching), and a request mix."""
    block_size = rng.choice([4, 8, 16])
    num_users = rng.randint(3, 8)
    return {
        "block_size": block_size,
        "system_prompt_tokens": rng.randint(2 * block_size, 6 * block_size),
        # a user may send nothing after the system prompt (0 tokens: a client that opens a session)
        "user_tokens": [rng.choice([0, rng.randint(1, 2 * block_size)]) for _ in range(num_users)],
        "prompt_len": rng.randint(20, 300),
        "output_len": rng.randint(10, 200),
        "max_tokens": rng.choice([256, 512, 1024, 2048]),
        "capacity_tokens": rng.choice([4096, 8192, 16384, 32768]),
    }


def _ids(value) -> list[int] | None:
    return None if value is None else [int(x) for x in value]


# --- the engine's interface, replayed against the course's own manager --------------------------


# --- 02.contiguous_waste ---------------------------------------------------------------------


@question(
    "02.contiguous_waste",
    points=2,
    answers=["contiguous_waste"],  # the reference is the grader's alone (issue 47 item 2)
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


# --- 02.allocate / 02.append / 02.free: the engine's interface, vLLM v1 names ------------------


def _step(m, req, n: int):
    """allocate_slots, then (as the engine's step) the n tokens count as computed on success."""
    got = m.allocate_slots(req, n)
    if got is not None:
        req.num_computed_tokens += n
    return None if got is None else _ids(got)


@question("02.allocate", points=2, answers=["MyKVCacheManager"], forbid=refs("kv_manager"))
def _(MyKVCacheManager):
    """allocate_slots for a new prompt: whole blocks from the front of the free queue, or None."""
    from lab_utils.kv import Request

    m = MyKVCacheManager(8, 4)
    first, second = _step(m, Request("a", list(range(10))), 10), _step(m, Request("b", [7] * 4), 4)
    assert first == [0, 1, 2] and second == [3], (
        "a prompt gets just enough whole blocks for its tokens, taken in queue order"
    )
    assert _ids(m.get_block_ids("a")) == first and int(m.num_free_blocks) == 4
    assert [int(m.ref_cnt[b]) for b in range(5)] == [1, 1, 1, 1, 0], "a block a table holds has one reference"
    assert m.allocate_slots(Request("c", [1] * 17), 17) is None, "more blocks than are free: refuse"
    assert int(m.num_free_blocks) == 4 and _ids(m.get_block_ids("c")) == [], "a refused call changes nothing"


@question("02.append", points=2, answers=["MyKVCacheManager"], forbid=refs("kv_manager"))
def _(MyKVCacheManager):
    """allocate_slots for a running request: a new block only when its blocks are full; None if none is free."""
    from lab_utils.kv import Request

    m = MyKVCacheManager(2, 4)
    req = Request("a", [5, 6, 7])
    _step(m, req, 3)
    got = []
    for t in range(6):  # decode steps: the request brings one new token each time
        req.append_output(t)
        got.append(_step(m, req, 1))
    assert got[0] == [] and got[1] == [1], (
        "a token goes into the last block while it has room, else into a new one"
    )
    assert got[2:5] == [[], [], []], "a token goes into the last block while it has room"
    assert got[5] is None, "when a new block is needed and none is free, say so with None"
    assert _ids(m.get_block_ids("a")) == [0, 1] and int(m.num_free_blocks) == 0
    chunked = MyKVCacheManager(4, 4)  # a prompt of 10 in two chunks: the same call
    req = Request("p", list(range(10)))
    assert _step(chunked, req, 6) == [0, 1] and _step(chunked, req, 4) == [2], (
        "the blocks to hold are counted from the tokens already computed plus the new ones"
    )


@question("02.free", points=2, answers=["MyKVCacheManager"], forbid=refs("kv_manager"))
def _(MyKVCacheManager):
    """free: blocks rejoin the back of the queue, last block first, and are reused in that order."""
    from lab_utils.kv import Request

    m = MyKVCacheManager(6, 2)
    a, b = Request("a", list(range(5))), Request("b", [1, 2])
    _step(m, a, 5)
    _step(m, b, 2)
    m.free(a)
    assert _ids(m.get_block_ids("a")) == [] and int(m.num_free_blocks) == 5
    assert _ids(m.free_queue)[:2] == [4, 5], "freed blocks join the queue behind the never-used ones"
    assert _ids(m.free_queue) != [4, 5, 0, 1, 2], "in which order does a request give back its blocks?"
    m.free(b)
    assert int(m.num_free_blocks) == 6 and all(int(r) == 0 for r in m.ref_cnt)


# --- 02.prefix_lookup ----------------------------------------------------------------------------


def _cached_table(block_size: int, prompts: list[list[int]]) -> dict:
    from lab_utils.kv import KVCacheManager, Request

    kv = KVCacheManager(num_blocks=256, block_size=block_size)
    for i, tokens in enumerate(prompts):
        req = Request(f"p{i}", tokens)
        hits, n = kv.get_computed_blocks(req)
        kv.allocate_slots(req, req.num_tokens - n, hits)
    return {h: b.block_id for h, b in kv.block_pool.cached_block_hash_to_block.items()}


@question(
    "02.prefix_lookup",
    points=3,
    answers=["cached_prefix_blocks"],
    forbid=refs("prefix_lookup"),
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


# --- 02.fork_cow ---------------------------------------------------------------------------------


@question("02.fork_cow", points=3, answers=["ForkingKVCacheManager"], forbid=refs("kv_manager"))
def _(ForkingKVCacheManager):
    """fork shares every block; the first write into a shared partial block copies it (copy-on-write)."""
    from lab_utils.kv import Request

    m = ForkingKVCacheManager(8, 4)
    a = Request("a", list(range(6)))
    _step(m, a, 6)
    child = a.fork("a.1")
    m.fork(a, child)
    assert _ids(m.get_block_ids("a.1")) == _ids(m.get_block_ids("a")), (
        "the child starts with the parent's table"
    )
    assert int(m.num_free_blocks) == 6, "a fork copies no memory"
    a.append_output(1)
    new = _step(m, a, 1)
    assert new is not None and len(new) == 1 and len(m.pending_copies) == 1, (
        "writing into a block someone else also holds needs a copy first"
    )
    child.append_output(2)
    assert _step(m, child, 1) == [], "after the copy, the other sequence owns the original alone"
    m.free(a)
    m.free(child)
    assert int(m.num_free_blocks) == 8 and all(int(r) == 0 for r in m.ref_cnt), (
        "every reference is given back"
    )


# --- 02.max_concurrent ---------------------------------------------------------------------------


@question(
    "02.max_concurrent",
    points=2,
    answers=["max_concurrent"],
    forbid=refs("max_concurrent"),
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


# --- 02.prefix_saving (predict, then measure) ------------------------------------------------------


@question(
    "02.prefix_saving",
    points=2,
    answers=["predicted_blocks_saved"],
    predict=True,
    forbid=refs("kv_manager"),
)
def _(predicted_blocks_saved):
    """predicted_blocks_saved(scenario): KV blocks prefix caching saves when all the users run at once."""
    one = {"block_size": 4, "system_prompt_tokens": 9, "user_tokens": [3]}
    got = float(predicted_blocks_saved(dict(one)))
    assert math.isfinite(got) and got == int(got) and got == 0, (
        "a single user has nobody to share the system prompt with"
    )
    two = {"block_size": 4, "system_prompt_tokens": 9, "user_tokens": [3, 5, 2]}
    more = float(predicted_blocks_saved(dict(two)))
    assert more == int(more) and more > 0, "a whole number of blocks, and later users share something"


# --- 02.vllm_hits ----------------------------------------------------------------------------------


_BEFORE = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 256.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
"""


@question(
    "02.vllm_hits",
    points=2,
    answers=["predicted_prefix_hits", "prefix_cache_delta"],
    forbid=refs("prometheus_parsers"),
)
def _(predicted_prefix_hits, prefix_cache_delta):
    """Prefix-cache hit tokens vLLM should report for N requests sharing a prefix, sent one by one; and
    prefix_cache_delta(before, after): (hit tokens, queried tokens) between two /metrics scrapes."""
    assert int(predicted_prefix_hits(300, 1, 128)) == 0, "a single request has nobody to share with"
    assert int(predicted_prefix_hits(100, 5, 128)) == 0, "what is the smallest unit a prefix cache reuses?"
    same = [float(x) for x in prefix_cache_delta(_BEFORE, _BEFORE)]
    assert same == [0.0, 0.0], "(hits, queries): nothing happened between two equal scrapes"
    after = _BEFORE.replace("256.0", "512.0").replace("1000.0", "1600.0")
    hits, queries = (float(x) for x in prefix_cache_delta(_BEFORE, after))
    assert 0 < hits <= queries, "counters only grow, and a hit is a queried token that was found"


# --- 02.kv_quant_capacity (predict, then measure) ----------------------------------------------------


_GQA = {"num_layers": 4, "num_kv_heads": 2, "num_attention_heads": 8, "head_dim": 16}
_MLA = {"num_layers": 3, "num_kv_heads": 16, "num_attention_heads": 16, "kv_lora_rank": 32,
        "qk_rope_head_dim": 8}  # fmt: skip


def _capacity(kv_capacity, model: dict, dtype: str, budget: int, block_size: int) -> tuple[int, int]:
    got = tuple(kv_capacity(dict(model), dtype, budget, block_size))
    assert len(got) == 2, "return (bytes per token, number of blocks)"
    per_token, blocks = float(got[0]), float(got[1])
    assert per_token == int(per_token) and blocks == int(blocks), "bytes and blocks are whole numbers"
    return int(per_token), int(blocks)


@question(
    "02.kv_quant_capacity",
    points=3,
    answers=["kv_capacity"],
    predict=True,
    forbid=refs("kv_dtype_sizing"),
)
def _(kv_capacity):
    """kv_capacity(model, dtype, budget_bytes, block_size): (KV bytes per token with the
    dtype's scales, whole KV blocks that fit in the budget), for a GQA or an MLA model."""
    budget, bs = 1 << 20, 16
    half, full = (
        _capacity(kv_capacity, _GQA, "fp8_e4m3", budget, bs),
        _capacity(kv_capacity, _GQA, "bfloat16", budget, bs),
    )
    assert half[0] < full[0] and half[1] > full[1], "a one-byte element holds more tokens than a two-byte one"
    int8 = _capacity(kv_capacity, _GQA, "int8", budget, bs)
    assert int8[0] != half[0], "int8 and fp8 both store one byte per element: what else does int8 store?"
    for per_token, blocks in (half, full, int8):
        assert blocks * bs * per_token <= budget < (blocks + 1) * bs * per_token, (
            "whole blocks that fit in the budget, and one more would not"
        )
    mla = _capacity(kv_capacity, _MLA, "bfloat16", budget, bs)
    wide = _capacity(
        kv_capacity, dict(_MLA, num_kv_heads=128, num_attention_heads=128), "bfloat16", budget, bs
    )
    assert mla == wide, "an MLA layer caches one latent per token, whatever its number of heads"


# --- 02.stream_agreement ---------------------------------------------------------------------------


@question("02.stream_agreement", points=2, answers=["stream_agreement"], forbid=refs("accuracy_gate"))
def _(stream_agreement):
    """stream_agreement(pairs): (share of prompts whose candidate stream equals the baseline's, the
    first divergence of each pair: index of the first differing token, None when identical)."""
    pairs = [([5, 6, 7], [5, 6, 7]), ([5, 6, 7], [5, 9, 7])]
    share, first = stream_agreement([(list(a), list(b)) for a, b in pairs])
    first = [None if d is None else int(d) for d in first]
    assert abs(float(share) - 0.5) < 1e-12, "one of the two prompts came out the same"
    assert first == [None, 1], "None where the streams are identical, else where they first differ (from 0)"
    share, first = stream_agreement([([5, 6, 7, 8], [5, 6])])
    assert float(share) == 0.0 and list(first)[0] is not None, (
        "a candidate that stops early is not the same stream"
    )


# --- 02.kv_gate -------------------------------------------------------------------------------------


def _pairs(k: int, n: int) -> list[tuple[list[int], list[int]]]:
    return [([1, 2, 3], [1, 2, 3]) if i < k else ([1, 2, 3], [1, 2, 4]) for i in range(n)]


@question("02.kv_gate", points=3, answers=["ship_or_hold"], forbid=refs("accuracy_gate"))
def _(ship_or_hold):
    """ship_or_hold(pairs, min_agreement, confidence): "ship" when the exact (Clopper-Pearson)
    interval's lower end of the identical-stream share reaches min_agreement, else "hold"."""
    got = str(ship_or_hold(_pairs(10, 10), 0.5, 0.95))
    assert got in ("ship", "hold"), 'the answer is "ship" or "hold"'
    assert got == "ship", "ten identical prompts out of ten are enough to show half of them agree"
    assert str(ship_or_hold(_pairs(9, 10), 0.85, 0.95)) == "hold", (
        "the point estimate clears the bound here; does the interval?"
    )
