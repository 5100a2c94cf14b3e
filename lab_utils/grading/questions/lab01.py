"""Lab 01 — GPU memory math, parallelism, decode and prefill limits: graded questions.

The scenario draws a real model shape (lab_utils.drills.shapes, copied from the Hub configs), a
catalogue GPU (lab_utils.memory.GPUS), precisions, a workload and the settings of the lab's real
vLLM run. Public checks try one or two fixed cases; hidden checks re-run each function on cases
drawn from the grader's seed; an answer about the scenario is a function of it, called on scenarios
the grader draws. The references live on the instructor's side (grader/hidden/lab01.py).
"""

from __future__ import annotations

import math

from lab_utils.grading.checks import close, model_dict
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import lab_scenario, question, scenario

GiB = 1 << 30


@scenario("01")
def _(rng):
    from lab_utils.drills.shapes import MODELS

    spec = MODELS[rng.choice(sorted(MODELS))]
    return {
        "model": model_dict(spec),
        "gpu": rng.choice(["L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200"]),
        "weights": rng.choice(["bfloat16", "fp8"]),
        "kv_cache_dtype": rng.choice(["bfloat16", "fp8"]),
        "concurrent_requests": rng.choice([8, 16, 32, 64]),
        "context_tokens": rng.choice([4096, 8192, 16384]),
        "gpu_memory_utilization": 0.9,
        "reserve_gib": rng.choice([2.0, 3.0, 4.0]),  # activations + CUDA context per GPU
        "gpus_per_node": 8,
        "prompt_tokens": rng.choice([1024, 2048, 4096, 8192]),
        "mfu": rng.choice([0.3, 0.4, 0.5]),
        "ttft_parallel": list(rng.choice([(1, 1), (2, 1), (4, 1), (2, 2), (1, 4), (8, 1), (4, 2)])),
        "spec_alpha": rng.choice([0.5, 0.6, 0.7, 0.8, 0.9]),
        "spec_k": rng.choice([2, 3, 4, 5, 7]),
        "draft_cost_ratio": rng.choice([0.02, 0.05, 0.1, 0.2]),
        "vllm": {
            "kv_cache_gib": rng.choice([1, 2]),
            "dtype": "float32",
            "block_size": 128,
            "max_model_len": rng.choice([n for n in range(1000, 4001, 50) if n % 128]),
        },
    }


# --- 01.kv_bytes_per_token -------------------------------------------------------------------


@question(
    "01.kv_bytes_per_token",
    points=3,
    answers=["kv_bytes_per_token", "request_kv_bytes"],
    forbid=refs("kv_per_token"),
)
def _(kv_bytes_per_token, request_kv_bytes):
    """KV-cache bytes one token occupies, from layers, KV heads, head_dim and bytes per element; and
    request_kv_bytes(config, num_tokens, dtype_bytes): what one request holds, sliding-window layers too."""
    one = int(kv_bytes_per_token(1, 1, 1, 1))
    assert one != 1, "a token stores two vectors per layer and KV head"
    big = int(kv_bytes_per_token(32, 8, 128, 2))
    assert big == 32 * 8 * 128 * 2 * one, "every layer stores its own keys and values for every KV head"
    full = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
    a, b = int(request_kv_bytes(dict(full), 100, 2)), int(request_kv_bytes(dict(full), 200, 2))
    assert a > 0 and b == 2 * a, "with full attention in every layer, a request's KV grows with every token"
    mixed = {**full, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"] * 2}
    m1, m2 = int(request_kv_bytes(dict(mixed), 100, 2)), int(request_kv_bytes(dict(mixed), 200, 2))
    assert m1 < a and a < m2 < b, "a sliding-window layer never needs keys and values older than its window"


# --- 01.vllm_capacity (predict, then vLLM measures) ------------------------------------------


@question(
    "01.vllm_capacity",
    points=3,
    answers=["vllm_capacity", "predicted_vllm"],
    forbid=refs("vllm_capacity"),
    predict=True,
)
def _(vllm_capacity, predicted_vllm):
    """vLLM's logged (KV tokens, max concurrency), or None when it refuses; and predicted_vllm(settings)
    for the course model."""
    got = vllm_capacity(GiB, 46_080, 128, 2000)
    assert got is not None, "1 GiB holds many 2,000-token requests of this model: vLLM starts"
    tokens, conc = got
    assert float(conc) > 1, "several requests fit at once"
    assert int(tokens) != GiB // 46_080, "vLLM hands out whole blocks; a partial block is never used"
    assert vllm_capacity(GiB, 46_080, 128, 32_768) is None, (
        "return None when one request of max_model_len cannot fit (remember the block vLLM keeps back)"
    )
    settings = {"kv_cache_gib": 1, "dtype": "float32", "block_size": 128, "max_model_len": 2000}
    pred = predicted_vllm(dict(settings))
    assert pred is not None, "predicted_vllm(settings): 1 GiB holds a 2,000-token request of the course model"
    tokens, conc = pred
    assert int(tokens) > 0 and float(conc) > 1, (
        "predicted_vllm(settings): (KV cache tokens, max concurrency) for the course model"
    )


# --- 01.parallel_plan ------------------------------------------------------------------------


@question(
    "01.parallel_plan",
    points=3,
    answers=["parallel_plan", "scenario_plan"],
)
def _(parallel_plan, scenario_plan):
    """(tensor-parallel, pipeline-parallel) degrees for a memory need; and scenario_plan(scenario)."""
    tp, pp = map(int, parallel_plan(100.0, 70.0, 64, 8))
    assert pp == 1, "one node can hold this: stay within tensor parallelism"
    assert tp != 1, "100 GiB does not fit in 70 GiB"
    assert 64 % tp == 0 and 8 % tp == 0, "a degree must split the query heads and the KV heads evenly"
    tp, pp = map(int, parallel_plan(900.0, 60.0, 64, 8))
    assert tp <= 8, "tensor parallelism stays inside one node (NVLink): at most gpus_per_node"
    assert tp * pp * 60.0 >= 900.0, "all the GPUs together must hold the weights and the KV cache"
    assert tp * (pp - 1) * 60.0 < 900.0, "past one node, add pipeline stages, as few as fit"
    tp, pp = map(int, scenario_plan(lab_scenario("01", 0)))
    assert tp >= 1 and pp >= 1, "scenario_plan(scenario): (tp, pp), two positive whole numbers"


# --- 01.decode_roofline ----------------------------------------------------------------------


@question(
    "01.decode_roofline",
    points=2,
    answers=["decode_step"],
    forbid=refs("roofline"),
)
def _(decode_step):
    """Decode tokens/s of one step and which roof limits it ("memory" or "compute")."""
    rate, bound = decode_step(1, 16e9, 1e8, 16e9, 3.35e12, 989e12)
    assert str(bound) == "memory", "at batch 1 each weight byte read does very little arithmetic"
    assert 100 < float(rate) < 3.35e12 / 16e9, "one step reads the weights once plus each sequence's KV cache"
    rate2, bound2 = decode_step(4096, 1e9, 0.0, 2e9, 1e12, 1e14)
    assert str(bound2) == "compute", "with a huge batch and no KV reads the arithmetic dominates"
    assert float(rate2) > float(decode_step(2048, 1e9, 0.0, 2e9, 1e12, 1e14)[0]) * 0.99, (
        "more sequences per step never lowers tokens/s in this model"
    )


# --- 01.spec_decode --------------------------------------------------------------------------


@question(
    "01.spec_decode",
    points=2,
    answers=["expected_tokens_per_pass", "scenario_spec_speedup"],
)
def _(expected_tokens_per_pass, scenario_spec_speedup):
    """Expected tokens per target pass with k drafts accepted with probability alpha; the speed-up of a
    scenario."""
    assert close(expected_tokens_per_pass(0.0, 4), 1.0), (
        "even when every draft is rejected, the target's own pass still yields a token"
    )
    half = float(expected_tokens_per_pass(0.5, 1))
    assert 1 < half < 2, "one draft, accepted half the time, adds less than one token"
    assert float(expected_tokens_per_pass(0.8, 5)) > float(expected_tokens_per_pass(0.8, 2)), (
        "more drafts can only add expected tokens"
    )
    s = float(scenario_spec_speedup(lab_scenario("01", 0)))
    assert math.isfinite(s) and 0 < s < 10, "scenario_spec_speedup(scenario): a ratio of tokens per unit time"


# --- 01.prefill_ttft -------------------------------------------------------------------------


@question(
    "01.prefill_ttft",
    points=2,
    answers=["prefill_ttft_s", "scenario_ttft_s"],
    forbid=refs("prefill_flops"),
)
def _(prefill_ttft_s, scenario_ttft_s):
    """Compute-bound prefill time on tp x pp GPUs; and scenario_ttft_s(scenario)."""
    one = float(prefill_ttft_s(8e9, 4096, 989, 0.5, 1, 1))
    assert math.isfinite(one) and 0 < one < 10, "seconds: a few hundred ms for 4k tokens of an 8B model"
    assert close(prefill_ttft_s(8e9, 8192, 989, 0.5, 2, 1), one), (
        "twice the prompt on twice the tensor-parallel GPUs: the same time"
    )
    assert close(prefill_ttft_s(8e9, 4096, 989, 0.5, 1, 4), one), (
        "pipeline stages run one after another for a single prompt: they add GPUs, not speed, here"
    )
    t = float(scenario_ttft_s(lab_scenario("01", 0)))
    assert math.isfinite(t) and t > 0, "scenario_ttft_s(scenario): seconds, positive"
