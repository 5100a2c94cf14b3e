"""Lab 04: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab04`.
"""

from __future__ import annotations

import functools
import math
import random
import sys

from grader.hidden.schedules import v1_step
from grader.registry import hidden
from lab_utils.grading.checks import inside
from lab_utils.grading.questions.lab04 import _drive, _scenario_engine


def _ref_blocks(scen: dict) -> list[int]:
    bs, m = scen["block_size"], scen["max_tokens"]
    # the last sampled token's K/V is never written: prompt + max_tokens - 1 tokens live in the cache
    return [math.ceil((p + m - 1) / bs) for p in scen["prompt_lens"]]


def _ref_spans(table: list[int], start: int, end: int, bs: int) -> list[tuple[int, int]]:
    spans: list[list[int]] = []
    for pos in range(start, end):
        row = table[pos // bs] * bs + pos % bs
        if spans and spans[-1][0] + spans[-1][1] == row:
            spans[-1][1] += 1
        else:
            spans.append([row, 1])
    return [(a, n) for a, n in spans]


def _spans_table(rng) -> list[int]:
    """A block table of distinct physical blocks, in runs: some ascending neighbours (one run of
    rows), some descending (neighbours in memory, not in the table's order), some scattered."""
    pool = list(range(1, 400))
    rng.shuffle(pool)
    used: set[int] = set()
    table: list[int] = []
    want = rng.randint(1, 10)
    while len(table) < want:
        b = pool.pop()
        if b in used:
            continue
        kind = rng.random()
        run = (
            [b + i for i in range(rng.randint(1, 4))]
            if kind < 0.5
            else ([b - i for i in range(rng.randint(2, 3))] if kind < 0.65 else [b])
        )
        run = [x for x in run if 0 < x and x not in used][: want - len(table)]
        used.update(run)
        table.extend(run)
    return table


@hidden("04.slot_spans")
def _(slot_spans, rng, scenario):
    wrong = 0
    for k in range(30):
        bs = rng.choice([1, 2, 4, 8, 16, 128])
        table = _spans_table(rng)
        total = len(table) * bs
        if k < 3:  # the whole table; an empty range; one token
            start, end = (0, total) if k == 0 else (p := rng.randrange(total), p + (k == 2))
        else:
            start = rng.choice([0, rng.randrange(total), rng.randrange(len(table)) * bs])
            end = rng.choice([total, rng.randint(start, total)])
        got = [(int(a), int(n)) for a, n in list(slot_spans(list(table), start, end, bs))]
        wrong += got != _ref_spans(table, start, end, bs)
    assert not wrong, f"wrong on {wrong} of 30 unseen block tables and token ranges"


def _ref_capacity(gib, bs, dbytes, layers, kv_heads, head_dim) -> int:
    per_block = 2 * layers * kv_heads * head_dim * dbytes * bs
    return int(int(gib * 2**30) // per_block) * bs


@hidden("04.kv_capacity_tokens")
def _(kv_capacity_tokens, rng, scenario):
    wrong = 0
    for _ in range(25):
        args = (
            rng.choice([0.05, 0.25, 0.5, 1.0, 3.0, 20.0]),
            rng.choice([4, 16, 32, 128]),
            rng.choice([1, 2, 4]),
            rng.randint(2, 80),
            rng.choice([1, 2, 4, 8]),
            rng.choice([64, 80, 128]),
        )
        if int(kv_capacity_tokens(*args)) != _ref_capacity(*args):
            wrong += 1
    assert not wrong, f"wrong on {wrong} of 25 unseen model shapes and cache sizes"


def _blocks_scenario(rng) -> dict:
    bs = rng.choice([1, 2, 4, 8, 16, 32])
    m = rng.choice([1, 2, rng.randint(1, 3 * bs + 2), rng.randint(1, 60)])
    lens = [rng.randint(1, 120) for _ in range(rng.randint(1, 6))]
    if rng.random() < 0.4:  # a request that ends exactly on a block boundary, or one token past it
        k = rng.randrange(len(lens))
        lens[k] = max(1, rng.randint(1, 8) * bs - m + rng.choice([0, 1, 2]))
    return {"block_size": bs, "prompt_lens": lens, "max_tokens": m, "token_seed": rng.randrange(10**6)}


@hidden("04.blocks_needed")
def _(predicted_blocks, rng, scenario):
    # graded exactly (whole blocks, no tolerance): the reference model is the cache's arithmetic
    cases = [dict(scenario)] + [_blocks_scenario(rng) for _ in range(19)]
    wrong = 0
    for case in cases:
        got = [int(x) for x in list(predicted_blocks(dict(case, prompt_lens=list(case["prompt_lens"]))))]
        wrong += got != _ref_blocks(case)
    assert not wrong, (
        f"wrong on {wrong} of {len(cases)} unseen scenarios: count which tokens' K/V are ever written"
    )


def _priority_step(**mistake):
    """vLLM v1's step under --scheduling-policy priority: rank = (priority, arrival_time); a
    `mistake` (schedules.v1_step's newest_victim / restore) gives a wrong variant to separate."""
    from lab_utils.engine import SchedulerOutput

    def step(state):
        return v1_step(state, SchedulerOutput(), rank=lambda r: (r.priority, r.arrival_time), **mistake)

    return step


_ref_priority_schedule = _priority_step()
# the stated rules a wrong policy may break beyond first come first served (which every hidden case
# separates): the hidden cases separate each from vLLM's policy
_MISTAKES = {
    "newest victim": {"newest_victim": True},
    "planned tokens not given back": {"restore": False},
}


def _random_case(rng) -> dict:
    bs = rng.choice([2, 4, 8])
    n = rng.randint(2, 6)
    prompts = {f"r{i}": rng.randint(1, 30) for i in range(n)}
    max_tokens = rng.randint(1, 12)
    need_one = max(math.ceil((p + max_tokens) / bs) for p in prompts.values())
    return dict(
        num_blocks=rng.randint(need_one, need_one * n + 2),
        block_size=bs,
        budget=rng.choice([4, 8, 16, 64]),
        max_num_seqs=rng.randint(1, 5),
        prompts=prompts,
        max_tokens=max_tokens,
        priorities={rid: rng.randint(0, 3) for rid in prompts},
        # most workloads have late arrivals: an urgent request can join while less urgent ones run
        arrive_at=dict(zip(prompts, sorted(rng.randint(0, 8) * (i > 0) for i in range(n))))
        if rng.random() < 0.7
        else None,
    )


def _contended_case(rng) -> dict:
    """A workload where urgent requests arrive while less urgent ones run, with a small budget and a
    tight cache: the victim is often a request already planned this step, whose tokens go back."""
    bs, n = rng.choice([2, 4]), rng.randint(3, 6)
    prompts = {f"r{i}": rng.randint(4, 30) for i in range(n)}
    max_tokens = rng.randint(2, 12)
    need_one = max(math.ceil((p + max_tokens) / bs) for p in prompts.values())
    return dict(
        num_blocks=rng.randint(need_one, 2 * need_one + 1),
        block_size=bs,
        budget=rng.choice([4, 6, 8, 12]),
        max_num_seqs=rng.randint(3, 5),
        prompts=prompts,
        max_tokens=max_tokens,
        priorities={
            rid: rng.randint(2, 3) if i < n // 2 else rng.randint(0, 1) for i, rid in enumerate(prompts)
        },
        arrive_at=dict(zip(prompts, sorted(rng.randint(0, 6) * (i > 0) for i in range(n)))),
    )


def priority_cases(rng, count: int = 12, each: int = 3) -> list[dict]:
    """Workloads on which the priority policy plans differently from first come first served; among
    them at least `each` on which it plans differently from each stated rule's mistake."""
    wrong = {k: _priority_step(**m) for k, m in _MISTAKES.items()}
    cases, caught = [], dict.fromkeys(wrong, 0)
    for k in range(100 * count):
        case = (_contended_case if k % 2 else _random_case)(rng)
        want, _ = _drive(_ref_priority_schedule, **case)
        if _drive(None, **case)[0] == want:
            continue
        # a mistake already caught `each` times is not driven again (the case set needs no more)
        differs = {m for m, f in wrong.items() if caught[m] < each and _drive(f, **case)[0] != want}
        reserved = sum(each - n for n in caught.values())
        if len(cases) + reserved >= count and not differs:
            continue  # the slots left are kept for cases that separate a mistake not yet caught enough
        cases.append((case, want))
        for m in differs:
            caught[m] += 1
        if len(cases) == count:
            break
    return cases


@functools.lru_cache(maxsize=8)
def _cases_for(seed: int) -> tuple:
    """The hidden cases of one judge key, built once per process (the library survey and the
    many-seeds tests judge many candidates under one key; building takes 0.1-0.5 s).

    In-process scoring (the course's own tests) watches every call with a profile hook
    (lab_utils.grading.scoring._CallWatch), which made building these cases about 8x slower (2.2 s
    against 0.3 s per case set, 2026-12-06); this trusted code calls nothing of the answer's, so the
    hook is set aside while it runs and put back after."""
    hook = sys.getprofile()
    sys.setprofile(None)
    try:
        return tuple(priority_cases(random.Random(seed)))
    finally:
        sys.setprofile(hook)


@hidden("04.my_schedule")
def _(my_schedule, rng, scenario):
    cases = _cases_for(rng.getrandbits(64))
    wrong = 0
    for case, want in cases:
        try:
            got, _ = inside(_drive, my_schedule, **case)
        except AssertionError:
            got = None
        if got != want:
            wrong += 1
    assert not wrong, (
        f"on {wrong} of {len(cases)} unseen workloads your plans differ from vLLM v1's priority "
        "policy at some step (who is admitted, how many tokens, who is preempted)"
    )


def _preempt_scenario(rng, draw) -> dict:
    """A scenario of the lab's kind (every request grows by at least one block) whose lab-style
    tight cache does preempt, so that every hidden case has an answer."""
    while True:
        scen = draw(rng)
        if rng.random() < 0.5:  # two to five requests instead of three
            bs, m = scen["block_size"], scen["max_tokens"]
            scen["prompt_lens"] = [rng.randint(6, 24) for _ in range(rng.randint(2, 5))]
            scen["max_tokens"] = m if m > bs else bs + 1
        bs, lens = scen["block_size"], scen["prompt_lens"]
        longest = max(lens) + scen["max_tokens"]
        if _scenario_engine(max(sum(-(-p // bs) for p in lens), -(-longest // bs)), scen).num_preemptions:
            return scen


def _victims_log(rng) -> tuple[list[dict], dict[str, int]]:
    """A step log of a tight cache (EngineRun.steps' shape) and, from the scheduler's own state, the
    tokens each victim had computed when it was preempted."""
    from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
    from lab_utils.kv import KVCacheManager

    bs = rng.choice([2, 4, 8])
    n = rng.randint(2, 6)
    prompts = {f"r{i}": rng.randint(1, 30) for i in range(n)}
    m = rng.randint(2, 14)
    need_one = max(-(-(p + m) // bs) for p in prompts.values())
    s = Scheduler(
        KVCacheManager(rng.randint(need_one, need_one + n + 1), bs, enable_caching=False),
        SchedulerConfig(
            max_num_seqs=rng.randint(2, 5), max_num_batched_tokens=rng.choice([8, 16, 64]), max_model_len=256
        ),
    )
    for rid, k in prompts.items():
        s.add_request(Request(rid, list(range(7, 7 + k)), SamplingParams(temperature=0, max_tokens=m)))
    steps, lost = [], {}
    while s.has_unfinished_requests() and len(steps) < 400:
        before = {r.request_id: r.num_computed_tokens for r in s.running}
        out = s.schedule()
        for rid in out.preempted_req_ids:
            lost[rid] = lost.get(rid, 0) + before[rid]
        steps.append(
            {
                "step": len(steps) + 1,
                "schedule_s": rng.uniform(1e-5, 1e-4),
                "execute_s": rng.uniform(0.005, 0.05),
                "update_s": rng.uniform(1e-5, 1e-4),
                "scheduled": {str(k): int(v) for k, v in out.num_scheduled_tokens.items()},
                "blocks": {str(k): len(v) for k, v in out.block_tables.items()},
                "preempted": list(out.preempted_req_ids),
                "num_free_blocks": int(s.kv.num_free_blocks),
            }
        )
        if not out.num_scheduled_tokens:
            break
        sampled = {
            rid: 5
            for rid, k in out.num_scheduled_tokens.items()
            if out.num_computed_tokens[rid] + k == s.requests[rid].num_tokens
        }
        s.update_from_output(out, sampled)
    return steps, {k: v for k, v in lost.items()}


@hidden("04.preemption")
def _(tight_blocks, recomputed_tokens, rng, scenario):
    from lab_utils.grading import lab_scenario

    def draw_scen(r):  # the lab's own kind of scenario, from a seed the judge's key chose
        return lab_scenario("04", r.randrange(10**9))

    sized = 0
    scens = [dict(scenario)] + [_preempt_scenario(rng, draw_scen) for _ in range(9)]
    for scen in scens:
        n = int(tight_blocks(dict(scen, prompt_lens=list(scen["prompt_lens"]))))
        bs = scen["block_size"]
        longest = max(scen["prompt_lens"]) + scen["max_tokens"]
        if n * bs < longest:  # the engine refuses a max_model_len the whole cache cannot hold
            continue
        s = _scenario_engine(n, scen)
        sized += bool(s.num_preemptions) and not s.has_unfinished_requests()
    # step logs: most with a request preempted more than once, two without any preemption
    kinds = ["again"] * 6 + ["once"] * 2 + ["none"] * 2
    right = 0
    for kind in kinds:
        while True:
            steps, want = _victims_log(rng)
            victims = [r for st in steps for r in st["preempted"]]
            again = len(victims) > len(set(victims))
            if kind == ("none" if not want else "again" if again else "once"):
                break
        got = {str(k): int(v) for k, v in dict(recomputed_tokens([dict(x) for x in steps])).items()}
        right += got == want
    if sized == len(scens) and right == len(kinds):
        return None
    if not sized and not right:
        raise AssertionError(
            f"wrong on all {len(scens)} unseen scenarios (tight caches) and all {len(kinds)} step logs"
        )
    # half the points each: the cache you sized, and what preemption cost
    return 0.5 * sized / len(scens) + 0.5 * right / len(kinds)


def _sweep_log(rng) -> tuple[dict, int]:
    """One sweep point: prompt lengths and the step log of a roomy cache (no preemption), with the
    output tokens the scheduler really sampled."""
    from lab_utils.engine import Request, SamplingParams, Scheduler, SchedulerConfig
    from lab_utils.kv import KVCacheManager

    n = rng.randint(1, 8)
    prompts = {f"q{i}": rng.randint(1, 40) for i in range(n)}
    lens = {rid: rng.randint(1, 12) for rid in prompts}
    s = Scheduler(
        KVCacheManager(512, 4, enable_caching=False),
        SchedulerConfig(
            max_num_seqs=rng.randint(1, 8),
            max_num_batched_tokens=rng.choice([4, 8, 16, 32, 256]),
            max_model_len=256,
        ),
    )
    for rid, k in prompts.items():
        s.add_request(
            Request(rid, list(range(9, 9 + k)), SamplingParams(temperature=0, max_tokens=lens[rid]))
        )
    steps, produced, t = [], 0, 0.0
    while s.has_unfinished_requests() and len(steps) < 500:
        out = s.schedule()
        if not out.num_scheduled_tokens:
            break
        sampled = {
            rid: 5
            for rid, k in out.num_scheduled_tokens.items()
            if out.num_computed_tokens[rid] + k == s.requests[rid].num_tokens
        }
        produced += len(sampled)
        rec = {
            "step": len(steps) + 1,
            "schedule_s": rng.uniform(1e-5, 2e-4),
            "execute_s": rng.uniform(0.005, 0.08),
            "update_s": rng.uniform(1e-5, 2e-4),
            "scheduled": {str(k): int(v) for k, v in out.num_scheduled_tokens.items()},
            "blocks": {str(k): len(v) for k, v in out.block_tables.items()},
            "preempted": [],
            "num_free_blocks": int(s.kv.num_free_blocks),
        }
        t += rec["schedule_s"] + rec["execute_s"] + rec["update_s"]
        steps.append(rec)
        s.update_from_output(out, sampled)
    return {"prompt_lens": dict(prompts), "steps": steps}, produced / t


@hidden("04.throughput_vs_batch")
def _(sweep_throughput, rng, scenario):
    wrong = total = 0
    for _ in range(6):
        sizes = sorted(rng.sample([1, 2, 3, 4, 6, 8, 12, 16], rng.randint(2, 4)))
        sweep, want = {}, {}
        for b in sizes:
            sweep[b], want[b] = _sweep_log(rng)
        got = {int(k): float(v) for k, v in dict(sweep_throughput(sweep)).items()}
        for b in sizes:
            total += 1
            wrong += b not in got or not abs(got[b] - want[b]) <= 1e-6 * want[b]
    assert not wrong, f"wrong on {wrong} of {total} unseen sweep points"


# --- 04.verify_greedy / 04.verify_sampled ---------------------------------------------------------


def _ref_verify_greedy(drafts: list[int], rows: list[list[float]]) -> list[int]:
    greedy = [row.index(max(row)) for row in rows]
    n = 0
    while n < len(drafts) and drafts[n] == greedy[n]:
        n += 1
    return greedy[: n + 1]


@hidden("04.verify_greedy")
def _(verify_greedy, rng, scenario):
    """Random logit tables (no ties) with drafts that agree with the target for a random stretch."""
    wrong = 0
    for _ in range(40):
        vocab, k = rng.randint(3, 12), rng.randint(0, 5)
        rows = [rng.sample(range(1000), vocab) for _ in range(k + 1)]
        rows = [[v / 100 - 5 for v in r] for r in rows]
        best = [max(range(vocab), key=r.__getitem__) for r in rows]
        agree = rng.randint(0, k)  # drafts right up to here, then (if any are left) a wrong one
        drafts = best[:agree] + [rng.choice([t for t in range(vocab) if t != b]) for b in best[agree:k]]
        got = [int(t) for t in verify_greedy(list(drafts), [list(r) for r in rows])]
        wrong += got != _ref_verify_greedy(drafts, rows)
    assert not wrong, f"wrong tokens on {wrong} of 40 unseen logit tables"


# The sampling verifier is judged by its output distribution, not its tokens (any correct use of the
# randomness is fine). Per case: the judge draws the drafts from the draft distributions, calls the
# answer _SAMPLED_DRAWS times and tests (a) each position's token counts among the steps that reach
# it against the target row (Pearson's chi-square, 4 degrees of freedom, every expected count >= 8),
# (b) the share of the steps reaching draft j that keep it against beta_j = sum min(p_j, q_j)
# (Hoeffding, exact), and (c) the shape of every step. Each test is set at _SAMPLED_DELTA, so a
# correct verifier fails a grading with probability about (tests per case x cases) x _SAMPLED_DELTA
# = 10 x 5e-8 < 1e-6 (the chi-square level is the usual large-sample one). The cases are drawn so that
# the two usual mistakes show: resampling from p instead of the residual (the first token's counts
# get a chi-square non-centrality of twice the threshold), and keeping a draft with probability
# p(d) as if it were certain (right tokens, too few kept: the share moves by twice the bound).
_SAMPLED_DRAWS = 1500
_SAMPLED_CASES = 2
_SAMPLED_DELTA = 5e-8
_VOCAB = 5  # chi-square with 4 degrees of freedom: its tail has a closed form
_MIN_AT_POSITION = 200  # positions reached fewer times are not tested on their own


def _chi2_sf_4(x: float) -> float:
    """P(X >= x) for a chi-square variable with 4 degrees of freedom."""
    return math.exp(-x / 2) * (1 + x / 2)


def _chi2_threshold(delta: float = _SAMPLED_DELTA) -> float:
    lo, hi = 0.0, 200.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _chi2_sf_4(mid) > delta else (lo, mid)
    return hi


def _chi2(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


def _first_token_law(p: list[float], q: list[float], accept, residual) -> list[float]:
    """The first emitted token's distribution when draft x ~ q is kept with accept(x) and otherwise
    replaced by a draw from residual(x)."""
    out = [0.0] * len(p)
    for x, qx in enumerate(q):
        if qx == 0:
            continue
        a = accept(x)
        out[x] += qx * a
        r = residual(x)
        for t, rt in enumerate(r):
            out[t] += qx * (1 - a) * rt
    return out


def _norm(v: list[float]) -> list[float]:
    s = sum(v)
    return [x / s for x in v] if s > 0 else [0.0] * len(v)


def _random_dist(rng, vocab: int, zeros: int = 0, floor: float = 0.0) -> list[float]:
    """A random distribution, peaked, with `zeros` impossible tokens; every other at least `floor`."""
    w = _norm([rng.expovariate(1.0) ** 2 for _ in range(vocab)])
    w = [(1 - floor * vocab) * x + floor for x in w]
    for i in rng.sample(range(vocab), zeros):
        w[i] = 0.0
    return _norm(w)


def _mistakes_visible(p0: list[float], q0: list[float], n: int) -> bool:
    """True when two usual mistakes show over n steps: resampling from p instead of the residual
    (the first token's chi-square gets a non-centrality of at least twice the threshold), and
    keeping a draft with probability p(d) as if it were certain, as for an n-gram draft (the law of
    the tokens stays right, but the share of first drafts kept moves by twice the Hoeffding bound)."""
    resid = _norm([max(a - b, 0.0) for a, b in zip(p0, q0)])
    right = _first_token_law(p0, q0, lambda x: min(1.0, p0[x] / q0[x]), lambda x: resid)
    assert sum(abs(a - b) for a, b in zip(right, p0)) < 1e-9  # the theorem, on this case
    from_p = _first_token_law(p0, q0, lambda x: min(1.0, p0[x] / q0[x]), lambda x: p0)
    chi_ok = n * sum((b - a) ** 2 / a for a, b in zip(p0, from_p)) >= 2 * _chi2_threshold()
    beta = sum(min(a, b) for a, b in zip(p0, q0))
    kept_if_certain = sum(a * b for a, b in zip(p0, q0))  # a right law, but fewer drafts kept
    return chi_ok and abs(kept_if_certain - beta) >= 2 * _hoeffding(n)


def _hoeffding(n: int, delta: float = _SAMPLED_DELTA) -> float:
    """The deviation of a mean of n draws in [0, 1] exceeded with probability at most delta."""
    return math.sqrt(math.log(2 / delta) / (2 * n))


def _sampled_case(rng, n: int = _SAMPLED_DRAWS) -> tuple[list[list[float]], list[list[float]]]:
    """Target rows p (k+1, every token at least 4 %) and draft rows q (k, some with an impossible
    token), k = 2, vocab 5, where the usual mistakes are visible."""
    while True:
        p = [_random_dist(rng, _VOCAB, floor=0.04) for _ in range(3)]
        q = [_random_dist(rng, _VOCAB, zeros=rng.randint(0, 1)) for _ in range(2)]
        beta = [sum(min(a, b) for a, b in zip(pi, qi)) for pi, qi in zip(p, q)]
        if not 0.3 < beta[0] < 0.8 or beta[1] < 0.3:
            continue  # enough steps reach position 1, and enough rejections at position 0
        if _mistakes_visible(p[0], q[0], n):
            return p, q


def _draw(rng, dist: list[float]) -> int:
    return rng.choices(range(len(dist)), weights=dist)[0]


def judge_sampled_verifier(verify_sampled, rng, draws: int = _SAMPLED_DRAWS, cases: int = _SAMPLED_CASES):
    """(failed tests, tests) of a sampling verifier on `cases` hidden cases; shape errors fail all."""
    failed = tests = 0
    for _ in range(cases):
        p, q = _sampled_case(rng, draws)
        k, vocab = len(q), len(p[0])
        at = [[0] * vocab for _ in range(k + 1)]  # at[j][t]: steps whose token j was t
        for _ in range(draws):
            drafts = [_draw(rng, qi) for qi in q]
            got = [int(t) for t in verify_sampled([list(r) for r in p], [list(r) for r in q], list(drafts),
                                                   rng.randrange(2**31))]  # fmt: skip
            if not 1 <= len(got) <= k + 1 or got[:-1] != drafts[: len(got) - 1]:
                return tests + 1, tests + 1  # not a speculative step's shape: kept drafts, then one token
            if not all(0 <= t < vocab for t in got):
                return tests + 1, tests + 1
            for j, t in enumerate(got):
                at[j][t] += 1
        for j in range(k + 1):
            n = sum(at[j])
            if n < _MIN_AT_POSITION:
                continue
            tests += 1
            failed += _chi2(at[j], p[j]) > _chi2_threshold()
        beta = [sum(min(a, b) for a, b in zip(pi, qi)) for pi, qi in zip(p, q)]
        for j in range(k):  # of the steps that reach draft j, the share that keep it: beta_j
            reached, kept = sum(at[j]), sum(at[j + 1])
            if reached >= _MIN_AT_POSITION:
                tests += 1
                failed += abs(kept / reached - beta[j]) > _hoeffding(reached)
    return failed, tests


@hidden("04.verify_sampled")
def _(verify_sampled, rng, scenario):
    failed, tests = judge_sampled_verifier(verify_sampled, rng)
    assert not failed, (
        f"{failed} of {tests} statistical tests failed on unseen distributions (a correct verifier fails "
        "one with probability under one in a million): the tokens, or how many drafts are kept, do not "
        "follow the target's distribution"
    )


def _ref_spec(case: dict) -> tuple[float, float]:
    reach, tokens = 1.0, 1.0
    for a in case["acceptance"]:
        reach *= a  # draft j is emitted only if every draft before it was kept too
        tokens += reach
    cost = case["verify_cost"] + len(case["acceptance"]) * case["draft_cost"]
    return tokens, tokens / cost


@hidden("04.spec_speedup")
def _(predicted_spec, rng, scenario):
    wrong = 0
    for _ in range(30):
        k = rng.randint(1, 6)
        case = {
            "acceptance": [round(rng.uniform(0.2, 1.0), 3) for _ in range(k)],
            "draft_cost": rng.choice([0.0, round(rng.uniform(0.01, 0.6), 3)]),
            "verify_cost": round(rng.uniform(1.0, 1.6), 3),
        }
        t, s = (float(x) for x in predicted_spec({**case, "acceptance": list(case["acceptance"])}))
        rt, rs = _ref_spec(case)
        wrong += not (abs(t - rt) <= 1e-6 * rt and abs(s - rs) <= 1e-6 * rs)
    assert not wrong, f"wrong on {wrong} of 30 unseen cases (tokens per step and speedup, 1e-6 relative)"
