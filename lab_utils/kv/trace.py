"""Record what a KVCacheManager does, one frame per event, as plain data a plot can replay.

rec = TraceRecorder(KVCacheManager(num_blocks=8, block_size=4))
a = Request("a", list(range(6)))
rec.allocate(a)            # prefill: cache lookup, allocate_slots, mark computed
rec.append(a, token_id=7)  # one decode step
rec.free(a)
rec.frames                 # list[Frame], picklable
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .kv_cache_manager import KVCacheManager, RequestLike


@dataclass
class Frame:
    """The cache right after one event (all plain values, so frames pickle and compare)."""

    index: int
    event: str  # "start", "allocate", "append", "free", "fork", "rejected"
    request_id: str | None
    description: str
    block_size: int
    num_blocks: int
    # request_id -> physical block ids, logical order (the block tables).
    block_tables: dict[str, list[int]]
    # request_id -> tokens the request holds in the cache.
    num_tokens: dict[str, int]
    # Per physical block: references, short hash (None when not cached).
    ref_cnt: list[int]
    block_hash: list[str | None]
    # Free queue, front (evicted next) to back.
    free_queue: list[int]
    usage: float
    prefix_cache_hits: int
    prefix_cache_queries: int
    copies: list[tuple[int, int]] = field(default_factory=list)

    def shared_blocks(self) -> list[int]:
        """Physical blocks held by more than one block table."""
        return [i for i, r in enumerate(self.ref_cnt) if r > 1]


def snapshot(
    kv: KVCacheManager,
    tokens: dict[str, int],
    index: int = 0,
    event: str = "start",
    request_id: str | None = None,
    description: str = "",
    copies: list[tuple[int, int]] | None = None,
) -> Frame:
    """A Frame of the manager's current state; `tokens` gives each request's stored token count."""
    blocks = kv.block_pool.blocks
    return Frame(
        index=index,
        event=event,
        request_id=request_id,
        description=description,
        block_size=kv.block_size,
        num_blocks=kv.num_blocks,
        block_tables={rid: kv.get_block_ids(rid) for rid in kv.req_to_blocks},
        num_tokens={rid: int(tokens.get(rid, 0)) for rid in kv.req_to_blocks},
        ref_cnt=[b.ref_cnt for b in blocks],
        block_hash=[b.block_hash[:6] if b.block_hash else None for b in blocks],
        free_queue=kv.block_pool.free_block_queue.block_ids(),
        usage=round(kv.usage, 6),
        prefix_cache_hits=kv.prefix_cache_hits,
        prefix_cache_queries=kv.prefix_cache_queries,
        copies=list(copies or []),
    )


class TraceRecorder:
    """Drive a KVCacheManager with prefill/decode/free/fork events and keep a Frame after each.

    The recorder plays the engine's part: it looks up the prefix cache for a new request, asks
    allocate_slots for room, and marks the tokens computed, which is the order vLLM's scheduler
    and model runner follow.
    """

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._tokens: dict[str, int] = {}
        self.frames: list[Frame] = [self._frame("start", None, "empty cache")]

    def _frame(
        self, event: str, rid: str | None, text: str, copies: list[tuple[int, int]] | None = None
    ) -> Frame:
        return snapshot(self.kv, self._tokens, len(getattr(self, "frames", [])), event, rid, text, copies)

    def _record(
        self, event: str, rid: str | None, text: str, copies: list[tuple[int, int]] | None = None
    ) -> Frame:
        frame = self._frame(event, rid, text, copies)
        self.frames.append(frame)
        return frame

    def allocate(self, request: RequestLike) -> bool:
        """Prefill a new request: reuse cached prefix blocks, allocate the rest; False if it does not fit."""
        hits, num_cached = self.kv.get_computed_blocks(request)
        num_new = len(request.all_token_ids) - num_cached
        blocks = self.kv.allocate_slots(request, num_new, hits)
        rid = request.request_id
        if blocks is None:
            self._record("rejected", rid, f"{rid}: {num_new} tokens do not fit")
            return False
        request.num_computed_tokens = len(request.all_token_ids)
        self._tokens[rid] = request.num_computed_tokens
        text = f"{rid}: prefill {len(request.all_token_ids)} tokens"
        if num_cached:
            text += f" ({num_cached} from the prefix cache)"
        self._record("allocate", rid, text)
        return True

    def append(self, request: RequestLike, token_id: int = 0) -> bool:
        """One decode step: add a token and make room for it; False (request unchanged) if it does not fit."""
        append = getattr(request, "append_output", None)
        if append is None:
            raise TypeError("append needs a request with append_output(token_id), e.g. lab_utils.kv.Request")
        append(token_id)
        rid = request.request_id
        if self.kv.allocate_slots(request, 1) is None:
            request.output_token_ids.pop()
            self._record("rejected", rid, f"{rid}: no free block for the next token")
            return False
        copies = self.kv.pop_pending_copies()
        request.num_computed_tokens = len(request.all_token_ids)
        self._tokens[rid] = request.num_computed_tokens
        text = f"{rid}: decode, now {self._tokens[rid]} tokens"
        if copies:
            text += " (copy-on-write " + ", ".join(f"{s}→{d}" for s, d in copies) + ")"
        self._record("append", rid, text, copies)
        return True

    def fork(self, parent: RequestLike, child: RequestLike) -> None:
        """Parallel sampling: the child shares every block of the parent."""
        self.kv.fork(parent, child)
        self._tokens[child.request_id] = self._tokens.get(parent.request_id, 0)
        self._record("fork", child.request_id, f"fork {parent.request_id} → {child.request_id}")

    def free(self, request: RequestLike) -> None:
        """The request finished: its blocks go back to the free queue (cached ones stay findable)."""
        self.kv.free(request)
        self._tokens.pop(request.request_id, None)
        self._record("free", request.request_id, f"{request.request_id}: finished, blocks freed")
