"""Lab 13: the calculator on published MoE configs, the router hooks, and the course MoE."""

from __future__ import annotations

import json

import pytest

from lab_utils.memory import ModelSpec, kv_cache_bytes_per_token, weight_bytes
from lab_utils.moe.configs import NAMES, load_config

# published totals and active parameters (billions); DeepSeek-V3's 671 B leaves out its MTP module
PUBLISHED = {
    "mixtral-8x7b": (46.7, 12.9),
    "deepseek-v3": (671, 37),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235, 22),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_total_and_active_within_two_percent(name):
    spec = ModelSpec.from_hf_config(load_config(name))
    total, active = PUBLISHED[name]
    assert spec.total_params / 1e9 == pytest.approx(total, rel=0.02)
    assert spec.active_params / 1e9 == pytest.approx(active, rel=0.02)


def test_gpt_oss_counts_the_input_embedding_as_active_here():
    spec = ModelSpec.from_hf_config(load_config("gpt-oss-20b"))
    assert spec.total_params / 1e9 == pytest.approx(20.9, rel=0.02)
    # OpenAI's 3.6 B leaves out the input embedding (a look-up); the calculator counts it, as Mixtral's figure does
    assert (spec.active_params - spec.vocab_size * spec.hidden_size) / 1e9 == pytest.approx(3.6, rel=0.02)
    assert spec.num_sliding_layers == 12 and spec.sliding_window == 128


def test_every_config_loads_and_weights_follow_the_total():
    for name in NAMES:
        spec = ModelSpec.from_hf_config(load_config(name))
        assert spec.is_moe and 0 < spec.active_params < spec.total_params
        assert weight_bytes(spec, "bfloat16") == 2 * spec.total_params
        assert weight_bytes(spec, "fp8") < weight_bytes(spec, "bfloat16")
        assert weight_bytes(spec, "int4") < weight_bytes(spec, "fp8")


def test_deepseek_shape():
    spec = ModelSpec.from_hf_config(load_config("deepseek-v3"))
    assert (spec.num_moe_layers, spec.num_experts, spec.num_shared_experts) == (58, 256, 1)
    assert spec.is_mla and spec.kv_lora_rank == 512


def test_kv_per_token_by_attention_type():
    ds = ModelSpec.from_hf_config(load_config("deepseek-v3"))
    assert kv_cache_bytes_per_token(ds, "bfloat16") == 61 * (512 + 64) * 2  # the latent, not 128 heads
    assert kv_cache_bytes_per_token(ds, "bfloat16", tensor_parallel_size=8) == 61 * 576 * 2  # not split by TP
    oss = ModelSpec.from_hf_config(load_config("gpt-oss-20b"))
    per_layer = 2 * 8 * 64 * 2
    assert kv_cache_bytes_per_token(oss, "bfloat16") == 24 * per_layer  # every layer, no length given
    assert kv_cache_bytes_per_token(oss, "bfloat16", context_len=100) == 24 * per_layer  # inside the window
    at_8k = kv_cache_bytes_per_token(oss, "bfloat16", context_len=8192)
    assert at_8k == (12 * per_layer * 8192 + 12 * per_layer * 128) // 8192
    mix = ModelSpec.from_hf_config(load_config("mixtral-8x7b"))
    assert kv_cache_bytes_per_token(mix, "bfloat16") == 2 * 32 * 8 * 128 * 2


def test_dense_models_unchanged_and_moe_needs_top_k():
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "vocab_size": 32,
    }
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.active_params == spec.total_params == spec.num_params
    assert not spec.is_moe and len(spec.linear_shapes()) == 7
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelSpec.from_hf_config({**cfg, "num_local_experts": 4})
    moe = ModelSpec.from_hf_config({**cfg, "num_local_experts": 4, "num_experts_per_tok": 2})
    with pytest.raises(ValueError, match="matrix_shapes"):
        moe.linear_shapes()
    assert moe.total_params - moe.active_params == 2 * 2 * 3 * 8 * 16  # two idle experts in two layers


def test_router_hooks_keep_and_clear_logits():
    import torch

    from lab_utils.moe.routing import clear_router_logits, install_router_hooks, read_router_logits

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block_sparse_moe = torch.nn.Module()
            self.block_sparse_moe.gate = torch.nn.Linear(3, 4, bias=False)

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Block(), Block()])
    assert install_router_hooks(model) == 2 and install_router_hooks(model) == 2  # hooks once
    for block in model.layers:
        block.block_sparse_moe.gate(torch.ones(5, 3))
    got = read_router_logits(model)
    assert sorted(got) == [0, 1] and len(got[0]) == 5 and len(got[0][0]) == 4
    assert read_router_logits(model) == {0: [], 1: []}  # read clears
    model.layers[0].block_sparse_moe.gate(torch.ones(2, 3))
    assert clear_router_logits(model) == 2 and read_router_logits(model)[0] == []


@pytest.mark.slow
def test_course_moe_loads_in_transformers_and_answers_like_the_dense_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lab_utils.models import course_model_path
    from lab_utils.moe import course_moe_path

    path = course_moe_path()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["num_local_experts"] == 4
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    outs = []
    for p in (course_model_path(), path):
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.bfloat16)
        outs.append(model.generate(ids, max_new_tokens=6, do_sample=False)[0].tolist())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(402e6, rel=0.01)
    assert outs[0][: ids.shape[1] + 3] == outs[1][: ids.shape[1] + 3]  # the experts start as copies
