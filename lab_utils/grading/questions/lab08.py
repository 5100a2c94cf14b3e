"""Lab 08 — TensorRT-LLM as it is today: graded questions.

The scenario draws a model shape (lab_utils.drills.shapes), a catalogue GPU, a weight format, a KV
dtype, a sequence length and free_gpu_memory_fraction, one weight matrix of the course model with
three INT4 group sizes, a set of legacy `trtllm-build` flags, and the memory budget and greedy
agreement an INT4 checkpoint must meet. Every answer is a function: public checks try one or two
fixed cases and properties; hidden checks (grader/hidden/lab08.py, with the references) call each
function on cases and scenarios drawn from the grader's key.
"""

from __future__ import annotations

from lab_utils.grading.checks import close, model_dict
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario

PROJS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
# the predicted RMS error must match the uniform-rounding model to this relative tolerance


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
        # what the INT4 checkpoint must meet: weight memory (MB, 16-bit rest included) and agreement
        "int4_budget_mb": rng.choice([111.5, 113.5, 117.0, 125.0]),
        "min_agreement": rng.choice([0.0, 0.2, 0.3]),
    }


# --- 08.group_quantize -------------------------------------------------------------------------


def _check_group(fn, w, bits, g) -> str | None:
    """None when fn's (q, scale) is valid and uses the smallest scale that fits; else what is wrong.

    (The hidden check also compares the error with a reference quantizer's.)"""
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
    big = w.double().reshape(out, -1, g).abs().amax(dim=2) > 1e-9
    if bool((q.reshape(out, -1, g).abs().amax(dim=2)[big] < qmax).any()):
        return (
            "the error is larger than it needs to be: what is the smallest scale that still fits every value?"
        )
    return None


@question(
    "08.group_quantize",
    points=3,
    answers=["group_quantize"],
    forbid=refs("quantizers"),
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


# --- 08.matrix_bytes ---------------------------------------------------------------------------


@question("08.matrix_bytes", points=2, answers=["matrix_bytes"], forbid=refs("quantized_bytes"))
def _(matrix_bytes):
    """Stored bytes of one (in x out) weight matrix in fp16, fp8, int4 (group scales) and nvfp4."""
    fp16, fp8 = int(matrix_bytes(64, 4, "fp16")), int(matrix_bytes(64, 4, "fp8"))
    assert fp8 > 0 and fp16 == 2 * fp8, "a 16-bit value takes twice the bytes of an 8-bit one"
    got = int(matrix_bytes(256, 8, "int4", 128))
    assert got > 256 * 8 // 2, "packed 4-bit values are not all: every group of every row keeps a scale"
    assert int(matrix_bytes(256, 8, "int4", 64)) > got, "smaller groups, more scales"
    nvfp4 = int(matrix_bytes(64, 4, "nvfp4"))
    assert fp8 // 2 < nvfp4 < fp8, "4-bit values plus their scales: more than half a byte per weight"
    assert nvfp4 != int(matrix_bytes(64, 4, "int4", 16)), (
        "NVFP4 is not INT4 in groups of 16: what are its scales?"
    )


# --- 08.max_sequences (and the same count for any scenario) -----------------------------------


@question(
    "08.max_sequences",
    points=3,
    answers=["max_sequences", "scenario_sequences"],
    forbid=refs("trtllm_kv_planning"),
)
def _(max_sequences, scenario_sequences):
    """Sequences whose KV cache fits under free_gpu_memory_fraction; and scenario_sequences(scenario),
    that count for a scenario dict of this lab (graded on scenarios the notebook never saw)."""
    got = int(max_sequences(1300, 200, 100, 0.5, 10, 8, 4))
    assert 0 < got < int(0.5 * 1300) // 80, (
        "the fraction applies to memory still FREE after weights and the rest"
    )
    assert int(max_sequences(1300, 200, 100, 0.5, 10, 9, 4)) < got, (
        "one token more per sequence: does it still fit the blocks an 8-token sequence uses?"
    )
    from lab_utils.grading import lab_scenario

    assert callable(scenario_sequences), "scenario_sequences(scenario): a function of the scenario dict"
    assert int(scenario_sequences(lab_scenario("08", 0))) >= 0, "a whole number of sequences"


# --- 08.fraction_needed ------------------------------------------------------------------------


@question(
    "08.fraction_needed",
    points=2,
    answers=["fraction_needed"],
    forbid=refs("trtllm_kv_planning"),
)
def _(fraction_needed):
    """Smallest free_gpu_memory_fraction (in steps of 0.01) that fits n sequences, or None."""
    got = fraction_needed(1300, 200, 100, 10, 8, 4, 3)
    assert got is not None and 0 < float(got) < 1, "3 sequences of 8 tokens fit in this GPU"
    assert close(float(got) * 100, round(float(got) * 100)), "a fraction in steps of 0.01"
    more = fraction_needed(1300, 200, 100, 10, 8, 4, 6)
    assert more is not None and float(more) > float(got), "twice the sequences need a larger fraction"
    assert fraction_needed(1300, 200, 100, 10, 8, 4, 13) is None, "more than the whole free memory: None"


# --- 08.legacy_to_llm_api ----------------------------------------------------------------------


def _plain(obj):
    import json

    return json.loads(json.dumps(obj, default=str))


@question("08.legacy_to_llm_api", points=3, answers=["legacy_to_llm_api"])
def _(legacy_to_llm_api):
    """Legacy trtllm-build / runtime flags as an LLM API option dict (nested where they belong)."""
    from lab_utils.trtllm.options import OptionsError, validate_options

    def valid(got, what):
        try:
            validate_options(got)
        except OptionsError as err:
            raise AssertionError(f"{what}: not a valid LLM API option file ({err.key})") from None

    got = _plain(legacy_to_llm_api({"max_batch_size": 32, "tp_size": 2, "use_gemm_plugin": "float16"}))
    assert "use_gemm_plugin" not in got, (
        "plugin choices were TensorRT build switches: they have no LLM API option"
    )
    valid(got, "max_batch_size, tp_size, use_gemm_plugin")
    assert sorted(v for v in got.values() if isinstance(v, int)) == [2, 32], "values pass through unchanged"
    got = _plain(legacy_to_llm_api({"tokens_per_block": 64, "max_input_len": 1000, "max_output_len": 24}))
    assert "tokens_per_block" not in got and 64 in dict(got.get("kv_cache_config") or {}).values(), (
        "KV-cache settings live inside one sub-config"
    )
    valid(got, "tokens_per_block, max_input_len, max_output_len")
    assert not {"max_input_len", "max_output_len"} & set(got) and len(got) == 2, (
        "the engine's separate input and output limits became one limit"
    )


# --- 08.predicted_rms (predict, then the lab measures) -------------------------------------------


@question(
    "08.predicted_rms",
    points=3,
    answers=["predict_rms_error"],  # nothing in the course library predicts it (issue 47 item 2)
    predict=True,
)
def _(predict_rms_error):
    """RMS rounding error predicted from the group scales alone (a last group may be shorter)."""
    import torch

    w = torch.tensor([[1.0, -1.0, 0.5, 0.25, 7.0, 0.0, 0.0, 0.0]])
    got = float(predict_rms_error(w, 4, 4))
    assert got > 0, "rounding always costs something when the scale is not zero"
    assert float(predict_rms_error(w, 4, 8)) > got, "one larger group takes the larger scale for everyone"
    assert float(predict_rms_error(w, 8, 4)) < got, "more bits, finer steps"
    short = float(predict_rms_error(torch.tensor([[7.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]), 4, 4))
    whole = float(predict_rms_error(torch.tensor([[7.0] + [1.0] * 11]), 4, 4))
    assert short > 0 and not close(short, whole, 1e-3), (
        "10 inputs in groups of 4: the last group is short; how much of the matrix's error is in it?"
    )


# --- 08.quant_run (an analysis of quantisation results) ----------------------------------------


def _result(scheme, bits, weight_bytes, agreement_bits, nll):
    return {
        "scheme": scheme,
        "bits": bits,
        "weight_bytes": weight_bytes,
        "agreement_bits": agreement_bits,
        "nll": nll,
    }


@question("08.quant_run", points=2, answers=["best_int4"])
def _(best_int4):
    """best_int4(results, max_weight_bytes, min_agreement): the INT4 scheme to ship, or None."""
    results = [
        _result("float32", None, 300, [1, 1, 1, 1], [1.0, 1.2, 0.8]),
        _result("int8 per-channel", 8, 160, [1, 1, 1, 0], [1.1, 1.2, 0.9]),
        _result("int4 g32", 4, 116, [1, 1, 0, 0], [1.4, 1.5, 1.3]),
        _result("int4 g128", 4, 112, [1, 0, 0, 0], [1.9, 1.5, 1.6]),
    ]
    got = best_int4([dict(r) for r in results], 150, 0.0)
    assert got is not None and str(got).startswith("int4"), "the name of an INT4 scheme in the results"
    assert str(best_int4([dict(r) for r in results], 114, 0.0)) == "int4 g128", (
        "a scheme whose weights do not fit the budget is not a choice, however good"
    )
    assert best_int4([dict(r) for r in results], 150, 0.9) is None, (
        "no INT4 scheme agrees with the float model often enough: None"
    )
