"""bench/engine_throughput.py's own pieces: the ShareGPT requests it sends, agreement, medians."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "engine_throughput.py"
_spec = importlib.util.spec_from_file_location("engine_throughput", _PATH)
et = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(et)


def test_agreement_counts_whole_requests_and_the_shared_prefix():
    same, prefix = et.agreement([[1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3], [4, 9, 6, 7]])
    assert same == 0.5  # one of two requests identical
    assert prefix == pytest.approx(4 / 7)  # 3 + 1 tokens before the first difference, of 7
    assert et.agreement([[1]], [[2]]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="same requests"):
        et.agreement([[1]], [])


def test_median_range_and_the_synthetic_workload_are_what_they_say():
    assert et.median_range([3.0, 1.0, 2.0, 10.0]) == (2.5, 1.0, 10.0)
    a, b = et.synthetic_requests(20, seed=1), et.synthetic_requests(20, seed=1)
    assert a == b and a != et.synthetic_requests(20, seed=2)
    assert all(20 <= len(p) <= 200 and 16 <= n <= 256 for p, n in a)


@pytest.mark.slow
def test_sharegpt_requests_are_real_prompts_within_the_length_filter(course_model):
    from transformers import AutoTokenizer

    from lab_utils.sim import sharegpt

    tok = AutoTokenizer.from_pretrained(str(course_model))
    try:
        reqs, note = et.sharegpt_requests(12, seed=5, tokenizer=tok, max_model_len=1024)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert len(reqs) == 12 and "17,671 complete conversations" in note and "cut short" in note
    assert all(sharegpt.keep(len(p), n) and len(p) + n <= 1024 for p, n in reqs)
    assert len({tuple(p) for p, _ in reqs}) == 12  # twelve different conversations
    again, _ = et.sharegpt_requests(12, seed=5, tokenizer=tok, max_model_len=1024)
    assert again == reqs and et.sharegpt_requests(12, seed=6, tokenizer=tok, max_model_len=1024)[0] != reqs
    text = tok.decode(reqs[0][0])
    assert len(text.split()) >= 2  # decodes back to words: a human turn, not random ids
