"""LoRA adapter memory: bytes per rank and per layer, one adapter's size, and how many fit beside
the KV cache.

A LoRA adapter on a linear layer of shape (in -> out) adds A (r x in) and B (out x r): r * (in + out)
numbers. Summed over the adapted projections of one layer that is `rank x (a per-rank width)`, and
the model has num_layers of them. vLLM reserves room for `--max-loras` adapters of
`--max-lora-rank` each, whatever rank the loaded ones really have, so the slots are sized by the
maximum rank, not the adapter's.
"""

from __future__ import annotations

from .spec import ModelSpec, dtype_bytes

# The projections of a Llama-style layer, in ModelSpec.linear_shapes() order.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def _shapes(spec: ModelSpec, target_modules: tuple[str, ...] | list[str]) -> list[tuple[int, int]]:
    unknown = [m for m in target_modules if m not in PROJECTIONS]
    if unknown:
        raise ValueError(f"unknown target modules {unknown}; a Llama-style layer has {list(PROJECTIONS)}")
    shapes = dict(zip(PROJECTIONS, spec.linear_shapes()))
    return [shapes[m] for m in target_modules]


def lora_params_per_rank_per_layer(spec: ModelSpec, target_modules=ATTENTION) -> int:
    """Numbers one rank of an adapter adds to one layer: the sum of (in + out) over its projections."""
    return sum(i + o for i, o in _shapes(spec, tuple(target_modules)))


def lora_adapter_bytes(spec: ModelSpec, rank: int, target_modules=ATTENTION, dtype: str = "float32") -> int:
    """Bytes of one adapter of `rank` on `target_modules` in every layer, stored in `dtype`."""
    if int(rank) != rank or rank < 1:
        raise ValueError(f"rank must be a positive whole number, got {rank!r}")
    per = lora_params_per_rank_per_layer(spec, target_modules)
    return int(rank) * per * spec.num_layers * dtype_bytes(dtype)


def adapters_that_fit(
    spec: ModelSpec,
    free_bytes: float,
    kv_cache_bytes: float,
    max_lora_rank: int,
    target_modules=ATTENTION,
    dtype: str = "float32",
) -> int:
    """How many adapter slots of `max_lora_rank` fit in `free_bytes` once the KV cache has its share."""
    left = free_bytes - kv_cache_bytes
    if left <= 0:
        return 0
    return int(left // lora_adapter_bytes(spec, max_lora_rank, target_modules, dtype))


__all__ = [
    "ATTENTION",
    "PROJECTIONS",
    "adapters_that_fit",
    "lora_adapter_bytes",
    "lora_params_per_rank_per_layer",
]
