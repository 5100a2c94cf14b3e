"""KV cache managers written as a learner answers lab 02 (plain lists and a deque, no lab_utils code).

Shared by the tests that grade lab 02's answers and the tests that plug a learner's manager into the
engine's scheduler, so both exercise the same learner-style code.
"""

from __future__ import annotations

from collections import deque


class MyKVCacheManager:
    """The engine's interface (lab_utils.kv.interface), no prefix caching, as the notebook's scaffold."""

    def __init__(self, num_blocks, block_size, enable_caching=False):
        self.block_size, self.num_blocks = block_size, num_blocks
        self.free_queue = deque(range(num_blocks))
        self.ref_cnt = [0] * num_blocks
        self.req_to_blocks = {}

    @property
    def num_free_blocks(self):
        return len(self.free_queue)

    def get_block_ids(self, request_id):
        return list(self.req_to_blocks.get(request_id, []))

    def get_computed_blocks(self, request):
        return [], 0

    def allocate_slots(self, request, num_new_tokens, new_computed_blocks=None):
        table = self.req_to_blocks.get(request.request_id, [])
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if needed > len(self.free_queue):
            return None
        new = [self.free_queue.popleft() for _ in range(max(0, needed))]
        for b in new:
            self.ref_cnt[b] += 1
        self.req_to_blocks[request.request_id] = table + new
        return new

    def free(self, request):
        for b in reversed(self.req_to_blocks.pop(request.request_id, [])):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue.append(b)


class ForkingKVCacheManager(MyKVCacheManager):
    def __init__(self, num_blocks, block_size, enable_caching=False):
        super().__init__(num_blocks, block_size)
        self.pending_copies = []

    def pop_pending_copies(self):
        out, self.pending_copies = self.pending_copies, []
        return out

    def fork(self, parent, child):
        table = list(self.req_to_blocks[parent.request_id])
        for b in table:
            self.ref_cnt[b] += 1
        self.req_to_blocks[child.request_id] = table

    def allocate_slots(self, request, num_new_tokens, new_computed_blocks=None):
        table = self.req_to_blocks.get(request.request_id, [])
        n = request.num_computed_tokens
        if num_new_tokens and n % self.block_size and self.ref_cnt[table[-1]] > 1:
            if not self.free_queue:
                return None
            old, new = table[-1], self.free_queue.popleft()
            self.ref_cnt[new] += 1
            self.ref_cnt[old] -= 1
            table[-1] = new
            self.pending_copies.append((old, new))
            return [new]
        return super().allocate_slots(request, num_new_tokens)
