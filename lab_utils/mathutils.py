"""Arithmetic every part of the course needs (vLLM keeps `cdiv` in `vllm.utils`)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers: how many blocks of size b hold a items."""
    return -(-a // b)


def percentile(values: Iterable[float | None], q: float) -> float:
    """The q-th percentile (0-100), interpolating linearly between ranks (numpy's default).

    `None` values (a request that never produced a token, say) are left out; nan when none remain.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q is a percentile between 0 and 100, got {q}")
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
