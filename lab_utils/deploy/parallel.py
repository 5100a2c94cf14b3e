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

`per_gpu_memory` uses lab_utils.memory's terms: weights / (TP x PP), the activation peak of one
layer with its MLP split TP ways, the runtime overhead, and what is left of the budget for KV
blocks. Each GPU holds K and V only for its own stage's layers and its own KV heads, so a
replica's token capacity is what one of its GPUs can hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..facts import fact
from ..memory import (
    GiB,
    ModelSpec,
    activation_bytes,
    dtype_bytes,
    get_gpu,
    kv_heads_per_gpu,
    runtime_overhead_bytes,
    weight_bytes,
)

NODE_GPUS = 8  # GPUs in one NVLink domain (an HGX node)


def parallel_problems(spec: ModelSpec, tp: int, pp: int = 1, gpus_per_node: int = NODE_GPUS) -> list[str]:
    """Why (TP, PP) cannot serve `spec`; [] when it can."""
    out = []
    if tp < 1 or pp < 1:
        return ["TP and PP are at least 1"]
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
    kv_tokens: int  # tokens the replica's KV cache holds

    @property
    def fits(self) -> bool:
        return self.kv_tokens > 0

    def concurrency(self, max_model_len: int) -> int:
        """Requests of max_model_len tokens the replica holds at once."""
        return self.kv_tokens // int(max_model_len)

    def as_row(self) -> dict:
        return {
            "TP": self.tp,
            "PP": self.pp,
            "GPUs": self.tp * self.pp,
            "weights GiB/GPU": round(self.weights_bytes / GiB, 2),
            "activations GiB": round(self.activation_bytes / GiB, 2),
            "overhead GiB": round(self.overhead_bytes / GiB, 2),
            "KV GiB/GPU": round(self.kv_bytes / GiB, 2),
            "KV tokens": self.kv_tokens,
        }


def per_gpu_memory(
    spec: ModelSpec,
    gpu: str,
    tp: int = 1,
    pp: int = 1,
    *,
    weights: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
    gpu_memory_utilization: float = fact("vllm.gpu_memory_utilization"),
) -> ParallelMemory:
    """Memory of one GPU in a TP x PP replica of `spec` (see the module docstring for the terms)."""
    g = get_gpu(gpu)
    n = tp * pp
    w = -(-weight_bytes(spec, weights) // n)
    act = activation_bytes(spec, 8192, 256, tp)
    over = runtime_overhead_bytes(n)
    budget = int(gpu_memory_utilization * g.memory_bytes)
    left = budget - w - act - over
    per_token = (
        2
        * math.ceil(spec.num_layers / pp)
        * kv_heads_per_gpu(spec, tp)
        * spec.head_dim
        * dtype_bytes(kv_cache_dtype)
    )
    tokens = max(0, left) // per_token
    return ParallelMemory(tp, pp, g.name, budget, w, act, over, left, per_token, tokens)


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
    "parallel_problems",
    "per_gpu_memory",
]
