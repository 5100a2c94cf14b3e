"""KV cache memory: a contiguous baseline, vLLM-style paged blocks, prefix caching, fork + CoW.

from lab_utils.kv import KVCacheManager, Request
kv = KVCacheManager(num_blocks=8, block_size=4)
req = Request("a", prompt_token_ids=[1, 2, 3, 4, 5])
kv.allocate_slots(req, 5)          # two blocks: [0, 1]
kv.get_block_ids("a")              # the block table -> [0, 1]

The engine needs only `KVCacheManagerInterface` (interface.py): a learner's own manager plugs in.
"""

from lab_utils.mathutils import cdiv

from .block_pool import (
    BlockHash,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
    hash_request_blocks,
)
from .contiguous import ContiguousAllocator, Slab
from .interface import KVCacheManagerInterface, missing_members
from .kv_cache_manager import KVCacheManager, RequestLike
from .metrics import parse_prometheus, vllm_kv_metrics
from .request import Request
from .trace import Frame, TraceRecorder, snapshot
from .workload import (
    MemoryTimeline,
    WorkloadRequest,
    make_workload,
    max_concurrent_requests,
    simulate_contiguous,
    simulate_paged,
)

__all__ = [
    "BlockHash",
    "BlockPool",
    "ContiguousAllocator",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "KVCacheManagerInterface",
    "MemoryTimeline",
    "Request",
    "RequestLike",
    "Slab",
    "WorkloadRequest",
    "cdiv",
    "hash_block_tokens",
    "hash_request_blocks",
    "make_workload",
    "max_concurrent_requests",
    "missing_members",
    "simulate_contiguous",
    "simulate_paged",
    "Frame",
    "TraceRecorder",
    "snapshot",
    "parse_prometheus",
    "vllm_kv_metrics",
]
