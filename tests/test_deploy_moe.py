"""Lab 10's planner with expert parallelism (issue 40): a tiny MoE whose bytes are counted by hand
below, not by the calculator, so a wrong split of experts, attention or KV fails."""

from __future__ import annotations

from lab_utils.deploy.parallel import moe_layouts, parallel_problems, per_gpu_memory, routed_expert_bytes
from lab_utils.drills.shapes import MODELS
from lab_utils.memory import ModelSpec, weight_bytes
from lab_utils.moe.configs import load_config

# 2 layers, hidden 8, 4 query heads and 2 KV heads of width 2, 4 experts of width 4, top-2, vocab 32
TINY = ModelSpec(
    "tiny-moe", 2, 8, 4, 2, 2, 16, 32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4
)
# By hand: attention q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192 per layer; one expert 3 x 8 x 4 = 96, four
# of them 384; router 8 x 4 = 32; embedding and lm_head 2 x 32 x 8 = 512; norms 2 x 16 + 8 = 40.
TOTAL = 2 * (192 + 384 + 32) + 512 + 40  # 1768 parameters
EXPERTS_BF16 = 2 * 384 * 2  # routed experts, both layers, 2 bytes each: 1536
REST_BF16 = (TOTAL - 2 * 384) * 2  # everything else: 2000
GPU = "H100-80GB"


def test_hand_count_matches_the_calculator():
    assert TINY.total_params == TOTAL
    assert weight_bytes(TINY, "bfloat16") == EXPERTS_BF16 + REST_BF16


def test_routed_expert_bytes_by_precision():
    assert routed_expert_bytes(TINY, "bf16") == 1536
    assert routed_expert_bytes(TINY, "fp8") == 768
    # 4-bit, groups of 128 (one group here): gate/up 8x4 -> 16 packed + 8 scale + 2 zero bytes = 26,
    # down 4x8 -> 16 + 16 + 4 = 36; an expert 2 x 26 + 36 = 88, eight experts
    assert routed_expert_bytes(TINY, "awq") == 8 * 88
    assert routed_expert_bytes(MODELS["Llama-3-8B"], "bf16") == 0


def test_expert_parallel_splits_experts_over_tp_times_dp_and_the_rest_over_tp():
    ep4 = per_gpu_memory(TINY, GPU, 1, dp=4, expert_parallel=True)  # DP attention: one expert each
    assert (ep4.ep, ep4.dp, ep4.gpus) == (4, 4, 4)
    assert ep4.expert_bytes == 384 and ep4.weights_bytes == 2000 + 384
    tp2 = per_gpu_memory(TINY, GPU, 2, dp=2, expert_parallel=True)
    assert tp2.ep == 4 and tp2.weights_bytes == 1000 + 384
    uneven = per_gpu_memory(TINY, GPU, 1, dp=3, expert_parallel=True)  # 4 experts on 3: two on one GPU
    assert uneven.expert_bytes == 768 and uneven.weights_bytes == 2000 + 768
    plain = per_gpu_memory(TINY, GPU, 4)  # TP 4, no EP: every matrix split four ways
    assert plain.ep == 1 and plain.weights_bytes == 884 and plain.expert_bytes == 384


def test_kv_per_gpu_and_capacity_with_dp_ranks():
    ep4 = per_gpu_memory(TINY, GPU, 1, dp=4, expert_parallel=True)
    tp2 = per_gpu_memory(TINY, GPU, 2, dp=2, expert_parallel=True)
    # K and V x 2 layers x KV heads on the GPU x width 2 x 2 bytes
    assert ep4.kv_bytes_per_token == 2 * 2 * 2 * 2 * 2 == 32
    assert tp2.kv_bytes_per_token == 2 * 2 * 1 * 2 * 2 == 16
    left = ep4.budget_bytes - ep4.weights_bytes - ep4.activation_bytes - ep4.overhead_bytes
    assert ep4.kv_bytes == left and ep4.kv_tokens == left // 32
    assert ep4.concurrency(4096) == 4 * (ep4.kv_tokens // 4096)  # each DP rank holds its own requests
    assert ep4.as_row()["KV tokens"] == 4 * ep4.kv_tokens and ep4.as_row()["EP"] == 4


def test_mla_latent_is_not_split_by_tp():
    mla = ModelSpec(
        "tiny-mla",
        2,
        8,
        4,
        4,
        2,
        16,
        32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=4,
        kv_lora_rank=4,
        qk_rope_head_dim=2,
        qk_nope_head_dim=2,
        v_head_dim=2,
    )
    # the latent and the rotary key: 2 layers x (4 + 2) x 2 bytes, on every TP rank
    for tp in (1, 2, 4):
        assert per_gpu_memory(mla, GPU, tp).kv_bytes_per_token == 24
    tp4 = per_gpu_memory(mla, GPU, 4)
    dp4 = per_gpu_memory(mla, GPU, 1, dp=4, expert_parallel=True)
    assert dp4.concurrency(1024) > 3 * tp4.concurrency(1024)  # four caches instead of four copies of one


def test_dense_plans_are_unchanged():
    spec = MODELS["Llama-3-70B"]
    m = per_gpu_memory(spec, GPU, 4, 2)
    assert m.kv_bytes_per_token == 2 * 40 * 2 * 128 * 2  # 40 layers per stage, 2 of 8 KV heads per GPU
    assert m.weights_bytes == -(-weight_bytes(spec, "bfloat16") // 8)
    assert (m.dp, m.ep, m.expert_bytes) == (1, 1, 0) and m.concurrency(8192) == m.kv_tokens // 8192


def test_ep_problems_and_layouts():
    assert parallel_problems(TINY, 1, dp=4, expert_parallel=True) == []
    assert parallel_problems(TINY, 1, dp=8, expert_parallel=True)  # 8 ranks, 4 experts
    assert parallel_problems(MODELS["Llama-3-8B"], 1, dp=2, expert_parallel=True)  # no experts
    rows = [(m.tp, m.dp, m.ep) for m in moe_layouts(TINY, GPU, 4)]
    assert rows == [(4, 1, 1), (2, 2, 4), (1, 4, 4)]
    mixtral = ModelSpec.from_hf_config(load_config("mixtral-8x7b"))
    layouts = moe_layouts(mixtral, GPU, 8)
    assert [(m.tp, m.dp) for m in layouts] == [(8, 1), (4, 2), (2, 4), (1, 8)]
    # the experts are 45.1 B of Mixtral's 46.7 B parameters: about 5.6 B (11.3 GB in bf16) per GPU either way
    assert all(abs(m.expert_bytes / 1e9 - 11.27) < 0.05 for m in layouts)
    assert layouts[-1].weights_bytes > layouts[0].weights_bytes  # DP attention copies attention 8 times
