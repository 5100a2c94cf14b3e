"""The drills' calculators, kept by the grader: the references lab 11's hidden checks grade against.

Each function is one formula an interviewer expects on a whiteboard. They were the learner's
`lab_utils.drills.calc` until issue 47: lab 11 asks the learner to write `gpus_needed`,
`batching_gain` and `cost_per_million_tokens` (lab 10 `valid_tp_degrees`, lab 13 the all-to-all
bytes, lab 14 the load-or-recompute crossover), and a copy of a library function with one no-op
line added beat the refusal's fingerprint. The drills (lab_utils.drills.topics) now work each answer
out in their own lines; tests/test_drills.py checks them against these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def valid_tp_degrees(num_heads: int, num_kv_heads: int, max_tp: int = 8) -> list[int]:
    """Tensor-parallel degrees vLLM accepts, within one NVLink domain of `max_tp` GPUs.

    The attention heads split evenly (num_heads % TP == 0). The KV heads split evenly too, or, when
    TP exceeds them, each is replicated on TP / KV GPUs, which needs TP to be a multiple of them
    (vLLM's QKVParallelLinear). Lab 10 grades the same rule.
    """
    return [
        tp
        for tp in range(1, int(max_tp) + 1)
        if num_heads % tp == 0 and (num_kv_heads % tp == 0 or tp % num_kv_heads == 0)
    ]


def kv_share_per_gpu(num_kv_heads: int, tp: int) -> float:
    """Fraction of a replica's KV cache one GPU holds at tensor-parallel degree `tp`.

    Each GPU keeps its own KV heads: KV / TP of them when TP divides the KV heads, one replicated
    head when TP exceeds them, so the share stops shrinking at 1 / KV.
    """
    return 1.0 / min(int(tp), int(num_kv_heads))


def gpus_needed(
    weights_gb: float,
    kv_gb: float,
    gpu_memory_gb: float,
    utilization: float,
    reserve_gb: float,
    num_heads: int,
    num_kv_heads: int,
    max_tp: int = 8,
) -> int | None:
    """Smallest TP degree whose per-GPU share of weights and KV fits, or None when no degree fits.

    Per GPU: weights / TP + KV x kv_share_per_gpu + reserve (activations, CUDA context) <=
    utilization x memory, over the degrees `valid_tp_degrees` allows (KV heads replicated when TP
    exceeds them, so the KV share stops shrinking there).
    """
    usable = utilization * gpu_memory_gb - reserve_gb
    if usable <= 0:
        return None
    for tp in valid_tp_degrees(num_heads, num_kv_heads, max_tp):
        if weights_gb / tp + kv_gb * kv_share_per_gpu(num_kv_heads, tp) <= usable:
            return tp
    return None


def ridge_point(peak_tflops: float, bandwidth_gb_s: float) -> float:
    """FLOPs per byte at which a GPU stops being bandwidth-bound: peak FLOP/s over bytes/s."""
    return _positive("peak_tflops", peak_tflops) * 1e12 / (_positive("bandwidth_gb_s", bandwidth_gb_s) * 1e9)


def decode_arithmetic_intensity(batch_size: int, bytes_per_param: float) -> float:
    """FLOPs per weight byte of a decode step: 2 FLOPs per weight per sequence, each weight read once."""
    return 2.0 * batch_size / _positive("bytes_per_param", bytes_per_param)


def critical_batch(peak_tflops: float, bandwidth_gb_s: float, bytes_per_param: float) -> float:
    """Decode batch at which the weight-streaming intensity reaches the ridge point (KV reads ignored)."""
    return ridge_point(peak_tflops, bandwidth_gb_s) * bytes_per_param / 2.0


def prefill_ttft_s(
    num_params: float, prompt_tokens: int, peak_tflops: float, mfu: float, num_gpus: int = 1
) -> float:
    """Compute-bound prefill time: 2 FLOPs per parameter per prompt token at `mfu` of the peak."""
    flops = 2.0 * num_params * prompt_tokens
    return flops / (num_gpus * _positive("peak_tflops", peak_tflops) * 1e12 * _positive("mfu", mfu))


def batching_gain(output_lens: Sequence[int], batch_size: int) -> float:
    """Throughput of continuous over static batching for requests taken in arrival order.

    Static: consecutive groups of `batch_size` run until their longest request finishes, so a
    group costs max(lengths) decode steps. Continuous: a finished request's slot is refilled at
    once, so all slots stay busy and the work costs sum(lengths) / batch_size steps. Decode steps
    are taken to cost the same whatever the batch (memory-bound); prefill and the tail are ignored.
    """
    lens = [int(x) for x in output_lens]
    if not lens or batch_size < 1:
        raise ValueError("need at least one output length and batch_size >= 1")
    static = sum(max(lens[i : i + batch_size]) for i in range(0, len(lens), batch_size))
    continuous = sum(lens) / batch_size
    return static / continuous


def littles_law_concurrency(rate: float, latency_s: float) -> float:
    """Requests in the system on average: L = lambda x W."""
    return rate * latency_s


def max_rate(concurrency: float, latency_s: float) -> float:
    """Highest arrival rate a server holding `concurrency` requests at once sustains: lambda = L / W."""
    return concurrency / _positive("latency_s", latency_s)


def goodput(
    ttfts_s: Sequence[float],
    tpots_s: Sequence[float],
    duration_s: float,
    ttft_slo_s: float,
    tpot_slo_s: float,
) -> float:
    """Requests per second that met BOTH latency targets (the others do not count)."""
    ok = sum(1 for a, b in zip(ttfts_s, tpots_s) if a <= ttft_slo_s and b <= tpot_slo_s)
    return ok / _positive("duration_s", duration_s)


def spec_expected_tokens(alpha: float, k: int) -> float:
    """Tokens one target forward pass yields with k draft tokens, each accepted with probability alpha.

    (1 - alpha^(k+1)) / (1 - alpha): accepted drafts plus the one token the target always adds.
    """
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def spec_speedup(alpha: float, k: int, draft_cost_ratio: float) -> float:
    """Speed-up over plain decoding when one draft step costs `draft_cost_ratio` of a target step."""
    return spec_expected_tokens(alpha, k) / (1 + k * draft_cost_ratio)


def spec_tokens_from_counters(num_drafts: int, accepted_per_pos: Sequence[int]) -> float:
    """Mean tokens per target step from vLLM's counters: every drafting step ends in one target pass
    that emits its accepted drafts and one token of its own (vLLM's mean acceptance length)."""
    return 1.0 + sum(int(a) for a in accepted_per_pos) / _positive("num_drafts", num_drafts)


def spec_accept_probability(target: Sequence[float], draft: Sequence[float], token: int) -> float:
    """Rejection sampling: the chance a drafted `token` is kept, min(1, p(token) / q(token))."""
    p, q = float(target[token]), float(draft[token])
    return min(1.0, p / _positive("draft probability of the drafted token", q))


def spec_residual(target: Sequence[float], draft: Sequence[float]) -> list[float]:
    """Rejection sampling: the law of the token drawn after a refusal, max(0, p - q) normalised."""
    extra = [max(0.0, float(p) - float(q)) for p, q in zip(target, draft)]
    total = sum(extra)
    if total <= 0:
        raise ValueError("p equals q: no draft is ever refused, so there is no residual law")
    return [e / total for e in extra]


def spec_acceptance_rate(target: Sequence[float], draft: Sequence[float]) -> float:
    """Chance a draft at one position is kept, averaged over what the draft proposes: sum of min(p, q)."""
    return sum(min(float(p), float(q)) for p, q in zip(target, draft))


def batch1_decode_tokens_per_s(bandwidth_gb_s: float, weights_gb: float) -> float:
    """Upper bound of batch-1 decode: every token reads all the weights once."""
    return bandwidth_gb_s / _positive("weights_gb", weights_gb)


def cached_prefix_tokens(prefix_tokens: int, block_size: int) -> int:
    """Tokens of a shared prefix a block-based prefix cache reuses: whole blocks only."""
    return (int(prefix_tokens) // int(block_size)) * int(block_size)


def prefill_saved_fraction(prefix_tokens: int, suffix_tokens: int, block_size: int) -> float:
    """Fraction of a request's prefill skipped when its shared prefix is already cached."""
    return cached_prefix_tokens(prefix_tokens, block_size) / (prefix_tokens + suffix_tokens)


def cost_per_million_tokens(price_per_gpu_hour: float, num_gpus: int, tokens_per_s: float) -> float:
    """Dollars per million generated tokens at a sustained throughput."""
    return price_per_gpu_hour * num_gpus / (_positive("tokens_per_s", tokens_per_s) * 3600) * 1e6


def replicas_needed(
    rate: float, tokens_per_request: float, tokens_per_s_per_replica: float, headroom: float = 0.7
) -> int:
    """Replicas for a token demand, running each at `headroom` of its measured capacity."""
    return max(1, math.ceil(rate * tokens_per_request / (tokens_per_s_per_replica * headroom)))


# --- Mixture-of-Experts, MLA and expert parallelism ------------------------------------------------


def moe_param_counts(
    layers: int,
    dense_layers: int,
    hidden: int,
    vocab: int,
    attn_params_per_layer: int,
    dense_intermediate: int,
    expert_intermediate: int,
    routed_experts: int,
    shared_experts: int,
    top_k: int,
) -> tuple[int, int]:
    """(total, active) parameters of an MoE decoder, in the drills' model.

    Every layer has its attention; the first `dense_layers` have a dense MLP of 3 x hidden x
    dense_intermediate (gate, up, down), the others `routed_experts` + `shared_experts` experts of
    3 x hidden x expert_intermediate each, of which a token uses `top_k` routed ones and every shared
    one. Untied embeddings and lm_head (vocab x hidden each) count in both; norms and the router
    are left out.
    """
    expert = 3 * hidden * expert_intermediate
    moe_layers = layers - dense_layers
    common = (
        2 * vocab * hidden + layers * attn_params_per_layer + dense_layers * 3 * hidden * dense_intermediate
    )
    total = common + moe_layers * (routed_experts + shared_experts) * expert
    active = common + moe_layers * (top_k + shared_experts) * expert
    return int(total), int(active)


def mla_kv_bytes_per_token(
    layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: float
) -> float:
    """MLA caches one latent vector (kv_lora_rank) and one shared RoPE key (qk_rope_head_dim) per layer."""
    return layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes


def gqa_kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """Grouped-query attention caches a K and a V of head_dim per KV head per layer."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def ep_alltoall_bytes_per_token(
    hidden: int, top_k: int, dispatch_bytes: float, combine_bytes: float, ep_size: int
) -> float:
    """Bytes one token sends through an MoE layer's all-to-all under expert parallelism.

    The token's hidden state goes to each of its top_k experts (dispatch) and each expert's output
    comes back (combine). With the experts spread evenly over `ep_size` GPUs and balanced routing, a
    copy lands on the token's own GPU with probability 1 / ep_size and then moves no bytes.
    """
    return top_k * hidden * (dispatch_bytes + combine_bytes) * (ep_size - 1) / ep_size


def kv_transfer_bytes(
    prompt_tokens: int, block_size: int, layers: int, kv_heads: int, head_dim: int, dtype_bytes: float
) -> float:
    """KV bytes moved for a prompt: whole blocks (the last one partly filled still moves whole)."""
    blocks = math.ceil(int(prompt_tokens) / int(block_size))
    return blocks * int(block_size) * gqa_kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes)


def load_recompute_crossover_tokens(
    prefill_tokens_per_s: float, kv_bytes_per_token: float, tier_gb_s: float, overhead_s: float
) -> float | None:
    """Prompt length at which loading its KV (overhead + bytes / bandwidth) takes as long as prefilling it.

    Recompute: N / prefill_tokens_per_s. Load: overhead_s + N x kv_bytes_per_token / tier bandwidth.
    Longer prompts load faster than they compute; None when a token reads slower than it computes.
    """
    per_token_gain = 1 / _positive("prefill_tokens_per_s", prefill_tokens_per_s) - kv_bytes_per_token / (
        _positive("tier_gb_s", tier_gb_s) * 1e9
    )
    if per_token_gain <= 0:
        return None
    return overhead_s / per_token_gain
