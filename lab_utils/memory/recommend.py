"""Which GPUs, how many, at what cost: a decode roofline and a sorted list of configurations.

Decode roofline: each decode step reads every weight once (shared by the whole batch) and each
sequence's KV cache, and does about 2 FLOPs per weight per sequence. A step cannot be faster than
the slower of the two limits, so

    step time   >= max(bytes read / bandwidth, FLOPs / peak FLOP/s)      (per GPU, TP splits both)
    tokens/s    <= batch / step time

It is an upper bound: real kernels reach perhaps 60-80% of bandwidth, and TP adds communication.
"""

from __future__ import annotations

from dataclasses import dataclass

from .breakdown import (
    VLLM_GPU_MEMORY_UTILIZATION,
    DoesNotFitError,
    MemoryBreakdown,
    activation_bytes,
    memory_breakdown,
    runtime_overhead_bytes,
)
from .gpus import GPU, GPUS, get_gpu
from .kv import kv_cache_bytes_per_token
from .spec import ModelSpec
from .weights import weight_bytes


def decode_tokens_per_s(
    spec: ModelSpec,
    gpu: str | GPU,
    batch_size: int,
    context_len: int = 1024,
    *,
    tensor_parallel_size: int = 1,
    weights: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
) -> float:
    """Roofline upper bound on output tokens/s of a decode step with `batch_size` sequences."""
    g = get_gpu(gpu)
    for name, value in (("batch_size", batch_size), ("tensor_parallel_size", tensor_parallel_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 0:
        raise ValueError(f"context_len must be a whole number of cached tokens >= 0, got {context_len!r}")
    tp = tensor_parallel_size
    bytes_read = weight_bytes(spec, weights) / tp + batch_size * context_len * kv_cache_bytes_per_token(
        spec, kv_cache_dtype, tp
    )
    flops = batch_size * spec.decode_flops_per_token(context_len) / tp
    step = max(bytes_read / (g.bandwidth_gb_s * 1e9), flops / (g.bf16_tflops * 1e12))
    return batch_size / step


@dataclass(frozen=True)
class Recommendation:
    """One configuration that fits, with its cost and a throughput estimate."""

    gpu: GPU
    num_gpus: int  # = tensor-parallel degree
    gpus_by_memory: int  # ceil(memory needed / usable memory per GPU), before the TP constraint
    breakdown: MemoryBreakdown
    batch_size: int  # sequences decoding together in the estimate
    tokens_per_s: float  # roofline upper bound at that batch
    cost_per_hour: float  # indicative (see GPU.price_note)

    @property
    def cost_per_million_tokens(self) -> float:
        """Dollars per million output tokens at the roofline rate (a lower bound on cost)."""
        return self.cost_per_hour / (self.tokens_per_s * 3600) * 1e6

    def as_row(self) -> dict:
        """A flat dict for a table."""
        b = self.breakdown
        return {
            "gpu": self.gpu.name,
            "num_gpus": self.num_gpus,
            "gpus_by_memory": self.gpus_by_memory,
            "kv_cache_gib_per_gpu": round(b.kv_cache_bytes / (1 << 30), 2),
            "max_concurrency": round(b.max_concurrency, 2),
            "batch_size": self.batch_size,
            "tokens_per_s": round(self.tokens_per_s),
            "cost_per_hour": round(self.cost_per_hour, 2),
            "cost_per_million_tokens": round(self.cost_per_million_tokens, 3),
        }


def gpus_by_memory(
    spec: ModelSpec,
    gpu: str | GPU,
    *,
    max_model_len: int | None = None,
    min_concurrency: int = 1,
    weights: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> int:
    """GPUs needed by memory alone: ceil(total needed / usable per GPU), before any TP constraint.

    Needed: all weights plus KV for `min_concurrency` requests of max_model_len. Usable per GPU:
    the budget minus (estimated) activations and runtime overhead. Rounding DOWN here (the seed's
    `int()`) would hand back one GPU too few whenever the ratio is not a whole number.
    """
    g = get_gpu(gpu)
    max_model_len = spec.max_position_embeddings if max_model_len is None else max_model_len
    need = weight_bytes(spec, weights) + min_concurrency * max_model_len * kv_cache_bytes_per_token(
        spec, kv_cache_dtype
    )
    for n in range(1, 1025):
        usable = (
            gpu_memory_utilization * g.memory_bytes
            - activation_bytes(spec, tensor_parallel_size=n)
            - runtime_overhead_bytes(n)
        )
        if usable > 0 and n * usable >= need:
            return n
    raise ValueError(f"{spec.name} does not fit on any number of {g.name} GPUs up to 1024")


def _tp_allowed(spec: ModelSpec, tp: int) -> bool:
    # vLLM splits query heads evenly; KV heads are split or, when fewer than TP, replicated.
    kv = spec.num_kv_heads
    return spec.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def recommend(
    spec: ModelSpec,
    *,
    max_model_len: int | None = None,
    min_concurrency: int = 1,
    context_len: int | None = None,
    weights: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
    gpus: list[str | GPU] | None = None,
    max_gpus: int = 8,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int = 256,
    block_size: int = 16,
    sort_by: str = "cost_per_hour",
) -> list[Recommendation]:
    """Configurations (GPU type x count) that serve `spec` with `min_concurrency` requests of max_model_len.

    For each GPU type: the smallest GPU count that fits, rounded up to a tensor-parallel degree that
    divides the attention heads. The throughput estimate decodes as many sequences as the KV cache
    holds at `context_len` tokens each (default max_model_len // 2), at most `max_num_seqs`.
    Sorted by `sort_by`: "cost_per_hour" or "cost_per_million_tokens".
    """
    max_model_len = spec.max_position_embeddings if max_model_len is None else max_model_len
    if isinstance(min_concurrency, bool) or not isinstance(min_concurrency, int) or min_concurrency <= 0:
        raise ValueError(
            f"min_concurrency must be a positive whole number of requests, got {min_concurrency!r}"
        )
    if isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus <= 0:
        raise ValueError(f"max_gpus must be a positive whole number, got {max_gpus!r}")
    if sort_by not in ("cost_per_hour", "cost_per_million_tokens"):
        raise ValueError(f"sort_by must be 'cost_per_hour' or 'cost_per_million_tokens', got {sort_by!r}")
    context_len = max(1, int(max_model_len) // 2) if context_len is None else context_len
    out: list[Recommendation] = []
    for gpu in [get_gpu(g) for g in (gpus if gpus is not None else list(GPUS))]:
        by_memory = gpus_by_memory(
            spec,
            gpu,
            max_model_len=max_model_len,
            min_concurrency=min_concurrency,
            weights=weights,
            kv_cache_dtype=kv_cache_dtype,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        for tp in range(by_memory, max_gpus + 1):
            if not _tp_allowed(spec, tp):
                continue
            try:
                b = memory_breakdown(
                    spec,
                    gpu,
                    tensor_parallel_size=tp,
                    gpu_memory_utilization=gpu_memory_utilization,
                    max_model_len=max_model_len,
                    weights=weights,
                    kv_cache_dtype=kv_cache_dtype,
                    block_size=block_size,
                    max_num_seqs=max_num_seqs,
                )
            except DoesNotFitError:
                continue
            if b.kv.num_blocks - 1 < min_concurrency * b.kv.blocks_per_request:
                continue
            per_seq_blocks = -(-context_len // block_size)
            batch = max(1, min(max_num_seqs, (b.kv.num_blocks - 1) // per_seq_blocks))
            rate = decode_tokens_per_s(
                spec,
                gpu,
                batch,
                context_len,
                tensor_parallel_size=tp,
                weights=weights,
                kv_cache_dtype=kv_cache_dtype,
            )
            out.append(Recommendation(gpu, tp, by_memory, b, batch, rate, gpu.price_per_hour * tp))
            break
    key = (
        (lambda r: (r.cost_per_hour, r.cost_per_million_tokens))
        if sort_by == "cost_per_hour"
        else (lambda r: (r.cost_per_million_tokens, r.cost_per_hour))
    )
    return sorted(out, key=key)
