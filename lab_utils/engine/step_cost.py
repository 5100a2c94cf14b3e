"""What one decoding step costs a target and its draft model: the inputs of a speculation forecast.

    from lab_utils.engine.step_cost import step_costs
    costs = step_costs(TARGET_DIR, DRAFT_DIR, k=3)
    costs["draft_cost"]             # one draft token, in target one-token steps
    costs["verify_cost_per_draft"]  # what each draft checked adds to the target's step, same unit

Both models run in PyTorch (transformers; float32 on the CPU's threads, bfloat16 on a GPU) with a KV cache: after a
`context`-token prefill, the median of `reps` one-token steps of each model, and of the target's
step over k + 1 new tokens (a speculative step checks k drafts and adds its own token). Plain
PyTorch, not vLLM's kernels: the ratios carry over, the milliseconds do not; the per-step work a
serving engine adds around the model (scheduling, sampling, the proposer's bookkeeping) is not
in them, which is what a measured speed-up shows on top of the forecast.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path


def _load(folder: str | Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    return model.to(device).eval()


def _step_ms(model, context: int, new: int, reps: int) -> float:
    """Median milliseconds of a forward over `new` tokens after a `context`-token cached prefix."""
    import torch

    dev = model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ids = torch.arange(1000, 1000 + context, dtype=torch.long, device=dev).unsqueeze(0)
    times = []
    with torch.inference_mode():
        past = model(ids, use_cache=True).past_key_values
        step = torch.arange(2000, 2000 + new, dtype=torch.long, device=dev).unsqueeze(0)
        for _ in range(reps + 1):  # the first run warms up
            sync()
            t0 = time.perf_counter()
            model(step, past_key_values=past, use_cache=True)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
            past.crop(-new)  # back to the prefix, so every rep sees the same context
    return statistics.median(times[1:])


def step_costs(
    target: str | Path, draft: str | Path, k: int = 3, context: int = 64, reps: int = 15, device: str = "cpu"
) -> dict:
    """Per-step costs of `target` and `draft` (folders transformers can load), and their ratios.

    `device="cuda"` times both on the GPU in bfloat16 (GPU mode); "cpu" in float32."""
    if k < 1:
        raise ValueError(f"k is the number of drafts a step checks; give at least 1, got {k}")
    tgt, dft = _load(target, device), _load(draft, device)
    target_ms = _step_ms(tgt, context, 1, reps)
    verify_ms = _step_ms(tgt, context, k + 1, reps)
    draft_ms = _step_ms(dft, context, 1, reps)
    return {
        "target_ms": target_ms,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
        "k": k,
        "draft_cost": draft_ms / target_ms,
        "verify_cost_per_draft": max(0.0, (verify_ms - target_ms) / (k * target_ms)),
    }
