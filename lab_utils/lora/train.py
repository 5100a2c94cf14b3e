"""Train the course's LoRA adapters with peft on CPU, and cache them next to the course model.

    adapter_path("json")        # trains on first use (one to two minutes on 2 cores), then returns at once
    prepare_all()               # every adapter in data.TASKS; `python -m lab_utils.lora` does this

    $COURSE_CACHE/adapters/SmolLM2-135M-Instruct/json/   adapter_config.json, adapter_model.safetensors

A LoRA adapter adds, beside a frozen weight W (out x in), two small matrices B (out x r) and
A (r x in); the layer computes W x + (alpha / r) B A x. Only A and B are trained and saved, so an
adapter is a few MB where the model is 540 MB, and one server can hold many (`--enable-lora`).

Like the model, a folder is trusted only when its marker is there; it is written under a temporary
name and renamed into place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from ..models import MODEL_NAME, _locked, cache_dir, course_model_path
from . import data

MARKER = ".course-adapter.json"
FORMAT_VERSION = 2  # bump when the recipe below changes, so old adapters are retrained
RANK = 8
ALPHA = 16
# attention projections only: enough to change the answer's form, and what every LoRA runtime loads
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
STEPS = 16
LEARNING_RATE = 6e-3
# Only the top layers are adapted: backpropagation then stops there, which makes CPU training
# several times faster, and the answer's form is decided near the output anyway.
LAYERS = tuple(range(22, 30))
SEED = 0


def adapters_dir() -> Path:
    """Where the course keeps its adapters (under COURSE_CACHE, beside the models)."""
    return cache_dir() / "adapters" / MODEL_NAME


def is_prepared(folder: Path) -> bool:
    """True when `folder` holds a finished adapter of the current recipe."""
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return info.get("format") == FORMAT_VERSION and (folder / "adapter_config.json").exists()


def all_prepared() -> bool:
    """True when every task in data.TASKS has a finished adapter."""
    return all(is_prepared(adapters_dir() / t) for t in data.TASKS)


def adapter_path(task: str) -> Path:
    """The folder of the adapter for `task` ("json" or "upper"), training it on first use."""
    if task not in data.TASKS:
        raise ValueError(f"unknown adapter {task!r}; the course trains {list(data.TASKS)}")
    folder = adapters_dir() / task
    if is_prepared(folder):
        return folder
    with _locked(adapters_dir() / ".prepare.lock"):
        if not is_prepared(folder):
            train(task, folder)
    return folder


def prepare_all() -> dict[str, Path]:
    """Every course adapter, trained where missing."""
    return {t: adapter_path(t) for t in data.TASKS}


def _batch(tok, pairs: list[tuple[str, str]]):
    """Token ids, attention mask and labels; the loss counts the target tokens only."""
    import torch

    rows, labels = [], []
    for p, t in pairs:
        p_ids = tok(p, add_special_tokens=False)["input_ids"]
        t_ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(p_ids + t_ids)
        labels.append([-100] * len(p_ids) + t_ids)
    width = max(map(len, rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.full((len(rows), width), pad)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    lab = torch.full((len(rows), width), -100)
    for i, (r, lb) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, mask, lab


def train(task: str, folder: Path, steps: int = STEPS, progress=print) -> dict:
    """Train the adapter for `task` and save it (peft's format, which vLLM loads) into `folder`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    base = course_model_path()
    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        lora_dropout=0.0,
        target_modules=list(TARGET_MODULES),
        layers_to_transform=list(LAYERS),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    ids, mask, labels = _batch(tok, data.examples(task))
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    model.train()
    losses = []
    for step in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(float(loss))
        if step % 4 == 0 or step == steps - 1:
            progress(
                f"[adapter {task}] step {step + 1}/{steps} loss {losses[-1]:.3f} ({time.monotonic() - t0:.0f} s)"
            )
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():
        shutil.rmtree(folder)
    work = Path(tempfile.mkdtemp(prefix=f".{task}-", dir=folder.parent))
    try:
        work.chmod(0o755)  # mkdtemp makes it owner-only; the grader's sandbox user must read it
        model.save_pretrained(work)
        info = {
            "format": FORMAT_VERSION,
            "task": task,
            "rank": RANK,
            "alpha": ALPHA,
            "target_modules": list(TARGET_MODULES),
            "layers": list(LAYERS),
            "steps": steps,
            "final_loss": losses[-1],
            "train_seconds": round(time.monotonic() - t0, 1),
        }
        (work / MARKER).write_text(json.dumps(info, indent=1))
        work.rename(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return info


def adapter_info(task: str) -> dict:
    """What the marker of a prepared adapter says (rank, loss, training time ...)."""
    return json.loads((adapter_path(task) / MARKER).read_text())


def generate(task: str | None, prompt: str, max_new_tokens: int = 24) -> str:
    """Greedy completion of `prompt` by the course model with adapter `task` (None: the base model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = course_model_path()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if task is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path(task))
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
