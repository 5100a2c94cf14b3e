"""GPU memory planning for TensorRT-LLM: weights per format, KV cache from free_gpu_memory_fraction.

TensorRT-LLM (PyTorch backend) loads the weights, warms up, and then gives the KV cache
`free_gpu_memory_fraction` (default 0.9) of the memory that is STILL FREE; the rest of the free
memory stays unallocated for activations that grow later and for other processes:

    free      = GPU memory - weights/TP - runtime overhead - peak activations
    KV cache  = fraction x free        (capped by kv_cache_config.max_tokens when set)
    left      = (1 - fraction) x free
    blocks    = KV cache // (tokens_per_block x KV bytes per token)
    sequences = blocks // cdiv(seq_len, tokens_per_block)

Note the difference from vLLM's `gpu_memory_utilization`, a fraction of the WHOLE GPU (lab 01).
Weight bytes per format reuse `lab_utils.memory` (lab 01); NVFP4 is added here:

    NVFP4 (Blackwell): 4-bit E2M1 values, two per byte, one FP8 E4M3 scale per 16 values and one
    FP32 scale per tensor -> 4.5 bits per weight (ModelOpt checkpoint layout, group_size 16).
"""

from __future__ import annotations

from dataclasses import dataclass

from lab_utils.mathutils import cdiv

from ..memory import (
    GPU,
    ModelSpec,
    activation_bytes,
    get_gpu,
    kv_cache_bytes_per_token,
    runtime_overhead_bytes,
    weight_bytes,
)

GiB = 1 << 30
WEIGHT_FORMATS = ("fp16", "bf16", "fp8", "nvfp4", "int4_awq")
KV_FORMATS = ("fp16", "bf16", "fp8")
NVFP4_BLOCK = 16  # values sharing one FP8 scale


def nvfp4_matrix_bytes(in_features: int, out_features: int) -> int:
    """Bytes of one weight matrix in NVFP4: packed values, FP8 block scales, one FP32 tensor scale."""
    n = int(in_features) * int(out_features)
    return cdiv(n, 2) + cdiv(n, NVFP4_BLOCK) + 4


def weight_bytes_in(spec: ModelSpec, fmt: str, group_size: int = 128) -> int:
    """All weight bytes of `spec` in a TensorRT-LLM weight format (see WEIGHT_FORMATS).

    Only the layers' matrices are quantized; embeddings, lm_head and norms stay in 16 bits.
    int4_awq counts group scales and zero points per `group_size` rows as lab 01 does.
    """
    fmt = str(fmt).lower()
    if fmt in ("fp16", "bf16"):
        return weight_bytes(spec, "float16")
    if fmt == "fp8":
        return weight_bytes(spec, "fp8")
    if fmt == "int4_awq":
        return weight_bytes(spec, "awq", group_size=group_size)
    if fmt == "nvfp4":
        # lab 01's fp8 total is 1 byte per matrix weight + the 16-bit rest: swap the matrices
        rest = weight_bytes(spec, "fp8") - spec.linear_params
        return rest + spec.num_layers * sum(nvfp4_matrix_bytes(i, o) for i, o in spec.linear_shapes())
    raise ValueError(f"unknown weight format {fmt!r}; use one of {WEIGHT_FORMATS}")


def concurrent_sequences(
    gpu_bytes: int,
    weight_bytes_per_gpu: int,
    other_bytes: int,
    fraction: float,
    kv_bytes_per_token: int,
    seq_len: int,
    tokens_per_block: int = 32,
) -> int:
    """Sequences of `seq_len` tokens whose KV cache fits at once (0 when nothing fits).

    The KV cache is `fraction` of what is free after weights and other (overhead + activations);
    it is cut into whole blocks, and every sequence needs whole blocks.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"free_gpu_memory_fraction must be in [0, 1], got {fraction}")
    if seq_len <= 0 or tokens_per_block <= 0 or kv_bytes_per_token <= 0:
        raise ValueError("seq_len, tokens_per_block and kv_bytes_per_token must be positive")
    free = max(int(gpu_bytes) - int(weight_bytes_per_gpu) - int(other_bytes), 0)
    kv = int(fraction * free)
    blocks = kv // (int(tokens_per_block) * int(kv_bytes_per_token))
    return blocks // cdiv(int(seq_len), int(tokens_per_block))


@dataclass(frozen=True)
class MemoryPlan:
    """Where one GPU's memory goes under TensorRT-LLM, and how many sequences fit."""

    gpu: str
    weights: str
    kv_dtype: str
    total_bytes: int
    weight_bytes: int  # per GPU
    other_bytes: int  # runtime overhead + peak activations (estimates, as in lab 01)
    free_bytes: int  # after weights and other
    fraction: float  # free_gpu_memory_fraction
    kv_cache_bytes: int
    kv_bytes_per_token: int
    tokens_per_block: int
    seq_len: int
    sequences: int  # concurrent sequences of seq_len that fit

    @property
    def left_bytes(self) -> int:
        """Free memory the fraction leaves unallocated (headroom)."""
        return self.free_bytes - self.kv_cache_bytes

    @property
    def kv_tokens(self) -> int:
        """Token slots in whole blocks."""
        return (
            self.kv_cache_bytes // (self.tokens_per_block * self.kv_bytes_per_token) * self.tokens_per_block
        )

    def as_row(self) -> dict:
        """A table row in GiB."""
        g = lambda b: round(b / GiB, 2)  # noqa: E731
        return {
            "gpu": self.gpu,
            "weights": self.weights,
            "kv": self.kv_dtype,
            "weights_gib": g(self.weight_bytes),
            "other_gib": g(self.other_bytes),
            "kv_cache_gib": g(self.kv_cache_bytes),
            "left_gib": g(self.left_bytes),
            "kv_tokens": self.kv_tokens,
            "sequences": self.sequences,
        }


def plan_memory(
    spec: ModelSpec,
    gpu: str | GPU,
    weights: str = "fp16",
    kv_dtype: str = "fp16",
    seq_len: int = 4096,
    free_gpu_memory_fraction: float = 0.9,
    tokens_per_block: int = 32,
    tensor_parallel_size: int = 1,
    max_num_tokens: int = 8192,
    max_batch_size: int = 256,
    cuda_graphs: bool = True,
) -> MemoryPlan:
    """Plan one GPU (of `tensor_parallel_size`) serving `spec` with TensorRT-LLM's KV-cache rule."""
    g = get_gpu(gpu)
    if kv_dtype not in KV_FORMATS:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; use one of {KV_FORMATS}")
    w = weight_bytes_in(spec, weights) // int(tensor_parallel_size)
    other = runtime_overhead_bytes(tensor_parallel_size, cuda_graphs) + activation_bytes(
        spec,
        max_num_batched_tokens=max_num_tokens,
        max_num_seqs=max_batch_size,
        tensor_parallel_size=tensor_parallel_size,
    )
    per_token = kv_cache_bytes_per_token(
        spec, "fp8" if kv_dtype == "fp8" else "float16", tensor_parallel_size
    )
    free = max(g.memory_bytes - w - other, 0)
    kv = int(free_gpu_memory_fraction * free)
    seqs = concurrent_sequences(
        g.memory_bytes, w, other, free_gpu_memory_fraction, per_token, seq_len, tokens_per_block
    )
    return MemoryPlan(
        g.name,
        weights,
        kv_dtype,
        g.memory_bytes,
        w,
        other,
        free,
        float(free_gpu_memory_fraction),
        kv,
        per_token,
        int(tokens_per_block),
        int(seq_len),
        seqs,
    )
