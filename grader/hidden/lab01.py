"""Lab 01: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab01`.
"""

from __future__ import annotations

from grader.registry import hidden
from lab_utils.grading.checks import close, frac_wrong
from lab_utils.grading.questions.lab01 import GiB, _capacity, _decode, _expected, _kv, _plan, _ttft

SMOL_KV = (30, 3, 64)


VLLM_RTOL = 0.005


def _spec(scen: dict):
    from lab_utils.memory import ModelSpec

    return ModelSpec(**scen["model"])


def _nbytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}[dtype]


@hidden("01.kv_bytes_per_token")
def _(kv_bytes_per_token, rng, scenario):
    cases = [
        (
            rng.randint(1, 96),
            rng.choice([1, 2, 4, 8, 16]),
            rng.choice([64, 80, 96, 128, 256]),
            rng.choice([1, 2, 4]),
        )
        for _ in range(20)
    ]
    frac_wrong(sum(int(kv_bytes_per_token(*c)) != _kv(*c) for c in cases), len(cases))


@hidden("01.vllm_capacity")
def _(vllm_capacity, predicted_vllm, rng, scenario):
    wrong, n = 0, 24
    for i in range(n):
        per_token = _kv(
            rng.randint(2, 80), rng.choice([1, 2, 4, 8]), rng.choice([64, 128]), rng.choice([1, 2, 4])
        )
        block = rng.choice([16, 32, 128])
        max_len = rng.randint(100, 20_000)
        need = -(-max_len // block)
        if i % 4 == 0:  # right at the edge: exactly the request's blocks, or one more (the null block)
            blocks = need + rng.choice([0, 1])
        else:
            blocks = rng.randint(max(1, need // 2), need * 40)
        kv = blocks * block * per_token + rng.randrange(block * per_token)
        want, got = _capacity(kv, per_token, block, max_len), vllm_capacity(kv, per_token, block, max_len)
        if want is None or got is None:
            wrong += (want is None) != (got is None)
        else:
            wrong += int(got[0]) != want[0] or not close(got[1], want[1], 1e-9)
    frac_wrong(wrong, n)
    v = scenario["vllm"]
    want = _capacity(
        v["kv_cache_gib"] * GiB, _kv(*SMOL_KV, _nbytes(v["dtype"])), v["block_size"], v["max_model_len"]
    )
    tokens, conc = predicted_vllm
    assert close(tokens, want[0], VLLM_RTOL) and close(conc, want[1], VLLM_RTOL), (
        "predicted_vllm is not what vLLM reports for this run's SCENARIO['vllm'] settings"
    )


@hidden("01.parallel_plan")
def _(parallel_plan, scenario_plan, rng, scenario):
    from lab_utils.drills.shapes import MODELS

    shapes = [(s.num_attention_heads, s.num_kv_heads) for s in MODELS.values()] + [
        (28, 4),
        (40, 8),
        (32, 32),
        (12, 4),
        (9, 3),
        (16, 2),
        (48, 6),
    ]
    wrong, n = 0, 24
    for _ in range(n):
        heads, kv = rng.choice(shapes)
        usable = rng.choice([14.0, 20.0, 39.0, 66.0, 70.0, 125.0])
        total = usable * rng.uniform(0.3, 30.0)
        wrong += tuple(map(int, parallel_plan(total, usable, heads, kv))) != _plan(total, usable, heads, kv)
    frac_wrong(wrong, n)
    from lab_utils.memory import GPUS, weight_bytes

    spec, s = _spec(scenario), scenario
    total = (
        weight_bytes(spec, s["weights"])
        + s["concurrent_requests"]
        * s["context_tokens"]
        * _kv(spec.num_layers, spec.num_kv_heads, spec.head_dim, _nbytes(s["kv_cache_dtype"]))
    ) / GiB
    usable = s["gpu_memory_utilization"] * GPUS[s["gpu"]].memory_bytes / GiB - s["reserve_gib"]
    ok = {
        _plan(total * f, usable, spec.num_attention_heads, spec.num_kv_heads, s["gpus_per_node"])
        for f in (1 - 1e-9, 1.0, 1 + 1e-9)
    }
    assert tuple(map(int, scenario_plan)) in ok, "scenario_plan is not the plan for this run's SCENARIO"


@hidden("01.decode_roofline")
def _(decode_step, rng, scenario):
    wrong, n = 0, 24
    for _ in range(n):
        args = (
            rng.choice([1, 2, 8, 32, 128, 512, 2048]),
            rng.uniform(0.3e9, 150e9),
            rng.uniform(0, 4e9),
            rng.uniform(0.3e9, 150e9),
            rng.uniform(0.3e12, 8e12),
            rng.uniform(50e12, 2.5e15),
        )
        rate, bound = decode_step(*args)
        want_rate, want_bound = _decode(*args)
        wrong += not close(rate, want_rate) or str(bound) != want_bound
    frac_wrong(wrong, n)


@hidden("01.spec_decode")
def _(expected_tokens_per_pass, scenario_spec_speedup, rng, scenario):
    cases = [(round(rng.uniform(0.05, 0.98), 3), rng.randint(1, 10)) for _ in range(16)] + [
        (1.0, rng.randint(2, 8))
    ]
    frac_wrong(sum(not close(expected_tokens_per_pass(a, k), _expected(a, k)) for a, k in cases), len(cases))
    s = scenario
    want = _expected(s["spec_alpha"], s["spec_k"]) / (1 + s["spec_k"] * s["draft_cost_ratio"])
    assert close(scenario_spec_speedup, want, 1e-3), (
        "scenario_spec_speedup is not the speed-up for this run's SCENARIO (alpha, k, draft cost)"
    )


@hidden("01.prefill_ttft")
def _(prefill_ttft_s, scenario_ttft_s, rng, scenario):
    cases = [
        (
            rng.uniform(0.1e9, 400e9),
            rng.randint(16, 32_768),
            rng.choice([121, 312, 362, 989, 2250]),
            rng.uniform(0.2, 0.7),
            rng.choice([1, 2, 4, 8]),
            rng.choice([1, 2, 4]),
        )
        for _ in range(16)
    ]
    frac_wrong(sum(not close(prefill_ttft_s(*c), _ttft(*c)) for c in cases), len(cases))
    from lab_utils.memory import GPUS

    s = scenario
    tp, pp = s["ttft_parallel"]
    want = _ttft(
        _spec(s).non_embedding_params, s["prompt_tokens"], GPUS[s["gpu"]].bf16_tflops, s["mfu"], tp, pp
    )
    assert close(scenario_ttft_s, want, 1e-3), "scenario_ttft_s is not the TTFT for this run's SCENARIO"
