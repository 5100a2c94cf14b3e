"""The four terms of GPU memory for serving a model with vLLM, per GPU.

vLLM may use `gpu_memory_utilization x total` bytes of each GPU (the budget). It loads the weights,
runs one dummy forward pass of `max_num_batched_tokens` tokens to measure the peak activations,
notes the memory nobody allocated through torch (CUDA context, NCCL buffers, CUDA graphs), and
turns everything left in the budget into KV-cache blocks:

    budget   = gpu_memory_utilization x total memory
    KV cache = budget - weights/TP - peak activations - runtime overhead

Weights and KV cache are exact arithmetic. Activations and overhead are ESTIMATES here; vLLM
measures them on the real GPU (its log prints "Available KV cache memory: ... GiB").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..facts import fact
from .gpus import GPU, get_gpu
from .kv import DoesNotFitError, GiB, KVCacheReport, require_fit, vllm_kv_cache_report
from .spec import ModelSpec, dtype_bytes
from .weights import weight_bytes

# vLLM's --gpu-memory-utilization default (0.92 in 0.32, vllm/config/cache.py), kept in lab_utils.facts
VLLM_GPU_MEMORY_UTILIZATION: float = fact("vllm.gpu_memory_utilization")

CUDA_CONTEXT_BYTES = 768 << 20  # CUDA context, cuBLAS workspaces, allocator slack: measured 0.5-1 GiB
CUDA_GRAPH_BYTES = 512 << 20  # captured decode graphs; 0 with --enforce-eager
NCCL_BYTES = 256 << 20  # communication buffers, only with tensor parallelism


def runtime_overhead_bytes(tensor_parallel_size: int = 1, cuda_graphs: bool = True) -> int:
    """Estimated memory outside weights, activations and KV cache, per GPU."""
    return (
        CUDA_CONTEXT_BYTES
        + (CUDA_GRAPH_BYTES if cuda_graphs else 0)
        + (NCCL_BYTES if tensor_parallel_size > 1 else 0)
    )


def activation_bytes(
    spec: ModelSpec,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    tensor_parallel_size: int = 1,
    dtype: str = "bfloat16",
) -> int:
    """Estimated peak activations of vLLM's profiling pass, per GPU.

    The peak sits in the MLP of one layer (layers run one after another, so only one layer's
    intermediates live at a time): the residual stream and hidden state (2 x hidden), the fused
    gate/up output (2 x intermediate / TP) and the activated product (intermediate / TP), for every
    batched token; plus the logits of `max_num_seqs` sequences (model dtype, then float32).
    """
    for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    b = dtype_bytes(dtype)
    per_token = 2 * spec.hidden_size + 3 * spec.intermediate_size // tensor_parallel_size
    logits = max_num_seqs * spec.vocab_size * (b + 4)
    return max_num_batched_tokens * per_token * b + logits


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where one GPU's memory goes when vLLM serves `spec` (all byte figures per GPU)."""

    gpu: GPU
    tensor_parallel_size: int
    gpu_memory_utilization: float
    total_bytes: int  # the GPU's memory
    budget_bytes: int  # gpu_memory_utilization x total: what vLLM may use
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int  # what is left of the budget for KV blocks
    kv: KVCacheReport

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the KV cache holds (vLLM's logged figure)."""
        return self.kv.kv_cache_tokens

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len that fit at once."""
        return self.kv.max_concurrency

    @property
    def max_model_len(self) -> int:
        return self.kv.max_model_len

    def terms_gib(self) -> dict[str, float]:
        """The four terms plus the unused headroom, in GiB, for a stacked bar."""
        return {
            "weights": self.weights_bytes / GiB,
            "activations": self.activation_bytes / GiB,
            "runtime overhead": self.overhead_bytes / GiB,
            "KV cache": self.kv_cache_bytes / GiB,
            "not used (1 - utilization)": (self.total_bytes - self.budget_bytes) / GiB,
        }

    def summary(self) -> str:
        """A few lines a learner can read."""
        lines = [
            f"{self.tensor_parallel_size} x {self.gpu.name}, per GPU "
            f"({self.total_bytes / GiB:.1f} GiB, budget {self.budget_bytes / GiB:.1f} GiB at "
            f"gpu_memory_utilization={self.gpu_memory_utilization}):"
        ]
        lines += [f"  {k:<28}{v:8.2f} GiB" for k, v in self.terms_gib().items()]
        lines.append(
            f"  KV cache: {self.kv_cache_tokens:,} tokens; max concurrency at "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )
        return "\n".join(lines)


def memory_breakdown(
    spec: ModelSpec,
    gpu: str | GPU = "H100-80GB",
    *,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    weights: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    overhead_bytes: int | None = None,
    cuda_graphs: bool = True,
) -> MemoryBreakdown:
    """The four memory terms per GPU, KV tokens left and max concurrency at max_model_len.

    Raises:
        DoesNotFitError (a ValueError): the budget cannot hold even one request of max_model_len,
            which is exactly when vLLM refuses to start. The message names both numbers.
        ValueError: for bad arguments, saying what to change.
    """
    g = get_gpu(gpu)
    tp = tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise ValueError(f"tensor_parallel_size must be a positive whole number of GPUs, got {tp!r}")
    if spec.num_attention_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} must divide the {spec.num_attention_heads} attention "
            "heads (vLLM splits heads across GPUs); pick a divisor"
        )
    if not (isinstance(gpu_memory_utilization, (int, float)) and 0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization is a fraction in (0, 1], got {gpu_memory_utilization!r}")
    if overhead_bytes is not None and (not isinstance(overhead_bytes, (int, float)) or overhead_bytes < 0):
        raise ValueError(f"overhead_bytes must be >= 0, got {overhead_bytes!r}")
    act_dtype = weights if weights in ("float32", "float16", "bfloat16") else "bfloat16"
    w = -(-weight_bytes(spec, weights) // tp)
    act = activation_bytes(spec, max_num_batched_tokens, max_num_seqs, tp, act_dtype)
    over = runtime_overhead_bytes(tp, cuda_graphs) if overhead_bytes is None else int(overhead_bytes)
    budget = int(gpu_memory_utilization * g.memory_bytes)
    left = budget - w - act - over
    if left <= 0:
        raise DoesNotFitError(
            f"{tp} x {g.name}: weights ({w / GiB:.1f} GiB per GPU) + activations ({act / GiB:.1f}) + "
            f"overhead ({over / GiB:.1f}) = {(w + act + over) / GiB:.1f} GiB exceed the budget of "
            f"{budget / GiB:.1f} GiB ({gpu_memory_utilization} x {g.memory_gib:.1f} GiB), leaving nothing "
            "for the KV cache; use more GPUs, a bigger GPU, or quantized weights.",
            needed_bytes=w + act + over,
            available_bytes=budget,
        )
    report = require_fit(vllm_kv_cache_report(left, spec, kv_cache_dtype, block_size, max_model_len, tp))
    return MemoryBreakdown(
        g, tp, float(gpu_memory_utilization), g.memory_bytes, budget, w, act, over, left, report
    )


__all__ = [
    "DoesNotFitError",
    "MemoryBreakdown",
    "activation_bytes",
    "memory_breakdown",
    "runtime_overhead_bytes",
]
