"""Lab 11's graded questions, without running the notebook.

Solution-like answers (written here, not imported from lab_utils) earn full marks under two seeds;
the memorised submission, stubs, the forbidden references and plausible wrong answers do not.
"""

from __future__ import annotations

import heapq
import importlib
import math

import pytest
from submissions import judge_in_sandbox, notebook_namespace

from grader import drill_calc as calc
from grader.judge import score_graded
from grader.memorise import memorised_answers
from lab_utils.grading import get, lab_scenario, questions_for

SEEDS = (3, 11)


def gpus_needed(weights_gb, kv_gb, gpu_memory_gb, utilization, reserve_gb, num_heads, num_kv_heads, max_tp=8):
    usable = utilization * gpu_memory_gb - reserve_gb
    if usable <= 0:
        return None
    for tp in range(1, max_tp + 1):
        if num_heads % tp or (num_kv_heads % tp and tp % num_kv_heads):
            continue
        if weights_gb / tp + kv_gb / min(tp, num_kv_heads) <= usable:
            return tp
    return None


def gpus_needed_no_replication(w, kv, mem, util, reserve, heads, kv_heads, max_tp=8):
    usable = util * mem - reserve
    for tp in range(1, max_tp + 1):
        if heads % tp == 0 and kv_heads % tp == 0 and (w + kv) / tp <= usable:
            return tp
    return None


def critical_batch(peak_tflops, bandwidth_gb_s, bytes_per_param, num_params=None, kv_per_token=0, context=0):
    ridge = peak_tflops * 1e3 / bandwidth_gb_s
    if not kv_per_token * context:
        return ridge * bytes_per_param / 2
    spare = 2 * num_params - ridge * kv_per_token * context
    return None if spare <= 0 else ridge * num_params * bytes_per_param / spare


def critical_batch_weights_only(peak_tflops, bandwidth_gb_s, bytes_per_param, *kv):
    return peak_tflops * 1e3 / bandwidth_gb_s * bytes_per_param / 2


def batching_gain(output_lens, batch_size):
    lens = list(output_lens)
    static = sum(max(lens[i : i + batch_size]) for i in range(0, len(lens), batch_size))
    return static / (sum(lens) / batch_size)


def spec_expected_tokens(accept):
    return 1 + sum(math.prod(accept[: i + 1]) for i in range(len(accept)))


def spec_speedup(accept, c):
    return spec_expected_tokens(accept) / (1 + len(accept) * c)


def spec_one_rate(accept):  # the drill's formula with the first position's rate for every position
    a, k = accept[0], len(accept)
    return (1 - a ** (k + 1)) / (1 - a)


def cost_per_million_tokens(price, n, tps):
    return price * n / tps / 3600 * 1e6


def answer_drill(kind, x):
    # every drill's stated answer, recomputed from its inputs (as the solution does, shortened)
    from lab_utils.drills import make_drills  # noqa: F401  (only the kinds matter here)

    kv = lambda x: 2 * x["layers"] * x["kv_heads"] * x["head_dim"] * x["dtype_bytes"]  # noqa: E731
    q = lambda x: x["linear_params"] * x["bits"] / 8 + x["other_params"] * 2  # noqa: E731
    blocks = lambda x: x["prefix_tokens"] // x["block_size"] * x["block_size"]  # noqa: E731
    table = {
        "kv_bytes_per_token": lambda: kv(x) / 1024,
        "kv_concurrency": lambda: math.floor(x["kv_gb"] * 1e9 / kv(x) / x["context"]),
        "gpus_needed": lambda: gpus_needed(
            x["weights_gb"],
            x["kv_gb"],
            x["gpu_memory_gb"],
            x["utilization"],
            x["reserve_gb"],
            x["heads"],
            x["kv_heads"],
            x["max_tp"],
        ),
        "kv_to_weights": lambda: x["batch"]
        * x["context"]
        * x["kv_bytes_per_token"]
        / (x["num_params"] * x["bytes_per_param"]),
        "activation_gb": lambda: (
            x["tokens"] * (2 * x["hidden"] + 3 * x["intermediate"]) * x["dtype_bytes"]
            + x["seqs"] * x["vocab"] * (x["dtype_bytes"] + 4)
        )
        / 1e9,
        "ridge_point": lambda: x["peak_tflops"] * 1e3 / x["bandwidth_gb_s"],
        "critical_batch": lambda: critical_batch(x["peak_tflops"], x["bandwidth_gb_s"], x["bytes_per_param"]),
        "prefill_ttft_ms": lambda: 2
        * x["num_params"]
        * x["prompt_tokens"]
        / (x["num_gpus"] * x["peak_tflops"] * 1e12 * x["mfu"])
        * 1e3,
        "batching_gain": lambda: batching_gain(x["output_lens"], x["batch_size"]),
        "concurrency": lambda: x["rate"] * (x["ttft_s"] + x["output_tokens"] * x["tpot_s"]),
        "max_rate": lambda: x["concurrency"] / x["latency_s"],
        "goodput": lambda: sum(
            t <= x["ttft_slo_s"] and p <= x["tpot_slo_s"] for t, p in zip(x["ttfts_s"], x["tpots_s"])
        )
        / x["duration_s"],
        "spec_expected_tokens": lambda: spec_expected_tokens([x["alpha"]] * x["k"]),
        "spec_speedup": lambda: spec_speedup([x["alpha"]] * x["k"], x["draft_cost_ratio"]),
        "quant_memory_ratio": lambda: (x["linear_params"] + x["other_params"]) * 2 / q(x),
        "quant_batch1_tokens_per_s": lambda: x["bandwidth_gb_s"] * 1e9 / q(x),
        "prefix_prefill_saved": lambda: blocks(x) / (x["prefix_tokens"] + x["suffix_tokens"]),
        "prefix_kv_saved_gb": lambda: (x["users"] - 1) * blocks(x) * x["kv_bytes_per_token"] / 1e9,
        "cost_per_million": lambda: cost_per_million_tokens(
            x["price_per_gpu_hour"], x["num_gpus"], x["tokens_per_s"]
        ),
    }
    if kind in table:
        return table[kind]()
    if kind.startswith("spec_"):
        return _answer_spec(kind, x)
    return _answer_moe_kv(kind, x)


def _answer_spec(kind, x):
    # vLLM's counters, and the rejection rule at one position, by the rules the lab states
    if kind in ("spec_tokens_from_counters", "spec_speedup_from_counters"):
        per_step = 1 + sum(x["accepted_per_pos"]) / x["num_drafts"]
        if kind == "spec_tokens_from_counters":
            return per_step
        return per_step / (1 + x["k"] * x["draft_ms"] / x["target_ms"])
    p, q = x["target"], x["draft"]
    if kind == "spec_accept_probability":
        return min(1.0, p[x["drafted"]] / q[x["drafted"]])
    if kind == "spec_acceptance_rate":
        return sum(min(a, b) for a, b in zip(p, q))
    extra = [max(0.0, a - b) for a, b in zip(p, q)]
    return extra[x["token"]] / sum(extra)


def _answer_moe_kv(kind, x):
    # the MoE, MLA, expert-parallel and KV-transfer drills, by the models their questions state
    if kind.startswith("moe_"):
        common = (
            2 * x["vocab"] * x["hidden"]
            + x["layers"] * x["attn_params_per_layer"]
            + x["dense_layers"] * 3 * x["hidden"] * x["dense_intermediate"]
        )
        per_expert = (x["layers"] - x["dense_layers"]) * 3 * x["hidden"] * x["expert_intermediate"]
        active = common + (x["top_k"] + x["shared_experts"]) * per_expert
        total = common + (x["routed_experts"] + x["shared_experts"]) * per_expert
        return active / 1e9 if kind == "moe_active_params" else active / total
    mla = (
        x.get("layers", 0)
        * (x.get("kv_lora_rank", 0) + x.get("qk_rope_head_dim", 0))
        * x.get("dtype_bytes", 0)
    )
    if kind == "mla_kv_bytes_per_token":
        return mla / 1024
    if kind == "mla_vs_gqa":
        return 2 * x["layers"] * x["kv_heads"] * x["head_dim"] * x["dtype_bytes"] / mla
    if kind.startswith("ep_"):
        per_token = (
            x["top_k"] * x["hidden"] * (x["dispatch_bytes"] + x["combine_bytes"]) * (1 - 1 / x["ep_size"])
        )
        return (
            per_token / 1024
            if kind == "ep_alltoall_kib"
            else x["tokens"] * per_token / (x["link_gb_s"] * 1e6)
        )
    if kind.startswith("kv_transfer"):
        tokens = math.ceil(x["prompt_tokens"] / x["block_size"]) * x["block_size"]
        moved = tokens * 2 * x["layers"] * x["kv_heads"] * x["head_dim"] * x["dtype_bytes"]
        return moved / 1e6 if kind == "kv_transfer_mb" else moved / (x["link_gb_s"] * 1e6)
    save_per_token = 1 / x["prefill_tokens_per_s"] - x["kv_bytes_per_token"] / (x["tier_gb_s"] * 1e9)
    if kind == "kv_load_crossover":
        return x["overhead_s"] / save_per_token
    if kind == "kv_load_saving_ms":
        return (x["prompt_tokens"] * save_per_token - x["overhead_s"]) * 1e3
    raise KeyError(kind)


def predicted_gain(batching):
    lens, b = list(batching["output_lens"]), batching["batch_size"]
    static = sum(max(lens[i : i + b]) for i in range(0, len(lens), b))
    slots = [0] * min(b, len(lens))
    for n in lens:
        heapq.heappush(slots, heapq.heappop(slots) + n)
    return static / max(slots)


def batching_summary(lens, static, cont):
    def med(xs):
        xs = sorted(xs)
        m = len(xs) // 2
        return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2

    return {"gain": max(static) / max(cont), "p50_ratio": med(static) / med(cont)}


def chat_replicas(c):
    busy = c["prompt_tokens"] / c["prefill_tokens_per_s"] + c["output_tokens"] / c["decode_tokens_per_s"]
    return max(1, math.ceil(c["rate"] * busy / c["headroom"]))


def answers() -> dict:
    return {
        "gpus_needed": gpus_needed,
        "critical_batch": critical_batch,
        "batching_gain": batching_gain,
        "spec_expected_tokens": spec_expected_tokens,
        "spec_speedup": spec_speedup,
        "cost_per_million_tokens": cost_per_million_tokens,
        "answer_drill": answer_drill,
        "predicted_gain": predicted_gain,
        "batching_summary": batching_summary,
        "chat_replicas": chat_replicas,
    }


def _score(ans: dict, seed: int) -> dict:
    return {q.id: score_graded(q, ans, seed) for q in questions_for("11")}


@pytest.mark.parametrize("seed", SEEDS)
def test_solution_like_answers_score_full_marks(seed):
    for qid, r in _score(answers(), seed).items():
        assert r.earned == r.points, (qid, r)


def test_every_answer_is_a_function():
    for q in questions_for("11"):
        for name in q.answers:
            assert callable(answers()[name]), name


def test_stubs_and_references_score_zero():
    def stub(*a, **k):
        raise NotImplementedError

    assert sum(r.earned for r in _score({k: stub for k in answers()}, 3).values()) == 0
    # the drills' one-rate, weights-only calculators (the grader's since issue 47) answer other questions
    refs = dict(
        answers(),
        critical_batch=calc.critical_batch,
        spec_expected_tokens=calc.spec_expected_tokens,
        spec_speedup=calc.spec_speedup,
    )
    got = _score(refs, 3)
    for qid in ("11.critical_batch", "11.speculative"):
        assert got[qid].earned == 0, (qid, got[qid])


def test_memorised_submission_scores_nothing():
    s = lab_scenario("11", 0)
    solved = dict(answers())
    total = sum(q.points for q in questions_for("11"))
    fake = memorised_answers("11", solved)
    earned = sum(score_graded(q, fake, 7).earned for q in questions_for("11"))
    assert earned <= 0.1 * total, earned
    assert s["chat"]["prompt_tokens"] > 0


def test_wrong_models_fail():
    def steady_prediction(b):  # the steady-state model, no drain
        return batching_gain(b["output_lens"], b["batch_size"])

    def decode_only(c):  # the old chat sizing: prefill ignored
        return max(1, math.ceil(c["rate"] * c["output_tokens"] / (c["decode_tokens_per_s"] * c["headroom"])))

    def mean_not_median(lens, static, cont):
        return {"gain": max(static) / max(cont), "p50_ratio": sum(static) / sum(cont)}

    wrong = dict(
        answers(),
        predicted_gain=steady_prediction,
        chat_replicas=decode_only,
        batching_summary=mean_not_median,
        gpus_needed=gpus_needed_no_replication,
        critical_batch=critical_batch_weights_only,
        spec_expected_tokens=spec_one_rate,
    )
    for qid in (
        "11.predict_batching",
        "11.chat_replicas",
        "11.measured_batching",
        "11.gpus_needed",
        "11.critical_batch",
        "11.speculative",
    ):
        r = score_graded(get(qid), wrong, 3)
        assert r.earned < r.points, (qid, r)


def _simulated_gain(batching):  # lab 03's simulator at one unit per step: the prediction's own model
    from lab_utils.sim import ContinuousBatching, StaticBatching, StepCostModel, fixed_workload, simulate

    lens, b = list(batching["output_lens"]), int(batching["batch_size"])
    work = fixed_workload([int(batching["prompt_len"])] * len(lens), lens)
    cost = StepCostModel(fixed_s=1.0, per_token_s=0.0)
    ends = [
        max(r.finish_time for r in simulate(work, policy, cost).requests)
        for policy in (
            StaticBatching(batch_size=b),
            ContinuousBatching(max_num_seqs=b, max_num_batched_tokens=10**6),
        )
    ]
    return ends[0] / ends[1]


def _library_median_summary(lens, static, cont):
    import statistics

    return {"gain": max(static) / max(cont), "p50_ratio": statistics.median(static) / statistics.median(cont)}


def _replayed_drill(kind, inputs):  # a drill regenerated from its inputs carries its answer
    from lab_utils.drills import TOPICS, make_drills

    for seed in range(300):
        for d in make_drills(seed, n=len(TOPICS)):
            if d.kind == kind and d.inputs == dict(inputs):
                return d.answer
    return None


def test_library_shortcuts_score_zero():
    """The simulator that is the prediction's model, the median helpers, and drills replayed by the
    course's own generator are each forbidden where they would do a question's work."""
    b = lab_scenario("11", 3)["batching"]
    assert _simulated_gain(b) == pytest.approx(predicted_gain(b), rel=1e-9)  # it would be a bypass
    cases = {
        "11.predict_batching": dict(answers(), predicted_gain=_simulated_gain),
        "11.measured_batching": dict(answers(), batching_summary=_library_median_summary),
        "11.drill_answers": dict(answers(), answer_drill=_replayed_drill),
    }
    for qid, ans in cases.items():
        assert score_graded(get(qid), ans, 3).earned == 0, qid


_TORCH_SUMMARY = """
import torch


def batching_summary(output_lens, static_finish_s, continuous_finish_s):
    def med(xs):
        return float(torch.tensor(xs, dtype=torch.float64).FN(0.5))

    return {"gain": max(static_finish_s) / max(continuous_finish_s),
            "p50_ratio": med(static_finish_s) / med(continuous_finish_s)}
"""


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["quantile", "nanquantile"])
def test_a_batching_summary_built_on_torch_scores_zero_in_the_sandbox(tmp_path, fn):
    """torch's quantile (a method of a tensor, in C) interpolates the median in one call: the judge's
    sandbox replaces it by a stub that raises (the in-process watch sees only Python frames)."""
    ns = notebook_namespace(_TORCH_SUMMARY.replace("FN", fn))
    assert ns["batching_summary"]([1, 1], [1.0, 3.0], [1.0, 1.0])["p50_ratio"] == pytest.approx(2.0)
    results = judge_in_sandbox("11", {"batching_summary": ns["batching_summary"]}, tmp_path)
    assert results["11.measured_batching"].earned == 0, results["11.measured_batching"].message


_REPLAY = """
import random

from lab_utils.drills.topics import GENERATORS


def answer_drill(kind, inputs):
    for gen in GENERATORS.values():
        for seed in range(1500):
            spec = gen(random.Random(seed))
            if spec.kind == kind and spec.inputs == dict(inputs):
                return spec.answer
    return None
"""


@pytest.mark.slow
def test_drills_replayed_from_the_generators_table_score_zero_in_the_sandbox(tmp_path):
    """A drill regenerated until its inputs match carries its answer: 29 of 36 fresh drills come back
    from 3,000 seeds per topic in 2 s. The generators are forbidden, and the judge's call watch
    catches them even when reached through the module's GENERATORS table, not a module attribute."""
    from lab_utils.drills import make_drills

    ns = notebook_namespace(_REPLAY)
    d = make_drills(0, topics=["roofline"], n=1)[0]
    assert ns["answer_drill"](d.kind, d.inputs) == d.answer  # it works outside the sandbox
    results = judge_in_sandbox("11", {"answer_drill": ns["answer_drill"]}, tmp_path)
    r = results["11.drill_answers"]
    # the refusal names the generator as the course's own (lab_utils.grading.forbidden.refusal)
    assert r.earned == 0 and "is not allowed here" in r.message, r.message


def test_drill_answers_cover_the_moe_and_kv_transfer_kinds():
    """The hidden drill set draws every topic, so a solver that skips the MoE, MLA, expert-parallel
    and KV-transfer kinds loses marks, and one that calls the course's calculators for them earns 0."""

    def old_kinds_only(kind, x):
        return (
            None
            if kind.startswith(("moe_", "mla_", "ep_", "kv_transfer", "kv_load"))
            else answer_drill(kind, x)
        )

    r = score_graded(get("11.drill_answers"), dict(answers(), answer_drill=old_kinds_only), 3)
    assert 0 < r.earned < r.points, r

    # the drills' calculators are the grader's (grader/drill_calc.py, issue 47): nothing in the
    # learner's copy computes a drill's answer in one call
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lab_utils.drills.calc")


def test_drill_answers_cover_the_speculative_counters_and_rejection_kinds():
    """The hidden set draws the speculative topic three times: a solver without the counters and the
    rejection rule loses marks (the rejection-rule calculators are the grader's since issue 47)."""

    new = (
        "spec_tokens_from_counters",
        "spec_speedup_from_counters",
        "spec_accept_probability",
        "spec_residual_probability",
        "spec_acceptance_rate",
    )

    def without_new_kinds(kind, x):
        return None if kind in new else answer_drill(kind, x)

    lost = [
        score_graded(get("11.drill_answers"), dict(answers(), answer_drill=without_new_kinds), s)
        for s in SEEDS
    ]
    assert any(r.earned < r.points for r in lost), lost
