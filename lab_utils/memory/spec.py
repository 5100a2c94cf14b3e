"""A model's shape, read from its Hugging Face `config.json`, and what it implies.

Only the numbers that decide memory: layers, widths, heads, vocabulary. `num_params` is counted
from the architecture of a dense Llama-style decoder (Llama, Mistral, Qwen2, SmolLM2 ...):

    embedding             vocab x hidden
    per layer, attention  q: hidden x (heads*head_dim)   k, v: hidden x (kv_heads*head_dim)
                          o: (heads*head_dim) x hidden   (+ q/k/v biases for Qwen2)
    per layer, MLP        gate, up: hidden x intermediate   down: intermediate x hidden
    per layer, norms      2 x hidden
    final norm            hidden
    lm_head               vocab x hidden, unless tied to the embedding
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per element of each dtype the calculator knows, with the spellings people use.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}
_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "torch.float32": "float32",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "torch.float16": "float16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
}


def canonical_dtype(dtype: str) -> str:
    """The calculator's name for a dtype spelling ("bf16" -> "bfloat16"); ValueError if unknown."""
    name = str(dtype).strip().lower()
    name = _ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise ValueError(
            f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)} "
            "(or an alias such as 'bf16', 'fp16', 'fp32')"
        )
    return name


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of `dtype` (float32 -> 4, bfloat16 -> 2, fp8 -> 1)."""
    return DTYPE_BYTES[canonical_dtype(dtype)]


def _positive_int(name: str, value: Any, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r} ({hint})")
    return int(value)


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a dense decoder-only transformer, as far as memory is concerned."""

    name: str
    num_layers: int  # num_hidden_layers
    hidden_size: int
    num_attention_heads: int  # query heads
    num_kv_heads: int  # num_key_value_heads: equal to heads (MHA), fewer (GQA), or 1 (MQA)
    head_dim: int
    intermediate_size: int  # MLP width (gate/up/down projections)
    vocab_size: int
    tie_word_embeddings: bool = False  # lm_head shares the embedding matrix
    max_position_embeddings: int = 4096  # the context length the model was trained for
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen2)

    def __post_init__(self) -> None:
        for field_name, hint in [
            ("num_layers", "num_hidden_layers in config.json"),
            ("hidden_size", "hidden_size in config.json"),
            ("num_attention_heads", "num_attention_heads in config.json"),
            ("num_kv_heads", "num_key_value_heads; equal to num_attention_heads when absent"),
            ("head_dim", "head_dim, or hidden_size // num_attention_heads"),
            ("intermediate_size", "intermediate_size in config.json"),
            ("vocab_size", "vocab_size in config.json"),
            ("max_position_embeddings", "the model's context length"),
        ]:
            object.__setattr__(self, field_name, _positive_int(field_name, getattr(self, field_name), hint))
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}): each KV head serves a whole group "
                "of query heads"
            )

    @classmethod
    def from_hf_config(cls, config: str | Path | dict, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face config.json (a path, a folder holding one, or the parsed dict)."""
        if isinstance(config, (str, Path)):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ValueError(f"no config.json at {path}; pass the model folder, the file, or a dict")
            try:
                cfg = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not valid JSON ({exc}); pass a config.json") from None
            name = (
                name
                or cfg.get("_name_or_path")
                or (path.parent.name if path.name == "config.json" else path.stem)
            )
        elif isinstance(config, dict):
            cfg = dict(config)
        else:
            raise ValueError(f"config must be a path or a dict, got {type(config).__name__}")
        if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM inside
            cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
        if any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
            raise ValueError(
                "mixture-of-experts configs are not supported by this calculator; "
                "use a dense model config (Llama, Mistral, Qwen2, SmolLM2 ...)"
            )
        required = [
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        ]
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ValueError(f"config is missing {missing}; a decoder config.json needs {required}")
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else 0)
        return cls(
            name=str(name or cfg.get("_name_or_path") or cfg.get("model_type") or "model"),
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            num_attention_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.get("max_position_embeddings") or 4096,
            attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        )

    # -- parameter counts ------------------------------------------------------------------
    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of the weight matrices in ONE layer (q, k, v, o, gate, up, down)."""
        h, q, kv, i = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.intermediate_size,
        )
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    @property
    def linear_params(self) -> int:
        """Parameters in the transformer layers' weight matrices: what quantization shrinks."""
        return self.num_layers * sum(a * b for a, b in self.linear_shapes())

    @property
    def embedding_params(self) -> int:
        """Embedding plus lm_head (counted once when they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def small_params(self) -> int:
        """Norm weights and biases: tiny, never quantized."""
        bias = (
            (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        )
        return self.num_layers * (2 * self.hidden_size + bias) + self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters computed from the architecture (see the module docstring)."""
        return self.linear_params + self.embedding_params + self.small_params

    @property
    def non_embedding_params(self) -> int:
        """Parameters every token is multiplied through: all but the embedding and lm_head."""
        return self.num_params - self.embedding_params

    def prefill_flops(self, prompt_tokens: int) -> int:
        """FLOPs of one prompt's prefill, attention's quadratic term left out.

        2 per non-embedding parameter per prompt token (the embedding is a table lookup), plus one
        lm_head pass: the logits are computed for the last position only. Counting all parameters
        instead (2 x num_params x tokens) overstates it by about 15% for Llama-3-8B, 3% for 70B.
        """
        return 2 * self.non_embedding_params * int(prompt_tokens) + 2 * self.vocab_size * self.hidden_size

    def decode_flops_per_token(self, context_len: int = 0) -> int:
        """FLOPs to generate one token: 2 per weight, plus attention over `context_len` cached tokens."""
        attn = 4 * self.num_layers * self.num_attention_heads * self.head_dim * int(context_len)
        return 2 * (self.linear_params + self.vocab_size * self.hidden_size) + attn
