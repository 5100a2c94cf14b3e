"""Lab 00 (setup): the course model's shape, what a chat prompt costs, decoding, a bandwidth bound.

Public checks run one or two fixed cases; the hidden checks re-run the learner's functions on
configs, conversations and token sequences drawn from the grader's seed, and re-derive the decode
prediction from the stamped bandwidth measurement of the run.
"""

from __future__ import annotations

import functools
import math

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
# How far the decode prediction may be from the reference (the same measured bandwidth, the
# model's float32 weight bytes): the learner may count the weights slightly differently.


def _sentence(rng, lo: int = 2, hi: int = 9) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "?"


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


def _templated_len(tok, messages) -> int:
    return len(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


# --- 00.queries_per_kv_head ------------------------------------------------------------------


@question("00.queries_per_kv_head", points=1, answers=["queries_per_kv_head"])
def _(queries_per_kv_head):
    """A function: query heads sharing one KV head, from a config dict."""
    got = queries_per_kv_head({"num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768})
    assert float(got) == int(float(got)), "a whole number of query heads per KV head"
    assert int(got) != 4, "that is the number of KV heads, not how many query heads share each one"
    assert int(got) == 3, "compare the two head counts in the config"
    got = queries_per_kv_head({"num_attention_heads": 16, "hidden_size": 1024})
    assert int(got) == 1, (
        "a config without num_key_value_heads is plain multi-head attention: "
        "every query head has its own key/value head"
    )


# --- 00.count_chat_tokens --------------------------------------------------------------------


@question("00.count_chat_tokens", points=2, answers=["count_chat_tokens", "scenario_prompt_tokens"])
def _(count_chat_tokens, scenario_prompt_tokens):
    """A function counting the tokens the model really sees for a chat, and its value on SCENARIO."""
    tok = _tokenizer()
    messages = [{"role": "user", "content": "Hi"}]
    got = int(count_chat_tokens(tok, messages))
    assert got != len(tok("Hi")["input_ids"]), "count the whole templated prompt, not only the user's text"
    assert got == _templated_len(tok, messages), (
        "the model also sees the template's role markers and the prompt that opens the assistant's turn"
    )
    two = messages + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi"}]
    assert int(count_chat_tokens(tok, two)) > got, "a longer conversation costs more tokens"
    n = float(scenario_prompt_tokens)
    assert n == int(n) and n > 0, "scenario_prompt_tokens: a positive whole number of tokens"


# --- 00.new_text -----------------------------------------------------------------------------


@question("00.new_text", points=1, answers=["new_text"])
def _(new_text):
    """A function: the text of the generated tokens only, without the prompt or special tokens."""
    tok = _tokenizer()
    prompt = tok("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    out = prompt + tok("Hello there.")["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    text = str(new_text(tok, list(prompt), list(out)))
    assert "user" not in text and "Hi\n" not in text, "decode only what came after the prompt"
    assert "<|im_end|>" not in text, "leave out the special tokens the template and the model emit"
    assert text.strip() == "Hello there.", "decode the new tokens into plain text"


# --- 00.decode_prediction (predict, then measure) --------------------------------------------


@question(
    "00.decode_prediction",
    points=2,
    answers=["predicted_tokens_per_s", "bandwidth"],
    forbid=["lab_utils.drills.calc:batch1_decode_tokens_per_s"],
    predict=True,
)
def _(predicted_tokens_per_s, bandwidth):
    """Predicted batch-1 decode tokens/s from the measured read bandwidth and the weight bytes."""
    from lab_utils.grading.provenance import verify

    assert verify(bandwidth), (
        "`bandwidth` must be the object measure_read_bandwidth() returned in this run, unchanged"
    )
    p = float(predicted_tokens_per_s)
    assert math.isfinite(p) and p > 0, "a positive number of tokens per second"
    bw = float(bandwidth.bytes_per_s)
    assert p < bw / 1e6, "a decode step reads every weight: hundreds of MB, not bytes, per token"
    assert p > bw / 1e10, "the course model's weights are well under a GB per copy"
