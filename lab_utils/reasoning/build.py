"""Build the course's reasoning model: the course model fine-tuned to think, call tools and use them.

    python -m lab_utils.reasoning      # once: $COURSE_CACHE/models/SmolLM2-135M-Reasoning (float32)
    reasoning_model_path()             # the folder, built on first use

The recipe (a few CPU minutes):

- the tokenizer gains `<think>` and `</think>` as *ordinary* tokens: one id each, so vLLM's
  reasoning parser can find them, but not special, so they survive detokenisation (vLLM strips
  special tokens from the text its parsers read);
- the chat template is `template.CHAT_TEMPLATE` (ChatML, tools in `<tools>`, results in
  `<tool_response>`), saved with the tokenizer so vLLM renders the same prompts;
- the examples are `data.examples()`; the loss counts the assistant's tokens only;
- the bottom `FROZEN_LAYERS` layers and the input embeddings are frozen (the output projection,
  tied to the embeddings, still learns the two new tokens): backpropagation stops above them.

At the end the build generates greedily on held-out prompts and records, in the folder's marker,
how often the format came out right (`format_quality`): reasoning and answer both present and
separated, and a tool call that names the right tool with arguments its schema accepts.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from ..models import _locked, cache_dir, course_model_path
from . import data
from .template import CHAT_TEMPLATE

NAME = "SmolLM2-135M-Reasoning"
MARKER = ".course-reasoning.json"
FORMAT_VERSION = 1  # bump when the recipe changes, so an old build is rebuilt
THINK_TAGS = ("<think>", "</think>")
EXAMPLES = 120
EPOCHS = 2
BATCH = 8
LEARNING_RATE = 3e-4
FROZEN_LAYERS = 14
SEED = 0


def reasoning_dir() -> Path:
    return cache_dir() / "models" / NAME


def reasoning_ready() -> bool:
    """True when the reasoning model is built in the current format."""
    try:
        info = json.loads((reasoning_dir() / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return info.get("format") == FORMAT_VERSION and (reasoning_dir() / "config.json").exists()


def reasoning_model_path() -> Path:
    """The reasoning model's folder, built on first use."""
    folder = reasoning_dir()
    if not reasoning_ready():
        with _locked(folder.parent / ".reasoning.lock"):
            if not reasoning_ready():
                build_and_save(folder)
    return folder


def build_info() -> dict:
    """What the build recorded: time, loss, format quality on held-out prompts."""
    return json.loads((reasoning_model_path() / MARKER).read_text())


def _prompt(tok, example: dict) -> str:
    return tok.apply_chat_template(
        example["messages"],
        tools=example["tools"],
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )


def _batches(tok, examples: list[dict], rng):
    """(ids, mask, labels) batches of BATCH examples of similar length; labels -100 on the prompt."""
    import torch

    rows = []
    for ex in examples:
        p = tok(_prompt(tok, ex), add_special_tokens=False)["input_ids"]
        t = tok(ex["target"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append((p + t, [-100] * len(p) + t))
    rows.sort(key=lambda r: len(r[0]))  # similar lengths together: less padding to compute
    batches = [rows[i : i + BATCH] for i in range(0, len(rows), BATCH)]
    rng.shuffle(batches)
    for chunk in batches:
        width = max(len(r[0]) for r in chunk)
        ids = torch.full((len(chunk), width), tok.pad_token_id)  # (B, T)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        labels = torch.full((len(chunk), width), -100)
        for i, (r, lb) in enumerate(chunk):
            ids[i, : len(r)], mask[i, : len(r)], labels[i, : len(lb)] = torch.tensor(r), 1, torch.tensor(lb)
        yield ids, mask, labels


def _train(model, tok, examples: list[dict], progress) -> list[float]:
    import random

    import torch

    for p in model.parameters():
        p.requires_grad = False
    for layer in model.model.layers[FROZEN_LAYERS:]:
        for p in layer.parameters():
            p.requires_grad = True
    for p in model.model.norm.parameters():
        p.requires_grad = True
    model.lm_head.weight.requires_grad = True  # tied to the input embeddings: the new tokens learn here
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0)
    rng = random.Random(SEED)
    total = EPOCHS * -(-len(examples) // BATCH)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0 - s / total)
    embed = model.get_input_embeddings()
    losses, step, t0 = [], 0, time.monotonic()
    model.train()
    for _ in range(EPOCHS):
        for ids, mask, labels in _batches(tok, examples, rng):
            with torch.no_grad():  # frozen input side: no gradient flows below the trained layers
                x = embed(ids)
            hidden = model.model(inputs_embeds=x, attention_mask=mask).last_hidden_state  # (B, T, H)
            keep = labels[:, 1:] != -100  # only the target positions go through the vocabulary projection
            logits = model.lm_head(hidden[:, :-1][keep])  # (N, V)
            loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][keep])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
            sched.step()
            optim.zero_grad()
            losses.append(float(loss.detach()))
            step += 1
            if step <= 2 or step % 5 == 0 or step == total:
                left = (time.monotonic() - t0) / step * (total - step)
                progress(f"step {step}/{total} loss {losses[-1]:.3f} (about {left:.0f} s left)")
    model.eval()
    return losses


def _valid_args(name: str, args) -> bool:
    """True when `args` is what tool `name`'s JSON schema accepts (required keys, types, enums)."""
    schema = data.TOOLS[name]["parameters"]
    if (
        not isinstance(args, dict)
        or not set(schema["required"]) <= set(args)
        or not set(args) <= set(schema["properties"])
    ):
        return False
    for key, value in args.items():
        prop = schema["properties"][key]
        if prop["type"] == "string" and not isinstance(value, str):
            return False
        if "enum" in prop and value not in prop["enum"]:
            return False
    return True


_FORMAT = re.compile(r"<think>(.+?)</think>(.+)", re.DOTALL)
_CALL = re.compile(r"<tool_call>\s*(\{.*\})\s*</tool_call>", re.DOTALL)


def score(text: str, expect_call: list | None) -> dict:
    """How one held-out output came out: {"separated", "valid_call", "same_args"} (the last two None
    when no call was expected). Strict: it is a quality measure of the build, not a parser."""
    m = _FORMAT.fullmatch(text.strip())
    out = {
        "separated": bool(m and m.group(1).strip() and m.group(2).strip()),
        "valid_call": None,
        "same_args": None,
    }
    if expect_call is not None:
        call = _CALL.fullmatch(m.group(2).strip()) if m else None
        try:
            obj = json.loads(call.group(1)) if call else None
        except ValueError:
            obj = None
        ok = (
            isinstance(obj, dict)
            and obj.get("name") == expect_call[0]
            and _valid_args(expect_call[0], obj.get("arguments"))
        )
        out["valid_call"] = ok
        out["same_args"] = ok and obj["arguments"] == expect_call[1]
    return out


def generate(model, tok, examples: list[dict], max_new_tokens: int = 64) -> list[str]:
    """Greedy outputs (text, `<think>` tags kept) for a batch of chats (left-padded)."""
    import torch

    tok.padding_side = "left"
    enc = tok(
        [_prompt(tok, ex) for ex in examples], return_tensors="pt", padding=True, add_special_tokens=False
    )
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        )
    return [tok.decode(row[enc["input_ids"].shape[1] :], skip_special_tokens=True) for row in out]


def format_quality(model, tok, progress=print) -> dict:
    """Greedy outputs on held-out prompts, scored: the shares the lab quotes, and the outputs."""
    plain = data.held_out(20, seed=1)
    calls = data.held_out(20, seed=2, kinds=(1,))
    outs = generate(model, tok, plain) + generate(model, tok, calls)
    rows = [score(o, ex.get("call")) for o, ex in zip(outs, plain + calls)]
    quality = {
        "separated": sum(r["separated"] for r in rows[:20]) / 20,
        "valid_call": sum(bool(r["valid_call"]) for r in rows[20:]) / 20,
        "same_args": sum(bool(r["same_args"]) for r in rows[20:]) / 20,
        "held_out": len(rows),
        "samples": outs[:3] + outs[20:22],
    }
    progress(
        f"held-out format: separated {quality['separated']:.0%}, valid tool call {quality['valid_call']:.0%}"
    )
    return quality


def build_and_save(out: Path, progress=print) -> dict:
    """Fine-tune the course model and save it, with its tokenizer and template, into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    torch.manual_seed(SEED)
    base = course_model_path()
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_tokens(list(THINK_TAGS))  # ordinary (not special) tokens
    tok.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():  # the new rows start as the embedding of "think" (the word), not noise
        emb = model.get_input_embeddings().weight
        emb[old:] = emb[tok("think", add_special_tokens=False)["input_ids"]].mean(0)
    examples = data.examples(EXAMPLES, seed=SEED)
    progress(
        f"{len(examples)} examples, {EPOCHS} epochs, bottom {FROZEN_LAYERS} of {len(model.model.layers)} layers frozen"
    )
    losses = _train(model, tok, examples, progress)
    train_s = time.monotonic() - t0
    quality = format_quality(model, tok, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".reasoning-", dir=out.parent))
    try:
        work.chmod(0o755)  # the grader's sandbox user must read it
        model.save_pretrained(work)
        tok.save_pretrained(work)
        info = {
            "format": FORMAT_VERSION,
            "base": str(base),
            "examples": len(examples),
            "epochs": EPOCHS,
            "frozen_layers": FROZEN_LAYERS,
            "learning_rate": LEARNING_RATE,
            "first_loss": losses[0],
            "final_loss": losses[-1],
            "train_seconds": round(train_s, 1),
            "build_seconds": round(time.monotonic() - t0, 1),
            "format_quality": quality,
            "think_token_ids": tok.convert_tokens_to_ids(list(THINK_TAGS)),
        }
        (work / MARKER).write_text(json.dumps(info, indent=1))
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    progress(f"saved {out} after {info['build_seconds']:.0f} s")
    return info
