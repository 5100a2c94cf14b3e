"""Lab 00 (setup): the course model's shape, what a conversation costs a stateless chat API, streaming
text out of tokens, and a bandwidth bound on decode speed for any config.

Public checks run one or two fixed cases; the hidden checks (grader/hidden/lab00.py) call the
learner's functions on configs, conversations and token sequences drawn from the grader's key.
"""

from __future__ import annotations

import functools
import math

from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import question, scenario

# Questions a learner's scenario asks the course model, and short conversations to count.
_QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Italy?",
    "What is the capital of Japan?",
    "Name the largest planet in the solar system.",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
]
_SYSTEMS = [
    "You are terse.",
    "You are a helpful assistant.",
    "Answer in one word.",
    "You explain things to engineers.",
]
_WORDS = (
    "serving batching cache token latency GPU memory throughput prefill decode request queue "
    "kernel block model replica router budget"
).split()
_NON_ASCII = ["👋", "café", "naïve", "Zürich", "日本語", "→", "✓", "Genève", "€5", "😀"]


def _sentence(rng, lo: int = 2, hi: int = 9, other: float = 0.0) -> str:
    """Words of the course's vocabulary; with `other` > 0, some words from outside ASCII."""
    words = [rng.choice(_NON_ASCII if rng.random() < other else _WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "?"


def _conversation(rng) -> list[dict]:
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
    for turn in range(rng.randint(1, 3)):
        if turn:
            messages.append({"role": "assistant", "content": _sentence(rng).rstrip("?") + "."})
        messages.append({"role": "user", "content": _sentence(rng)})
    return messages


@scenario("00")
def _(rng):
    return {"question": rng.choice(_QUESTIONS), "conversation": _conversation(rng)}


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from transformers import AutoTokenizer

    from lab_utils.models import course_model_path

    return AutoTokenizer.from_pretrained(course_model_path())


# --- 00.queries_per_kv_head ------------------------------------------------------------------


@question(
    "00.queries_per_kv_head",
    points=1,
    answers=["queries_per_kv_head"],
    # lab 01's calculator reads configs, multimodal wrappers included
    forbid=refs("model_spec"),
)
def _(queries_per_kv_head):
    """A function: query heads sharing one KV head in the language model, from a config dict (plain,
    or a multimodal wrapper with the language model under text_config)."""
    got = queries_per_kv_head({"num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768})
    assert float(got) == int(float(got)), "a whole number of query heads per KV head"
    assert int(got) != 4, "that is the number of KV heads, not how many query heads share each one"
    got = queries_per_kv_head({"num_attention_heads": 16, "hidden_size": 1024})
    assert int(got) == 1, (
        "a config without num_key_value_heads is plain multi-head attention: "
        "every query head has its own key/value head"
    )


# --- 00.count_chat_tokens --------------------------------------------------------------------


@question("00.count_chat_tokens", points=2, answers=["request_prompt_tokens"])
def _(request_prompt_tokens):
    """request_prompt_tokens(tokenizer, messages): the prompt tokens of each request the conversation
    took through a stateless chat API."""
    tok = _tokenizer()
    one = [{"role": "user", "content": "Hi"}]
    got = [int(x) for x in request_prompt_tokens(tok, one)]
    assert len(got) == 1, "one user message: one request"
    assert got[0] > len(tok("Hi")["input_ids"]) + 2, (
        "the model also sees the template's role markers and the prompt that opens the assistant's turn"
    )
    two = one + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi"}]
    got2 = [int(x) for x in request_prompt_tokens(tok, two)]
    assert len(got2) == 2 and got2[0] == got[0], "one request per user message, in order"
    assert got2[1] > got[0] + len(tok("Hello.")["input_ids"]), (
        "the API keeps no state: the second request carries the whole history"
    )


# --- 00.stream_deltas ------------------------------------------------------------------------


# tokenizers' DecodeStream holds back half characters by itself; the stop strings are what is asked
@question("00.stream_deltas", points=2, answers=["stream_deltas"])
def _(stream_deltas):
    """stream_deltas(tokenizer, prompt_ids, output_ids, stop): the text each new token adds to a stream
    that ends before the first stop string. A token whose text ends in an incomplete character sends
    nothing, not even the complete characters before it; text that may still become a stop string
    waits for the next token."""
    tok = _tokenizer()
    prompt = tok("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    reply = tok("Hello 👋 there.")["input_ids"]
    out = prompt + reply + [tok.convert_tokens_to_ids("<|im_end|>")]
    deltas = [str(d) for d in stream_deltas(tok, list(prompt), list(out), [])]
    assert len(deltas) == len(reply) + 1, "one delta per generated token (some may be empty)"
    assert "user" not in "".join(deltas), "stream only what came after the prompt"
    assert "<|im_end|>" not in "".join(deltas), "leave out the special tokens the template and the model emit"
    assert not any("\ufffd" in d for d in deltas), (
        "a client shows each delta at once: never send half a character (look at the emoji's tokens)"
    )
    half = [i for i in range(1, len(reply)) if tok.decode(reply[: i + 1]).endswith("\ufffd")]
    assert half and all(deltas[i] == "" for i in half), (
        "a token whose text ends in an incomplete character sends nothing, not even the complete "
        "characters before it (the space before the emoji waits for the emoji)"
    )
    assert "".join(deltas) == "Hello 👋 there.", "the deltas, joined, are the reply's text"
    cut = [str(d) for d in stream_deltas(tok, list(prompt), list(out), ["there!", "."])]
    assert len(cut) == len(reply) + 1, "with stop strings too: one delta per generated token"
    assert "".join(cut) == "Hello 👋 there", "the stream ends before the first stop string, which is not sent"
    assert [i for i, d in enumerate(cut) if "there" in d] == [len(reply) - 1], (
        "' there' might have been the start of the stop string 'there!': a client must never see text "
        "that a later token turns into a stop string, so it waits until the next token decides"
    )


# --- 00.decode_prediction (predict, then measure) --------------------------------------------


@question(
    "00.decode_prediction",
    points=2,
    answers=["predicted_tokens_per_s"],
    forbid=refs("decode_speed", "model_spec"),
    predict=True,
)
def _(predicted_tokens_per_s):
    """predicted_tokens_per_s(config, bytes_per_s, dtype_bytes): the batch-1 decode bound."""
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    p = float(predicted_tokens_per_s(dict(cfg), 1e10, 4))
    assert math.isfinite(p) and 0 < p < 1e10 / 1e5, (
        "a positive number of tokens per second, bounded by the reads"
    )
    assert math.isclose(float(predicted_tokens_per_s(dict(cfg), 1e10, 2)), 2 * p, rel_tol=1e-6), (
        "half the bytes per weight: half the bytes every step reads"
    )
