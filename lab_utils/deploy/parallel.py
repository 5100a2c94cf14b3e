"""Tensor, pipeline and data parallelism: memory per GPU, KV capacity, and the rules that limit them.

    tensor parallel (TP)   every layer's matrices split across TP GPUs, attention heads included
                           (which degrees a model allows is vLLM's QKVParallelLinear: lab 10 asks
                           it). An all-reduce after every layer: keep TP inside one NVLink domain.
                           Here that is a node of 8 GPUs (HGX); rack-scale NVLink systems such as
                           GB200 NVL72 put 72 GPUs in one domain (NVIDIA's GB200 NVL72 page,
                           https://www.nvidia.com/en-us/data-center/gb200-nvl72/, checked 2026-12).
    pipeline parallel (PP) layers split into PP stages on different GPUs; only activations cross
                           between stages, so it spans nodes. Serving keeps several batches in
                           flight, one per stage at best (vLLM 0.32 schedules up to PP batches at
                           once: VllmConfig.max_concurrent_batches, "PP requires PP-size concurrent
                           batches to fill the pipeline"): with M batches in flight a stage works on
                           min(M, PP) of every PP stage-times, so a decode step idles
                           `decode_bubble_fraction(PP, M)`; each batch's step still passes through
                           every stage, so PP cuts no per-token latency. Training's fill-and-drain
                           bubble (`bubble_fraction`, GPipe) is per optimizer step, not per token.
    data parallel (DP)     whole copies (replicas) behind a router; no communication between them.

    expert parallel (EP)   mixture-of-experts models (lab 13): the routed experts are spread whole over
                           the EP ranks, and each token's hidden state travels to the ranks of its
                           top-k experts and back (an all-to-all per MoE layer, lab 13). In vLLM
                           (`--enable-expert-parallel`) the EP group is the TP x DP GPUs of a
                           deployment: attention, embeddings, dense MLPs and shared experts are split
                           TP ways and copied on each of the DP ranks ("DP attention" when TP = 1),
                           and each DP rank keeps its own requests and its own KV cache.

`per_gpu_memory` uses lab_utils.memory's terms: weights / (TP x PP) (with EP: the experts over the
EP ranks, the rest over TP x PP), the activation peak of one layer with its MLP split TP ways, the
runtime overhead, and what is left of the budget for KV blocks. Each GPU holds K and V only for its
own stage's layers and its own KV heads (MLA's latent is not split by heads: every TP rank holds
all of it), so a replica's (a DP rank's) token capacity is what one of its GPUs can hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..facts import fact
from ..memory import (
    DTYPE_BYTES,
    GiB,
    ModelSpec,
    activation_bytes,
    canonical_dtype,
    get_gpu,
    kv_cache_bytes_per_token,
    runtime_overhead_bytes,
    weight_bytes,
)
from ..memory.weights import _four_bit_matrix_bytes

NODE_GPUS = 8  # GPUs in one NVLink domain (an HGX node)


def parallel_problems(
    spec: ModelSpec,
    tp: int,
    pp: int = 1,
    gpus_per_node: int = NODE_GPUS,
    *,
    dp: int = 1,
    expert_parallel: bool = False,
) -> list[str]:
    """Why (TP, PP) cannot serve `spec` (with `expert_parallel`: EP over TP x DP GPUs); [] when it can."""
    out = []
    if tp < 1 or pp < 1 or dp < 1:
        return ["TP, PP and DP are at least 1"]
    if expert_parallel:
        ep = tp * dp
        if not spec.is_moe:
            out.append(f"expert parallelism needs experts: {spec.name} is dense")
        elif ep > spec.num_experts:
            out.append(f"EP={ep} exceeds the {spec.num_experts} experts: some GPUs would hold none")
    if spec.num_attention_heads % tp:
        out.append(f"TP={tp} does not divide the {spec.num_attention_heads} attention heads")
    kv = spec.num_kv_heads
    if kv % tp and tp % kv:
        out.append(f"TP={tp} neither divides the {kv} KV heads nor is a multiple of them")
    if tp > gpus_per_node:
        out.append(f"TP={tp} spans more than one {gpus_per_node}-GPU NVLink domain (an all-reduce per layer)")
    if pp > spec.num_layers:
        out.append(f"PP={pp} exceeds the {spec.num_layers} layers")
    return out


@dataclass(frozen=True)
class ParallelMemory:
    """One GPU of a (TP, PP) replica: bytes of each term and the KV tokens the replica holds."""

    tp: int
    pp: int
    gpu: str
    budget_bytes: int
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_bytes: int  # budget left for KV blocks (negative: does not fit)
    kv_bytes_per_token: int  # on this GPU: its stage's layers, its KV heads
    kv_tokens: int  # tokens the replica's KV cache holds (with DP ranks: one rank's)
    dp: int = 1  # DP ranks, each with its own requests and KV cache
    ep: int = 1  # expert-parallel ranks (TP x DP with expert parallelism, else 1)
    expert_bytes: int = 0  # of weights_bytes, the routed experts on this GPU

    @property
    def fits(self) -> bool:
        return self.kv_tokens > 0

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def concurrency(self, max_model_len: int) -> int:
        """Requests of max_model_len tokens the replica (all its DP ranks) holds at once."""
        return self.dp * (self.kv_tokens // int(max_model_len))

    def as_row(self) -> dict:
        return {
            "TP": self.tp,
            "PP": self.pp,
            "DP": self.dp,
            "EP": self.ep,
            "GPUs": self.gpus,
            "weights GiB/GPU": round(self.weights_bytes / GiB, 2),
            "experts GiB/GPU": round(self.expert_bytes / GiB, 2),
            "activations GiB": round(self.activation_bytes / GiB, 2),
            "overhead GiB": round(self.overhead_bytes / GiB, 2),
            "KV GiB/GPU": round(self.kv_bytes / GiB, 2),
            "KV tokens": self.dp * self.kv_tokens,
        }


def routed_expert_bytes(spec: ModelSpec, weights: str = "bfloat16", group_size: int = 128) -> int:
    """Bytes of the routed experts of every MoE layer stored as `weights` (0 for a dense model):
    the part of `weight_bytes(spec, weights)` that expert parallelism spreads over its ranks. Shared
    experts, dense MLPs, the router and attention are the rest."""
    if not spec.is_moe:
        return 0
    h, m = spec.hidden_size, spec.moe_intermediate_size or spec.intermediate_size
    experts = spec.num_moe_layers * spec.num_experts
    name = str(weights).strip().lower()
    if name in ("awq", "gptq", "int4", "w4a16"):
        gate_up, down = _four_bit_matrix_bytes(h, m, group_size), _four_bit_matrix_bytes(m, h, group_size)
        return experts * (2 * gate_up + down)
    canon = canonical_dtype(name)
    per_weight = 1 if canon in ("fp8", "int8") else DTYPE_BYTES[canon]
    return experts * spec.expert_params * per_weight


def per_gpu_memory(
    spec: ModelSpec,
    gpu: str,
    tp: int = 1,
    pp: int = 1,
    *,
    dp: int = 1,
    expert_parallel: bool = False,
    weights: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
    gpu_memory_utilization: float = fact("vllm.gpu_memory_utilization"),
) -> ParallelMemory:
    """Memory of one GPU in a TP x PP replica of `spec` (see the module docstring for the terms).

    `dp` DP ranks each hold a copy and their own KV cache. With `expert_parallel`, the routed
    experts are spread whole over EP = TP x DP ranks (a GPU holds ceil(experts / EP) of them, per
    PP stage) and everything else is split TP x PP ways and copied on every DP rank.
    """
    g = get_gpu(gpu)
    n = tp * pp
    total = weight_bytes(spec, weights)
    if expert_parallel:
        ep = tp * dp
        experts = routed_expert_bytes(spec, weights)
        on_gpu = -(-spec.num_experts // ep) if spec.is_moe else 0
        e = -(-experts * on_gpu // (spec.num_experts * pp)) if spec.is_moe else 0
        w = -(-(total - experts) // n) + e
    else:
        ep, e = 1, 0
        w = -(-total // n)
        if spec.is_moe:  # experts split TP x PP ways like every other matrix
            e = -(-routed_expert_bytes(spec, weights) // n)
    act = activation_bytes(spec, 8192, 256, tp)
    over = runtime_overhead_bytes(n * (dp if expert_parallel else 1))
    budget = int(gpu_memory_utilization * g.memory_bytes)
    left = budget - w - act - over
    per_layer = kv_cache_bytes_per_token(spec, kv_cache_dtype, tp) // spec.num_layers
    per_token = math.ceil(spec.num_layers / pp) * per_layer
    tokens = max(0, left) // per_token
    return ParallelMemory(tp, pp, g.name, budget, w, act, over, left, per_token, tokens, dp, ep, e)


def moe_layouts(spec: ModelSpec, gpu: str, gpus: int = NODE_GPUS, **kwargs) -> list[ParallelMemory]:
    """One GPU of each way to serve `spec` on `gpus` GPUs: TP over all of them, then expert
    parallelism over all of them with attention split TP ways and copied on gpus / TP DP ranks
    (TP = 1: DP attention), for every TP that divides `gpus`; layouts `parallel_problems` refuses
    are left out. Keyword arguments go to `per_gpu_memory` (weights, kv_cache_dtype, ...)."""
    out = []
    if not parallel_problems(spec, gpus, 1, gpus):
        out.append(per_gpu_memory(spec, gpu, gpus, 1, **kwargs))
    for tp in sorted((t for t in range(1, gpus) if gpus % t == 0), reverse=True):
        if not parallel_problems(spec, tp, 1, gpus, dp=gpus // tp, expert_parallel=True):
            out.append(per_gpu_memory(spec, gpu, tp, 1, dp=gpus // tp, expert_parallel=True, **kwargs))
    return out


def bubble_fraction(pp: int, microbatches: int) -> float:
    """Training: share of a pipeline's GPU time idle while it fills and drains once per optimizer
    step of `microbatches` micro-batches (GPipe schedule). Serving has no such step; see
    `decode_bubble_fraction`."""
    return (pp - 1) / (microbatches + pp - 1)


def decode_bubble_fraction(pp: int, in_flight_batches: int) -> float:
    """Serving: share of each stage's time idle in steady-state decoding with `in_flight_batches`
    batches in the pipeline. A decode step of one batch visits the PP stages in turn; with M < PP
    batches in flight, a stage is busy M of every PP stage-times; with M >= PP it never waits
    (inter-stage transfers and unequal stages ignored)."""
    if pp < 1 or in_flight_batches < 1:
        raise ValueError("pp and in_flight_batches are at least 1")
    return max(0.0, 1.0 - in_flight_batches / pp)


__all__ = [
    "NODE_GPUS",
    "ParallelMemory",
    "bubble_fraction",
    "decode_bubble_fraction",
    "moe_layouts",
    "parallel_problems",
    "per_gpu_memory",
    "routed_expert_bytes",
]
