"""A Llama-architecture decoder in plain torch that reads Hugging Face safetensors and attends
through a paged KV cache. This is the readable path; `fast.py` runs the same model faster.

No transformers model class is involved: the weights are read straight from the safetensors files,
and every layer is a handful of matmuls written out below (RMSNorm, RoPE, grouped-query attention,
SwiGLU MLP, tied embeddings). The batch is *flattened*: the tokens of every scheduled request sit
one after another in one (T, hidden) matrix, so each linear layer is a single matmul for the whole
batch; only attention needs to know which token belongs to which request.

`fast.FastLlamaModel` subclasses this model and swaps in CPU kernels (prepacked matmuls, vLLM's
paged attention); `LLMEngine(fast=False)` runs this file alone, and a test checks that both give
the same logits and the same greedy tokens.
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
class AttentionMetadata:
    """Which rows of the flattened batch belong to which request, and where their K/V live.

    Request i owns rows query_start_loc[i] .. query_start_loc[i + 1] of the batch; after this step
    its context holds seq_lens[i] tokens, whose K/V sit in the blocks block_table[i] lists. The
    first `num_decodes` requests have exactly one new token. A *slot* is one token position in the
    cache: block_id * block_size + offset (vLLM's names throughout).
    """

    slot_mapping: torch.Tensor  # (T,) the slot each new token's K/V is written to
    query_start_loc: list[int]  # (num_reqs + 1,) first row of each request, then T
    seq_lens: list[int]  # (num_reqs,) context length of each request, new tokens included
    block_table: torch.Tensor  # (num_reqs, max_blocks) block ids, padded with 0
    num_decodes: int  # requests with one new token; they come first

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)


class LlamaModel:
    """Weights of a Llama checkpoint plus the paged KV cache, and one batched forward pass."""

    def __init__(
        self, folder: str | Path, device: str = "cpu", dtype=None, kv_cache_dtype: str = "auto"
    ) -> None:
        import torch

        from .kv_quant import kv_cache_dtype as resolve_kv_dtype

        self.folder = Path(folder)
        self.config = LlamaConfig.from_folder(self.folder)
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        # How K/V are stored (kv_quant.py): the model's dtype, or fp8/int8 dequantized when read.
        self.kv_dtype = resolve_kv_dtype(kv_cache_dtype, self.dtype)
        self._load_weights()
        self._build_rope(self.config.max_position_embeddings)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        # int8 only: one float32 scale per stored token and KV head, (num_blocks, block_size, Hkv)
        self.k_scale: list[torch.Tensor] = []
        self.v_scale: list[torch.Tensor] = []
        self.block_size = 0

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
            self.lm_head = self.embed_tokens  # tied: the output projection reuses the embedding
        else:
            self.lm_head = take("lm_head.weight")  # (V, hidden)
        self.layers: list[dict[str, torch.Tensor]] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            q, k, v = (take(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            gate, up = take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")
            self.layers.append(
                {
                    "input_layernorm": take(p + "input_layernorm.weight"),
                    # q, k and v in one matrix, as vLLM's QKVParallelLinear: one matmul, not three.
                    "qkv_proj": torch.cat([q, k, v], 0).contiguous(),  # ((H + 2 Hkv) D, hidden)
                    "o_proj": take(p + "self_attn.o_proj.weight"),  # (hidden, H D)
                    "post_attention_layernorm": take(p + "post_attention_layernorm.weight"),
                    "gate_up_proj": torch.cat([gate, up], 0).contiguous(),  # (2 I, hidden)
                    "down_proj": take(p + "mlp.down_proj.weight"),  # (hidden, I)
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
        self.rope_freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (L, D/2)
        emb = torch.cat([self.rope_freqs, self.rope_freqs], dim=-1)  # (L, D)
        self.rope_cos = emb.cos().to(device=self.device, dtype=self.dtype)
        self.rope_sin = emb.sin().to(device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ KV cache
    @property
    def kv_converted(self) -> bool:
        """True when K/V are stored in another dtype than the model's (fp8, int8, or bf16 under fp32)."""
        return self.kv_dtype.torch_dtype() != self.dtype

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """One K and one V tensor per layer: (num_blocks, block_size, Hkv, D), zero-filled.

        Zeros matter: attention may read padding slots, and masked garbage could be NaN, which a
        mask does not cancel (NaN * 0 = NaN).
        """
        import torch

        c = self.config
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        store = self.kv_dtype.torch_dtype()
        self.k_cache = [torch.zeros(shape, dtype=store, device=self.device) for _ in range(c.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=store, device=self.device) for _ in range(c.num_layers)]
        self.k_scale, self.v_scale = [], []
        if self.kv_dtype.per_token_scales:
            scale_shape = (num_blocks, block_size, c.num_kv_heads)
            self.k_scale = [torch.zeros(scale_shape, device=self.device) for _ in range(c.num_layers)]
            self.v_scale = [torch.zeros(scale_shape, device=self.device) for _ in range(c.num_layers)]
        self.block_size = block_size

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy the K/V of block src into block dst, every layer."""
        import torch

        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for cache in (*self.k_cache, *self.v_cache, *self.k_scale, *self.v_scale):
            # Blocks are the first dimension in any layout. fp8 is copied as raw bytes: a copy
            # needs no arithmetic, and not every torch op knows the float8 types.
            raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
            raw.index_copy_(0, dst, raw.index_select(0, src))

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
        """Write this step's K/V into the cache, then attend each request over its own context.

        q: (T, H, D); k, v: (T, Hkv, D). Returns (T, H*D).
        """
        import torch

        self._write_kv(k, v, layer, meta)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
        for i in range(meta.num_reqs):
            self._attend_request(i, q, layer, meta, out)
        return out

    def _write_kv(self, k, v, layer: int, meta: AttentionMetadata) -> None:
        """Store each new token's K and V at its slot (blocks viewed as one row per slot).

        A quantized cache stores them rounded (kv_quant.quantize_kv), int8 with its scales beside.
        """
        import torch

        from .kv_quant import quantize_kv

        c = self.config
        for new, cache, scales in ((k, self.k_cache, self.k_scale), (v, self.v_cache, self.v_scale)):
            stored, scale = quantize_kv(new, self.kv_dtype)  # (T, Hkv, D), (T, Hkv) or None
            rows = cache[layer].view(-1, c.num_kv_heads, c.head_dim)  # one row per slot
            if stored.element_size() == 1:  # fp8 and int8 as raw bytes (see copy_blocks)
                rows, stored = rows.view(torch.uint8), stored.view(torch.uint8)
            rows.index_copy_(0, meta.slot_mapping, stored)
            if scale is not None:
                scales[layer].view(-1, c.num_kv_heads).index_copy_(0, meta.slot_mapping, scale)

    def _read_kv(self, layer: int, blocks: torch.Tensor, ctx: int):
        """A request's first `ctx` keys and values, read through its block ids: two (ctx, Hkv, D).

        This is where a quantized cache is dequantized, into the model's dtype, so attention
        below it is the same code for every KV dtype.
        """
        from .kv_quant import dequantize_kv

        out = []
        for cache, scales in ((self.k_cache, self.k_scale), (self.v_cache, self.v_scale)):
            stored = cache[layer][blocks].flatten(0, 1)[:ctx]  # (ctx, Hkv, D)
            if stored.dtype == self.dtype:  # stored as the model computes: nothing to undo
                out.append(stored)
                continue
            scale = scales[layer][blocks].flatten(0, 1)[:ctx] if scales else None  # (ctx, Hkv)
            out.append(dequantize_kv(stored, scale, self.kv_dtype, self.dtype))
        return out[0], out[1]

    def _attend_request(self, i: int, q, layer: int, meta: AttentionMetadata, out) -> None:
        """Attention of request i's new tokens over its context; writes rows of out (T, H*D)."""
        import torch
        import torch.nn.functional as F

        start, end = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        n, ctx = end - start, meta.seq_lens[i]
        # The request's context, read through its block table: (ctx, Hkv, D) -> (1, Hkv, ctx, D)
        blocks = meta.block_table[i, : -(-ctx // self.block_size)]
        keys, values = self._read_kv(layer, blocks, ctx)
        keys, values = keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)
        qi = q[start:end].transpose(0, 1).unsqueeze(0)  # (1, H, n, D)
        # The new tokens are the last n of the context: token j sees positions 0 .. ctx - n + j.
        rows = torch.arange(n, device=q.device).unsqueeze(1) + (ctx - n)
        mask = torch.arange(ctx, device=q.device).unsqueeze(0) <= rows  # (n, ctx)
        o = F.scaled_dot_product_attention(qi, keys, values, attn_mask=mask, enable_gqa=True)
        out[start:end] = o[0].transpose(0, 1).reshape(n, -1)  # (1, H, n, D) -> (n, H*D)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        hidden_states: list | None = None,
    ) -> torch.Tensor:
        """Run the flattened batch through every layer, writing K/V into the cache.

        Args:
            input_ids: (T,) new tokens of every scheduled request, decodes first.
            positions: (T,) their positions in their own sequences (RoPE).
            meta: where K/V go and what each token attends to.
            logits_indices: rows whose next-token logits are wanted (a request's last new token).
            hidden_states: when a list is given, each layer's output (T, hidden) is appended to it
                (the quality measurements of kv_quality.py read where a quantized cache drifts).
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
            q, k, v = F.linear(x, w["qkv_proj"]).split([qd, kd, kd], dim=-1)
            q = self._rope(q.view(t, c.num_heads, c.head_dim), cos, sin)  # (T, H, D)
            k = self._rope(k.view(t, c.num_kv_heads, c.head_dim), cos, sin)  # (T, Hkv, D)
            v = v.view(t, c.num_kv_heads, c.head_dim)
            h = h + F.linear(self._attention(q, k, v, i, meta), w["o_proj"])
            x = self._rms_norm(h, w["post_attention_layernorm"])
            gate, up = F.linear(x, w["gate_up_proj"]).chunk(2, dim=-1)  # (T, I) each
            h = h + F.linear(F.silu(gate) * up, w["down_proj"])
            if hidden_states is not None:
                hidden_states.append(h)
        h = self._rms_norm(h.index_select(0, logits_indices), self.norm)  # only rows we sample from
        return F.linear(h, self.lm_head).float()  # (S, vocab)
