"""Lab 01: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab01`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.checks import close, frac_wrong, partial
from lab_utils.grading.registry import lab_scenario

GiB = 1 << 30
SMOL_KV = (30, 3, 64)  # SmolLM2-135M (the model the lab starts in vLLM): layers, KV heads, head_dim
VLLM_RTOL = 0.005  # stated in the lab: the vLLM prediction must match to this relative tolerance


# --- references (independent of lab_utils.memory / grader.drill_calc) ----------------------


def _kv(layers, kv_heads, head_dim, nbytes) -> int:
    return 2 * layers * kv_heads * head_dim * nbytes


def _capacity(kv_bytes, per_token, block, max_len):
    blocks = int(kv_bytes) // (block * per_token)
    need = -(-max_len // block)
    if blocks - 1 < need:
        return None
    conc = blocks / need
    return int(conc * max_len), conc


def _plan(total, usable, heads, kv_heads, per_node=8):
    degrees = [t for t in range(1, per_node + 1) if heads % t == 0 and kv_heads % t == 0]
    for t in degrees:
        if total / t <= usable:
            return t, 1
    t = degrees[-1]
    return t, math.ceil(total / (t * usable))


def _decode(batch, weights, kv_seq, flops_seq, bw, peak):
    mem = (weights + batch * kv_seq) / bw
    comp = batch * flops_seq / peak
    return batch / max(mem, comp), ("memory" if mem >= comp else "compute")


def _expected(alpha, k):
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def _ttft(params, prompt, tflops, mfu, tp, pp):
    return 2 * params * prompt / (tp * tflops * 1e12 * mfu)


def _scenarios(rng, scenario, n):
    """The run's own scenario, then n - 1 the grader draws (other models, GPUs, workloads)."""
    return [dict(scenario)] + [lab_scenario("01", rng.randrange(2**31)) for _ in range(n - 1)]


def _spec(scen: dict):
    from lab_utils.memory import ModelSpec

    return ModelSpec(**scen["model"])


def _nbytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}[dtype]


def _request_kv(cfg, n, nbytes):
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    held = sum(min(n, cfg["sliding_window"]) if t == "sliding_attention" else n for t in types)
    return 2 * kv * hd * nbytes * held


def _kv_config(rng) -> dict:
    """A config as config.json has it: some fields left out, some models with sliding-window layers."""
    kv = rng.choice([1, 2, 4, 8, 16])
    heads = kv * rng.choice([1, 2, 4])
    hd = rng.choice([64, 128, 256])
    layers = rng.randint(4, 64)
    cfg = {"num_hidden_layers": layers, "hidden_size": heads * hd, "num_attention_heads": heads}
    if rng.random() < 0.8:
        cfg["num_key_value_heads"] = kv
    if rng.random() < 0.3:  # a head_dim that is not hidden_size // heads (Gemma 3, Qwen3)
        cfg["head_dim"] = hd // 2
    kind = rng.random()
    if kind < 0.7:  # mixed layers: every k-th full (Gemma 3: 6, gpt-oss: 2) or a random mix
        k = rng.choice([2, 4, 6])
        cfg["layer_types"] = [
            "full_attention" if (i + 1) % k == 0 else "sliding_attention" for i in range(layers)
        ]
        cfg["sliding_window"] = rng.choice([128, 512, 1024, 4096])
    elif kind < 0.85:  # a window in the config, switched off (Qwen2): no layer_types
        cfg["sliding_window"] = rng.choice([4096, 32768])
        cfg["use_sliding_window"] = False
    return cfg


@hidden("01.kv_bytes_per_token")
def _(kv_bytes_per_token, request_kv_bytes, rng, scenario):
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
    wrong, n = 0, 16
    for _ in range(n):
        cfg, nbytes = _kv_config(rng), rng.choice([1, 2, 4])
        tokens = rng.choice([1, 100, 1000, 5000, 32_768, 131_072])
        try:
            wrong += int(request_kv_bytes(dict(cfg), tokens, nbytes)) != _request_kv(cfg, tokens, nbytes)
        except (TypeError, ValueError):
            wrong += 1
    return partial(n - wrong, n, "configs and request lengths")


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
    frac_wrong(wrong, n, "unseen KV budgets")
    wrong = 0
    settings = [dict(scenario["vllm"])] + [
        {
            "kv_cache_gib": rng.choice([0.25, 0.5, 1, 2, 3]),
            "dtype": rng.choice(["float32", "bfloat16"]),
            "block_size": rng.choice([16, 32, 128]),
            "max_model_len": rng.randint(200, 40_000),
        }
        for _ in range(11)
    ]
    for v in settings:
        want = _capacity(
            v["kv_cache_gib"] * GiB, _kv(*SMOL_KV, _nbytes(v["dtype"])), v["block_size"], v["max_model_len"]
        )
        got = predicted_vllm(dict(v))
        if want is None or got is None:
            wrong += (want is None) != (got is None)
        else:
            tokens, conc = got
            wrong += not (close(tokens, want[0], VLLM_RTOL) and close(conc, want[1], VLLM_RTOL))
    return partial(len(settings) - wrong, len(settings), "vLLM settings for the course model")


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
    frac_wrong(wrong, n, "unseen memory needs")
    from lab_utils.memory import GPUS, weight_bytes

    wrong, cases = 0, _scenarios(rng, scenario, 20)
    for s in cases[
        1:
    ]:  # workloads from one request to hundreds of long ones: plans from (1, 1) to many nodes
        s["concurrent_requests"] = rng.choice([4, 32, 128, 256, 512, 1024])
        s["context_tokens"] = rng.choice([8192, 32768, 131072])
    for s in cases:
        spec = _spec(s)
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
        try:
            wrong += tuple(map(int, scenario_plan(dict(s)))) not in ok
        except (TypeError, ValueError):
            wrong += 1
    return partial(len(cases) - wrong, len(cases), "scenarios")


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
    wrong, scen = 0, [dict(scenario)]
    for _ in range(11):
        scen.append(
            {
                **scenario,
                "spec_alpha": round(rng.uniform(0.3, 0.95), 2),
                "spec_k": rng.randint(1, 8),
                "draft_cost_ratio": rng.choice([0.01, 0.02, 0.05, 0.1, 0.2, 0.3]),
            }
        )
    for s in scen:
        want = _expected(s["spec_alpha"], s["spec_k"]) / (1 + s["spec_k"] * s["draft_cost_ratio"])
        wrong += not close(scenario_spec_speedup(dict(s)), want, 1e-3)
    return partial(len(scen) - wrong, len(scen), "scenarios")


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

    wrong, scen = 0, _scenarios(rng, scenario, 10)
    for s in scen:
        tp, pp = s["ttft_parallel"]
        want = _ttft(
            _spec(s).non_embedding_params, s["prompt_tokens"], GPUS[s["gpu"]].bf16_tflops, s["mfu"], tp, pp
        )
        wrong += not close(scenario_ttft_s(dict(s)), want, 1e-3)
    return partial(len(scen) - wrong, len(scen), "scenarios")
