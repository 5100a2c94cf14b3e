"""Labs 02 and 03's graded questions, without running the notebooks.

Solution-like answers (written here, not imported from lab_utils) must earn full marks under two
seeds; wrong-but-plausible answers, lookup tables of the public cases, the known bypasses
(`my_schedule = reference_schedule`, a wrapper calling it, None, a hand-written measurement) and the
memorised submission must not.
"""

from __future__ import annotations

import pytest
from learner_kv import ForkingKVCacheManager, MyKVCacheManager

from grader.judge import score_graded
from grader.memorise import memorised_answers
from grader.registry import hidden_check
from lab_utils.grading import lab_scenario, questions_for

SEEDS = (3, 11)


# --- lab 02: solution-like answers ---------------------------------------------------------------


def contiguous_waste(workload):
    reserved = sum(r.prompt_len + r.max_tokens for r in workload)
    return sum(r.max_tokens - r.output_len for r in workload) / reserved


def cached_prefix_blocks(token_ids, block_size, cached):
    from lab_utils.kv import hash_block_tokens

    hits, parent = [], None
    for i in range((len(token_ids) - 1) // block_size if token_ids else 0):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        if parent not in cached:
            break
        hits.append(cached[parent])
    return hits


def max_concurrent(prompt_len, output_len, max_tokens, capacity_tokens, block_size):
    return (
        capacity_tokens // (prompt_len + max_tokens),
        (capacity_tokens // block_size) // -(-(prompt_len + output_len) // block_size),
    )


def predicted_prefix_hits(shared, n, block_size):
    return (n - 1) * (shared // block_size) * block_size


_PREFIX_NAMES = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


def _counters(text, match):
    total = dict.fromkeys(_PREFIX_NAMES, 0.0)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            for name in _PREFIX_NAMES:
                if match(line, name):
                    total[name] += float(line.rsplit(None, 1)[-1])
    return total


def _delta(match):
    def delta(before, after):
        b, a = _counters(before, match), _counters(after, match)
        return tuple(a[n] - b[n] for n in _PREFIX_NAMES)

    return delta


prefix_cache_delta = _delta(lambda line, name: line.split("{", 1)[0].split()[0] == name)


def predicted_blocks_saved(scenario):
    bs, system = scenario["block_size"], scenario["system_prompt_tokens"]
    return sum(min(system // bs, (system + n - 1) // bs) for n in scenario["user_tokens"][1:])


def kv_capacity(model, dtype, budget_bytes, block_size):
    element = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}[dtype]
    scale = 4 if dtype == "int8" else 0
    if "kv_lora_rank" in model:
        per_token = model["num_layers"] * (
            (model["kv_lora_rank"] + model["qk_rope_head_dim"]) * element + scale
        )
    else:
        per_token = model["num_layers"] * 2 * model["num_kv_heads"] * (model["head_dim"] * element + scale)
    return per_token, budget_bytes // (block_size * per_token)


def stream_agreement(pairs):
    first = []
    for base, cand in pairs:
        d = next((i for i, (a, b) in enumerate(zip(base, cand)) if a != b), None)
        first.append(min(len(base), len(cand)) if d is None and len(base) != len(cand) else d)
    return sum(d is None for d in first) / len(pairs), first


def ship_or_hold(pairs, min_agreement, confidence):
    import math

    n, k = len(pairs), sum(list(a) == list(b) for a, b in pairs)
    lo, hi = 0.0, 1.0
    for _ in range(60 if k else 0):
        p = (lo + hi) / 2
        tail = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
        lo, hi = (p, hi) if tail < (1 - confidence) / 2 else (lo, p)
    return "ship" if (lo + hi) / 2 * (k > 0) >= min_agreement else "hold"


def lab02_answers(seed: int) -> dict:
    return {
        "contiguous_waste": contiguous_waste,
        "MyKVCacheManager": MyKVCacheManager,
        "ForkingKVCacheManager": ForkingKVCacheManager,
        "cached_prefix_blocks": cached_prefix_blocks,
        "max_concurrent": max_concurrent,
        "predicted_prefix_hits": predicted_prefix_hits,
        "prefix_cache_delta": prefix_cache_delta,
        "predicted_blocks_saved": predicted_blocks_saved,
        "kv_capacity": kv_capacity,
        "stream_agreement": stream_agreement,
        "ship_or_hold": ship_or_hold,
    }


# --- lab 03: solution-like answers ---------------------------------------------------------------


def static_slot_utilisation(lens):
    return sum(lens) / (len(lens) * max(lens))


def my_schedule(state, watermark):
    from lab_utils.sim import SchedulerOutput

    cfg, plan = state.config, SchedulerOutput()
    tokens, budget, i = plan.num_scheduled_tokens, cfg.max_num_batched_tokens, 0
    while i < len(state.running) and budget > 0:
        req = state.running[i]
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        stop = False
        while state.kv.allocate_slots(req, n) is None:
            victim = state.preempt_last()
            plan.preempted_req_ids.append(victim.request_id)
            if victim is req:
                stop = True
                break
        if stop:
            break
        tokens[req.request_id] = n
        budget -= n
        i += 1
    if plan.preempted_req_ids:
        return plan
    while state.waiting and budget > 0 and len(state.running) < cfg.max_num_seqs:
        req = state.waiting[0]
        n = req.num_tokens - req.num_computed_tokens
        if n > budget and not cfg.enable_chunked_prefill:
            break
        n = min(n, budget)
        if state.kv.allocate_slots(req, n) is None:
            break
        if state.kv.num_free_blocks < watermark:
            state.kv.free(req)
            break
        state.admit(req)
        tokens[req.request_id] = n
        budget -= n
    return plan


def decodes_first_schedule(state, watermark):
    """vLLM v0's order (decodes, then prompt chunks) with a bug: it admits even after a preemption."""
    from lab_utils.sim import SchedulerOutput

    cfg, plan = state.config, SchedulerOutput()
    tokens = plan.num_scheduled_tokens
    for req in [r for r in state.running if r.is_decoding]:
        if req in state.running:
            while state.kv.allocate_slots(req, 1) is None:
                victim = state.preempt_last()
                plan.preempted_req_ids.append(victim.request_id)
                tokens.pop(victim.request_id, None)
                if victim is req:
                    break
            else:
                tokens[req.request_id] = 1
    for req in [r for r in state.running if not r.is_decoding]:
        left = cfg.max_num_batched_tokens - sum(tokens.values())
        if left > 0 and req in state.running:
            n = min(req.num_tokens - req.num_computed_tokens, left)
            if state.kv.allocate_slots(req, n) is not None:
                tokens[req.request_id] = n
    while state.waiting and len(state.running) < cfg.max_num_seqs:
        left = cfg.max_num_batched_tokens - sum(tokens.values())
        req = state.waiting[0]
        n = min(req.num_tokens - req.num_computed_tokens, left)
        if left <= 0 or state.kv.allocate_slots(req, n) is None:
            break
        state.admit(req)
        tokens[req.request_id] = n
    return plan


def goodput_rps(requests, ttft_slo, tpot_slo):
    good = sum(1 for a, f, e, n in requests if f - a <= ttft_slo and (n < 2 or (e - f) / (n - 1) <= tpot_slo))
    return good / (max(r[2] for r in requests) - min(r[0] for r in requests))


def queue_ratios(s):
    B, S, L = s["batch_size"], s["short_len"], s["long_len"]
    lens = [S] * (B - 1) + [L]
    return B * L / sum(lens), ((B - 1) * (L // S) + 1) / B, B * L / sum(lens)


def predicted_no_queue_gain(s):
    B, S, L = s["batch_size"], s["short_len"], s["long_len"]
    f, p, P = s["fixed_ms"], s["per_token_ms"], s["prompt_len"]
    prefill = f + p * B * P
    return (prefill + (L - 1) * (f + p * B)) / (prefill + (S - 1) * (f + p * B) + (L - S) * (f + p))


def throughput_gain(static, continuous):
    def rate(samples):
        return sum(x[0] for x in samples) / (max(x[2] for x in samples) - min(x[1] for x in samples))

    return rate(continuous) / rate(static)


def choose_batcher(s):
    from lab_utils.sim import DynamicBatching, StepCostModel, poisson_workload, simulate, summarize

    wl = poisson_workload(
        s["triton_num_requests"], s["triton_rate"], prompt_len=1, output_len=1, seed=s["triton_seed"]
    )
    cost = StepCostModel(fixed_s=s["triton_fixed_ms"] / 1e3, per_token_s=s["triton_per_item_ms"] / 1e3)
    top, found = s["triton_max_batch_size"], []
    for pref in [(), (4,), (8,), (4, 8), (16,), (8, 16), (32,), (16, 32)]:
        if any(x > top for x in pref):
            continue
        for delay in [0, 2_500, 5_000, 10_000, 15_000, 20_000, 30_000, 40_000]:
            res = simulate(wl, DynamicBatching(top, pref, delay), cost)
            p99, batch = summarize(res).e2e_p99 * 1e3, len(res.requests) / len(res.steps)
            if batch >= s["triton_min_mean_batch"] and p99 <= s["triton_p99_slo_ms"]:
                found.append((p99, delay, list(pref)))
    _, delay, pref = min(found)
    return delay, pref


def lab03_answers(seed: int) -> dict:
    return {
        "static_slot_utilisation": static_slot_utilisation,
        "queue_ratios": queue_ratios,
        "predicted_no_queue_gain": predicted_no_queue_gain,
        "throughput_gain": throughput_gain,
        "my_schedule": my_schedule,
        "goodput_rps": goodput_rps,
        "choose_batcher": choose_batcher,
    }


ANSWERS = {"02": lab02_answers, "03": lab03_answers}


def _total(lab: str, answers: dict, seed: int) -> tuple[float, float]:
    results = [score_graded(q, answers, seed) for q in questions_for(lab)]
    return sum(r.earned for r in results), sum(r.points for r in results)


# --- full marks under two seeds ------------------------------------------------------------------


@pytest.mark.parametrize("lab", ["02", "03"])
@pytest.mark.parametrize("seed", SEEDS)
def test_solution_like_answers_earn_full_marks(lab, seed):
    answers = ANSWERS[lab](seed)
    for q in questions_for(lab):
        r = score_graded(q, answers, seed)
        assert r.earned == r.points, (q.id, r.status, r.message)


def test_every_question_has_a_hidden_part_and_each_lab_a_prediction():
    for lab in ("02", "03"):
        qs = questions_for(lab)
        assert all(hidden_check(q.id) is not None for q in qs)
        assert any(q.predict for q in qs)


def test_scenarios_differ_between_seeds():
    for lab in ("02", "03"):
        assert lab_scenario(lab, SEEDS[0]) != lab_scenario(lab, SEEDS[1])


# --- wrong but plausible -------------------------------------------------------------------------


def _graded(qid: str, answers: dict, seed: int = SEEDS[0]):
    from lab_utils.grading import get

    return score_graded(get(qid), answers, seed)


def test_wrong_but_plausible_answers_fail():
    a2, a3 = lab02_answers(SEEDS[0]), lab03_answers(SEEDS[0])
    # waste counted over the tokens still to come, not over the slab
    assert (
        _graded(
            "02.contiguous_waste",
            {
                **a2,
                "contiguous_waste": lambda wl: sum(r.max_tokens - r.output_len for r in wl)
                / sum(r.max_tokens for r in wl),
            },
        ).earned
        == 0
    )

    class FrontFree(MyKVCacheManager):  # freed blocks rejoin the front (LIFO reuse)
        def free(self, request):
            for b in self.req_to_blocks.pop(request.request_id):
                self.ref_cnt[b] -= 1
                if self.ref_cnt[b] == 0:
                    self.free_queue.appendleft(b)

    assert _graded("02.free", {"MyKVCacheManager": FrontFree}).earned == 0

    class PromptOnly(MyKVCacheManager):  # counts blocks from the new tokens alone (ignores progress)
        def allocate_slots(self, request, num_new_tokens, new_computed_blocks=None):
            table = self.req_to_blocks.get(request.request_id, [])
            needed = -(-num_new_tokens // self.block_size) - (len(table) if not table else 0)
            if needed > len(self.free_queue):
                return None
            new = [self.free_queue.popleft() for _ in range(max(0, needed))]
            for b in new:
                self.ref_cnt[b] += 1
            self.req_to_blocks[request.request_id] = table + new
            return new

    assert _graded("02.append", {"MyKVCacheManager": PromptOnly}).earned == 0

    def unchained(token_ids, block_size, cached):  # looks every block up, not the chain
        from lab_utils.kv import hash_block_tokens

        hits = []
        for i in range((len(token_ids) - 1) // block_size):
            h = hash_block_tokens(None, token_ids[i * block_size : (i + 1) * block_size])
            if h not in cached:
                break
            hits.append(cached[h])
        return hits

    assert _graded("02.prefix_lookup", {"cached_prefix_blocks": unchained}).earned < 3

    # every user saves the whole system prompt, partial block included
    def whole_prompt(s):
        return (len(s["user_tokens"]) - 1) * -(-s["system_prompt_tokens"] // s["block_size"])

    assert _graded("02.prefix_saving", {"predicted_blocks_saved": whole_prompt}).earned < 1

    # every later user saves every full block: forgets that the last token's block is never cached
    def full_blocks(s):
        return (len(s["user_tokens"]) - 1) * (s["system_prompt_tokens"] // s["block_size"])

    assert _graded("02.prefix_saving", {"predicted_blocks_saved": full_blocks}).earned < 2
    # the measurement of the notebook's own scenario, copied into the prediction
    from grader.hidden.lab02 import blocks_saved

    measured = blocks_saved(lab_scenario("02", SEEDS[0]))
    assert _graded("02.prefix_saving", {"predicted_blocks_saved": lambda s: measured}).earned < 0.5

    # padding rows treated as free: the "no queue" gain of 1x
    assert _graded("03.predict_gain", {"predicted_no_queue_gain": lambda s: 1.0}, SEEDS[0]).earned < 0.5

    # the prefill step forgotten: a model that is right only when prompts are short
    def no_prefill(s):
        B, S, L, f, p = s["batch_size"], s["short_len"], s["long_len"], s["fixed_ms"], s["per_token_ms"]
        return L * (f + p * B) / (S * (f + p * B) + (L - S) * (f + p))

    assert _graded("03.predict_gain", {"predicted_no_queue_gain": no_prefill}).earned < 3
    # the notebook's own measurement, copied into the prediction
    from grader.hidden.lab03 import no_queue_gain

    measured = no_queue_gain(lab_scenario("03", SEEDS[0]))
    assert _graded("03.predict_gain", {"predicted_no_queue_gain": lambda s: measured}).earned < 0.5
    # one ratio for all three cases (the tokens ratio), and requests counted without the long one
    assert _graded("03.queue_ratios", {"queue_ratios": lambda s: (queue_ratios(s)[0],) * 3}).earned < 3

    # throughput timed from 0 (the clock's start), not from the first arrival
    def from_zero(static, cont):
        return (sum(x[0] for x in cont) / max(x[2] for x in cont)) / (
            sum(x[0] for x in static) / max(x[2] for x in static)
        )

    assert _graded("03.measured_gain", {"throughput_gain": from_zero}).earned < 1.5

    # mean of the requests' own tokens per second instead of the run's
    def per_request(static, cont):
        def mean(xs):
            return sum(x[0] / (x[2] - x[1]) for x in xs) / len(xs)

        return mean(cont) / mean(static)

    assert _graded("03.measured_gain", {"throughput_gain": per_request}).earned < 1
    # one fixed setting for every exercise
    for fixed in ((20_000, [8]), (30_000, [16]), (10_000, [])):
        assert _graded("03.dynamic_batcher", {"choose_batcher": lambda s, f=fixed: f}).earned < 1.5, fixed
    assert _graded("03.continuous_step", {"my_schedule": decodes_first_schedule}).earned < 4
    # the watermark ignored (vLLM v1's step), counted with the new request's blocks still free,
    # or held one block too high
    assert _graded("03.continuous_step", {"my_schedule": lambda s, w: my_schedule(s, 0)}).earned == 0
    assert _graded("03.continuous_step", {"my_schedule": lambda s, w: my_schedule(s, w + 1)}).earned < 1
    assert (
        _graded(
            "03.static_utilisation",
            {"static_slot_utilisation": lambda lens: sum(lens) / (len(lens) * (max(lens) + 1))},
        ).earned
        == 0
    )
    assert (
        _graded(
            "03.goodput",
            {
                "goodput_rps": lambda reqs, t, p: sum(1 for a, f, e, n in reqs if f - a <= t)
                / (max(r[2] for r in reqs) - min(r[0] for r in reqs))
            },
        ).earned
        < 2
    )
    assert a3  # built without error


# --- lookup tables of the public cases -----------------------------------------------------------


@pytest.mark.parametrize("lab", ["02", "03"])
def test_lookup_tables_of_public_cases_fail_hidden(lab):
    answers = ANSWERS[lab](SEEDS[0])
    memo = memorised_answers(lab, answers)
    for q in questions_for(lab):
        names = [n for n in q.answers if callable(answers[n]) and not isinstance(answers[n], type)]
        if not names:
            continue
        graded = score_graded(q, memo, SEEDS[1])
        assert graded.earned == 0, (q.id, graded.message)  # a table answers the public cases only


@pytest.mark.parametrize("lab", ["02", "03"])
def test_memorised_submission_scores_at_most_a_quarter(lab):
    memo = memorised_answers(lab, ANSWERS[lab](SEEDS[0]))
    earned, possible = _total(lab, memo, SEEDS[1])
    assert earned <= 0.25 * possible, (earned, possible)


# --- known bypasses --------------------------------------------------------------------------------


def test_reference_schedule_under_the_answers_name_scores_zero():
    from lab_utils.sim import reference_schedule

    r = _graded("03.continuous_step", {"my_schedule": reference_schedule})
    assert r.earned == 0 and r.status == "uses the reference"


def test_a_wrapper_calling_the_reference_scores_zero():
    from lab_utils.sim import reference_schedule
    from lab_utils.sim import scheduler as sim_scheduler

    def my_schedule(state, watermark):
        return reference_schedule(state)

    def via_module(state, watermark):
        return sim_scheduler.reference_schedule(state)

    for fn in (my_schedule, via_module):
        r = _graded("03.continuous_step", {"my_schedule": fn})
        assert r.earned == 0 and r.status == "uses the reference", r


def test_reference_kv_manager_and_helpers_score_zero():
    import lab_utils.kv.workload as workload
    from lab_utils.kv.workload import max_concurrent_requests

    # lab 02's waste figure is the grader's alone (issue 47 item 2): nothing to call
    assert not hasattr(workload, "never_used_fraction")
    wrapped = {"max_concurrent": lambda *a: tuple(max_concurrent_requests(*a).values())}
    assert _graded("02.max_concurrent", wrapped).earned == 0

    def measure_instead(scenario):  # the notebook's measurement (the course's block pool) as the prediction
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

    r = _graded("02.prefix_saving", {"predicted_blocks_saved": measure_instead})
    assert r.earned == 0 and r.status == "uses the reference", r

    def via_course_parser(before, after):
        from lab_utils.kv.metrics import vllm_kv_metrics

        b, a = vllm_kv_metrics(before), vllm_kv_metrics(after)
        return tuple(a[n] - b[n] for n in _PREFIX_NAMES)

    r = _graded("02.vllm_hits", {**lab02_answers(SEEDS[0]), "prefix_cache_delta": via_course_parser})
    assert r.earned == 0 and r.status == "uses the reference", r

    # lab 11's whole-blocks calculator is the grader's since issue 47 (grader/drill_calc.py)


def test_prefix_cache_delta_must_parse_the_page():
    """Substring matches add the deprecated alias or neighbours; splitting on spaces breaks on labels."""
    good = lab02_answers(SEEDS[0])
    substring = _delta(lambda line, name: name.split(":")[1] in line)
    split_on_space = _delta(
        lambda line, name: line.split("{", 1)[0].split()[0] == name and line.count(" ") == 1
    )
    for wrong in (substring, split_on_space):
        assert _graded("02.vllm_hits", {**good, "prefix_cache_delta": wrong}).earned < 1.9


def test_none_answers_score_zero():
    for lab in ("02", "03"):
        answers = {name: None for q in questions_for(lab) for name in q.answers}
        assert _total(lab, answers, SEEDS[0])[0] == 0


def test_simulating_instead_of_reasoning_scores_zero():
    """The ratios and the prediction may not run the simulator (nor course code that runs it)."""
    from lab_utils.sim import (
        ContinuousBatching,
        StaticBatching,
        StepCostModel,
        fixed_workload,
        simulate,
        summarize,
    )
    from lab_utils.sim.measure import measure_batching_gain

    def simulated_gain(s):
        B = s["batch_size"]
        batch = fixed_workload([s["prompt_len"]] * B, [s["short_len"]] * (B - 1) + [s["long_len"]])
        cost = StepCostModel(fixed_s=s["fixed_ms"] / 1e3, per_token_s=s["per_token_ms"] / 1e3)
        st = summarize(simulate(batch, StaticBatching(B, pad_finished=True), cost)).output_tokens_per_s
        return summarize(simulate(batch, ContinuousBatching(B, 4096), cost)).output_tokens_per_s / st

    def via_measure(s):
        B = s["batch_size"]
        batch = fixed_workload([s["prompt_len"]] * B, [s["short_len"]] * (B - 1) + [s["long_len"]])
        return measure_batching_gain(
            batch, B, StepCostModel(s["fixed_ms"] / 1e3, s["per_token_ms"] / 1e3)
        ).ratio

    for fn in (simulated_gain, via_measure):
        r = _graded("03.predict_gain", {"predicted_no_queue_gain": fn})
        assert r.earned == 0 and r.status == "uses the reference", r

    def simulated_utilisation(lens):  # the simulator's run of the batch, its slot-steps counted
        run = simulate(
            fixed_workload([1] * len(lens), list(lens)), StaticBatching(len(lens)), StepCostModel(0.01, 0)
        )
        return sum(len(s.decode) + len(s.prefill) for s in run.steps) / (len(lens) * len(run.steps))

    r = _graded("03.static_utilisation", {"static_slot_utilisation": simulated_utilisation})
    assert r.earned == 0 and r.status == "uses the reference", r


def test_the_library_measurement_as_the_analysis_scores_zero():
    from lab_utils.sim.measure import BatchingGain

    r = _graded("03.measured_gain", {"throughput_gain": lambda s, c: BatchingGain(1, s, c).ratio})
    assert r.earned == 0 and r.status == "uses the reference", r
