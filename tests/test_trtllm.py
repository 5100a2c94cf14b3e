"""lab_utils.trtllm: option-file schema, legacy flag mapping, memory planning, quantizers; the
Triton TensorRT-LLM backend config; the trtllm-serve launcher's refusal without a GPU."""

from __future__ import annotations

import math

import pytest

from grader.trtllm_legacy import legacy_to_llm_api
from lab_utils.memory import ModelSpec, kv_cache_bytes_per_token, weight_bytes
from lab_utils.trtllm import (
    OptionsError,
    concurrent_sequences,
    plan_memory,
    validate_options,
    weight_bytes_in,
)
from lab_utils.trtllm.plan import nvfp4_matrix_bytes

LLAMA3_8B = ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, max_position_embeddings=8192)


# -- option files ---------------------------------------------------------------------------
GOOD = """
max_batch_size: 64
max_num_tokens: 8192
enable_chunked_prefill: true
kv_cache_config:
  free_gpu_memory_fraction: 0.85
  enable_block_reuse: true
  dtype: fp8
cuda_graph_config:
  batch_sizes: [1, 2, 4, 8]
  enable_padding: true
"""


def test_good_file_passes_and_parses():
    opts = validate_options(GOOD)
    assert opts["kv_cache_config"]["free_gpu_memory_fraction"] == 0.85
    assert opts["cuda_graph_config"]["batch_sizes"] == [1, 2, 4, 8]
    assert validate_options("cuda_graph_config: null\n") == {"cuda_graph_config": None}
    assert validate_options("") == {}


@pytest.mark.parametrize(
    "text, key, words",
    [
        ("max_batch_sise: 8\n", "max_batch_sise", "did you mean max_batch_size"),
        ("enable_chunked_context: true\n", "enable_chunked_context", "did you mean enable_chunked_prefill"),
        (
            "kv_cache_config:\n  free_gpu_mem_fraction: 0.9\n",
            "kv_cache_config.free_gpu_mem_fraction",
            "unknown option",
        ),
        (
            "kv_cache_config:\n  free_gpu_memory_fraction: '0.9'\n",
            "kv_cache_config.free_gpu_memory_fraction",
            "expected a number",
        ),
        (
            "kv_cache_config:\n  free_gpu_memory_fraction: 1.2\n",
            "kv_cache_config.free_gpu_memory_fraction",
            "maximum",
        ),
        ("max_batch_size: true\n", "max_batch_size", "boolean"),
        ("max_batch_size: 0\n", "max_batch_size", "minimum"),
        ("kv_cache_config:\n  dtype: fp4\n", "kv_cache_config.dtype", "not one of"),
        ("backend: tensorrt\n", "backend", "not one of"),
        ("cuda_graph_config:\n  batch_sizes: [1, x]\n", "cuda_graph_config.batch_sizes[1]", "whole number"),
        ("kv_cache_config: 0.9\n", "kv_cache_config", "mapping"),
        ("- a\n- b\n", "<file>", "mapping"),
    ],
)
def test_bad_files_name_the_key(text, key, words):
    with pytest.raises(OptionsError) as err:
        validate_options(text)
    assert err.value.key == key
    assert str(err.value).startswith(key + ":")
    assert words in str(err.value)


def test_extra_keys_and_yaml_errors(tmp_path):
    assert validate_options({"my_new_option": 1}, extra_keys={"my_new_option"}) == {"my_new_option": 1}
    with pytest.raises(OptionsError, match="not valid YAML at line"):
        validate_options("a: [1, 2\nb: 3\n")
    path = tmp_path / "opts.yaml"
    path.write_text("max_seq_len: 4096\n")
    assert validate_options(path) == {"max_seq_len": 4096}


# -- legacy flags ---------------------------------------------------------------------------
def test_legacy_flags_map_to_llm_api():
    got = legacy_to_llm_api(
        {
            "max_batch_size": 64,
            "tp_size": 4,
            "pp_size": 1,
            "max_input_len": 4096,
            "max_output_len": 2048,
            "tokens_per_block": 64,
            "use_gemm_plugin": "float16",
            "use_gpt_attention_plugin": "float16",
            "enable_context_fmha": True,
            "kv_cache_free_gpu_mem_fraction": 0.8,
            "enable_kv_cache_reuse": "enable",
        }
    )
    assert got == {
        "max_batch_size": 64,
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 1,
        "max_seq_len": 6144,
        "kv_cache_config": {
            "tokens_per_block": 64,
            "free_gpu_memory_fraction": 0.8,
            "enable_block_reuse": True,
        },
    }
    validate_options(got)  # the translation is itself a valid option file
    assert legacy_to_llm_api({"max_seq_len": 8192, "max_input_len": 4096, "max_output_len": 10}) == {
        "max_seq_len": 8192
    }
    with pytest.raises(ValueError, match="max_input_len and max_output_len"):
        legacy_to_llm_api({"max_output_len": 10})
    with pytest.raises(ValueError, match="use_fast_build"):
        legacy_to_llm_api({"use_fast_build": True})


# -- planning -------------------------------------------------------------------------------
def test_concurrent_sequences_small_cases():
    # 1000 free bytes, fraction 0.5 -> 500 bytes of KV; 10 bytes/token, blocks of 4 tokens = 40 bytes
    # -> 12 blocks; a 9-token sequence needs 3 blocks -> 4 sequences
    assert concurrent_sequences(1300, 200, 100, 0.5, 10, 9, 4) == 4
    assert concurrent_sequences(1300, 200, 100, 0.5, 10, 8, 4) == 6
    assert concurrent_sequences(300, 200, 100, 0.9, 10, 8, 4) == 0
    assert concurrent_sequences(100, 200, 100, 0.9, 10, 8, 4) == 0  # weights alone do not fit
    with pytest.raises(ValueError):
        concurrent_sequences(1300, 200, 100, 1.5, 10, 8, 4)


def test_weight_formats_reuse_lab01_and_add_nvfp4():
    assert weight_bytes_in(LLAMA3_8B, "fp16") == weight_bytes(LLAMA3_8B, "float16")
    assert weight_bytes_in(LLAMA3_8B, "fp8") == weight_bytes(LLAMA3_8B, "fp8")
    assert weight_bytes_in(LLAMA3_8B, "int4_awq") == weight_bytes(LLAMA3_8B, "awq")
    assert nvfp4_matrix_bytes(32, 2) == 32 + 4 + 4  # 64 values: 32 packed bytes, 4 FP8 scales, 1 FP32
    nvfp4 = weight_bytes_in(LLAMA3_8B, "nvfp4")
    bits = 8 * (nvfp4 - weight_bytes(LLAMA3_8B, "fp8") + LLAMA3_8B.linear_params) / LLAMA3_8B.linear_params
    assert abs(bits - 4.5) < 1e-3  # 4 bits + an 8-bit scale per 16 values
    with pytest.raises(ValueError, match="unknown weight format"):
        weight_bytes_in(LLAMA3_8B, "fp4")


def test_plan_memory_rule_and_fp8_kv_doubles_sequences():
    p16 = plan_memory(LLAMA3_8B, "H100-80GB", "fp16", "fp16", seq_len=8192, free_gpu_memory_fraction=0.9)
    assert p16.free_bytes == p16.total_bytes - p16.weight_bytes - p16.other_bytes
    assert p16.kv_cache_bytes == int(0.9 * p16.free_bytes)
    assert p16.kv_bytes_per_token == kv_cache_bytes_per_token(LLAMA3_8B, "float16")
    assert p16.sequences == concurrent_sequences(
        p16.total_bytes, p16.weight_bytes, p16.other_bytes, 0.9, p16.kv_bytes_per_token, 8192, 32
    )
    p8 = plan_memory(LLAMA3_8B, "H100-80GB", "fp16", "fp8", seq_len=8192)
    assert p8.sequences in (2 * p16.sequences, 2 * p16.sequences + 1)
    assert plan_memory(LLAMA3_8B, "A10G", "fp16", "fp16", seq_len=8192).sequences < p16.sequences
    assert p16.left_bytes > 0 and p16.as_row()["gpu"] == "H100-80GB"


# -- quantizers -----------------------------------------------------------------------------
def test_quantizer_error_bounds():
    torch = pytest.importorskip("torch")
    from grader.hidden.lab08 import _ref_predict
    from lab_utils.trtllm.quant import fake_quantize, quantize, rms_error

    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 256, generator=g)
    w[3, 17] = 25.0  # an outlier
    for bits, qmax in ((8, 127), (4, 7)):
        qw = quantize(w, bits, "group", 64)
        q, scale = qw.q, qw.scale
        assert q.shape == w.shape and scale.shape == (48, 4)
        assert int(q.abs().max()) <= qmax
        w_hat = (q.float().reshape(48, 4, 64) * scale.unsqueeze(-1)).reshape(48, 256)
        err = (w - w_hat).abs().reshape(48, 4, 64)
        assert bool((err <= scale.unsqueeze(-1) / 2 + 1e-6).all()), "rounding error above half a step"
    # finer scales never lose to coarser ones on this matrix; the outlier hurts per-tensor most
    errs = [rms_error(w, quantize(w, 4, gran, 64).dequantize()) for gran in ("tensor", "channel", "group")]
    assert errs[0] > errs[1] > errs[2]
    # the uniform-rounding prediction (the grader's reference for lab 08's) is within 10% of the measurement
    measured = rms_error(w, quantize(w, 4, "group", 64).dequantize())
    assert abs(_ref_predict(w, 4, 64) / measured - 1) < 0.1
    # the fast in-place path computes the same matrix and bytes
    for gran in ("tensor", "channel", "group"):
        qw = quantize(w, 4, gran, 64)
        w_hat, nbytes = fake_quantize(w, 4, gran, 64)
        assert torch.allclose(w_hat, qw.dequantize()) and nbytes == qw.nbytes
    # 576 inputs in groups of 128: a short last group with its own scale
    qw = quantize(torch.randn(4, 576, generator=g), 4, "group", 128)
    q, scale = qw.q, qw.scale
    assert scale.shape == (4, 5) and q.shape == (4, 576)
    assert quantize(w, 4, "group", 64).nbytes == 48 * 256 // 2 + 48 * 4 * 2
    # lab 08 asks for both: neither is in the learner's copy (issue 47 item 2)
    import lab_utils.trtllm.quant as quant

    assert not hasattr(quant, "group_quantize") and not hasattr(quant, "predict_rms_error")


def test_awq_search_never_worse_than_plain_on_its_calibration():
    torch = pytest.importorskip("torch")
    from lab_utils.trtllm.quant import awq_quantize, quantize

    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 128, generator=g)
    x = torch.randn(96, 128, generator=g) * torch.linspace(0.1, 5.0, 128)  # a few loud input channels
    qw, alpha = awq_quantize(w, x, 4, 32, grid=6)
    plain = quantize(w, 4, "group", 32).dequantize()
    out_err = lambda w_hat: float((x @ w.T - x @ w_hat.T).pow(2).mean())  # noqa: E731
    assert out_err(qw.dequantize()) <= out_err(plain) + 1e-9
    assert 0.0 <= alpha <= 1.0


# -- Triton's TensorRT-LLM backend and the launcher -----------------------------------------
def test_triton_trtllm_config_parses_into_model_config():
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from tritonclient.grpc import model_config_pb2

    from lab_utils.triton import validate_config
    from lab_utils.triton.llm_backends import trtllm_config

    text = trtllm_config(
        engine_dir="/engines/x",
        max_batch_size=16,
        kv_cache_free_gpu_mem_fraction=0.8,
        max_tokens_in_paged_kv_cache=65536,
    )
    cfg = validate_config(text)
    assert isinstance(cfg, model_config_pb2.ModelConfig)
    assert cfg.backend == "tensorrtllm" and cfg.max_batch_size == 16
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.8"
    assert params["max_tokens_in_paged_kv_cache"] == "65536"
    assert cfg.model_transaction_policy.decoupled


def test_launcher_validates_options_and_refuses_without_gpu(monkeypatch):
    from lab_utils.servers.base import ServerStartError
    from lab_utils.servers.trtllm import TRTLLMServer

    with pytest.raises(OptionsError, match="kv_cache_config.free_gpu_memory_fractoin"):
        TRTLLMServer(model="/nonexistent", options={"kv_cache_config": {"free_gpu_memory_fractoin": 0.5}})
    srv = TRTLLMServer(model="/nonexistent", options={"max_batch_size": 8})
    assert (
        srv.argv[1] == "/nonexistent"
        and srv.argv[0].endswith("trtllm-serve")
        and "--config" in srv.argv
        and srv.host == "127.0.0.1"
    )
    assert srv.client_kwargs()["base_url"].endswith("/v1")
    monkeypatch.setattr("lab_utils.servers.trtllm.trtllm_available", lambda: (False, "no CUDA device"))
    with pytest.raises(ServerStartError, match="no CUDA device"):
        srv.start()
    srv.stop()
    assert not srv.config_path.exists()


@pytest.mark.slow
def test_quantization_on_the_course_model():
    pytest.importorskip("transformers")
    from lab_utils.trtllm.quant import Scheme, measure_schemes

    run = measure_schemes(
        [
            Scheme("float32", None),
            Scheme("int8 per-channel", 8, "channel"),
            Scheme("int4 per-tensor", 4, "tensor"),
        ],
        eval_tokens=64,
        greedy_tokens=8,
        progress=False,
    )
    assert run.agreement(0) == 1.0
    assert run.weight_bytes[1] < run.weight_bytes[0]
    assert run.perplexity(1) < run.perplexity(2)
    assert math.isfinite(run.perplexity(0)) and len(run.nll[0]) == 63


# -- lab 08's graded questions ----------------------------------------------------------------
def _solution_namespace(scen: dict) -> dict:
    """Answers written the way a learner would (not importing the course's references)."""
    torch = pytest.importorskip("torch")

    def group_quantize(w, bits, group_size):
        qmax = 2 ** (bits - 1) - 1
        wg = w.reshape(w.shape[0], -1, group_size)
        scale = (wg.abs().amax(dim=2, keepdim=True) / qmax).clamp(min=1e-12)
        return torch.clamp(torch.round(wg / scale), -qmax, qmax).reshape(w.shape), scale.reshape(
            w.shape[0], -1
        )

    def matrix_bytes(i, o, fmt, g=128):
        n = i * o
        return {
            "fp16": 2 * n,
            "fp8": n,
            "int4": -(-n // 2) + o * -(-i // g) * 2,
            "nvfp4": -(-n // 2) + -(-n // 16) + 4,
        }[fmt]

    def max_sequences(gpu, w, other, f, per_token, seq_len, tpb):
        return int(f * max(gpu - w - other, 0)) // (tpb * per_token) // -(-seq_len // tpb)

    def fraction_needed(gpu, w, other, per_token, seq_len, tpb, n):
        return next(
            (
                k / 100
                for k in range(1, 101)
                if max_sequences(gpu, w, other, k / 100, per_token, seq_len, tpb) >= n
            ),
            None,
        )

    def predict_rms_error(w, bits, g):
        out, inp = w.shape
        cols = [w[:, a : a + g].double() for a in range(0, inp, g)]  # a last group may be shorter
        total = sum((c.abs().amax(dim=1) / (2 ** (bits - 1) - 1)).pow(2).sum() * c.shape[1] for c in cols)
        return float((total / (12 * out * inp)).sqrt())

    def scenario_sequences(scenario):
        from lab_utils.memory import GPUS, GiB

        spec = ModelSpec(**scenario["model"])
        return max_sequences(
            GPUS[scenario["gpu"]].memory_bytes,
            weight_bytes_in(spec, scenario["weights"]),
            int(scenario["other_gib"] * GiB),
            scenario["fraction"],
            kv_cache_bytes_per_token(spec, "fp8" if scenario["kv_dtype"] == "fp8" else "float16"),
            scenario["seq_len"],
            scenario["tokens_per_block"],
        )

    def best_int4(results, max_bytes, min_agreement):
        fit = [
            r
            for r in results
            if r["bits"] == 4
            and r["weight_bytes"] <= max_bytes
            and sum(r["agreement_bits"]) >= min_agreement * len(r["agreement_bits"])
        ]
        return min(fit, key=lambda r: sum(r["nll"]) / len(r["nll"]))["scheme"] if fit else None

    return {
        "group_quantize": group_quantize,
        "matrix_bytes": matrix_bytes,
        "max_sequences": max_sequences,
        "scenario_sequences": scenario_sequences,
        "fraction_needed": fraction_needed,
        "legacy_to_llm_api": _learner_legacy,
        "predict_rms_error": predict_rms_error,
        "best_int4": best_int4,
    }


def _learner_legacy(flags):
    names = {
        "tp_size": "tensor_parallel_size",
        "pp_size": "pipeline_parallel_size",
        "enable_chunked_context": "enable_chunked_prefill",
        "tokens_per_block": "kv.tokens_per_block",
        "kv_cache_free_gpu_mem_fraction": "kv.free_gpu_memory_fraction",
        "max_tokens_in_paged_kv_cache": "kv.max_tokens",
        "enable_kv_cache_reuse": "kv.enable_block_reuse",
        "kv_cache_dtype": "kv.dtype",
    }
    keep = {"max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width", "dtype"}
    out = {}
    for k, v in flags.items():
        if k in keep:
            out[k] = v
        elif k in names and names[k].startswith("kv."):
            out.setdefault("kv_cache_config", {})[names[k][3:]] = v
        elif k in names:
            out[names[k]] = v
    if "max_seq_len" not in out and "max_input_len" in flags:
        out["max_seq_len"] = flags["max_input_len"] + flags["max_output_len"]
    return out


def _course_model_present() -> bool:
    from lab_utils.models import cache_dir

    return (cache_dir() / "models" / "SmolLM2-135M-Instruct" / "model.safetensors").exists()


@pytest.mark.skipif(not _course_model_present(), reason="needs the prepared course model (make model)")
@pytest.mark.parametrize("seed", [0, 777])
def test_lab08_solution_answers_score_full_and_mistakes_do_not(seed):
    from grader.judge import score_graded
    from lab_utils.grading import lab_scenario, questions_for

    scen = lab_scenario("08", seed)
    ns = _solution_namespace(scen)
    qs = {q.id: q for q in questions_for("08")}
    assert len(qs) >= 6
    for qid, q in qs.items():
        r = score_graded(q, ns, seed)
        assert r.earned == r.points, f"{qid}: {r.status} {r.message}"
    # plausible mistakes: truncation instead of rounding, the fraction of the whole GPU, a typed value
    import torch

    wrong = dict(ns)
    wrong["group_quantize"] = lambda w, b, g: (
        ns["group_quantize"](w, b, g)[0].trunc(),
        ns["group_quantize"](w, b, g)[1],
    )

    def trunc(w, bits, g):
        qmax = 2 ** (bits - 1) - 1
        wg = w.reshape(w.shape[0], -1, g)
        scale = (wg.abs().amax(dim=2, keepdim=True) / qmax).clamp(min=1e-12)
        return torch.clamp(torch.trunc(wg / scale), -qmax, qmax).reshape(w.shape), scale.reshape(
            w.shape[0], -1
        )

    wrong["group_quantize"] = trunc
    wrong["max_sequences"] = lambda gpu, w, o, f, pt, L, b: int(f * gpu - w - o) // (b * pt) // -(-L // b)
    wrong["legacy_to_llm_api"] = lambda flags: {k: v for k, v in flags.items() if "plugin" not in k}

    def padded_mean(w, bits, g):  # every group weighted alike, the short last one too
        cols = [w[:, a : a + g].double() for a in range(0, w.shape[1], g)]
        steps = torch.cat([c.abs().amax(dim=1) / (2 ** (bits - 1) - 1) for c in cols])
        return float((steps.pow(2).mean() / 12).sqrt())

    wrong["predict_rms_error"] = padded_mean

    def total_nll(results, max_bytes, min_agreement):  # sums NLL: a shorter run looks better
        fit = [r for r in results if r["bits"] == 4 and r["weight_bytes"] <= max_bytes]
        fit = [r for r in fit if sum(r["agreement_bits"]) >= min_agreement * len(r["agreement_bits"])]
        return min(fit, key=lambda r: sum(r["nll"]))["scheme"] if fit else None

    wrong["best_int4"] = total_nll
    for qid in (
        "08.group_quantize",
        "08.max_sequences",
        "08.legacy_to_llm_api",
        "08.predicted_rms",
        "08.quant_run",
    ):
        assert score_graded(qs[qid], wrong, seed).earned == 0, qid
    # scenario_sequences that reads the notebook's own scenario instead of its argument: partial at most
    fixed = ns["scenario_sequences"](scen)
    typed = dict(ns, scenario_sequences=lambda scenario: fixed)
    assert score_graded(qs["08.max_sequences"], typed, seed).earned < 0.3 * qs["08.max_sequences"].points
    # no budget, no agreement bar: the best INT4 overall is not the answer for every run
    loose = dict(ns, best_int4=lambda results, b, a: ns["best_int4"](results, 10**15, 0.0))
    assert score_graded(qs["08.quant_run"], loose, seed).earned == 0


def test_lab08_scenario_references_agree_with_the_library():
    from grader.hidden import lab08
    from lab_utils.grading import lab_scenario

    for seed in range(8):
        scen = lab_scenario("08", seed)
        spec = ModelSpec(**scen["model"])
        gpu, w, other, per_token = lab08._scenario_inputs(scen)
        assert w == weight_bytes_in(spec, scen["weights"])
        assert per_token == kv_cache_bytes_per_token(spec, "fp8" if scen["kv_dtype"] == "fp8" else "float16")


# An int4 answer read off the course's quantizer (a matrix of zeros in groups: packed codes plus one
# scale per group is the int4 count), NVFP4 and the rest written out: it gives the reference's count,
# so the quantizer is on 08.matrix_bytes' forbid list.
_QUANTIZER_BYTES = """
def matrix_bytes(in_features, out_features, fmt, group_size=128):
    import torch
    from lab_utils.trtllm.quant import quantize

    n = in_features * out_features
    if fmt == "fp16":
        return 2 * n
    if fmt == "fp8":
        return n
    if fmt == "int4":
        return quantize(torch.zeros(out_features, in_features), 4, "group", group_size).nbytes
    return -(-n // 2) + -(-n // 16) + 4
"""


@pytest.mark.slow
def test_matrix_bytes_read_off_the_quantizer_scores_zero(tmp_path):
    from submissions import judge_in_sandbox, notebook_namespace

    ns = notebook_namespace(_QUANTIZER_BYTES)
    assert ns["matrix_bytes"](256, 8, "int4", 128) == 256 * 8 // 2 + 8 * 2 * 2  # it does the job
    results = judge_in_sandbox("08", {"matrix_bytes": ns["matrix_bytes"]}, tmp_path)
    assert results["08.matrix_bytes"].earned == 0, results["08.matrix_bytes"].message
