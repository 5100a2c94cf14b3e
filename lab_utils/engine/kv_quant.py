"""How the course engine stores K and V: in the model's dtype, or quantized (fp8 or int8).

    kvd = kv_cache_dtype("int8", model_dtype=torch.float32)
    q, scale = quantize_kv(k, kvd)          # k: (T, Hkv, D) -> int8 (T, Hkv, D), float32 (T, Hkv)
    k_again = dequantize_kv(q, scale, kvd, torch.float32)

The names are vLLM's `--kv-cache-dtype` values (vllm/config/cache.py), plus `int8`:

| name       | stored as            | scales                          | bytes per element |
|------------|----------------------|---------------------------------|-------------------|
| `auto`     | the model's dtype    | none                            | 4 (fp32), 2 (bf16)|
| `fp8_e4m3` | torch.float8_e4m3fn  | one per tensor, fixed at 1.0    | 1                 |
| `fp8_e5m2` | torch.float8_e5m2    | one per tensor, fixed at 1.0    | 1                 |
| `int8`     | torch.int8           | one float32 per token and head  | 1 + 4 / head_dim  |

`fp8` means `fp8_e4m3`, as in vLLM. The fp8 scale stays 1.0 because that is what vLLM uses when
the checkpoint carries no calibrated `k_scale`/`v_scale` (the course model carries none): values
are cast as they are, clamped to the format's largest finite number. e4m3 keeps 3 mantissa bits
(relative step 1/16) and reaches 448; e5m2 keeps 2 (relative step 1/8) and reaches 57344. int8
scales each token's head vector by its own largest magnitude, so no calibration is needed, and
pays 4 bytes of scale per 64 values for it.

Per-tensor scales are a few bytes per layer, not per token, so they do not change capacity: at
one memory budget fp8 holds exactly twice the tokens of bf16. The per-token scales of int8 do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .llama import LlamaConfig

# The accepted spellings; "fp8" is vLLM's alias of "fp8_e4m3".
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
_ALIASES = {"fp8": "fp8_e4m3"}


@dataclass(frozen=True)
class KVCacheDType:
    """One way of storing the KV cache."""

    name: str  # canonical: "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "int8"
    storage: str  # the torch dtype name of each stored element
    element_bytes: int  # bytes of one stored K or V element
    scale_bytes_per_head: int  # bytes of scale per token and KV head (0: none, or per tensor)

    @property
    def quantized(self) -> bool:
        """True when what is stored is not what attention multiplies with."""
        return self.name in ("fp8_e4m3", "fp8_e5m2", "int8")

    @property
    def per_token_scales(self) -> bool:
        return self.scale_bytes_per_head > 0

    def torch_dtype(self):
        import torch

        return getattr(torch, self.storage)


_CATALOGUE = {
    "float32": KVCacheDType("float32", "float32", 4, 0),
    "bfloat16": KVCacheDType("bfloat16", "bfloat16", 2, 0),
    "float16": KVCacheDType("float16", "float16", 2, 0),
    "fp8_e4m3": KVCacheDType("fp8_e4m3", "float8_e4m3fn", 1, 0),
    "fp8_e5m2": KVCacheDType("fp8_e5m2", "float8_e5m2", 1, 0),
    "int8": KVCacheDType("int8", "int8", 1, 4),  # one float32 scale per token and head
}
INT8_MAX = 127


def kv_cache_dtype(name: str, model_dtype=None) -> KVCacheDType:
    """The storage for a `--kv-cache-dtype` name; "auto" follows the model's dtype (float32 if None)."""
    key = str(name).strip().lower()
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {name!r}")
    if key == "auto":
        key = str(model_dtype).removeprefix("torch.") if model_dtype is not None else "float32"
    return _CATALOGUE[_ALIASES.get(key, key)]


def engine_kv_bytes_per_token(config: LlamaConfig, kvd: KVCacheDType) -> int:
    """Bytes one token takes in the engine's cache: K and V of every layer and KV head, scales included.

    2 x layers x kv_heads x (head_dim x element_bytes + scale_bytes_per_head)
    """
    per_head = config.head_dim * kvd.element_bytes + kvd.scale_bytes_per_head
    return 2 * config.num_layers * config.num_kv_heads * per_head


def quantize_kv(x: torch.Tensor, kvd: KVCacheDType) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(T, Hkv, D) keys or values -> what the cache stores, and the per-token-head scales (or None)."""
    import torch

    if kvd.name == "int8":
        x32 = x.float()
        # Symmetric: the largest magnitude of each (token, head) maps to 127; an all-zero vector
        # gets scale 1 so that dividing stays finite.
        amax = x32.abs().amax(dim=-1)  # (T, Hkv)
        scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        q = torch.round(x32 / scale.unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return q, scale
    target = kvd.torch_dtype()
    if kvd.name.startswith("fp8"):
        # Saturate as vLLM's fp8 conversion does: a plain cast turns out-of-range values into NaN.
        top = torch.finfo(target).max
        return x.float().clamp(-top, top).to(target), None
    return x.to(target), None


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor | None, kvd: KVCacheDType, dtype) -> torch.Tensor:
    """What `quantize_kv` stored (..., Hkv, D), back in the model's `dtype` for attention."""
    if kvd.name == "int8":
        return (stored.float() * scale.unsqueeze(-1)).to(dtype)
    return stored.to(dtype)
