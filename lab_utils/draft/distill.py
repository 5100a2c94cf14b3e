"""Build the course draft: a few of the course model's layers, distilled on its own chat replies.

The recipe (measured in `python -m lab_utils.draft`, recorded in the marker):
1. Prompts: chat prompts like the labs' (orders, support questions, counting, copying) and first
   human turns from ShareGPT (`lab_utils.sim.sharegpt`), split into training and held-out sets.
2. Teacher data: the course model answers each prompt (greedy, and a share sampled at T=0.8) with
   transformers; its final hidden state at every position is kept from the same run. Because the
   draft shares the target's tied embedding, the teacher's logits are that hidden state times the
   embedding matrix, recomputed per batch instead of stored (49,152 floats per token).
3. Student: `DRAFT_LAYERS` of the target's layers (the first three and the last: the last layer
   is the one that shapes the hidden state for the shared lm_head), the target's final norm and
   its embedding (frozen, tied). Trained with the KL divergence from the teacher's next-token
   distribution at the reply's positions (where drafts are made; the prompt is context only),
   over the union of the teacher's top-`TOPK` tokens in the batch (a few thousand of the 49,152:
   the lm_head product is most of the cost), AdamW at `LR`, bf16 autocast on a CPU with bf16
   arithmetic and float32 on one without (AVX2 only: bf16 there is far slower), for
   `TRAIN_SECONDS` of wall time.
   Measured on 2 cores (Intel Xeon, 2026-12-03): first three + last beat the first four after
   45 s (27.5 % vs 16 % agreement at lr 1e-3 and 1,536-token batches, then 27.5 % at 3e-3 and
   512-token batches); the top-32 vocabulary 29.4 % vs 26.7 % with the whole vocabulary in the
   same 45 s; the longer build (96 replies, 80 s) 39 %; this recipe (128 replies, 85 s, held-out
   prompts never trained on) 37.3 %, acceptance 30 %, 13 %, 8 % at 3 ahead: short of 50 %. More replies help most; generating them
   is half the build (about 90 reply tokens/s with transformers, batch size barely matters).
4. Held-out: greedy next-token agreement on the target's greedy replies, and acceptance per draft
   position simulated as vLLM verifies greedy drafts (a step proposes 3, keeps the longest
   agreeing prefix, the next step starts after the target's own token).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path

from ..hostperf import has_bf16_instructions
from . import FORMAT_VERSION, MARKER, draft_dir, draft_ready

DRAFT_LAYERS = (0, 1, 2, 29)  # target layers kept, in order (-1 = the last)
SPEC_K = 3  # draft positions simulated
MAX_NEW_TOKENS = 96
TRAIN_SECONDS = 85.0  # the distillation's wall-clock budget
LR = 3e-3
BATCH_TOKENS = 1024  # tokens per optimiser step
TOPK = 32  # KL over the union of the teacher's top-k tokens in a batch (0: the whole vocabulary)
SEED = 0

# Prompts in the style of the labs' (04 and 05): requests a small chat model answers at length.
_SUBJECTS = [
    "their order",
    "a late delivery",
    "a refund",
    "a new bicycle",
    "the opening hours",
    "a broken screen",
    "a missing parcel",
    "a password reset",
    "a hotel booking",
    "a train ticket",
    "a birthday cake",
    "a gym membership",
    "a library book",
    "a car repair",
    "a lost key",
]
_TEMPLATES = [
    "Write a short note to customer number {i} about {s}.",
    "Write a polite email to a customer about {s}.",
    "Explain in three sentences how to handle {s}.",
    "A customer asks about {s}. What do you answer?",
    "Give me two tips about {s}.",
    "Summarise this: a customer called about {s} and wants an answer today.",
]
_FIXED = [
    "What is the capital of France?",
    "Count from one to twenty in words.",
    "Write a haiku about the sea.",
    "Do you sell helmets?",
    "When do you open?",
    "Can I rent a bike?",
    "Do you fix tyres?",
    "Explain what a KV cache is in one paragraph.",
    "What is 12 times 7?",
    "List five fruits.",
    "Tell me a short story about a robot.",
    "What is the boiling point of water?",
    "Repeat this text exactly:\nthe quick brown fox jumps over the lazy dog, " * 1,
    "Translate 'good morning' into French and Spanish.",
    "Why is the sky blue?",
    "Write a Python function that adds two numbers.",
    "What are the planets of the solar system?",
    "Give me a recipe for pancakes.",
    "How do I make a cup of tea?",
    "What is machine learning?",
]


def lab_prompts(n: int, seed: int) -> list[str]:
    """`n` lab-style prompts (a fixed set first, then templated ones), shuffled with `seed`."""
    rng = random.Random(seed)
    out = list(dict.fromkeys(_FIXED))
    seen = set(out)
    while len(out) < n:  # all different, so a training/held-out split never shares a prompt
        p = rng.choice(_TEMPLATES).format(i=100 + rng.randrange(900), s=rng.choice(_SUBJECTS))
        if p not in seen:
            seen.add(p)
            out.append(p)
    rng.shuffle(out)
    return out[:n]


def sharegpt_prompts(n: int, seed: int, tok, max_tokens: int = 160) -> list[str]:
    """`n` ShareGPT first human turns of 4-`max_tokens` tokens (empty when the data is missing)."""
    try:
        from lab_utils.sim.sharegpt import first_turns, read

        pairs = first_turns(read().conversations[:4000])
    except (FileNotFoundError, ImportError, OSError):
        return []
    rng = random.Random(seed)
    rng.shuffle(pairs)
    out = []
    for prompt, _ in pairs:
        if 4 <= len(tok(prompt)["input_ids"]) <= max_tokens:
            out.append(prompt)
        if len(out) >= n:
            break
    return out


class _Clock:
    """Progress lines with elapsed time and an estimate of the time left (never silent long)."""

    def __init__(self, budget_s: float) -> None:
        self.t0 = time.monotonic()
        self.budget = budget_s
        self.last = 0.0

    def say(self, msg: str, done: float | None = None, force: bool = True) -> None:
        now = time.monotonic() - self.t0
        if not force and now - self.last < 8:
            return
        self.last = now
        left = ""
        if done is not None and done > 0.02:
            left = f", about {max(0.0, now / done - now):.0f} s left"
        print(f"[draft {now:4.0f} s{left}] {msg}", flush=True)


def _generate(model, tok, prompts, sample_every, max_new, clock, stage, span, batch=12):
    """Chat replies of `model` to `prompts` (every `sample_every`-th sampled at T=0.8, else greedy).

    Returns [(ids, reply_start, hidden)] per prompt: the prompt + reply token ids (up to and with EOS),
    where the reply starts, and the model's final (normed) hidden state at each of those positions.
    """
    import torch

    out = []
    tok.padding_side = "left"
    jobs = [(i, p) for i, p in enumerate(prompts)]
    groups = {}
    for i, p in jobs:
        groups.setdefault(bool(sample_every) and i % sample_every == sample_every - 1, []).append((i, p))
    for items in groups.values():  # similar lengths together: less padding
        items.sort(key=lambda item: len(item[1]))
    done_n = 0
    results = {}
    for sampled, items in groups.items():
        for b in range(0, len(items), batch):
            chunk = items[b : b + batch]
            texts = [
                tok.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
                )
                for _, p in chunk
            ]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.inference_mode():
                g = model.generate(
                    **enc,
                    max_new_tokens=max_new,
                    do_sample=sampled,
                    temperature=0.8 if sampled else None,
                    top_p=None,
                    top_k=None,
                    output_hidden_states=True,
                    return_dict_in_generate=True,
                    pad_token_id=tok.pad_token_id,
                )
            plen = enc["input_ids"].shape[1]
            # hidden states: step 0 covers the prompt, each later step one token
            first = g.hidden_states[0][-1]  # (B, plen, H)
            later = [h[-1] for h in g.hidden_states[1:]]  # (B, 1, H) each
            hid = torch.cat([first, *later], dim=1) if later else first
            for r, (i, _) in enumerate(chunk):
                mask = enc["attention_mask"][r].bool()
                pad = int((~mask).sum())
                reply = g.sequences[r, plen:].tolist()
                if tok.eos_token_id in reply:
                    reply = reply[: reply.index(tok.eos_token_id) + 1]
                ids = g.sequences[r, pad:plen].tolist() + reply
                # hidden at position t predicts ids[t + 1]; the last token's hidden is not needed
                h = hid[r, pad : pad + len(ids) - 1].float().clone()
                results[i] = (ids, plen - pad, h, sampled)
            done_n += len(chunk)
            clock.say(
                f"{stage}: {done_n}/{len(prompts)} replies of the course model",
                span[0] + (span[1] - span[0]) * done_n / len(prompts),
            )
    out = [results[i] for i in range(len(prompts))]
    return out


def _draft_config(target_cfg: dict, n_layers: int) -> dict:
    cfg = dict(target_cfg)
    cfg["num_hidden_layers"] = n_layers
    cfg["_model_name_or_path"] = "course-draft"
    cfg.pop("layer_types", None)
    return cfg


def _student(target_dir: Path, layers: tuple[int, ...]):
    """A LlamaForCausalLM of the kept layers, initialised from the target's weights."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg_dict = json.loads((target_dir / "config.json").read_text())
    n_target = cfg_dict["num_hidden_layers"]
    layers = tuple(n_target + i if i < 0 else i for i in layers)
    cfg = LlamaConfig(**_draft_config(cfg_dict, len(layers)))
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg)
    weights = load_file(str(target_dir / "model.safetensors"))
    state = {}
    for name, w in weights.items():
        if name.startswith("model.layers."):
            idx = int(name.split(".")[2])
            if idx in layers:
                new = layers.index(idx)
                state[name.replace(f"model.layers.{idx}.", f"model.layers.{new}.", 1)] = w
        else:
            state[name] = w
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"draft init: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.float(), layers, n_target


def _pos_logits_argmax(model, seqs):
    """The draft's greedy next token at every position of each sequence (teacher forcing)."""
    import torch

    out = []
    with torch.inference_mode():
        for ids, *_ in seqs:
            x = torch.tensor([ids[:-1]])
            out.append(model(input_ids=x).logits[0].argmax(-1).tolist())
    return out


def simulate_steps(match: list[bool], k: int = SPEC_K) -> tuple[int, list[int]]:
    """Greedy verification over one reply, from whether the draft's next token agrees at each position.

    A step proposes k tokens and keeps the longest prefix the target agrees with; the target adds
    its own token after it, so the next step starts one past the kept drafts. (Teacher forcing is
    exact here: while the drafts agree, the draft saw the same history the target did.)
    Returns (steps, accepted[i] = steps whose draft i was kept).
    """
    steps, accepted = 0, [0] * k
    t = 0
    while t < len(match):
        run = 0
        while run < k and t + run < len(match) and match[t + run]:
            run += 1
        steps += 1
        for i in range(run):
            accepted[i] += 1
        t += run + 1
    return steps, accepted


def evaluate(model, heldout, k: int = SPEC_K) -> dict:
    """Agreement and simulated acceptance per position on held-out greedy target replies."""
    greedy = [s for s in heldout if not s[3]]
    preds = _pos_logits_argmax(model, greedy)
    agree = total = steps = 0
    accepted_at = [0] * k
    for (ids, start, *_), pred in zip(greedy, preds):
        # reply positions: the token at t+1 (t >= start-1) is the target's greedy choice
        match = [pred[t] == ids[t + 1] for t in range(start - 1, len(ids) - 1)]
        agree += sum(match)
        total += len(match)
        n, at = simulate_steps(match, k)
        steps += n
        accepted_at = [a + b for a, b in zip(accepted_at, at)]
    per_pos = [a / steps if steps else 0.0 for a in accepted_at]
    return {
        "agreement": agree / total if total else 0.0,
        "acceptance_per_position": per_pos,
        "mean_accepted": sum(per_pos),
        "heldout_tokens": total,
        "heldout_steps": steps,
    }


def _train_dtype() -> str:
    """The distillation's dtype: bf16 (autocast) only where the CPU has bf16 arithmetic (AVX512-BF16 /
    AMX). On an AVX2-only AMD EPYC a bf16 step took 26 s, so the 85 s budget gave 4 steps and a draft
    that agreed with the course model on 5.9% of tokens (2026-12-07); float32 is that machine's fast dtype."""
    return "bfloat16" if has_bf16_instructions() else "float32"


def _train(model, seqs, embed, seconds, clock, span, lr=LR, max_tokens_per_batch=BATCH_TOKENS, topk=TOPK):
    """KL(teacher || draft) over every position, until `seconds` pass. Returns (seconds, tokens)."""
    import torch
    import torch.nn.functional as F

    for p in model.parameters():
        p.requires_grad_(False)
    trainable = [
        p for n, p in model.named_parameters() if n.startswith("model.layers.") or n == "model.norm.weight"
    ]
    for p in trainable:
        p.requires_grad_(True)
    low = getattr(torch, _train_dtype())
    embed_low = embed.to(low)
    opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(SEED)
    order = list(range(len(seqs)))
    # batches of whole sequences, about max_tokens_per_batch tokens each, padded on the right
    t0 = time.monotonic()
    tokens = steps = 0
    ema = None
    model.train()
    while time.monotonic() - t0 < seconds:
        rng.shuffle(order)
        batch, n_tok = [], 0
        for j in order:
            ids = seqs[j][0]
            if batch and n_tok + len(ids) > max_tokens_per_batch:
                break
            batch.append(j)
            n_tok += len(ids)
        L = max(len(seqs[j][0]) - 1 for j in batch)
        x = torch.zeros(len(batch), L, dtype=torch.long)
        mask = torch.zeros(len(batch), L, dtype=torch.bool)
        loss_at = torch.zeros(len(batch), L, dtype=torch.bool)  # the reply's positions: where drafts are made
        th = torch.zeros(len(batch), L, embed.shape[1])
        for r, j in enumerate(batch):
            ids, _, h, _ = seqs[j]
            n = len(ids) - 1
            x[r, :n] = torch.tensor(ids[:-1])
            mask[r, :n] = True
            loss_at[r, seqs[j][1] - 1 : n] = True
            th[r, :n] = h
        frac = min(1.0, (time.monotonic() - t0) / seconds)
        for g in opt.param_groups:  # warm up, then cosine down to a tenth
            g["lr"] = lr * min(1.0, (steps + 1) / 10) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low == torch.bfloat16):
            hs = model.model(input_ids=x, attention_mask=mask.long()).last_hidden_state[loss_at]
            with torch.no_grad():
                teacher = th[loss_at].to(low) @ embed_low.T
                if topk:  # only the tokens in some position's teacher top-k: a fraction of the vocabulary
                    vocab = torch.unique(teacher.topk(topk, dim=-1).indices)
                    teacher = teacher[:, vocab]
            student = hs @ (embed_low[vocab] if topk else embed_low).T
        logp = F.log_softmax(student.float(), -1)
        tlogp = F.log_softmax(teacher.float(), -1)
        loss = (tlogp.exp() * (tlogp - logp)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        steps += 1
        tokens += int(loss_at.sum())
        loss = float(loss.detach())
        ema = loss if ema is None else 0.9 * ema + 0.1 * loss
        clock.say(
            f"distilling: step {steps}, {tokens:,} tokens, KL {ema:.3f}",
            span[0] + (span[1] - span[0]) * frac,
            force=False,
        )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return time.monotonic() - t0, tokens, steps, ema


def build_draft(
    force: bool = False,
    layers: tuple[int, ...] = DRAFT_LAYERS,
    train_seconds: float = TRAIN_SECONDS,
    n_train: int = 128,
    n_heldout: int = 24,
    out: Path | None = None,
) -> Path:
    """Build the draft into `out` (the cached folder by default) unless it is already built."""
    from lab_utils.models import _locked, cache_dir, course_model_path

    folder = Path(out) if out else draft_dir()
    if not force and out is None and draft_ready():
        print(f"course draft ready in {folder}", flush=True)
        return folder
    with _locked(cache_dir() / "models" / ".draft.lock"):
        if not force and out is None and draft_ready():
            return folder
        return _build(folder, course_model_path(), layers, train_seconds, n_train, n_heldout)


def _build(folder, target_dir, layers, train_seconds, n_train, n_heldout) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8)))
    clock = _Clock(train_seconds + 120)
    gen_share = 0.45  # rough share of the build's time spent generating, for the time-left estimate
    clock.say(
        f"building the draft for {target_dir.name}: layers {layers}, {train_seconds:.0f} s of distillation"
    )
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    share = sharegpt_prompts(n_train // 3 + n_heldout // 3, SEED, tok)
    n_share_train = min(len(share), n_train // 3)
    n_lab_train = n_train - n_share_train
    lab = lab_prompts(n_lab_train + n_heldout - (len(share) - n_share_train), SEED)
    train_p = lab[:n_lab_train] + share[:n_share_train]
    seen = set(train_p)  # held out means never trained on (ShareGPT repeats some first turns)
    held_p = [p for p in dict.fromkeys(lab[n_lab_train:] + share[n_share_train:]) if p not in seen][
        :n_heldout
    ]
    clock.say(
        f"prompts: {len(train_p)} for training, {len(held_p)} held out ({len(share)} from ShareGPT)", 0.01
    )
    train = _generate(
        target, tok, train_p, 3, MAX_NEW_TOKENS, clock, "training data", (0.02, gen_share * 0.8)
    )
    held = _generate(
        target, tok, held_p, 0, MAX_NEW_TOKENS, clock, "held-out data", (gen_share * 0.8, gen_share)
    )
    embed = target.model.embed_tokens.weight.detach()
    del target
    student, kept, n_target = _student(target_dir, layers)
    before = evaluate(student, held)
    clock.say(
        f"untrained cut: agreement {before['agreement']:.1%}, acceptance per position "
        + ", ".join(f"{a:.0%}" for a in before["acceptance_per_position"]),
        gen_share + 0.02,
    )
    secs, tokens, steps, kl = _train(student, train, embed, train_seconds, clock, (gen_share + 0.02, 0.95))
    after = evaluate(student, held)
    clock.say(
        f"distilled: agreement {after['agreement']:.1%}, acceptance per position "
        + ", ".join(f"{a:.0%}" for a in after["acceptance_per_position"]),
        0.97,
    )
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    student.config.architectures = ["LlamaForCausalLM"]
    student.generation_config.max_length = None
    student.save_pretrained(tmp, safe_serialization=True)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                  "special_tokens_map.json"):  # fmt: skip
        if (target_dir / extra).exists():
            shutil.copy(target_dir / extra, tmp / extra)
    params = sum(p.numel() for p in student.parameters())  # tied: the embedding counted once
    target_params = params + (n_target - len(kept)) * sum(
        p.numel() for p in student.model.layers[0].parameters()
    )
    info = {
        "format": FORMAT_VERSION,
        "target": str(target_dir),
        "target_layers": n_target,
        "layers_kept": list(kept),
        "params": params,
        "params_fraction": params / target_params,
        "distill_seconds": round(secs, 1),
        "train_steps": steps,
        "train_tokens": tokens,
        "train_sequences": len(train),
        "final_kl": kl,
        "agreement": after["agreement"],
        "agreement_untrained": before["agreement"],
        "acceptance_per_position": after["acceptance_per_position"],
        "acceptance_per_position_untrained": before["acceptance_per_position"],
        "mean_accepted": after["mean_accepted"],
        "heldout_tokens": after["heldout_tokens"],
        "heldout_prompts": held_p,
        "build_seconds": round(time.monotonic() - clock.t0, 1),
        "torch_threads": torch.get_num_threads(),
        "train_dtype": _train_dtype(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp / MARKER).write_text(json.dumps(info, indent=2))  # the very last file written
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    info["path"] = str(folder)
    (folder / MARKER).write_text(json.dumps(info, indent=2))
    clock.say(f"ready in {folder}", 1.0)
    return folder
