"""Arithmetic every part of the course needs (vLLM keeps the same helper in `vllm.utils`)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers: how many blocks of size b hold a items."""
    return -(-a // b)
