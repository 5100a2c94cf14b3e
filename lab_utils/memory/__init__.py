"""GPU memory math for serving: the four terms, KV-cache capacity as vLLM counts it, GPUs and cost.

    spec = ModelSpec.from_hf_config("path/to/config.json")
    kv_cache_bytes_per_token(spec, "bfloat16")            # 2 x layers x kv_heads x head_dim x 2
    memory_breakdown(spec, "H100-80GB", tensor_parallel_size=2, max_model_len=8192).summary()
    recommend(spec, max_model_len=8192, min_concurrency=16)[0].as_row()

One idea per module: spec (the model's shape), weights (bytes per precision), kv (blocks, vLLM's
capacity line and refusal), breakdown (the four terms), gpus (catalog), recommend (roofline, cost).
"""

from .breakdown import MemoryBreakdown, activation_bytes, memory_breakdown, runtime_overhead_bytes
from .gpus import GPU, GPUS, PRICE_NOTE, PRICES_AS_OF, get_gpu
from .kv import (
    DoesNotFitError,
    GiB,
    KVCacheReport,
    kv_cache_block_bytes,
    kv_cache_bytes_per_token,
    kv_cache_capacity_tokens,
    kv_cache_num_blocks,
    kv_heads_per_gpu,
    require_fit,
    vllm_kv_cache_report,
)
from .recommend import Recommendation, decode_tokens_per_s, gpus_by_memory, recommend
from .spec import DTYPE_BYTES, ModelSpec, canonical_dtype, dtype_bytes
from .weights import QUANTIZATIONS, bits_per_weight, weight_bytes

__all__ = [
    "DTYPE_BYTES",
    "GPU",
    "GPUS",
    "GiB",
    "PRICES_AS_OF",
    "PRICE_NOTE",
    "QUANTIZATIONS",
    "DoesNotFitError",
    "KVCacheReport",
    "MemoryBreakdown",
    "ModelSpec",
    "Recommendation",
    "activation_bytes",
    "bits_per_weight",
    "canonical_dtype",
    "decode_tokens_per_s",
    "dtype_bytes",
    "get_gpu",
    "gpus_by_memory",
    "kv_cache_block_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_capacity_tokens",
    "kv_cache_num_blocks",
    "kv_heads_per_gpu",
    "memory_breakdown",
    "recommend",
    "require_fit",
    "runtime_overhead_bytes",
    "vllm_kv_cache_report",
    "weight_bytes",
]
