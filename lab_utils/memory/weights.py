"""Bytes of model weights in each precision, including what quantization does not shrink.

Plain dtypes store every parameter at the same width. Quantized checkpoints only quantize the
transformer layers' weight matrices (q, k, v, o, gate, up, down); the embedding, lm_head and norm
weights stay in 16 bits. That is why an "8-bit" Llama-3-8B is 9.1 GB, not 8.0 GB.

4-bit weight-only (AWQ / GPTQ style, the vLLM `--quantization awq|gptq` checkpoints): for every
matrix of shape (in, out), weights are packed two per byte, and each group of `group_size`
consecutive input rows shares, per output column,

    one 16-bit scale        -> 2 bytes
    one 4-bit zero point    -> 0.5 bytes (packed eight to an int32)

so a 128-weight group costs 64 + 2.5 bytes: 4.16 bits per weight instead of 4.
"""

from __future__ import annotations

from lab_utils.mathutils import cdiv

from .spec import DTYPE_BYTES, ModelSpec, canonical_dtype

# Quantization schemes: (bits per quantized weight, bytes the unquantized parts are kept in)
QUANTIZATIONS = ("fp8", "int8", "awq", "gptq", "int4")
HIGH_PRECISION_BYTES = 2  # embeddings, lm_head, norms stay in bfloat16/float16


def _four_bit_matrix_bytes(in_features: int, out_features: int, group_size: int) -> int:
    groups = cdiv(in_features, group_size)
    packed = cdiv(in_features * out_features, 2)  # two 4-bit weights per byte
    scales = groups * out_features * 2  # one fp16 scale per group per output column
    zeros = cdiv(groups * out_features, 2)  # one 4-bit zero point per group per column
    return packed + scales + zeros


def weight_bytes(spec: ModelSpec, dtype_or_quantization: str = "bfloat16", group_size: int = 128) -> int:
    """Bytes of all weights of `spec` stored as a dtype or a quantization scheme.

    Args:
        spec: the model.
        dtype_or_quantization: "float32", "bfloat16", "float16" (every weight at that width);
            "fp8" or "int8" (layer matrices at 1 byte, the rest at 2); "awq", "gptq" or "int4"
            (4-bit layer matrices with group scales and zero points, the rest at 2 bytes).
        group_size: input rows sharing one scale in 4-bit schemes (128 is the common choice).
    """
    name = str(dtype_or_quantization).strip().lower()
    rest = (spec.embedding_params + spec.small_params) * HIGH_PRECISION_BYTES
    if name in ("awq", "gptq", "int4", "w4a16"):
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(
                f"group_size must be a positive whole number of weights, got {group_size!r} "
                "(128 is the usual AWQ/GPTQ choice)"
            )
        return sum(n * _four_bit_matrix_bytes(i, o, group_size) for i, o, n in spec.matrix_shapes()) + rest
    try:
        canon = canonical_dtype(name)
    except ValueError:
        raise ValueError(
            f"unknown dtype or quantization {dtype_or_quantization!r}; use one of "
            f"['float32', 'bfloat16', 'float16', 'fp8', 'int8', 'awq', 'gptq', 'int4']"
        ) from None
    if canon in ("fp8", "int8"):
        return spec.linear_params * 1 + rest
    return spec.num_params * DTYPE_BYTES[canon]


def bits_per_weight(spec: ModelSpec, dtype_or_quantization: str, group_size: int = 128) -> float:
    """Average stored bits per parameter (shows the overhead of scales and unquantized parts)."""
    return 8 * weight_bytes(spec, dtype_or_quantization, group_size) / spec.num_params
