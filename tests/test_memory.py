"""lab_utils.memory: exact KV arithmetic on published configs, parameter counts, vLLM's own numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab_utils.memory import (
    GPUS,
    DoesNotFitError,
    GiB,
    ModelSpec,
    bits_per_weight,
    decode_tokens_per_s,
    get_gpu,
    gpus_by_memory,
    kv_cache_bytes_per_token,
    kv_cache_capacity_tokens,
    kv_cache_num_blocks,
    memory_breakdown,
    recommend,
    require_fit,
    vllm_kv_cache_report,
    weight_bytes,
)

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "configs"


def spec(name: str) -> ModelSpec:
    return ModelSpec.from_hf_config(CONFIGS / f"{name}.json")


# bytes of K+V per token in bfloat16: 2 x layers x kv_heads x head_dim x 2
KV_BF16 = {
    "SmolLM2-135M": 2 * 30 * 3 * 64 * 2,  # 23,040
    "Llama-3-8B": 2 * 32 * 8 * 128 * 2,  # 131,072
    "Llama-3-70B": 2 * 80 * 8 * 128 * 2,  # 327,680
    "Mistral-7B-v0.1": 2 * 32 * 8 * 128 * 2,  # 131,072
    "Qwen2.5-7B": 2 * 28 * 4 * 128 * 2,  # 57,344
}

# parameter counts as published on the model cards ("135M", "8.03B", "70.6B", "7.24B", "7.61B")
PUBLISHED_PARAMS = {
    "SmolLM2-135M": 135e6,
    "Llama-3-8B": 8.03e9,
    "Llama-3-70B": 70.6e9,
    "Mistral-7B-v0.1": 7.24e9,
    "Qwen2.5-7B": 7.61e9,
}


@pytest.mark.parametrize("name", sorted(KV_BF16))
def test_kv_bytes_per_token_exact(name):
    s = spec(name)
    assert kv_cache_bytes_per_token(s, "bfloat16") == KV_BF16[name]
    assert kv_cache_bytes_per_token(s, "float32") == 2 * KV_BF16[name]
    assert kv_cache_bytes_per_token(s, "fp8") == KV_BF16[name] // 2


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_num_params_within_one_percent(name):
    assert abs(spec(name).num_params / PUBLISHED_PARAMS[name] - 1) < 0.01


def test_num_params_exact_on_known_checkpoints():
    # totals of the safetensors shards
    assert spec("Llama-3-8B").num_params == 8_030_261_248
    assert spec("SmolLM2-135M").num_params == 134_515_008
    assert spec("Qwen2.5-7B").num_params == 7_615_616_512  # q/k/v biases included


def test_from_hf_config_reads_fields_and_defaults():
    s = spec("Llama-3-70B")
    assert (s.num_layers, s.hidden_size, s.num_attention_heads, s.num_kv_heads, s.head_dim) == (
        80,
        8192,
        64,
        8,
        128,
    )
    assert (s.intermediate_size, s.vocab_size, s.tie_word_embeddings, s.max_position_embeddings) == (
        28672,
        128256,
        False,
        8192,
    )
    assert s.name == "Llama-3-70B"
    assert spec("SmolLM2-135M").tie_word_embeddings
    # MHA: no num_key_value_heads means one KV head per query head; head_dim from hidden/heads
    cfg = json.loads((CONFIGS / "Llama-3-8B.json").read_text())
    del cfg["num_key_value_heads"]
    mha = ModelSpec.from_hf_config(cfg)
    assert mha.num_kv_heads == 32 and mha.head_dim == 128
    assert kv_cache_bytes_per_token(mha) == 4 * KV_BF16["Llama-3-8B"]


def test_tied_embeddings_counted_once():
    cfg = json.loads((CONFIGS / "SmolLM2-135M.json").read_text())
    untied = ModelSpec.from_hf_config({**cfg, "tie_word_embeddings": False})
    assert untied.num_params - spec("SmolLM2-135M").num_params == 49152 * 576


def test_weight_bytes_per_precision():
    s = spec("Llama-3-8B")
    n = 8_030_261_248
    assert weight_bytes(s, "float32") == 4 * n
    assert weight_bytes(s, "bfloat16") == weight_bytes(s, "float16") == 2 * n
    # fp8/int8 quantize the layer matrices only: embedding + lm_head + norms stay 16-bit
    rest = 2 * 128256 * 4096 + (32 * 2 * 4096 + 4096)
    assert weight_bytes(s, "fp8") == weight_bytes(s, "int8") == s.linear_params + 2 * rest
    # 4-bit, group 128: per 128 weights 64 bytes + a 2-byte scale + a half-byte zero point
    assert weight_bytes(s, "awq") == weight_bytes(s, "gptq") == s.linear_params * (64 + 2.5) / 128 + 2 * rest
    assert 4.0 < bits_per_weight(spec("Llama-3-70B"), "awq") < 4.6


def test_weight_bytes_4bit_tiny_matrix_rounds_groups_up():
    # one layer, hidden 4 -> every matrix is 4 x 4 (or 4 x 8): one group per column at group 128
    tiny = ModelSpec("tiny", 1, 4, 1, 1, 4, 8, 10, tie_word_embeddings=True, max_position_embeddings=16)
    shapes = tiny.linear_shapes()
    assert shapes == [(4, 4), (4, 4), (4, 4), (4, 4), (4, 8), (4, 8), (8, 4)]
    expected = sum(i * o // 2 + o * 2 + -(-o // 2) for i, o in shapes)
    assert weight_bytes(tiny, "int4") == expected + 2 * (10 * 4 + 2 * 4 + 4)


def test_capacity_counts_whole_blocks_only():
    s = spec("SmolLM2-135M")
    block = 128 * 23_040
    assert kv_cache_num_blocks(GiB, s, "bfloat16", 128) == 364
    assert kv_cache_capacity_tokens(GiB, s, "bfloat16", 128) == 46_592  # DESIGN.md: vLLM said 46,592
    assert kv_cache_capacity_tokens(block * 3 - 1, s, "bfloat16", 128) == 256
    assert kv_cache_capacity_tokens(block * 3, s, "bfloat16", 128) == 384
    assert kv_cache_capacity_tokens(0, s, "bfloat16", 128) == 0


def test_report_matches_vllm_formula_for_odd_max_model_len():
    s = spec("SmolLM2-135M")
    r = vllm_kv_cache_report(GiB, s, "float32", 128, max_model_len=2000)
    assert (r.num_blocks, r.blocks_per_request) == (182, 16)
    assert r.max_concurrency == 182 / 16
    assert r.kv_cache_tokens == 22_750  # int(11.375 * 2000), not 182 * 128
    assert (
        r.log_line()
        == "CPU KV cache size: 22,750 tokens, Maximum concurrency for 2,000 tokens per request: 11.38x"
    )


def test_refusal_accounts_for_the_null_block():
    s = spec("SmolLM2-135M")
    block = 128 * 46_080  # float32
    just_enough = vllm_kv_cache_report(65 * block, s, "float32", 128, max_model_len=8192)
    assert just_enough.fits and just_enough.max_concurrency == 65 / 64
    one_short = vllm_kv_cache_report(65 * block - 1, s, "float32", 128, max_model_len=8192)
    assert not one_short.fits and one_short.estimated_max_model_len == 63 * 128
    small = vllm_kv_cache_report(128 << 20, s, "float32", 128, max_model_len=8192)
    assert (small.num_blocks, small.fits, small.estimated_max_model_len) == (22, False, 2688)


@pytest.mark.parametrize("logfile", sorted(DATA.glob("vllm_kv_*.log")), ids=lambda p: p.stem)
def test_calculator_predicts_recorded_vllm_logs(logfile):
    """Each saved vLLM start-up log names its settings in a header line; the calculator must agree."""
    from lab_utils.servers.vllm import parse_startup_log

    text = logfile.read_text()
    header = json.loads(text.splitlines()[0].lstrip("# "))
    report = vllm_kv_cache_report(
        header["kv_cache_bytes"],
        spec("SmolLM2-135M"),
        header["kv_cache_dtype"],
        128,
        max_model_len=header["max_model_len"],
    )
    if header["refused"]:
        assert not report.fits
        assert f"estimated maximum model length is {report.estimated_max_model_len}" in text
        with pytest.raises(DoesNotFitError) as err:
            require_fit(report)
        need, have = re.findall(r"needs ([\d.]+) GiB .* only ([\d.]+) GiB", str(err.value))[0]
        assert f"({need} GiB KV cache is needed" in text and f"available KV cache memory ({have} GiB)" in text
    else:
        info = parse_startup_log(text)
        assert report.fits
        assert info.kv_cache_tokens == report.kv_cache_tokens
        assert f"{info.max_concurrency:.2f}" == f"{report.max_concurrency:.2f}"


def test_seventy_b_on_two_80gb_gpus_barely_serves():
    b = memory_breakdown(spec("Llama-3-70B"), "H100-80GB", tensor_parallel_size=2, max_model_len=8192)
    assert b.weights_bytes == -(-2 * 70_553_706_496 // 2)
    assert b.weights_bytes + b.activation_bytes + b.overhead_bytes + b.kv_cache_bytes == b.budget_bytes
    assert b.kv_cache_bytes < 5 * GiB and 1 <= b.max_concurrency < 4
    assert b.kv.num_blocks == b.kv_cache_bytes // (16 * 327_680 // 2)  # TP=2 halves the KV heads


def test_breakdown_refuses_with_both_numbers():
    with pytest.raises(DoesNotFitError, match=r"needs .* GiB .* only .* GiB"):
        memory_breakdown(spec("Llama-3-70B"), "H100-80GB", tensor_parallel_size=2, max_model_len=131072)
    with pytest.raises(DoesNotFitError, match="exceed the budget"):
        memory_breakdown(spec("Llama-3-70B"), "H100-80GB", tensor_parallel_size=1)


def test_gpu_catalog_has_required_parts_and_dated_prices():
    for name in ["A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200"]:
        g = get_gpu(name)
        assert g.memory_bytes > 20 * GiB and g.bandwidth_gb_s > 0 and g.bf16_tflops > 0
        assert "indicative" in g.price_note and "20" in g.price_note
    assert get_gpu("h100_80gb") is GPUS["H100-80GB"]


def test_roofline_is_memory_bound_at_batch_one():
    s, g = spec("Llama-3-8B"), get_gpu("H100-80GB")
    rate = decode_tokens_per_s(s, g, 1, context_len=0)
    assert rate == pytest.approx(g.bandwidth_gb_s * 1e9 / weight_bytes(s, "bfloat16"))
    assert decode_tokens_per_s(s, g, 64, 1024) > 20 * rate  # batching amortises the weight reads
    # compute-bound limit: batch cannot beat peak FLOP/s
    huge = decode_tokens_per_s(s, g, 100_000, 0)
    assert huge <= g.bf16_tflops * 1e12 / s.decode_flops_per_token(0) * 1.0001


@pytest.mark.parametrize(
    "name,conc",
    [("Llama-3-70B", 1), ("Llama-3-70B", 32), ("Llama-3-8B", 64), ("Qwen2.5-7B", 8), ("SmolLM2-135M", 4)],
)
def test_recommend_only_returns_configs_that_fit(name, conc):
    s = spec(name)
    recs = recommend(s, max_model_len=8192, min_concurrency=conc)
    assert recs, "something should fit"
    for r in recs:
        b = memory_breakdown(s, r.gpu, tensor_parallel_size=r.num_gpus, max_model_len=8192)
        assert b.kv.num_blocks - 1 >= conc * b.kv.blocks_per_request
        assert (
            b.weights_bytes + b.activation_bytes + b.overhead_bytes + b.kv_cache_bytes <= r.gpu.memory_bytes
        )
        assert s.num_attention_heads % r.num_gpus == 0
        assert r.num_gpus >= r.gpus_by_memory
        assert r.cost_per_million_tokens == pytest.approx(r.cost_per_hour / (r.tokens_per_s * 3600) * 1e6)
    costs = [r.cost_per_hour for r in recs]
    assert costs == sorted(costs)


def test_gpu_count_rounds_up_not_down():
    s = spec("Llama-3-70B")
    g = get_gpu("H100-80GB")
    need = weight_bytes(s) + 8192 * kv_cache_bytes_per_token(s)
    assert int(need / (0.9 * g.memory_bytes)) == 1  # the seed's int(): one GPU, which cannot hold 141 GB
    assert gpus_by_memory(s, g, max_model_len=8192) == 2
    assert gpus_by_memory(s, "A100-40GB", max_model_len=8192) == 4
    # 3 x 80 GB would hold 24 full-length requests, but 3 does not divide 64 heads: 4 GPUs
    h100 = recommend(s, max_model_len=8192, min_concurrency=24, gpus=["H100-80GB"])
    assert [(r.gpus_by_memory, r.num_gpus) for r in h100] == [(3, 4)]


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda s: kv_cache_bytes_per_token(s, "int3"), "unknown dtype"),
        (lambda s: weight_bytes(s, "q3_k"), "unknown dtype or quantization"),
        (lambda s: weight_bytes(s, "awq", group_size=0), "group_size"),
        (lambda s: kv_cache_capacity_tokens(-1, s), "non-negative"),
        (lambda s: kv_cache_capacity_tokens(GiB, s, "bfloat16", 0), "block_size"),
        (lambda s: memory_breakdown(s, "H100-80GB", gpu_memory_utilization=1.5), r"\(0, 1\]"),
        (lambda s: memory_breakdown(s, "H100-80GB", tensor_parallel_size=3), "divide"),
        (lambda s: memory_breakdown(s, "H100-80GB", tensor_parallel_size=0), "positive"),
        (lambda s: memory_breakdown(s, "RTX-9999"), "unknown GPU"),
        (lambda s: memory_breakdown(s, "H100-80GB", max_model_len=0), "max_model_len"),
        (lambda s: recommend(s, min_concurrency=0), "min_concurrency"),
        (lambda s: decode_tokens_per_s(s, "L4", 0), "batch_size"),
    ],
)
def test_bad_inputs_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(spec("Llama-3-8B"))


@pytest.mark.parametrize(
    "change,match",
    [
        ({"num_hidden_layers": 0}, "num_layers must be a positive"),
        ({"hidden_size": -4096}, "hidden_size must be a positive"),
        ({"num_key_value_heads": 5}, "multiple of"),
        ({"vocab_size": 1.5}, "vocab_size"),
        ({"num_local_experts": 8}, "mixture-of-experts config needs num_experts_per_tok"),
    ],
)
def test_bad_configs_raise_value_error(change, match):
    cfg = {**json.loads((CONFIGS / "Llama-3-8B.json").read_text()), **change}
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_hf_config(cfg)


def test_missing_fields_and_bad_paths(tmp_path):
    cfg = json.loads((CONFIGS / "Llama-3-8B.json").read_text())
    del cfg["intermediate_size"]
    with pytest.raises(ValueError, match=r"missing \['intermediate_size'\]"):
        ModelSpec.from_hf_config(cfg)
    with pytest.raises(ValueError, match="no config.json"):
        ModelSpec.from_hf_config(tmp_path)
    with pytest.raises(ValueError, match="path or a dict"):
        ModelSpec.from_hf_config(42)


def test_recommend_never_returns_a_misfit_on_random_shapes():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None)
    @given(
        layers=st.integers(1, 96),
        kv=st.sampled_from([1, 2, 4, 8]),
        group=st.sampled_from([1, 2, 4, 8]),
        head_dim=st.sampled_from([64, 128]),
        mlp=st.integers(2, 5),
        conc=st.integers(1, 64),
        max_len=st.integers(256, 32768),
        weights=st.sampled_from(["bfloat16", "fp8", "awq"]),
    )
    def run(layers, kv, group, head_dim, mlp, conc, max_len, weights):
        heads = kv * group
        hidden = heads * head_dim
        s = ModelSpec(
            "random",
            layers,
            hidden,
            heads,
            kv,
            head_dim,
            mlp * hidden,
            32000,
            max_position_embeddings=max_len,
        )
        for r in recommend(s, min_concurrency=conc, weights=weights):
            b = memory_breakdown(s, r.gpu, tensor_parallel_size=r.num_gpus, weights=weights)
            assert b.kv.num_blocks - 1 >= conc * b.kv.blocks_per_request
            assert b.kv_cache_bytes > 0 and heads % r.num_gpus == 0
            assert r.num_gpus <= 8 and r.tokens_per_s > 0

    run()


def test_prefill_flops_count_non_embedding_parameters():
    """Prefill FLOPs: 2 per non-embedding parameter per token plus one lm_head pass (lab 01 section 8)."""
    s = spec("Llama-3-8B")
    assert s.non_embedding_params == s.num_params - 2 * s.vocab_size * s.hidden_size  # untied embeddings
    t = 4096
    assert s.prefill_flops(t) == 2 * s.non_embedding_params * t + 2 * s.vocab_size * s.hidden_size
    high = 2 * s.num_params * t / s.prefill_flops(t) - 1
    assert 0.10 < high < 0.16, f"the all-parameter count is {high:.1%} high for Llama-3-8B"
