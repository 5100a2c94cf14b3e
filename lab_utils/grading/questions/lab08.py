"""Lab 08 — TensorRT-LLM as it is today: graded questions.

The scenario draws a model shape (lab_utils.drills.shapes), a catalogue GPU, a weight format, a KV
dtype, a sequence length and free_gpu_memory_fraction, one weight matrix of the course model with
three INT4 group sizes, and a set of legacy `trtllm-build` flags. Public checks try one or two fixed
cases; hidden checks re-run each function on cases drawn from the grader's seed and recompute every
value answer from the grader's scenario. The references here are written independently of
lab_utils.trtllm, which the notebook teaches with.
"""

from __future__ import annotations

import math

from lab_utils.grading.checks import close, frac_wrong, model_dict
from lab_utils.grading.registry import hidden, question, scenario
from lab_utils.trtllm.legacy import RENAMED
from lab_utils.trtllm.legacy import legacy_to_llm_api as _REF_LEGACY
from lab_utils.trtllm.plan import concurrent_sequences as _REF_SEQS

GiB = 1 << 30
PROJS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
# the predicted RMS error must match the uniform-rounding model to this relative tolerance
PREDICT_RTOL = 1e-3


@scenario("08")
def _(rng):
    from lab_utils.drills.shapes import MODELS

    spec = MODELS[rng.choice(["Llama-3-8B", "Mistral-7B-v0.1", "Qwen2.5-7B", "Qwen2.5-14B"])]
    legacy = {
        "max_batch_size": rng.choice([8, 16, 64, 128, 256]),
        "tp_size": rng.choice([1, 2, 4, 8]),
        "max_input_len": rng.choice([1024, 2048, 4096]),
        "max_output_len": rng.choice([256, 512, 1024]),
        "use_gpt_attention_plugin": "float16",
        "use_gemm_plugin": rng.choice(["float16", "disable"]),
        "tokens_per_block": rng.choice([32, 64, 128]),
        "kv_cache_free_gpu_mem_fraction": rng.choice([0.5, 0.8, 0.9, 0.95]),
    }
    if rng.random() < 0.5:
        legacy["enable_kv_cache_reuse"] = rng.choice([True, False])
    return {
        "model": model_dict(spec, "tie_word_embeddings"),
        "gpu": rng.choice(["L40S", "A100-80GB", "H100-80GB", "H200", "B200"]),
        "weights": rng.choice(["fp16", "fp8", "nvfp4", "int4_awq"]),
        "kv_dtype": rng.choice(["fp16", "fp8"]),
        "seq_len": rng.choice([2048, 4096, 8192, 16384]),
        "fraction": rng.choice([0.7, 0.8, 0.85, 0.9, 0.95]),
        "tokens_per_block": rng.choice([32, 64]),
        "other_gib": rng.choice([1.5, 2.0, 3.0]),
        "target_sequences": rng.choice([8, 16, 32, 64]),
        "layer": rng.randrange(30),
        "proj": rng.choice(PROJS),
        "group_sizes": sorted(rng.sample([16, 32, 64, 96, 192], 3)),
        "legacy_flags": legacy,
    }


# --- 08.group_quantize -------------------------------------------------------------------------


def _ref_group(w, bits, g):
    import torch

    qmax = 2 ** (bits - 1) - 1
    wg = w.reshape(w.shape[0], -1, g)
    scale = (wg.abs().amax(dim=2, keepdim=True) / qmax).clamp(min=1e-12)
    q = torch.clamp(torch.round(wg / scale), -qmax, qmax)
    return (q * scale).reshape(w.shape)


def _check_group(fn, w, bits, g) -> str | None:
    """None when fn's (q, scale) is valid and as accurate as the absmax scale; else what is wrong."""
    import torch

    out, inp = w.shape
    qmax = 2 ** (bits - 1) - 1
    q, scale = fn(w.clone(), bits, g)
    q = torch.as_tensor(q).double()
    scale = torch.as_tensor(scale).double()
    if tuple(q.shape) != (out, inp):
        return "q must have the weight's shape (out_features, in_features)"
    if tuple(scale.shape) != (out, inp // g):
        return "one scale per group: shape (out_features, in_features // group_size)"
    if not bool((q == q.round()).all()) or float(q.abs().max()) > qmax:
        return f"codes must be whole numbers in [-{qmax}, {qmax}] for {bits} bits"
    w_hat = (q.reshape(out, -1, g) * scale.unsqueeze(-1)).reshape(out, inp)
    err = (w.double() - w_hat).abs().reshape(out, -1, g)
    if not bool((err <= scale.abs().unsqueeze(-1) * (0.5 + 1e-4) + 1e-9).all()):
        return "some value is further than half a step from its code times the scale: round, do not truncate"
    mse = float((w.double() - w_hat).pow(2).mean())
    ref = float((w.double() - _ref_group(w, bits, g).double()).pow(2).mean())
    if mse > ref * 1.01 + 1e-15:
        return (
            "the error is larger than it needs to be: what is the smallest scale that still fits every value?"
        )
    return None


@question(
    "08.group_quantize",
    points=3,
    answers=["group_quantize"],
    forbid=[
        "lab_utils.trtllm.quant:group_quantize",
        "lab_utils.trtllm.quant:quantize",
        "lab_utils.trtllm.quant:fake_quantize",
        "lab_utils.trtllm.quant:quantize_per_channel",
        "lab_utils.trtllm.quant:awq_quantize",
    ],
)
def _(group_quantize):
    """Symmetric group-wise quantization: (codes, one scale per group of each row)."""
    import torch

    w = torch.tensor(
        [[0.1, -0.2, 0.3, -0.4, 1.0, 2.0, -3.0, 7.0], [0.0, 0.05, -0.05, 0.01, -8.0, 4.0, 2.0, 1.0]]
    )
    problem = _check_group(group_quantize, w, 4, 4)
    assert problem is None, problem
    g = torch.Generator().manual_seed(8)
    problem = _check_group(group_quantize, torch.randn(6, 64, generator=g), 8, 16)
    assert problem is None, problem


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


# --- 08.matrix_bytes ---------------------------------------------------------------------------


def _ref_bytes(inp, out, fmt, g=128):
    n = inp * out
    if fmt == "fp16":
        return 2 * n
    if fmt == "fp8":
        return n
    if fmt == "int4":
        return -(-n // 2) + out * -(-inp // g) * 2
    if fmt == "nvfp4":
        return -(-n // 2) + -(-n // 16) + 4
    raise ValueError(fmt)


@question(
    "08.matrix_bytes", points=2, answers=["matrix_bytes"], forbid=["lab_utils.trtllm.plan:nvfp4_matrix_bytes"]
)
def _(matrix_bytes):
    """Stored bytes of one (in x out) weight matrix in fp16, fp8, int4 (group scales) and nvfp4."""
    assert int(matrix_bytes(64, 4, "fp16")) == 512, "two bytes per 16-bit value"
    got = int(matrix_bytes(256, 8, "int4", 128))
    assert got > 256 * 8 // 2, "packed 4-bit values are not all: every group of every row keeps a scale"
    assert got == _ref_bytes(256, 8, "int4", 128), "two values per byte, one FP16 scale per group per row"
    got = int(matrix_bytes(64, 4, "nvfp4"))
    assert got != _ref_bytes(64, 4, "int4", 16), (
        "NVFP4's block scales are FP8, and the tensor has one more scale"
    )
    assert got == _ref_bytes(64, 4, "nvfp4"), (
        "packed FP4 values, an FP8 scale per 16 values, one FP32 per tensor"
    )


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


# --- 08.max_sequences (and the scenario's value) ---------------------------------------------


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


@question(
    "08.max_sequences",
    points=3,
    answers=["max_sequences", "scenario_sequences"],
    forbid=["lab_utils.trtllm.plan:concurrent_sequences", "lab_utils.memory.kv:kv_cache_num_blocks"],
)
def _(max_sequences, scenario_sequences):
    """Sequences whose KV cache fits under free_gpu_memory_fraction; and that count for SCENARIO."""
    got = int(max_sequences(1300, 200, 100, 0.5, 10, 8, 4))
    assert got != int(0.5 * 1300) // 80, (
        "the fraction applies to memory still FREE after weights and the rest"
    )
    assert got == 6, "a fraction of the free memory, cut into whole blocks; each sequence takes whole blocks"
    assert int(max_sequences(1300, 200, 100, 0.5, 10, 9, 4)) == 4, "a 9-token sequence needs 3 blocks of 4"
    assert int(scenario_sequences) >= 0, "scenario_sequences: a whole number computed from SCENARIO"


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


# --- 08.fraction_needed ------------------------------------------------------------------------


def _ref_fraction(gpu, weights, other, per_token, seq_len, tpb, n_seq):
    for k in range(1, 101):
        if _REF_SEQS(gpu, weights, other, k / 100, per_token, seq_len, tpb) >= n_seq:
            return k / 100
    return None


@question(
    "08.fraction_needed",
    points=2,
    answers=["fraction_needed"],
    forbid=["lab_utils.trtllm.plan:concurrent_sequences"],
)
def _(fraction_needed):
    """Smallest free_gpu_memory_fraction (in steps of 0.01) that fits n sequences, or None."""
    got = fraction_needed(1300, 200, 100, 10, 8, 4, 3)
    assert got is not None and 0 < float(got) <= 1, "3 sequences of 8 tokens fit in this GPU"
    assert close(got, 0.24), "the smallest fraction, in steps of 0.01, whose whole blocks hold them all"
    assert fraction_needed(1300, 200, 100, 10, 8, 4, 13) is None, "more than the whole free memory: None"


@hidden("08.fraction_needed")
def _(fraction_needed, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        case = (*_random_gpu(rng), rng.randint(100, 40_000), rng.choice([16, 32, 64]), rng.randint(1, 300))
        want, got = _ref_fraction(*case), fraction_needed(*case)
        wrong += (want is None) != (got is None) or (want is not None and not close(got, want, 1e-9))
    frac_wrong(wrong, n)


# --- 08.legacy_to_llm_api ----------------------------------------------------------------------

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


def _plain(obj):
    import json

    return json.loads(json.dumps(obj, default=str))


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


@question(
    "08.legacy_to_llm_api",
    points=3,
    answers=["legacy_to_llm_api"],
    forbid=["lab_utils.trtllm.legacy:legacy_to_llm_api"],
)
def _(legacy_to_llm_api):
    """Legacy trtllm-build / runtime flags as an LLM API option dict (nested where they belong)."""
    got = _plain(legacy_to_llm_api({"max_batch_size": 32, "tp_size": 2, "use_gemm_plugin": "float16"}))
    assert "use_gemm_plugin" not in got, (
        "plugin choices were TensorRT build switches: they have no LLM API option"
    )
    assert got == {"max_batch_size": 32, "tensor_parallel_size": 2}, "tp_size has a longer name today"
    got = _plain(legacy_to_llm_api({"tokens_per_block": 64, "max_input_len": 1000, "max_output_len": 24}))
    assert "tokens_per_block" not in got, "KV-cache settings live inside one sub-config"
    assert got == _REF_LEGACY({"tokens_per_block": 64, "max_input_len": 1000, "max_output_len": 24}), (
        "the engine's separate input and output limits became one limit on the whole sequence"
    )


@hidden("08.legacy_to_llm_api")
def _(legacy_to_llm_api, rng, scenario):
    cases = [dict(scenario["legacy_flags"])] + [_random_flags(rng) for _ in range(15)]
    wrong = sum(_plain(legacy_to_llm_api(dict(c))) != _plain(_REF_LEGACY(c)) for c in cases)
    frac_wrong(wrong, len(cases), "flag sets (the scenario's and unseen ones)")


# --- 08.predicted_rms (predict, then the lab measures) -------------------------------------------


def _ref_predict(w, bits, g):
    qmax = 2 ** (bits - 1) - 1
    scale = w.double().reshape(w.shape[0], -1, g).abs().amax(dim=2) / qmax
    return float((scale.pow(2).mean() / 12).sqrt())


def _course_matrix(layer: int, proj: str):
    from safetensors import safe_open

    from lab_utils.models import course_model_path

    with safe_open(str(course_model_path(verify=False) / "model.safetensors"), "pt") as f:
        return f.get_tensor(f"model.layers.{layer}.{proj}.weight").float()


@question(
    "08.predicted_rms",
    points=3,
    answers=["predict_rms_error", "predicted_rms"],
    forbid=["lab_utils.trtllm.quant:predict_rms_error"],
    predict=True,
)
def _(predict_rms_error, predicted_rms):
    """RMS rounding error predicted from group scales alone; and its values for SCENARIO's matrix."""
    import torch

    w = torch.tensor([[1.0, -1.0, 0.5, 0.25, 7.0, 0.0, 0.0, 0.0]])
    got = float(predict_rms_error(w, 4, 4))
    assert got > 0, "rounding always costs something when the scale is not zero"
    assert close(got, _ref_predict(w, 4, 4), 1e-6), (
        "each group's step is its scale; a rounding error spread evenly over one step has RMS step/sqrt(12)"
    )
    assert float(predict_rms_error(w, 4, 8)) > got, "one larger group takes the larger scale for everyone"
    vals = {int(k): float(v) for k, v in dict(predicted_rms).items()}
    assert len(vals) == 3 and all(v > 0 for v in vals.values()), (
        "predicted_rms: {group size: predicted RMS} for the three group sizes in SCENARIO"
    )


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


# --- 08.quant_run (measured) -------------------------------------------------------------------


@question("08.quant_run", points=2, answers=["quant_run", "best_int4"])
def _(quant_run, best_int4):
    """The stamped measurement of the lab's schemes; and the INT4 scheme with the lowest perplexity."""
    names = [str(s) for s in quant_run.schemes]
    assert names and names[0] == "float32", "quant_run: the object measure_schemes returned, float32 first"
    assert str(best_int4) in names and str(best_int4).startswith("int4"), (
        "best_int4: the name of an INT4 scheme in quant_run, picked from its measured perplexities"
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
