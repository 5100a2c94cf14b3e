"""A Llama-architecture decoder in plain torch that reads Hugging Face safetensors and attends
through a paged KV cache.

No transformers model class is involved: the weights are read straight from the safetensors files,
and every layer is a handful of matmuls written out below (RMSNorm, RoPE, grouped-query attention,
SwiGLU MLP, tied embeddings). The batch is *flattened*: the tokens of every scheduled request sit
one after another in one (T, hidden) matrix, so each linear layer is a single matmul for the whole
batch; only attention needs to know which token belongs to which request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass
class LlamaConfig:
    """The numbers of a Llama checkpoint that the forward pass needs (from config.json)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_folder(cls, folder: str | Path) -> LlamaConfig:
        """Read and check config.json; a clear error for architectures this runner cannot run."""
        folder = Path(folder)
        try:
            cfg = json.loads((folder / "config.json").read_text())
        except FileNotFoundError:
            raise ValueError(f"{folder} has no config.json: not a Hugging Face model folder") from None
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs) and cfg.get("model_type") != "llama":
            raise ValueError(
                f"{folder} holds a {archs[0]} model (model_type={cfg.get('model_type')!r}); the course "
                f"engine runs {', '.join(SUPPORTED_ARCHITECTURES)} checkpoints only. Use vLLM for "
                "other architectures, or pass a Llama-family folder."
            )
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ValueError(
                f"{folder}: RoPE scaling {rope_type!r} is not implemented in the course "
                "engine (only plain RoPE)"
            )
        for flag in ("attention_bias", "mlp_bias"):
            if cfg.get(flag):
                raise ValueError(f"{folder}: {flag}=true is not implemented in the course engine")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{folder}: hidden_act={cfg['hidden_act']!r}; the course engine implements silu")
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        gen = folder / "generation_config.json"
        if gen.exists():  # generation_config may list more EOS ids (chat models often do)
            eos = json.loads(gen.read_text()).get("eos_token_id", eos)
        eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        return cls(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V, every layer, KV heads only."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


@dataclass
class PrefillSpan:
    """One request with more than one new token in the flattened batch (a prompt or a chunk of it)."""

    start: int  # first row of its tokens in the flattened batch
    end: int  # one past its last row
    num_computed: int  # tokens already in the cache before this chunk (prefix hit, earlier chunks)
    context_slots: torch.Tensor | None  # (num_computed + n,) cache slots of its whole context


@dataclass
class DecodeGroup:
    """Consecutive decode rows whose contexts are padded to one length and attended to in one call.

    Decodes are sorted by context length and cut into small groups, so a request with 30 tokens
    of context is not padded to the 450 of the longest one: padding costs a gather and attention
    over slots that are then masked out.
    """

    start: int  # first row in the flattened batch
    end: int  # one past the last row
    slots: torch.Tensor  # (n, L) context slots per request, padded with slot 0
    mask: torch.Tensor  # (n, 1, 1, L) additive: 0 where a slot is real context, -inf on padding


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and which cache slots each request attends to.

    The first `num_decodes` rows of the batch are requests with exactly one new token (split into
    `decode_groups`); the rest are prefill spans. A *slot* is one token position in the cache:
    block_id * block_size + offset.
    """

    slot_mapping: torch.Tensor  # (T,) slot each new token's K/V is written to
    num_decodes: int
    decode_groups: list[DecodeGroup]  # the decode rows, in groups of similar context length
    prefills: list[PrefillSpan]


class Linear:
    """y = x @ weight.T, the one matmul every projection is.

    On CPU the weight is reordered once, at load, into oneDNN's blocked layout, as vLLM's CPU
    backend does (`create_onednn_mm`). At decode batch sizes that ran 1.3x to 2x faster than
    `F.linear` (MKL) on a 2-core AVX2 machine, the lm_head most of all. Where torch has no oneDNN,
    on CUDA, or for a dtype this CPU cannot reorder (bf16 without AVX-512), it stays `F.linear`.
    """

    def __init__(self, weight: torch.Tensor, prepack: bool = True) -> None:
        import torch

        self.weight: torch.Tensor | None = weight
        self.packed = None
        if prepack and weight.device.type == "cpu" and torch.backends.mkldnn.is_available():
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32)  # 32: a decode batch
                gen = torch.Generator().manual_seed(0)  # its own: the global RNG stays untouched
                probe = torch.randn(3, weight.shape[1], generator=gen).to(weight.dtype)
                same = torch.allclose(
                    self._packed_matmul(probe, packed), probe @ weight.T, rtol=1e-3, atol=1e-3
                )
            except (RuntimeError, AttributeError):  # no such op, or not for this dtype/CPU
                same = False
            if same:
                # The packed copy is all a call reads. A tied lm_head's weight lives on as the
                # embedding, which holds its own reference; an untied one is freed here.
                self.packed, self.weight = packed, None

    @staticmethod
    def _packed_matmul(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if self.packed is not None:
            return self._packed_matmul(x, self.packed)
        return F.linear(x, self.weight)


class LlamaModel:
    """Weights of a Llama checkpoint plus the paged KV cache, and one batched forward pass."""

    def __init__(self, folder: str | Path, device: str = "cpu", dtype=None) -> None:
        import torch

        self.folder = Path(folder)
        self.config = LlamaConfig.from_folder(self.folder)
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self._load_weights()
        self._build_rope(self.config.max_position_embeddings)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []

    # ------------------------------------------------------------------ weights
    def _read_safetensors(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise ValueError(
                f"{self.folder} has no *.safetensors files; the course engine loads "
                "safetensors only (save the model with safe_serialization=True)"
            )
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f), device="cpu"))
        return tensors

    def _load_weights(self) -> None:
        import torch

        c = self.config
        raw = self._read_safetensors()

        def take(name: str) -> torch.Tensor:
            try:
                t = raw.pop(name)  # noqa: F821 (raw is the enclosing function's; it is deleted after loading)
            except KeyError:
                raise ValueError(
                    f"{self.folder}: weight {name!r} is missing; is this a Llama checkpoint?"
                ) from None
            return t.to(device=self.device, dtype=self.dtype).contiguous()

        self.embed_tokens = take("model.embed_tokens.weight")  # (V, hidden)
        self.norm = take("model.norm.weight")
        if c.tie_word_embeddings or "lm_head.weight" not in raw:
            self.lm_head = Linear(self.embed_tokens)  # tied: the output projection reuses the embedding
        else:
            self.lm_head = Linear(take("lm_head.weight"))
        self.layers: list[dict[str, torch.Tensor | Linear]] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            q, k, v = (take(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            gate, up = take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")
            self.layers.append(
                {
                    "input_layernorm": take(p + "input_layernorm.weight"),
                    # q, k and v in one matrix: one matmul instead of three. ((H + 2 Hkv) D, hidden)
                    "qkv_proj": Linear(torch.cat([q, k, v], 0).contiguous()),
                    "o_proj": Linear(take(p + "self_attn.o_proj.weight")),
                    "post_attention_layernorm": take(p + "post_attention_layernorm.weight"),
                    "gate_up_proj": Linear(torch.cat([gate, up], 0).contiguous()),  # (2 I, hidden)
                    "down_proj": Linear(take(p + "mlp.down_proj.weight")),
                }
            )
        del raw

    def _build_rope(self, max_len: int) -> None:
        import torch

        c = self.config
        # Same arithmetic as transformers' default RoPE, in float32, so positions match bit for bit.
        inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim)
        )
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (L, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (L, D)
        self.rope_cos = emb.cos().to(device=self.device, dtype=self.dtype)
        self.rope_sin = emb.sin().to(device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ KV cache
    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """One K and one V tensor per layer: (num_blocks * block_size, Hkv, D), zero-filled.

        Zeros matter: padded decode rows read slot 0, and masked garbage could be NaN, which a
        mask does not cancel (NaN * 0 = NaN).
        """
        import torch

        c = self.config
        shape = (num_blocks * block_size, c.num_kv_heads, c.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.block_size = block_size

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy the K/V of block src into block dst, every layer."""
        import torch

        if not pairs:
            return
        bs = self.block_size
        src = torch.tensor([s * bs + o for s, _ in pairs for o in range(bs)], device=self.device)
        dst = torch.tensor([d * bs + o for _, d in pairs for o in range(bs)], device=self.device)
        for cache in (*self.k_cache, *self.v_cache):
            cache.index_copy_(0, dst, cache.index_select(0, src))

    # ------------------------------------------------------------------ forward
    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        import torch

        # As transformers' LlamaRMSNorm: normalise in float32, scale in the model dtype.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return weight * x32.to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attention(self, q, k, v, layer: int, meta: AttentionMetadata):
        """Attention of every new token over its own request's cached context. Returns (T, H*D)."""
        import torch
        import torch.nn.functional as F

        c = self.config
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        group = c.num_heads // c.num_kv_heads
        pieces = []
        for g in meta.decode_groups:
            # Decode: gather each request's context through its block table, padded to the longest
            # in its group. The G query heads that share a KV head are laid out as G "query
            # positions", so no K/V copy per query head is needed (GQA as one batched matmul).
            n, length = g.slots.shape
            flat = g.slots.reshape(-1)
            keys = kc.index_select(0, flat).view(n, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
            values = vc.index_select(0, flat).view(n, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
            qd = q[g.start : g.end].view(n, c.num_kv_heads, group, c.head_dim)  # (n, Hkv, G, D)
            out = F.scaled_dot_product_attention(qd, keys, values, attn_mask=g.mask)
            pieces.append(out.reshape(n, c.num_heads * c.head_dim))  # (n, Hkv, G, D) -> (n, H*D)
        for span in meta.prefills:
            n = span.end - span.start
            qp = q[span.start : span.end].transpose(0, 1).unsqueeze(0)  # (1, H, n, D)
            if span.context_slots is None:
                # A fresh prompt: its context is exactly the tokens just computed; plain causal mask.
                kp = k[span.start : span.end].transpose(0, 1).unsqueeze(0)  # (1, Hkv, n, D)
                vp = v[span.start : span.end].transpose(0, 1).unsqueeze(0)
                out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
            else:
                # A chunk after cached tokens: token i of the chunk sees context 0 .. num_computed + i.
                ctx = span.context_slots.shape[0]
                kp = kc.index_select(0, span.context_slots).transpose(0, 1).unsqueeze(0)  # (1, Hkv, ctx, D)
                vp = vc.index_select(0, span.context_slots).transpose(0, 1).unsqueeze(0)
                rows = torch.arange(n, device=q.device).unsqueeze(1) + span.num_computed
                mask = torch.arange(ctx, device=q.device).unsqueeze(0) <= rows  # (n, ctx)
                out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=True)
            pieces.append(out[0].transpose(0, 1).reshape(n, c.num_heads * c.head_dim))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, 0)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run the flattened batch through every layer, writing K/V into the cache.

        Args:
            input_ids: (T,) new tokens of every scheduled request, decodes first.
            positions: (T,) their positions in their own sequences (RoPE).
            meta: where K/V go and what each token attends to.
            logits_indices: rows whose next-token logits are wanted (a request's last new token).
        Returns:
            (S, vocab) float32 logits, one row per entry of logits_indices.
        """
        import torch.nn.functional as F

        c = self.config
        t = input_ids.shape[0]
        cos = self.rope_cos.index_select(0, positions).unsqueeze(1)  # (T, 1, D)
        sin = self.rope_sin.index_select(0, positions).unsqueeze(1)
        h = F.embedding(input_ids, self.embed_tokens)  # (T, hidden)
        qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        for i, w in enumerate(self.layers):
            x = self._rms_norm(h, w["input_layernorm"])
            qk, v = w["qkv_proj"](x).split([qd + kd, kd], dim=-1)
            # q and k rotate by the same angles: one RoPE over their H + Hkv heads together
            qk = self._rope(qk.view(t, c.num_heads + c.num_kv_heads, c.head_dim), cos, sin)
            q, k = qk.split([c.num_heads, c.num_kv_heads], dim=1)  # (T, H, D), (T, Hkv, D)
            v = v.view(t, c.num_kv_heads, c.head_dim)
            # Write this step's K/V into their slots; attention then reads them from the cache.
            self.k_cache[i].index_copy_(0, meta.slot_mapping, k)
            self.v_cache[i].index_copy_(0, meta.slot_mapping, v)
            h = h + w["o_proj"](self._attention(q, k, v, i, meta))
            x = self._rms_norm(h, w["post_attention_layernorm"])
            gate, up = w["gate_up_proj"](x).chunk(2, dim=-1)  # (T, I) each
            h = h + w["down_proj"](F.silu(gate) * up)
        h = self._rms_norm(h.index_select(0, logits_indices), self.norm)  # only rows we sample from
        return self.lm_head(h).float()  # (S, vocab)
