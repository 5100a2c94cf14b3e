"""One fine-tune as its own model: an adapter merged into the base weights (peft's merge_and_unload).

    merged_path("json")   # merges on first use (seconds), then returns at once

    $COURSE_CACHE/merged/SmolLM2-135M-Instruct/json/   config.json, model.safetensors, tokenizer

Merging computes W' = W + (alpha / r) B A once for every adapted projection, so the model runs
with no extra matmul at all, but each fine-tune is then a full copy of the weights (540 MB for the
course model in float32) where its adapter is a few MB. That is the trade lab 12 measures: one
plain server per merged fine-tune, or one `--enable-lora` server with the base and many adapters.

Like the adapters, a folder is trusted only when its marker is there, and it is written under a
temporary name and renamed into place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from ..models import MODEL_NAME, _locked, cache_dir, course_model_path
from . import train

MARKER = ".course-merged.json"
# the fine-tunes `make setup` merges: the lab compares one merged model with its adapter
MERGED_TASKS = ("json",)


def merged_dir() -> Path:
    """Where the course keeps its merged models (under COURSE_CACHE, beside the adapters)."""
    return cache_dir() / "merged" / MODEL_NAME


def is_merged(folder: Path) -> bool:
    """True when `folder` holds a finished merge of an adapter of the current recipe."""
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return info.get("adapter_format") == train.FORMAT_VERSION and (folder / "config.json").exists()


def all_merged() -> bool:
    """True when every task in MERGED_TASKS has a finished merged model."""
    return all(is_merged(merged_dir() / t) for t in MERGED_TASKS)


def merged_path(task: str) -> Path:
    """The folder of the course model with adapter `task` merged in, merging it on first use."""
    adapter = train.adapter_path(task)  # validates the name; trains the adapter if it is missing
    folder = merged_dir() / task
    if is_merged(folder):
        return folder
    with _locked(merged_dir() / ".prepare.lock"):
        if not is_merged(folder):
            merge(adapter, folder)
    return folder


def prepare_merged() -> dict[str, Path]:
    """Every merged model in MERGED_TASKS, merged where missing."""
    return {t: merged_path(t) for t in MERGED_TASKS}


def merge(adapter: Path, folder: Path) -> dict:
    """Merge the peft adapter in `adapter` into the course model and save a plain HF folder."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    base = course_model_path()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()  # W += (alpha/r) B A
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():
        shutil.rmtree(folder)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        work.chmod(0o755)  # mkdtemp makes it owner-only; the grader's sandbox user must read it
        model.save_pretrained(work)
        AutoTokenizer.from_pretrained(base).save_pretrained(work)
        info = {
            "adapter_format": train.FORMAT_VERSION,
            "adapter": str(adapter),
            "base": str(base),
            "merge_seconds": round(time.monotonic() - t0, 1),
        }
        (work / MARKER).write_text(json.dumps(info, indent=1))
        work.rename(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return info


def weight_bytes(folder: Path) -> int:
    """Bytes of the weight files (*.safetensors) in a model or adapter folder."""
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
