"""Lab 08: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab08`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.checks import close, frac_wrong
from lab_utils.grading.questions.lab08 import _check_group, _plain, _ref_bytes, _ref_predict
from lab_utils.trtllm.legacy import RENAMED
from lab_utils.trtllm.legacy import legacy_to_llm_api as _REF_LEGACY
from lab_utils.trtllm.plan import concurrent_sequences as _REF_SEQS

GiB = 1 << 30


PREDICT_RTOL = 1e-3


@hidden("08.group_quantize")
def _(group_quantize, rng, scenario):
    import torch

    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    wrong, n = 0, 16
    for _ in range(n):
        g = rng.choice([8, 16, 32, 64, 128])
        w = torch.randn(rng.randint(1, 40), g * rng.randint(1, 8), generator=gen) * rng.choice(
            [0.01, 1.0, 30.0]
        )
        if rng.random() < 0.5:  # an outlier somewhere
            w[rng.randrange(w.shape[0]), rng.randrange(w.shape[1])] *= 50
        try:
            wrong += _check_group(group_quantize, w, rng.choice([2, 3, 4, 8]), g) is not None
        except Exception:
            wrong += 1
    frac_wrong(wrong, n, "unseen random matrices")


@hidden("08.matrix_bytes")
def _(matrix_bytes, rng, scenario):
    wrong, n = 0, 24
    for _ in range(n):
        fmt = rng.choice(["fp16", "fp8", "int4", "nvfp4"])
        inp, out, g = (
            rng.choice([576, 1536, 4096, 5120, 14336, 3000]),
            rng.randint(1, 20000),
            rng.choice([32, 64, 128]),
        )
        wrong += int(matrix_bytes(inp, out, fmt, g)) != _ref_bytes(inp, out, fmt, g)
    frac_wrong(wrong, n)


def _spec(scen):
    from lab_utils.memory import ModelSpec

    return ModelSpec(**scen["model"])


def _scenario_inputs(scen):
    """(gpu bytes, weight bytes, other bytes, kv bytes per token) for the scenario, computed here."""
    from lab_utils.memory import GPUS

    spec = _spec(scen)
    rest = (spec.embedding_params + spec.small_params) * 2
    mats = [(i, o) for i, o in spec.linear_shapes()]
    if scen["weights"] == "fp16":
        w = spec.num_params * 2
    elif scen["weights"] == "fp8":
        w = spec.linear_params + rest
    elif scen["weights"] == "nvfp4":
        w = rest + spec.num_layers * sum(_ref_bytes(i, o, "nvfp4") for i, o in mats)
    else:  # int4_awq as lab 01 counts it: packed values, FP16 scale and 4-bit zero per group of 128 rows

        def awq(i, o):
            groups = -(-i // 128)
            return -(-i * o // 2) + groups * o * 2 + -(-groups * o // 2)

        w = rest + spec.num_layers * sum(awq(i, o) for i, o in mats)
    per_token = (
        2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * (1 if scen["kv_dtype"] == "fp8" else 2)
    )
    return GPUS[scen["gpu"]].memory_bytes, w, int(scen["other_gib"] * GiB), per_token


def _random_gpu(rng) -> tuple[int, int, int, int]:
    """An unseen case's memory: GPU bytes, weight bytes, other bytes, KV bytes per token."""
    per_token = 2 * rng.randint(1, 80) * rng.choice([1, 2, 8]) * 128 * rng.choice([1, 2])
    return (
        rng.choice([24, 48, 80, 141]) * GiB,
        rng.randint(1, 60) * GiB // 2,
        rng.randint(1, 4) * GiB,
        per_token,
    )


@hidden("08.max_sequences")
def _(max_sequences, scenario_sequences, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        gpu, weights, other, per_token = _random_gpu(rng)
        fraction = rng.choice([0.5, 0.7, 0.9, 0.95])
        case = (gpu, weights, other, fraction, per_token, rng.randint(100, 40_000), rng.choice([16, 32, 64]))
        wrong += int(max_sequences(*case)) != _REF_SEQS(*case)
    frac_wrong(wrong, n)
    gpu, w, other, per_token = _scenario_inputs(scenario)
    want = _REF_SEQS(
        gpu, w, other, scenario["fraction"], per_token, scenario["seq_len"], scenario["tokens_per_block"]
    )
    assert int(scenario_sequences) == want, "scenario_sequences is not the count for this run's SCENARIO"


def _ref_fraction(gpu, weights, other, per_token, seq_len, tpb, n_seq):
    for k in range(1, 101):
        if _REF_SEQS(gpu, weights, other, k / 100, per_token, seq_len, tpb) >= n_seq:
            return k / 100
    return None


@hidden("08.fraction_needed")
def _(fraction_needed, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        case = (*_random_gpu(rng), rng.randint(100, 40_000), rng.choice([16, 32, 64]), rng.randint(1, 300))
        want, got = _ref_fraction(*case), fraction_needed(*case)
        wrong += (want is None) != (got is None) or (want is not None and not close(got, want, 1e-9))
    frac_wrong(wrong, n)


_DROPPED = (  # a few of lab_utils.trtllm.legacy.LEGACY_DROPPED, drawn into random flag sets
    "use_gpt_attention_plugin",
    "use_gemm_plugin",
    "use_rmsnorm_plugin",
    "enable_context_fmha",
    "use_paged_context_fmha",
    "remove_input_padding",
    "paged_kv_cache",
    "multiple_profiles",
)


def _random_flags(rng):
    flags = {}
    for k in rng.sample(sorted(RENAMED), rng.randint(2, 7)):
        if k == "kv_cache_free_gpu_mem_fraction":
            flags[k] = rng.choice([0.5, 0.8, 0.9])
        elif k in ("enable_kv_cache_reuse", "enable_chunked_context"):
            flags[k] = rng.choice([True, False])
        elif k == "dtype":
            flags[k] = rng.choice(["float16", "bfloat16"])
        elif k == "kv_cache_dtype":
            flags[k] = "fp8"
        else:
            flags[k] = rng.choice([1, 2, 4, 8, 32, 64, 256, 4096, 8192])
    for k in rng.sample(_DROPPED, rng.randint(0, 3)):
        flags[k] = rng.choice(["float16", "enable", True])
    if "max_seq_len" not in flags and rng.random() < 0.5:
        flags["max_input_len"], flags["max_output_len"] = rng.choice([512, 2048]), rng.choice([128, 1024])
    return flags


@hidden("08.legacy_to_llm_api")
def _(legacy_to_llm_api, rng, scenario):
    cases = [dict(scenario["legacy_flags"])] + [_random_flags(rng) for _ in range(15)]
    wrong = sum(_plain(legacy_to_llm_api(dict(c))) != _plain(_REF_LEGACY(c)) for c in cases)
    frac_wrong(wrong, len(cases), "flag sets (the scenario's and unseen ones)")


def _course_matrix(layer: int, proj: str):
    from safetensors import safe_open

    from lab_utils.models import course_model_path

    with safe_open(str(course_model_path(verify=False) / "model.safetensors"), "pt") as f:
        return f.get_tensor(f"model.layers.{layer}.{proj}.weight").float()


@hidden("08.predicted_rms")
def _(predict_rms_error, predicted_rms, rng, scenario):
    import torch

    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    wrong, n = 0, 10
    for _ in range(n):
        g = rng.choice([8, 16, 32, 64])
        w = torch.randn(rng.randint(1, 30), g * rng.randint(1, 6), generator=gen) * rng.choice([0.02, 1.0])
        bits = rng.choice([3, 4, 8])
        wrong += not close(predict_rms_error(w, bits, g), _ref_predict(w, bits, g), 1e-6)
    frac_wrong(wrong, n)
    w = _course_matrix(scenario["layer"], scenario["proj"])
    got = {int(k): float(v) for k, v in dict(predicted_rms).items()}
    assert sorted(got) == sorted(scenario["group_sizes"]), "predicted_rms must cover SCENARIO['group_sizes']"
    for g in scenario["group_sizes"]:
        assert close(got[g], _ref_predict(w, 4, g), PREDICT_RTOL), (
            "predicted_rms does not match the rounding model for this run's SCENARIO matrix"
        )


@hidden("08.quant_run")
def _(quant_run, best_int4, rng, scenario):
    from lab_utils.grading.provenance import verify

    assert verify(quant_run), "quant_run was not produced by measure_schemes in this run"
    names = list(quant_run.schemes)
    for g in scenario["group_sizes"]:
        assert f"int4 g{g}" in names, "quant_run must measure the INT4 group sizes in SCENARIO"
    ppl = {s: math.exp(sum(nll) / len(nll)) for s, nll in zip(names, quant_run.nll) if s.startswith("int4")}
    assert str(best_int4) == min(ppl, key=ppl.get), (
        "best_int4 is not the lowest-perplexity INT4 scheme measured"
    )
