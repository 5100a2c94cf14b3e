"""Lab 00 (setup): questions that exercise the whole grading path on the course model."""

from __future__ import annotations

import json

from lab_utils.grading.registry import question


def _config() -> dict:
    from lab_utils.models import course_model_path

    return json.loads((course_model_path() / "config.json").read_text())


@question("00.queries_per_kv_head", points=1, answers=["queries_per_kv_head"])
def _(queries_per_kv_head):
    """How many query heads share one KV head in the course model (grouped-query attention)."""
    cfg = _config()
    expected = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    value = float(queries_per_kv_head)
    assert value == int(value), "a whole number: query heads divided by key/value heads"
    assert int(value) == expected, "read num_attention_heads and num_key_value_heads in config.json"


@question("00.count_chat_tokens", points=2, answers=["count_chat_tokens"])
def _(count_chat_tokens):
    """A function counting the tokens the model really sees for a chat, template included."""
    from transformers import AutoTokenizer

    from lab_utils.models import course_model_path

    tok = AutoTokenizer.from_pretrained(course_model_path())
    cases = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Name three serving frameworks."}],
    ]
    for messages in cases:
        want = len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        got = int(count_chat_tokens(tok, messages))
        bare = len(tok(messages[-1]["content"])["input_ids"])
        assert got != bare, "count the whole templated prompt, not only the user's text"
        assert got == want, ("include the chat template's role markers and the generation prompt "
                             "(add_generation_prompt=True)")


@question("00.capital_answer", points=1, answers=["capital_answer"])
def _(capital_answer):
    """The course model's greedy answer to the capital-of-France question."""
    text = str(capital_answer)
    assert text.strip(), "store the decoded answer text (a non-empty string)"
    assert "<|im_start|>" not in text, "decode only the new tokens, without the prompt or its template"
    assert "paris" in text.lower(), "generate greedily (do_sample=False) from the chat-templated prompt"
