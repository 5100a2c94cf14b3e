"""Calibrate the step cost model on this machine: time real forward passes of the course model, fit.

    cost, samples = calibrate()          # a few seconds on 2 CPU cores
    cost.decode_step_time(8, 256)        # predicted seconds for a decode step of 8 x 256 tokens

Prefill steps run (batch, prompt) token blocks; decode steps run one token per sequence on top of
a KV cache of a given length. A least-squares fit of seconds against (1, tokens, context tokens)
gives the three coefficients of `StepCostModel` (kept non-negative).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .cost import StepCostModel


@dataclass(frozen=True)
class StepMeasurement:
    """One timed forward pass."""

    kind: str  # "prefill" or "decode"
    batch_size: int
    num_tokens: int  # tokens computed in the pass
    num_context_tokens: int  # KV tokens attended (what the cost model calls context)
    seconds: float


def measure_steps(
    model_path=None,
    *,
    batch_sizes: tuple[int, ...] = (1, 4, 8),
    prompt_lens: tuple[int, ...] = (32, 128),
    context_lens: tuple[int, ...] = (64, 256),
    repeats: int = 3,
    dtype: str = "float32",
    model=None,
    progress: str | None = None,
) -> list[StepMeasurement]:
    """Time prefill and decode forward passes of the course model (median of `repeats`). `progress`:
    a label to print `label: i/n done, ... s left` with (lab_utils.notebook.progress), or None."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    if model is None:
        if model_path is None:
            from lab_utils.models import course_model_path

            model_path = course_model_path()
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=getattr(torch, dtype))
    model.eval()
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    out: list[StepMeasurement] = []

    def tokens(b: int, n: int):
        return torch.randint(1000, min(vocab, 20000), (b, n), generator=gen)

    from lab_utils.notebook import progress as progress_of

    plan = [("prefill", b, n) for b in (1, max(batch_sizes)) for n in prompt_lens]
    plan += [("decode", b, c) for b in batch_sizes for c in context_lens]
    with torch.inference_mode():
        model(tokens(1, 8))  # warm-up: first call pays one-off allocation costs
        for kind, b, n in progress_of(plan, progress):
            times = []
            if kind == "prefill":
                for _ in range(repeats):
                    ids = tokens(b, n)
                    t = time.perf_counter()
                    model(ids, use_cache=True)
                    times.append(time.perf_counter() - t)
                out.append(StepMeasurement("prefill", b, b * n, b * n, statistics.median(times)))
                continue
            past = model(tokens(b, n), use_cache=True).past_key_values  # n: the context length
            for _ in range(repeats):
                t = time.perf_counter()
                past = model(tokens(b, 1), past_key_values=past, use_cache=True).past_key_values
                times.append(time.perf_counter() - t)
            out.append(StepMeasurement("decode", b, b, b * (n + repeats // 2 + 1), statistics.median(times)))
    return out


def fit_cost_model(measurements: list[StepMeasurement]) -> StepCostModel:
    """Least-squares fit of seconds = fixed + per_token * tokens + per_context * context, all >= 0."""
    import numpy as np

    if len(measurements) < 3:
        raise ValueError("fit_cost_model needs at least 3 measurements (three unknowns)")
    X = np.array([[1.0, m.num_tokens, m.num_context_tokens] for m in measurements])
    y = np.array([m.seconds for m in measurements])
    # relative error matters (a 5 ms decode step and a 500 ms prefill): weight rows by 1/y
    w = 1.0 / np.maximum(y, 1e-6)
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        sol, *_ = np.linalg.lstsq(X[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # a negative coefficient has no physical meaning: drop it
    return StepCostModel(
        fixed_s=float(coef[0]), per_token_s=float(coef[1]), per_context_token_s=float(coef[2]), combine="sum"
    )


def calibrate(model_path=None, **kwargs) -> tuple[StepCostModel, list[StepMeasurement]]:
    """Measure the course model here and fit a StepCostModel; returns (model, measurements)."""
    samples = measure_steps(model_path, **kwargs)
    return fit_cost_model(samples), samples


def fit_error(cost: StepCostModel, measurements: list[StepMeasurement]) -> float:
    """Median relative error of the cost model on the measurements."""
    import statistics

    errs = [
        abs(cost.step_time(m.num_tokens, m.num_context_tokens) - m.seconds) / m.seconds for m in measurements
    ]
    return statistics.median(errs)
