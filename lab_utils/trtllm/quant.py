"""Weight quantization on the course model with torch: what FP8/INT4/NVFP4 checkpoints trade away.

Symmetric integer quantization of a weight matrix W (out_features x in_features) with b bits:

    qmax  = 2**(b-1) - 1                    # 127 for INT8, 7 for INT4
    scale = max|W| / qmax                   # over the whole tensor, one row, or one group of a row
    q     = clamp(round(W / scale), -qmax, qmax)     and  W ~ q * scale

The granularity decides which values share a scale: per-tensor (one), per-channel (one per output
row), group-wise (one per `group_size` consecutive inputs of a row: AWQ/GPTQ use 128). An outlier
only hurts the values that share its scale. Rounding makes an error of at most scale/2 per value;
if it is spread evenly, its RMS is scale/sqrt(12) (lab 08 asks you to predict it).

AWQ (activation-aware, Lin et al. 2023) multiplies the input channels that see large activations
by s > 1 before quantizing and divides the activations by s, so those weights lose less: s =
mean|x|**alpha, alpha searched on calibration text. Here W_eff = Q(W * s) / s is what the model
computes; a real checkpoint folds 1/s into the previous operation.

Measured on the course model: weight bytes (packed values + FP16 scales), greedy-token agreement
(on the float model's own greedy continuation, does the quantized model pick the same next token?)
and perplexity on a fixed text. Everything runs in float32 on CPU; the rounding is what we study.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

SCALE_BYTES = 2  # scales stored in FP16, as in AWQ/GPTQ checkpoints

# A fixed text for perplexity (written for the course; plain English, about 300 tokens).
EVAL_TEXT = (
    "A language model server spends most of its time waiting for memory. Each new token needs every "
    "weight of the model to travel from memory to the arithmetic units, and a small batch does very little "
    "arithmetic with each weight it reads. This is why serving systems batch many requests together and why "
    "they care so much about the size of the weights. If the weights take half the bytes, each decoding step "
    "reads half as much, and the memory that is saved can hold the key and value cache of more requests. "
    "Quantization stores each weight with fewer bits and keeps a scale that says how large the values in a "
    "group are. With eight bits the error is usually too small to notice. With four bits the model starts to "
    "change its mind about some tokens, and the way the scales are shared decides how often. A single large "
    "weight in a row forces a large scale on every weight that shares it, so the small weights lose most of "
    "their precision. Smaller groups limit that damage at the price of more scales. Methods that look at the "
    "activations protect the input channels that matter most. The only way to know what a format costs a "
    "given model is to measure it on text the model has to predict, token by token, and to compare its "
    "choices with the choices of the original model."
)
CALIBRATION_TEXTS = (
    "The capital of France is Paris, and the river that runs through it is the Seine.",
    "To sort a list in Python, call sorted() on it or use the list's sort method.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The quick brown fox jumps over the lazy dog near the bank of the river.",
)
GREEDY_PROMPTS = (
    "The three most important ideas in computer science are",
    "Here is a short story about a robot who learns to cook:",
)


# -- tensors ------------------------------------------------------------------------------
@dataclass
class QuantizedWeight:
    """Integer codes and their scales; `dequantize()` gives back the approximate float matrix."""

    q: Any  # torch.int8 (out, in): codes in [-qmax, qmax]
    scale: Any  # torch.float32 (out, n_groups): per-tensor (1, 1), per-channel (out, 1)
    bits: int
    group_size: int  # inputs sharing one scale along a row (in_features for per-channel/tensor)
    input_scale: Any = None  # AWQ: the per-input-channel s, divided back out (in,)

    def dequantize(self):
        out, inp = self.q.shape
        g = self.scale.shape[1]
        q = _pad_to_groups(self.q.float(), self.group_size if g > 1 else inp)  # whole groups again
        # (out, groups, group_size) x (out or 1, groups, 1): per-tensor scales broadcast over rows
        w = (q.reshape(out, g, -1) * self.scale.unsqueeze(-1)).reshape(out, -1)[:, :inp]
        return w / self.input_scale if self.input_scale is not None else w

    @property
    def nbytes(self) -> int:
        """Stored bytes: packed codes plus FP16 scales (and the AWQ input scales)."""
        extra = self.input_scale.numel() * SCALE_BYTES if self.input_scale is not None else 0
        return math.ceil(self.q.numel() * self.bits / 8) + self.scale.numel() * SCALE_BYTES + extra


def _qmax(bits: int) -> int:
    if bits not in (2, 3, 4, 8):
        raise ValueError(f"bits must be 2, 3, 4 or 8, got {bits!r}")
    return 2 ** (bits - 1) - 1


def _codes(w, scale, qmax):
    import torch

    return torch.clamp(torch.round(w / scale), -qmax, qmax)


def _pad_to_groups(w, group_size: int):
    """Zero-pad the inputs to whole groups (zeros never change a group's max|w|)."""
    import torch

    out, inp = w.shape
    pad = -inp % group_size
    return torch.nn.functional.pad(w, (0, pad)) if pad else w


def quantize(w, bits: int, granularity: str = "group", group_size: int = 128) -> QuantizedWeight:
    """Quantize with one of the three granularities ("tensor", "channel", "group").

    A per-channel scale is a group as wide as the row; a last group shorter than group_size (576
    inputs in groups of 128) gets its own scale.
    """
    import torch

    qmax = _qmax(bits)
    out, inp = w.shape
    if granularity == "tensor":
        scale = (w.abs().max() / qmax).clamp(min=1e-12).reshape(1, 1).float()
        return QuantizedWeight(_codes(w, scale, qmax).to(torch.int8), scale, bits, inp)
    if granularity not in ("channel", "group"):
        raise ValueError(f"granularity must be 'tensor', 'channel' or 'group', got {granularity!r}")
    g = inp if granularity == "channel" else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g <= 0:
        raise ValueError(f"group_size must be a positive whole number, got {g!r}")
    wg = _pad_to_groups(w, g).reshape(out, -1, g)  # (out, groups, g)
    scale = (wg.abs().amax(dim=2, keepdim=True) / qmax).clamp(min=1e-12)  # (out, groups, 1)
    q = _codes(wg, scale, qmax).reshape(out, -1)[:, :inp].to(torch.int8)
    return QuantizedWeight(q, scale.reshape(out, -1).float(), bits, g)


def fake_quantize(w, bits: int, granularity: str = "group", group_size: int = 128):
    """The dequantized matrix and its stored bytes, computed in place (the fast path for whole models).

    Same arithmetic as `quantize(...).dequantize()` with fewer temporaries: 106 M weights per scheme.
    """
    import torch

    qmax = _qmax(bits)
    out, inp = w.shape
    g = {"tensor": None, "channel": inp, "group": group_size}[granularity]
    if g is None:
        scale = (w.abs().max() / qmax).clamp(min=1e-12)
        n_scales = 1
        w_hat = torch.div(w, scale)
    else:
        wg = _pad_to_groups(w, g).reshape(out, -1, g)
        scale = (wg.abs().amax(dim=2, keepdim=True) / qmax).clamp_(min=1e-12)
        n_scales = scale.numel()
        w_hat = torch.div(wg, scale)
    w_hat.round_().clamp_(-qmax, qmax).mul_(scale)
    w_hat = w_hat.reshape(out, -1)[:, :inp]
    return w_hat, math.ceil(w.numel() * bits / 8) + n_scales * SCALE_BYTES


def rms_error(w, w_hat) -> float:
    """Measured RMS difference between a matrix and its quantized version."""
    return float((w.double() - w_hat.double()).pow(2).mean().sqrt())


def matrix_rms_errors(w, bits: int, group_sizes) -> dict[int, float]:
    """Measured RMS error of group-wise quantization of one matrix, per group size."""
    return {int(g): rms_error(w, quantize(w, bits, "group", int(g)).dequantize()) for g in group_sizes}


def awq_quantize(w, x, bits: int = 4, group_size: int = 128, grid: int = 11) -> tuple[QuantizedWeight, float]:
    """AWQ-style search: scale inputs by mean|x|**alpha before group quantization; best alpha by output error.

    Args:
        w: (out, in) weight. x: (tokens, in) calibration inputs of this linear layer.
    Returns:
        the quantized weight (with its input scales) and the chosen alpha.
    """
    import torch

    act = x.abs().mean(dim=0).clamp(min=1e-6)  # (in,)
    y = x @ w.T  # (tokens, out): what the float layer computes
    best_alpha, best_err = 0.0, float("inf")
    for alpha in torch.linspace(0, 1, grid).tolist():
        s = act.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # keep scales centred around 1
        w_hat = fake_quantize(w * s, bits, "group", group_size)[0] / s
        err = float((y - x @ w_hat.T).pow(2).mean())
        if err < best_err:
            best_alpha, best_err = alpha, err
    s = act.pow(best_alpha)
    s = s / (s.max() * s.min()).sqrt()
    qw = quantize(w * s, bits, "group", group_size)
    qw.input_scale = s if best_alpha > 0 else None
    return qw, best_alpha


# -- the course model -----------------------------------------------------------------------
@dataclass(frozen=True)
class Scheme:
    """One way of quantizing every layer matrix."""

    name: str
    bits: int | None  # None: the float model
    granularity: str = "group"
    group_size: int = 128
    awq: bool = False


def default_schemes(group_sizes: tuple[int, ...] = (128,)) -> list[Scheme]:
    """Float, INT8 per-tensor/per-channel, INT4 per-channel, INT4 per group size, INT4 + AWQ."""
    out = [
        Scheme("float32", None),
        Scheme("int8 per-tensor", 8, "tensor"),
        Scheme("int8 per-channel", 8, "channel"),
        Scheme("int4 per-channel", 4, "channel"),
    ]
    out += [Scheme(f"int4 g{g}", 4, "group", g) for g in group_sizes]
    out.append(Scheme(f"int4 g{max(group_sizes)} + AWQ", 4, "group", max(group_sizes), awq=True))
    return out


def load_course_model(path=None):
    """The course model in float32 for CPU and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models import course_model_path

    path = path or course_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tok


def layer_linears(model) -> dict:
    """The transformer layers' nn.Linear modules by name (embeddings and lm_head excluded)."""
    import torch

    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}


def calibration_inputs(model, tok, texts=CALIBRATION_TEXTS, max_tokens: int = 128) -> dict:
    """Inputs each layer linear sees on calibration text: {name: (tokens, in_features)}."""
    import torch

    seen: dict[str, list] = {}
    hooks = [
        m.register_forward_hook(
            lambda mod, inp, out, n=n: seen.setdefault(n, []).append(
                inp[0].detach().reshape(-1, inp[0].shape[-1])
            )
        )
        for n, m in layer_linears(model).items()
    ]
    try:
        with torch.no_grad():
            for t in texts:
                ids = tok(t, return_tensors="pt").input_ids[:, :max_tokens]
                model(ids)
    finally:
        for h in hooks:
            h.remove()
    return {n: torch.cat(v)[: max_tokens * len(texts)] for n, v in seen.items()}


@dataclass
class QuantRun:
    """The measured results of one run over several schemes, with the raw per-token samples."""

    schemes: list[str]
    weight_bytes: list[int]  # layer matrices + 16-bit rest, per scheme
    agreement_bits: list[list[int]]  # per scheme: 1 where the greedy token matches the float model's
    nll: list[list[float]]  # per scheme: negative log-likelihood of every eval-text token
    rms_error: list[float | None]  # measured RMS weight error over all layer matrices
    seconds: float = 0.0

    def raw_samples(self) -> dict:
        return {
            "schemes": self.schemes,
            "weight_bytes": self.weight_bytes,
            "agreement_bits": self.agreement_bits,
            "nll": self.nll,
            "rms_error": self.rms_error,
        }

    def agreement(self, i: int) -> float:
        bits = self.agreement_bits[i]
        return sum(bits) / len(bits)

    def perplexity(self, i: int) -> float:
        return math.exp(sum(self.nll[i]) / len(self.nll[i]))

    def rows(self) -> list[dict]:
        """One row per scheme: MB of weights, agreement, perplexity, RMS error."""
        return [
            {
                "scheme": s,
                "weight_MB": round(self.weight_bytes[i] / 1e6, 1),
                "agreement": round(self.agreement(i), 4),
                "perplexity": round(self.perplexity(i), 3),
                "rms_error": None if self.rms_error[i] is None else float(f"{self.rms_error[i]:.3g}"),
            }
            for i, s in enumerate(self.schemes)
        ]


def _greedy_path(model, tok, prompts, new_tokens: int):
    import torch

    paths = []
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            out = model.generate(
                ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
            )
            paths.append((out, ids.shape[1]))
    return paths


def _score(model, eval_ids, paths):
    """Per-token NLL on the eval text; per-position greedy choices along the float model's paths."""
    import torch

    with torch.no_grad():
        logits = model(eval_ids).logits[0, :-1]  # (T-1, vocab)
        nll = torch.nn.functional.cross_entropy(logits, eval_ids[0, 1:], reduction="none").tolist()
        choices = []
        for ids, start in paths:
            lg = model(ids).logits[0, start - 1 : -1]  # predictions for the generated positions
            choices.append(lg.argmax(-1))
    return nll, torch.cat(choices)


def measure_schemes(
    schemes: list[Scheme],
    model=None,
    tok=None,
    eval_tokens: int = 300,
    greedy_tokens: int = 48,
    calib_tokens: int = 64,
    awq_grid: int = 11,
    progress: bool = True,
) -> QuantRun:
    """Quantize every layer matrix with each scheme in turn and measure it; the model is restored after.

    Weight bytes count the layer matrices as stored by the scheme and everything else in FP16.
    """
    import torch

    t0 = time.perf_counter()
    if model is None:
        model, tok = load_course_model()
    linears = layer_linears(model)
    originals = {n: m.weight.data.clone() for n, m in linears.items()}
    n_all = sum(p.numel() for p in model.parameters())
    n_lin = sum(w.numel() for w in originals.values())
    rest_bytes = (n_all - n_lin) * 2
    eval_ids = tok(EVAL_TEXT, return_tensors="pt").input_ids[:, :eval_tokens]
    paths = _greedy_path(model, tok, GREEDY_PROMPTS, greedy_tokens)
    calib = calibration_inputs(model, tok, max_tokens=calib_tokens) if any(s.awq for s in schemes) else {}

    run = QuantRun([], [], [], [], [])
    ref_choice = None
    from lab_utils.notebook import progress as said  # done/total and the time left (a run: 15-60 s)

    todo = said(schemes, "quantizing and scoring the whole model, one scheme at a time" if progress else None)
    try:
        for s in todo:
            t1 = time.perf_counter()
            if s.bits is None:
                lin_bytes, err = n_lin * 2, None
            else:
                lin_bytes, se = 0, 0.0
                for n, m in linears.items():
                    w = originals[n]
                    if s.awq:
                        qw = awq_quantize(w, calib[n], s.bits, s.group_size, awq_grid)[0]
                        w_hat, nbytes = qw.dequantize(), qw.nbytes
                    else:
                        w_hat, nbytes = fake_quantize(w, s.bits, s.granularity, s.group_size)
                    m.weight.data.copy_(w_hat)
                    lin_bytes += nbytes
                    se += float(torch.sub(w, w_hat).pow_(2).sum(dtype=torch.float64))
                err = math.sqrt(se / n_lin)
            nll, choice = _score(model, eval_ids, paths)
            if ref_choice is None:
                ref_choice = choice  # the first scheme is the float reference
            run.schemes.append(s.name)
            run.weight_bytes.append(int(lin_bytes + rest_bytes))
            run.agreement_bits.append((choice == ref_choice).int().tolist())
            run.nll.append([float(x) for x in nll])
            run.rms_error.append(err)
            for n, m in linears.items():
                m.weight.data.copy_(originals[n])
            if progress:
                print(f"  {s.name:<22} {time.perf_counter() - t1:5.1f} s")
    finally:
        for n, m in linears.items():
            m.weight.data.copy_(originals[n])
    run.seconds = time.perf_counter() - t0

    return run  # raw per-token samples: the lab's analysis derives agreement and perplexity
