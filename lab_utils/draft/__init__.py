"""A small draft model for the course model, for speculative decoding (labs 04, 05, 11).

The draft is a few of the course model's own layers, distilled on the course model's own chat
replies (torch on CPU, a few minutes): it keeps the target's tokenizer, embeddings and tied
lm_head, so it proposes tokens in the target's vocabulary and reads about a third of its weights.

    python -m lab_utils.draft      # build it once into $COURSE_CACHE/models/<model>-draft (idempotent)
    make setup                     # does the same (the "draft" step of `python -m lab_utils.setup`)

    from lab_utils.draft import draft_path, draft_info
    LLM(model=course_model, speculative_config={"method": "draft_model", "model": str(draft_path()),
                                                "num_speculative_tokens": 3})

`draft_info()` reads the marker written as the build's very last step: the layers kept, the
parameters, the distillation time and tokens, and what the draft was measured to do on held-out
replies of the target: greedy next-token agreement, and simulated acceptance per draft position
at 3 ahead (the chance that draft token i is accepted, counting a rejection before it as a miss).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# bump when the recipe changes, so old caches are rebuilt (4: float32 on CPUs without bf16)
FORMAT_VERSION = 4
MARKER = ".course-draft.json"


class DraftNotBuilt(FileNotFoundError):
    """The draft model is not built yet (`make setup` or `python -m lab_utils.draft` builds it)."""


def draft_dir() -> Path:
    """Where the draft for the course model (or for COURSE_MODEL's model) is cached."""
    from lab_utils.models import MODEL_NAME, cache_dir

    override = os.environ.get("COURSE_MODEL")
    if override:
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", override.strip("/")).strip("_")[-80:] or "model"
        return cache_dir() / "models" / "drafts" / f"{name}-draft"
    return cache_dir() / "models" / f"{MODEL_NAME}-draft"


def _read_marker(folder: Path) -> dict | None:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("format") != FORMAT_VERSION:
        return None
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        return None
    return info


def draft_ready() -> bool:
    """True when the draft is built in the current format."""
    return _read_marker(draft_dir()) is not None


def draft_path() -> Path:
    """The built draft's folder (a Hugging Face LlamaForCausalLM folder vLLM loads as a draft).

    Raises DraftNotBuilt, naming the command that builds it, when it is missing or outdated.
    """
    folder = draft_dir()
    if _read_marker(folder) is None:
        raise DraftNotBuilt(
            f"the course draft model is not built (no current {MARKER} in {folder}). "
            "Build it with `make setup` or `python -m lab_utils.draft` (a few minutes on CPU)."
        )
    return folder


def draft_info() -> dict:
    """What the build recorded: layers kept, parameters, distillation time and tokens, held-out
    agreement and acceptance per position (raises DraftNotBuilt when not built)."""
    info = _read_marker(draft_path())
    assert info is not None
    return info


def format_info(info: dict) -> str:
    """The marker as a few readable lines."""
    acc = info.get("acceptance_per_position") or []
    lines = [
        f"draft model: layers {info.get('layers_kept')} of {info.get('target_layers')} kept, "
        f"{info.get('params', 0) / 1e6:.1f} M parameters ({info.get('params_fraction', 0):.0%} of the target's)",
        f"distilled for {info.get('distill_seconds', 0):.0f} s on {info.get('train_tokens', 0):,} tokens "
        f"of the target's own replies ({info.get('build_seconds', 0):.0f} s build in all)",
        f"held-out greedy next-token agreement with the target: {info.get('agreement', 0):.1%} "
        f"(the untrained layer cut: {info.get('agreement_untrained', 0):.1%})",
        "simulated acceptance per draft position at "
        f"{len(acc)} ahead: {', '.join(f'{a:.0%}' for a in acc)}; "
        f"mean accepted per step {info.get('mean_accepted', 0):.2f} of {len(acc)}",
        f"built {info.get('date')}, format {info.get('format')}, in {info.get('path', draft_dir())}",
    ]
    return "\n".join(lines)


__all__ = [
    "FORMAT_VERSION",
    "MARKER",
    "DraftNotBuilt",
    "draft_dir",
    "draft_info",
    "draft_path",
    "draft_ready",
    "format_info",
]
