"""What a quantized KV cache costs in quality: one text, read with each cache, compared position by position.

    model = LlamaModel(course_model_path())                       # the readable model
    ref = teacher_forced(model, ids, "auto")                      # the unquantized cache
    cand = teacher_forced(model, ids, "fp8_e4m3")
    compare(model, ref, cand, ids).perplexity                     # and per layer, per position

*Teacher forced*: the whole text goes in as one prompt, so every position predicts the next token
of the same text under both caches, and the two runs differ only in how K/V were stored. In the
readable path every token's attention reads its context back from the cache, its own K/V included,
so what a position sees here is what it would see when decoded one token at a time.

The error is read at two places:
- per position: the final logits, candidate against reference, at every position; whether it
  grows along the text says whether rounding errors accumulate with context;
- per layer: each layer's output put through the final norm and the output projection (the
  "logit lens"), at a sample of positions; it says where in the stack the error enters and grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .llama import LlamaModel


@dataclass
class TeacherForced:
    """One text read through the model with one KV cache dtype."""

    kv_cache_dtype: str
    logits: torch.Tensor  # (T, vocab) float32: row t predicts token t + 1
    hidden: list[torch.Tensor]  # one (T, hidden) per layer: that layer's output


@dataclass
class QualityReport:
    """A candidate cache against the reference on one text."""

    kv_cache_dtype: str
    num_tokens: int
    perplexity: float  # of the candidate on the text
    reference_perplexity: float
    argmax_agreement: float  # share of positions whose top token is the reference's
    logit_error_per_position: list[float] = field(default_factory=list)  # mean |diff| over vocab
    kl_per_position: list[float] = field(default_factory=list)  # KL(reference || candidate), nats
    lens_positions: list[int] = field(default_factory=list)  # where the per-layer error was read
    logit_error_per_layer: list[float] = field(default_factory=list)  # mean over lens_positions

    def error_by_context(self, bins: int = 4) -> list[tuple[int, int, float]]:
        """(first position, last position, mean logit error) over `bins` equal stretches of the text."""
        err = self.logit_error_per_position
        size = max(1, -(-len(err) // bins))
        return [
            (i, min(i + size, len(err)) - 1, sum(err[i : i + size]) / len(err[i : i + size]))
            for i in range(0, len(err), size)
        ]


def teacher_forced(model: LlamaModel, token_ids: list[int], kv_cache_dtype: str = "auto",
                   block_size: int = 16) -> TeacherForced:  # fmt: skip
    """Read `token_ids` as one prompt with the cache stored as `kv_cache_dtype`.

    The model's cache is reallocated (just enough blocks for the text), so use a model that is not
    serving anything else; its KV dtype is set back afterwards.
    """
    import torch

    from .kv_quant import kv_cache_dtype as resolve
    from .llama import AttentionMetadata

    n = len(token_ids)
    if n < 2:
        raise ValueError("a text of at least 2 tokens is needed (each position predicts the next)")
    if n > model.config.max_position_embeddings:
        raise ValueError(f"{n} tokens exceed the model's context of {model.config.max_position_embeddings}")
    saved = model.kv_dtype
    model.kv_dtype = resolve(kv_cache_dtype, model.dtype)
    try:
        num_blocks = -(-n // block_size)
        model.allocate_kv_cache(num_blocks, block_size)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n, device=model.device),
            query_start_loc=[0, n],
            seq_lens=[n],
            block_table=torch.arange(num_blocks, device=model.device).unsqueeze(0),  # (1, blocks)
            num_decodes=0,
        )
        ids = torch.tensor(token_ids, dtype=torch.long, device=model.device)
        hidden: list[torch.Tensor] = []
        with torch.inference_mode():
            logits = model.forward(ids, ids.new_tensor(range(n)), meta, ids.new_tensor(range(n)), hidden)
    finally:
        model.kv_dtype = saved
        model.k_cache, model.v_cache, model.k_scale, model.v_scale = [], [], [], []
    return TeacherForced(kv_cache_dtype, logits, hidden)


def _perplexity(logits: torch.Tensor, token_ids: list[int]) -> float:
    import torch

    targets = torch.tensor(token_ids[1:], dtype=torch.long)
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), targets)
    return float(torch.exp(nll))


def compare(
    model: LlamaModel, ref: TeacherForced, cand: TeacherForced, token_ids: list[int], lens_points: int = 16
) -> QualityReport:
    """Perplexity, top-token agreement and logit error of `cand` against `ref` on the same text."""
    import torch

    logp_ref = torch.log_softmax(ref.logits, -1)
    logp_cand = torch.log_softmax(cand.logits, -1)
    kl = (logp_ref.exp() * (logp_ref - logp_cand)).sum(-1)  # (T,)
    per_pos = (ref.logits - cand.logits).abs().mean(-1)  # (T,)
    n = len(token_ids)
    points = sorted({round(i * (n - 1) / max(1, lens_points - 1)) for i in range(lens_points)})
    rows = torch.tensor(points, dtype=torch.long)
    per_layer = []
    with torch.inference_mode():
        for h_ref, h_cand in zip(ref.hidden, cand.hidden):
            lens = [
                torch.nn.functional.linear(
                    model._rms_norm(h.index_select(0, rows), model.norm), model.lm_head
                )
                for h in (h_ref, h_cand)
            ]
            per_layer.append(float((lens[0] - lens[1]).abs().float().mean()))
    return QualityReport(
        kv_cache_dtype=cand.kv_cache_dtype,
        num_tokens=n,
        perplexity=_perplexity(cand.logits, token_ids),
        reference_perplexity=_perplexity(ref.logits, token_ids),
        argmax_agreement=float((ref.logits.argmax(-1) == cand.logits.argmax(-1)).float().mean()),
        logit_error_per_position=per_pos.tolist(),
        kl_per_position=kl.clamp_min(0).tolist(),
        lens_positions=points,
        logit_error_per_layer=per_layer,
    )
