"""Lab 00: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab00`. The references are here.
"""

from __future__ import annotations

from grader.registry import hidden
from lab_utils.grading.checks import partial
from lab_utils.grading.questions.lab00 import _WORDS, _conversation, _sentence, _tokenizer

PREDICT_RTOL = 0.03  # stated in the lab


def _group(cfg: dict) -> int:
    heads = cfg["num_attention_heads"]
    return heads // (cfg.get("num_key_value_heads") or heads)


@hidden("00.queries_per_kv_head")
def _(queries_per_kv_head, rng, scenario):
    from lab_utils.drills.shapes import MODELS

    cases = [
        {
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_kv_heads,
            "hidden_size": s.hidden_size,
        }
        for s in MODELS.values()
    ]
    for _ in range(12):
        kv = rng.choice([1, 2, 4, 8])
        cfg = {
            "num_attention_heads": kv * rng.choice([1, 2, 3, 4, 7, 8]),
            "hidden_size": 64 * rng.randint(4, 64),
        }
        if rng.random() < 0.8:
            cfg["num_key_value_heads"] = kv
        cases.append(cfg)
    # multimodal wrappers (Gemma 3, Llama 4, Qwen2.5-VL): the language model under text_config, a
    # vision encoder beside it with heads of its own (multi-head attention)
    for c in rng.sample(cases, 8):
        vision_heads = rng.choice([12, 16])
        cases.append(
            {
                "model_type": rng.choice(["gemma3", "llama4", "qwen2_5_vl", "mistral3"]),
                "text_config": dict(c),
                "vision_config": {"num_attention_heads": vision_heads, "hidden_size": 64 * vision_heads},
            }
        )
    wrong = 0
    for c in cases:
        try:
            wrong += int(queries_per_kv_head(dict(c))) != _group(c.get("text_config") or c)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            wrong += 1
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen configs"


def _templated_len(tok, messages) -> int:
    return len(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


def _reference_requests(tok, messages) -> list[int]:
    return [_templated_len(tok, messages[: i + 1]) for i, m in enumerate(messages) if m["role"] == "user"]


@hidden("00.count_chat_tokens")
def _(request_prompt_tokens, rng, scenario):
    tok = _tokenizer()
    cases = [scenario["conversation"]] + [_conversation(rng) for _ in range(9)]
    for c in cases[1:4]:  # longer chats
        for _ in range(rng.randint(1, 3)):
            c += [
                {"role": "assistant", "content": _sentence(rng).rstrip("?") + "."},
                {"role": "user", "content": _sentence(rng)},
            ]
    passed = 0
    for m in cases:
        try:
            got = [int(x) for x in request_prompt_tokens(tok, [dict(x) for x in m])]
        except (TypeError, ValueError):
            continue
        passed += got == _reference_requests(tok, m)
    return partial(passed, len(cases), "conversations")


def _reference_deltas(tok, prompt_ids, output_ids, stop=()) -> list[str]:
    new, sent, out, done = list(output_ids)[len(prompt_ids) :], "", [], False
    stop = [s for s in stop if s]
    for i in range(len(new)):
        if done:  # the stream ended at a stop string
            out.append("")
            continue
        text = tok.decode(new[: i + 1], skip_special_tokens=True)
        found = [text.find(s) for s in stop if s in text]
        if found:
            text, done = text[: min(found)], True
        elif text.endswith("\ufffd"):
            out.append("")
            continue
        elif i < len(new) - 1:  # hold back an ending that may grow into a stop string
            hold = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[: len(text) - hold]
        delta = text[len(sent) :]
        sent += delta
        out.append(delta)
    return out


def _stops(rng, reply_text: str) -> list[str]:
    """Stop strings for a reply: none, one that occurs (a word, two words, a character), one whose
    beginning occurs but not the whole, or a mix."""
    words = reply_text.split()
    kind = rng.random()
    if kind < 0.2 or len(words) < 2:
        return []
    if kind < 0.4:  # a word of the reply (with its leading space, or without)
        w = rng.choice(words[1:])
        return [rng.choice([w, " " + w, w[:3]])]
    if kind < 0.55:  # two words across a token boundary
        i = rng.randrange(len(words) - 1)
        return [words[i][-2:] + " " + words[i + 1][:2]]
    if kind < 0.75:  # only the beginning occurs: held back, then released
        w = rng.choice(words)
        return [w + "!!", rng.choice(["\n\n", "###"])]
    if kind < 0.9:  # a character of the reply, possibly outside ASCII
        return [rng.choice([c for c in reply_text if not c.isspace()])]
    return ["###", rng.choice(words)[:4], "?!"]


def _ids_case(tok, rng):
    special = [tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")]
    words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 8))]
    prompt = special[:1] + tok(" ".join(words))["input_ids"] + special[1:]
    text = " " + _sentence(rng, other=rng.choice([0.0, 0.3, 0.6]))
    reply = tok(text)["input_ids"]
    out = prompt + reply + ([special[1]] if rng.random() < 0.7 else [])
    return prompt, out, _stops(rng, text)


@hidden("00.stream_deltas")
def _(stream_deltas, rng, scenario):
    tok = _tokenizer()
    cases = [_ids_case(tok, rng) for _ in range(16)]
    passed, why = 0, []
    for p, o, stop in cases:
        try:
            got = [str(d) for d in stream_deltas(tok, list(p), list(o), list(stop))]
        except (TypeError, ValueError):
            why.append("it raised on some token sequences")
            continue
        want = _reference_deltas(tok, p, o, stop)
        passed += got == want
        if got != want:
            why.append(_what_differs(tok, p, o, stop, got, want))
    return partial(passed, len(cases), "token sequences", max(set(why), key=why.count) if why else "")


def _what_differs(tok, prompt_ids, output_ids, stop, got: list[str], want: list[str]) -> str:
    """The rule a wrong stream broke, in words (never the expected deltas)."""
    if len(got) != len(want):
        return "one delta per generated token"
    if "".join(got) != "".join(want):
        return "the joined deltas: the text after the prompt, no special tokens, ending before the first stop string"
    new = list(output_ids)[len(prompt_ids) :]
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w and tok.decode(new[: i + 1], skip_special_tokens=True).endswith("\ufffd"):
            return "a token whose text ends in an incomplete character sends nothing, not even the complete characters before it"
    return "text that may still become a stop string waits for the next token"


def _read_params(c: dict) -> int:
    """Parameters one decode step streams: every layer's matrices and norms, the final norm and the
    lm_head; the embedding table is only looked up (one row), whether or not it is tied."""
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * c["intermediate_size"] + 2 * h
    return layers * per_layer + h + c["vocab_size"] * h


def _config(rng) -> dict:
    kv = rng.choice([1, 2, 4, 8])
    heads = kv * rng.choice([1, 2, 3, 4, 8])
    hd = rng.choice([32, 64, 128])
    cfg = {
        "num_hidden_layers": rng.randint(2, 40),
        "hidden_size": heads * hd,
        "intermediate_size": heads * hd * rng.choice([2, 3, 4]),
        "num_attention_heads": heads,
        "vocab_size": rng.choice([32_000, 49_152, 128_256, 151_936]),
        "tie_word_embeddings": rng.random() < 0.3,
    }
    if rng.random() < 0.8:
        cfg["num_key_value_heads"] = kv
    if rng.random() < 0.3:  # a head_dim that is not hidden_size // heads (Qwen3, Gemma)
        cfg["head_dim"] = hd * 2
    return cfg


def _real_configs() -> list[dict]:
    from lab_utils.drills.shapes import MODELS

    return [
        {
            "num_hidden_layers": s.num_layers,
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_kv_heads,
            "vocab_size": s.vocab_size,
            "tie_word_embeddings": s.tie_word_embeddings,
        }
        for s in MODELS.values()
    ]


@hidden("00.decode_prediction")
def _(predicted_tokens_per_s, rng, scenario):
    import json

    from lab_utils.models import course_model_path

    course = json.loads((course_model_path() / "config.json").read_text())
    cases = [course] + _real_configs() + [_config(rng) for _ in range(12)]
    wrong = 0
    for cfg in cases:
        bw, nbytes = rng.uniform(5e9, 5e12), rng.choice([1, 2, 4])
        want = bw / (_read_params(cfg) * nbytes)
        try:
            got = float(predicted_tokens_per_s(dict(cfg), bw, nbytes))
        except (TypeError, ValueError):
            got = float("nan")
        wrong += not abs(got - want) <= PREDICT_RTOL * want
    # one model of what a step reads: right within the tolerance on every config, or not
    assert not wrong, f"more than {PREDICT_RTOL:.0%} off on {wrong} of {len(cases)} unseen configs"
