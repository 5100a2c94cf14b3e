"""The baseline PagedAttention replaced: one contiguous slab per request, placed first-fit.

Before paging, a serving system had to give each request a single range of KV memory large enough
for the longest sequence it might become (prompt + max_tokens), because the attention kernel read
K and V by striding through one range. Memory is lost three ways, and this module counts each:

- reservation waste: slots reserved for tokens not generated yet (or never);
- internal fragmentation: the part of a slab the request never fills, known only when it ends;
- external fragmentation: free memory split into holes too small for the next request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slab:
    """One request's reservation: slots [start, start + size) of the arena."""

    request_id: str
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


class ContiguousAllocator:
    """A fixed arena of `num_slots` token slots; each request gets one slab, first fit.

    Args:
        num_slots: the KV budget in tokens (the same budget a paged cache would split into blocks).
    """

    def __init__(self, num_slots: int) -> None:
        if int(num_slots) < 1:
            raise ValueError(f"num_slots must be at least 1, got {num_slots}")
        self.num_slots = int(num_slots)
        self.slabs: dict[str, Slab] = {}
        # Tokens actually stored in each slab (prompt + output so far).
        self.num_tokens: dict[str, int] = {}
        # Why allocations failed: "reservation" (not enough free memory in total) or
        # "external" (enough in total, but no single hole large enough).
        self.failures: list[tuple[str, str]] = []

    def holes(self) -> list[tuple[int, int]]:
        """Free ranges as (start, size), in address order."""
        out, cursor = [], 0
        for slab in sorted(self.slabs.values(), key=lambda s: s.start):
            if slab.start > cursor:
                out.append((cursor, slab.start - cursor))
            cursor = slab.end
        if cursor < self.num_slots:
            out.append((cursor, self.num_slots - cursor))
        return out

    @property
    def num_free_slots(self) -> int:
        """Slots in no slab."""
        return self.num_slots - sum(s.size for s in self.slabs.values())

    @property
    def largest_hole(self) -> int:
        """The biggest slab that could be placed right now."""
        return max((size for _, size in self.holes()), default=0)

    def allocate(self, request_id: str, reserve_tokens: int, num_tokens: int = 0) -> Slab | None:
        """Reserve `reserve_tokens` contiguous slots at the lowest address that fits, or None.

        `num_tokens` is how many of them are filled at once (the prompt). A failure is recorded
        as "external" when the free total would have sufficed, else as "reservation".
        """
        if request_id in self.slabs:
            raise ValueError(f"request {request_id!r} already holds a slab")
        if reserve_tokens < 1 or num_tokens > reserve_tokens:
            raise ValueError(
                f"need 1 <= num_tokens ({num_tokens}) <= reserve_tokens ({reserve_tokens})"
                if num_tokens > reserve_tokens
                else f"reserve_tokens must be at least 1, got {reserve_tokens}"
            )
        for start, size in self.holes():
            if size >= reserve_tokens:
                slab = Slab(request_id, start, reserve_tokens)
                self.slabs[request_id] = slab
                self.num_tokens[request_id] = num_tokens
                return slab
        why = "external" if self.num_free_slots >= reserve_tokens else "reservation"
        self.failures.append((request_id, why))
        return None

    def append(self, request_id: str, n: int = 1) -> None:
        """Record `n` more tokens stored in the request's slab (never grows the slab)."""
        filled = self.num_tokens[request_id] + n
        if filled > self.slabs[request_id].size:
            raise ValueError(f"request {request_id!r} outgrew its slab of {self.slabs[request_id].size}")
        self.num_tokens[request_id] = filled

    def free(self, request_id: str) -> None:
        """Release the request's slab."""
        self.slabs.pop(request_id)
        self.num_tokens.pop(request_id)

    @property
    def num_reserved_slots(self) -> int:
        """Slots inside slabs."""
        return self.num_slots - self.num_free_slots

    @property
    def num_stored_tokens(self) -> int:
        """Tokens actually stored."""
        return sum(self.num_tokens.values())

    def reservation_waste(self) -> int:
        """Reserved slots that hold no token right now."""
        return self.num_reserved_slots - self.num_stored_tokens

    def external_fragmentation(self) -> float:
        """1 - largest hole ÷ free slots: 0 when the free memory is one piece, near 1 when shattered."""
        free = self.num_free_slots
        return 0.0 if free == 0 else 1.0 - self.largest_hole / free
