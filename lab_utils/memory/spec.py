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

Mixture-of-experts and today's attention (Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss) change two
terms. An MoE layer holds `num_experts` routed experts (each a gate/up/down MLP of width
`moe_intermediate_size`), `num_shared_experts` that every token uses, and a router (hidden x
experts); the first `num_dense_layers` layers keep a dense MLP. A token is multiplied through the
attention, the shared experts and `num_experts_per_tok` routed experts only: `active_params`.
Multi-head latent attention (MLA, DeepSeek) projects through low-rank q and kv matrices and
caches the latent, not heads; sliding-window layers (gpt-oss) attend to the last `sliding_window`
tokens only.
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
    # -- mixture of experts (0: a dense MLP in every layer) --
    num_experts: int = 0  # routed experts per MoE layer (num_local_experts, n_routed_experts)
    num_experts_per_tok: int = 0  # top-k: routed experts each token goes through
    moe_intermediate_size: int = 0  # width of one expert's MLP (0: intermediate_size)
    num_shared_experts: int = 0  # experts every token goes through (DeepSeek n_shared_experts)
    num_dense_layers: int = 0  # layers that keep a dense MLP (first_k_dense_replace)
    # -- multi-head latent attention (0: ordinary heads) --
    kv_lora_rank: int = 0  # the cached latent's width
    q_lora_rank: int = 0  # 0: q is one full projection
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0  # the rotary part of each key, cached beside the latent
    v_head_dim: int = 0
    # -- sliding-window attention --
    sliding_window: int = 0  # tokens a sliding layer attends to (0: none)
    num_sliding_layers: int = 0  # layers that use the window (layer_types "sliding_attention")

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
        for field_name in (
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "num_shared_experts",
            "num_dense_layers",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "sliding_window",
            "num_sliding_layers",
        ):
            value = getattr(self, field_name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or int(value) != value
                or value < 0
            ):
                raise ValueError(f"{field_name} must be a whole number >= 0, got {value!r}")
            object.__setattr__(self, field_name, int(value))
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be between 1 and num_experts "
                f"({self.num_experts}): each token goes through that many routed experts"
            )
        if self.num_dense_layers > self.num_layers or self.num_sliding_layers > self.num_layers:
            raise ValueError("num_dense_layers and num_sliding_layers cannot exceed num_layers")
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
            **_moe_and_attention_fields(cfg),
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
    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """True when attention is multi-head latent attention (a cached latent, not heads)."""
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def attention_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of one layer's attention matrices (q, k, v, o; MLA: its low-rank pairs)."""
        h, heads = self.hidden_size, self.num_attention_heads
        if not self.is_mla:
            q, kv = heads * self.head_dim, self.num_kv_heads * self.head_dim
            return [(h, q), (h, kv), (h, kv), (q, h)]
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = [(h, self.q_lora_rank), (self.q_lora_rank, heads * qk)] if self.q_lora_rank else [(h, heads * qk)]
        return q + [
            (h, self.kv_lora_rank + self.qk_rope_head_dim),  # kv_a: the latent and the rotary key
            (self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim)),  # kv_b
            (heads * self.v_head_dim, h),  # o
        ]

    @property
    def expert_params(self) -> int:
        """Parameters of one expert (gate, up, down)."""
        return 3 * self.hidden_size * (self.moe_intermediate_size or self.intermediate_size)

    def matrix_shapes(self) -> list[tuple[int, int, int]]:
        """(in, out, count) of every layer matrix in the model: what quantization shrinks."""
        h, i = self.hidden_size, self.intermediate_size
        if not self.is_moe and not self.is_mla:
            return [(a, b, self.num_layers) for a, b in self.linear_shapes()]
        shapes = [(a, b, self.num_layers) for a, b in self.attention_shapes()]
        dense = self.num_layers - self.num_moe_layers
        if dense:
            shapes += [(h, i, 2 * dense), (i, h, dense)]
        if self.num_moe_layers:
            m, n = self.moe_intermediate_size or i, self.num_experts + self.num_shared_experts
            shapes += [(h, m, 2 * n * self.num_moe_layers), (m, h, n * self.num_moe_layers)]
            shapes += [(h, self.num_experts, self.num_moe_layers)]  # the router
        return shapes

    @property
    def active_params(self) -> int:
        """Parameters one token is multiplied through (plus the embedding): total for a dense model.

        Attention, dense MLPs, the router, the shared experts and `num_experts_per_tok` routed
        experts of every MoE layer; the embedding and lm_head are counted as in `num_params`.
        """
        if not self.is_moe:
            return self.num_params
        idle = self.num_moe_layers * (self.num_experts - self.num_experts_per_tok) * self.expert_params
        return self.num_params - idle

    @property
    def total_params(self) -> int:
        """All parameters (the same as `num_params`)."""
        return self.num_params

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of the weight matrices in ONE layer (q, k, v, o, gate, up, down).

        Dense models only; `matrix_shapes()` covers experts and latent attention.
        """
        if self.is_moe or self.is_mla:
            raise ValueError(
                f"{self.name} has experts or latent attention: its layers differ; use matrix_shapes()"
            )
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
        return sum(a * b * n for a, b, n in self.matrix_shapes())

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
        mla_norms = (self.q_lora_rank + self.kv_lora_rank) if self.is_mla else 0
        return self.num_layers * (2 * self.hidden_size + bias + mla_norms) + self.hidden_size

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
        weights = self.linear_params - (self.num_params - self.active_params)
        return 2 * (weights + self.vocab_size * self.hidden_size) + attn


def _moe_and_attention_fields(cfg: dict) -> dict[str, int]:
    """The MoE, MLA and sliding-window fields of a config.json (zeros for a dense model)."""
    layers = int(cfg["num_hidden_layers"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    fields: dict[str, int] = {}
    if experts:
        # Qwen-MoE: mlp_only_layers stay dense, and only every decoder_sparse_step-th layer is MoE
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        moe_layers = sum(
            1 for n in range(layers) if n >= first_dense and n not in dense_only and (n + 1) % step == 0
        )
        top_k = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
        if not top_k:
            raise ValueError(
                "a mixture-of-experts config needs num_experts_per_tok (the routed experts per token)"
            )
        fields.update(
            num_experts=int(experts),
            num_experts_per_tok=int(top_k),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            num_shared_experts=int(cfg.get("n_shared_experts") or 0),
            num_dense_layers=layers - moe_layers,
        )
    if cfg.get("kv_lora_rank"):
        fields.update(
            {
                k: int(cfg.get(k) or 0)
                for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim")
            },
            qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        )
    # sliding windows counted only where layer_types names the layers (gpt-oss, Gemma 3); a
    # single sliding_window without them (Mistral 7B v0.1) is left to the dense rule
    kinds = cfg.get("layer_types") or []
    if cfg.get("sliding_window") and kinds:
        fields.update(
            sliding_window=int(cfg["sliding_window"]),
            num_sliding_layers=sum(1 for k in kinds[:layers] if k == "sliding_attention"),
        )
    return fields
