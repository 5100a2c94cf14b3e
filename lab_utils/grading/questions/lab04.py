"""Lab 04 (the course engine): the runs of cache rows a token range takes in a paged cache, KV
capacity, a prediction of the blocks each request needs, your own scheduling policy on the real
engine's scheduler, a forced preemption, and throughput against max_num_seqs.

Every answer is a function. The measuring questions grade the analysis: the hidden checks make up
step logs (`EngineRun.steps`-shaped) from the engine's scheduler on fake tokens and call the
learner's function on them; the notebook applies the same function to its own measured runs.
"""

from __future__ import annotations

from lab_utils.grading.checks import inside
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario


@scenario("04")
def _(rng):
    """Three requests of random token ids for the block prediction and the forced preemption."""
    block_size = rng.choice([4, 8])
    # every request grows by at least one block, so a cache that admits all three must preempt
    return {
        "block_size": block_size,
        "prompt_lens": [rng.randint(6, 24) for _ in range(3)],
        "max_tokens": rng.randint(block_size + 1, block_size + 6),
        "token_seed": rng.randrange(1_000_000),
    }


# --- 04.slot_spans ------------------------------------------------------------------------------


# No forbid: no course function copies a token range out of the paged cache, so there is no
# reference to forbid; the model runner's per-token slot arithmetic is a part of the answer only.
@question("04.slot_spans", points=2, answers=["slot_spans"])
def _(slot_spans):
    """slot_spans(block_table, start, end, block_size): the contiguous runs of rows of the flat cache
    that hold token positions start..end-1 of a request, in position order, as (first row, rows)."""
    table, bs = [7, 2, 3, 9], 4
    spans = [(int(a), int(n)) for a, n in slot_spans(list(table), 2, 13, bs)]
    assert spans and all(n > 0 for _, n in spans), "a list of (first row, number of rows), none empty"
    assert sum(n for _, n in spans) == 11, "positions 2..12 are 11 tokens: 11 rows in all"
    rows = [a + i for a, n in spans for i in range(n)]
    owned = {b * bs + i for b in table for i in range(bs)}
    assert all(r in owned for r in rows), "every row lies in one of the request's physical blocks"
    assert len(set(rows)) == len(rows), "no row twice"
    assert 7 * bs <= rows[0] < 8 * bs, (
        "the first position lives in the block that logical block 0 maps to, past the rows it skips"
    )
    assert all(a + n != b for (a, n), (b, _) in zip(spans, spans[1:])), (
        "two runs where one ends at the row the next starts at are one copy, not two"
    )
    assert list(slot_spans(list(table), 5, 5, bs)) == [], "an empty range needs no copy"


# --- 04.kv_capacity_tokens ----------------------------------------------------------------------


@question(
    "04.kv_capacity_tokens",
    points=2,
    answers=["kv_capacity_tokens"],
    forbid=refs("kv_sizing", "engine_kv_sizing"),
)
def _(kv_capacity_tokens):
    """Tokens a paged KV cache holds for a model shape: whole blocks only."""
    a = int(kv_capacity_tokens(1.0, 16, 4, 30, 3, 64))
    b = int(kv_capacity_tokens(1.0, 16, 2, 30, 3, 64))
    assert a > 0 and a % 16 == 0, "the cache holds whole blocks: a multiple of the block size"
    assert 1.9 < b / a < 2.1, "halving the bytes per value should about double the tokens"


# --- 04.blocks_needed (predict, then the roomy run measures it) -----------------------------------


@question(
    "04.blocks_needed", points=2, answers=["predicted_blocks"], predict=True, forbid=refs("engine_runs")
)
def _(predicted_blocks):
    """predicted_blocks(scenario): the most KV blocks each request holds at once (prompt order)."""
    case = {"block_size": 4, "prompt_lens": [5, 12], "max_tokens": 6, "token_seed": 1}
    got = [int(x) for x in predicted_blocks(dict(case))]
    assert len(got) == 2 and all(x >= 2 for x in got), (
        "one whole number of blocks per request; a request that grows past its prompt's last block "
        "holds more than one block"
    )
    more = [int(x) for x in predicted_blocks({**case, "block_size": 2})]
    assert all(m > g for m, g in zip(more, got)), "smaller blocks: more of them per request"


# --- 04.my_schedule -----------------------------------------------------------------------------


def _drive(
    schedule_fn,
    num_blocks: int,
    block_size: int,
    budget: int,
    max_num_seqs: int,
    prompts: dict[str, int],
    max_tokens: int,
    max_steps: int = 300,
    priorities: dict[str, int] | None = None,
    arrive_at: dict[str, int] | None = None,
):
    """Run a scheduler with `schedule_fn` (None: the engine's own first-come-first-served policy)
    on fake tokens; (plans, scheduler). Requests arrive in the order of `prompts` (arrival times
    0, 1, 2, ...) with `priorities` (default 0: lower is served first); `arrive_at` gives the step
    before which a request joins the queue (default 0: before the first step)."""
    from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
    from lab_utils.kv import KVCacheManager

    s = Scheduler(
        KVCacheManager(num_blocks, block_size, enable_caching=False),
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256),
        schedule_fn=schedule_fn,
    )
    pending = [
        Request(
            rid,
            list(range(100, 100 + n)),
            SamplingParams(temperature=0, max_tokens=max_tokens),
            arrival_time=float(i),
            priority=(priorities or {}).get(rid, 0),
        )
        for i, (rid, n) in enumerate(prompts.items())
    ]
    plans = []
    while (pending or s.has_unfinished_requests()) and len(plans) < max_steps:
        while pending and (arrive_at or {}).get(pending[0].request_id, 0) <= len(plans):
            s.add_request(pending.pop(0))
        try:
            out = s.schedule()
        except NotImplementedError:
            raise
        except RuntimeError as e:
            raise AssertionError(f"step {len(plans) + 1}: the engine refused your plan: {e}") from None
        plans.append(
            ({str(k): int(v) for k, v in out.num_scheduled_tokens.items()}, list(out.preempted_req_ids))
        )
        if not out.num_scheduled_tokens and not pending:
            break  # a stall: the plans so far are what the comparison sees
        sampled = {
            rid: 5
            for rid, n in out.num_scheduled_tokens.items()
            if out.num_computed_tokens[rid] + n == s.requests[rid].num_tokens
        }
        s.update_from_output(out, sampled)
    return plans, s


@question("04.my_schedule", points=3, answers=["my_schedule"], forbid=refs("reference_schedule"))
def _(my_schedule):
    """vLLM v1's policy under --scheduling-policy priority, on the engine's Scheduler."""
    # 1. one priority, a token budget smaller than the prompts: chunked prefill, all finish, no leak
    plans, s = inside(_drive, my_schedule, 16, 4, 8, 4, {"a": 6, "b": 10}, max_tokens=3)
    assert plans and sum(plans[0][0].values()) == 8 and "a" in plans[0][0], (
        "first step: with a budget smaller than the two prompts, the first request should be served "
        "and the budget used up (a prompt may be cut into chunks)"
    )
    assert not s.has_unfinished_requests(), (
        "the requests never finished: does every running request get tokens?"
    )
    assert s.kv.num_free_blocks == 16, "blocks were not all returned after the requests finished"
    # 2. the older request has the lower priority and the cache cannot hold both as they grow
    plans, s = inside(
        _drive, my_schedule, 4, 4, 32, 4, {"old": 7, "new": 7}, max_tokens=6, priorities={"old": 1, "new": 0}
    )
    preempted = [rid for p in plans for rid in p[1]]
    assert preempted, "the KV cache ran out but nothing was preempted"
    assert preempted[0] == "old", (
        "the first victim should be the running request with the lowest priority (the largest "
        "priority number), even when it was admitted first"
    )
    assert not s.has_unfinished_requests(), "after a preemption the victim must come back and finish"
    assert s.kv.num_free_blocks == 4, "blocks leaked after preemption"


# --- 04.preemption: size a cache that must preempt; what preemption cost, from the step log --------


def _scenario_engine(num_blocks: int, scen: dict, schedule_fn=None):
    """The lab's forced-preemption engine on fake tokens: (plans, scheduler, discarded tokens)."""
    from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
    from lab_utils.kv import KVCacheManager

    bs = scen["block_size"]
    s = Scheduler(
        KVCacheManager(int(num_blocks), bs, enable_caching=False),
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=1024),
        schedule_fn=schedule_fn,
    )
    for i, n in enumerate(scen["prompt_lens"]):
        s.add_request(
            Request(
                str(i),
                list(range(100, 100 + n)),
                SamplingParams(temperature=0, max_tokens=scen["max_tokens"]),
            )
        )
    steps = 0
    while s.has_unfinished_requests() and steps < 400:
        steps += 1
        out = s.schedule()
        if not out.num_scheduled_tokens:
            break
        sampled = {
            rid: 5
            for rid, n in out.num_scheduled_tokens.items()
            if out.num_computed_tokens[rid] + n == s.requests[rid].num_tokens
        }
        s.update_from_output(out, sampled)
    return s


@question(
    "04.preemption", points=2, answers=["tight_blocks", "recomputed_tokens"], forbid=refs("engine_runs")
)
def _(tight_blocks, recomputed_tokens):
    """tight_blocks(scenario): KV blocks that force a preemption; recomputed_tokens(steps): per victim,
    the tokens whose K/V preemption threw away."""
    case = {"block_size": 4, "prompt_lens": [7, 9, 6], "max_tokens": 7, "token_seed": 1}
    n = int(tight_blocks(dict(case)))
    assert n >= 1, "a positive whole number of blocks"
    s = _scenario_engine(n, case)
    assert s.num_preemptions > 0, "with this many blocks nobody was preempted: how many must the cache lack?"
    assert not s.has_unfinished_requests(), "with this many blocks the requests could not all finish"
    step = {"schedule_s": 1e-4, "execute_s": 0.01, "update_s": 1e-4, "blocks": {}, "num_free_blocks": 0}
    log = [
        {**step, "step": 1, "scheduled": {"a": 4, "b": 4}, "preempted": []},
        {**step, "step": 2, "scheduled": {"a": 1}, "preempted": ["b"]},
        {**step, "step": 3, "scheduled": {"a": 1}, "preempted": []},
    ]
    got = {str(k): int(v) for k, v in dict(recomputed_tokens([dict(x) for x in log])).items()}
    assert set(got) == {"b"}, "one entry per request that was preempted, and only those"
    assert got["b"] > 0, "a preempted request loses the K/V it had computed"
    quiet = dict(recomputed_tokens([dict(log[0]), {**log[2], "step": 2}]))
    assert not quiet, "no preemption, nothing recomputed"


# --- 04.throughput_vs_batch: output tokens per second from a sweep's step logs -------------------


@question("04.throughput_vs_batch", points=2, answers=["sweep_throughput"])
def _(sweep_throughput):
    """sweep_throughput(sweep): {max_num_seqs: output tokens per second of step time}."""
    step = {"schedule_s": 0.0, "update_s": 0.0, "blocks": {}, "preempted": [], "num_free_blocks": 0}
    one = {
        "prompt_lens": {"a": 3},
        "steps": [
            {**step, "step": 1, "execute_s": 0.5, "scheduled": {"a": 3}},
            {**step, "step": 2, "execute_s": 0.5, "scheduled": {"a": 1}},
        ],
    }
    got = {int(k): float(v) for k, v in dict(sweep_throughput({1: one})).items()}
    assert set(got) == {1}, "one throughput per max_num_seqs in the sweep"
    assert 0 < got[1] < 4, "output tokens per second: a prompt's tokens are not output tokens"


# --- 04.verify_greedy / 04.verify_sampled: the verification step of speculative decoding ----------

# The engine's own verifiers: an answer may neither be nor call them.
_VERIFIERS = refs("speculative_verifiers")  # lab_utils/grading/forbidden.py


@question("04.verify_greedy", points=2, answers=["verify_greedy"], forbid=_VERIFIERS)
def _(verify_greedy):
    """verify_greedy(draft_tokens, target_logits): the tokens one greedy speculative step emits, where
    target_logits[j] is the target's row of logits after the real tokens and the first j drafts."""
    rows = [[0.1, 2.0, 0.3], [1.5, 0.2, 0.1], [0.0, 0.1, 0.9]]
    got = [int(t) for t in verify_greedy([1, 0], [list(r) for r in rows])]
    assert 1 <= len(got) <= 3, "a step emits at least one token and at most one per draft plus one"
    assert got[:1] == [1], "the first token is always the one the target itself would pick first"
    one = [int(t) for t in verify_greedy([2], [list(rows[0]), list(rows[1])])]
    assert len(one) == 1, "a draft the target disagrees with is not kept, nor is anything after it"


@question("04.verify_sampled", points=3, answers=["verify_sampled"], forbid=_VERIFIERS)
def _(verify_sampled):
    """verify_sampled(target_probs, draft_probs, draft_tokens, seed): one sampled speculative step
    (rejection sampling) whose tokens follow the target's distribution exactly."""
    p = [[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]]
    got = [int(t) for t in verify_sampled([list(r) for r in p], [list(r) for r in p], [0, 2], 7)]
    assert len(got) == 3 and got[:2] == [0, 2], (
        "a draft model that proposes from the target's own distribution is always right: every draft "
        "is kept, and one more token follows"
    )
    q = [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    p0 = [[0.6, 0.4, 0.0], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]]
    for seed in range(3):
        got = [int(t) for t in verify_sampled([list(r) for r in p0], [list(r) for r in q], [2, 0], seed)]
        assert len(got) == 1 and got[0] in (0, 1), (
            "a draft the target gives no probability is never kept, and the token that replaces it "
            "is one the target can produce"
        )


# --- 04.spec_speedup (predict, then the speculative run measures it) -----------------------------


@question("04.spec_speedup", points=2, answers=["predicted_spec"], predict=True, forbid=refs("engine_runs"))
def _(predicted_spec):
    """predicted_spec(case) -> (tokens per step, speedup over one token per step), from the chance
    that each draft position is kept once reached (case["acceptance"]), one draft token's cost
    (case["draft_cost"]) and a verifying step's cost (case["verify_cost"]), both in target decode
    steps."""
    none = {"acceptance": [0.0, 0.0, 0.0], "draft_cost": 0.0, "verify_cost": 1.0}
    t0, s0 = (float(x) for x in predicted_spec(dict(none)))
    assert abs(t0 - 1.0) < 1e-9 and abs(s0 - 1.0) < 1e-9, (
        "drafts that are never kept, free to make and free to check: one token a step, no gain"
    )
    good = {"acceptance": [0.9, 0.8, 0.7], "draft_cost": 0.05, "verify_cost": 1.1}
    t1, s1 = (float(x) for x in predicted_spec(dict(good)))
    assert 1.0 < t1 < 4.0, "with three drafts a step emits more than one token and at most four"
    assert s1 < t1, "drafting and verifying cost something: the speedup is below the tokens per step"
