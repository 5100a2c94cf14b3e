"""Lab 00: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab00`.
"""

from __future__ import annotations

import functools

from grader.registry import hidden
from lab_utils.grading.questions.lab00 import _WORDS, _conversation, _sentence, _templated_len, _tokenizer

PREDICT_RTOL = 0.03


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
    wrong = sum(int(queries_per_kv_head(dict(c))) != _group(c) for c in cases)
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen configs"


@hidden("00.count_chat_tokens")
def _(count_chat_tokens, scenario_prompt_tokens, rng, scenario):
    tok = _tokenizer()
    cases = [_conversation(rng) for _ in range(8)]
    wrong = sum(int(count_chat_tokens(tok, m)) != _templated_len(tok, m) for m in cases)
    assert not wrong, f"count_chat_tokens is wrong on {wrong} of {len(cases)} unseen conversations"
    assert int(float(scenario_prompt_tokens)) == _templated_len(tok, scenario["conversation"]), (
        "scenario_prompt_tokens is not the count for this run's SCENARIO conversation"
    )


def _reference_new_text(tok, prompt_ids, output_ids) -> str:
    return tok.decode(list(output_ids)[len(prompt_ids) :], skip_special_tokens=True)


def _ids_case(tok, rng):
    special = [tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")]
    words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 8))]
    prompt = special[:1] + tok(" ".join(words))["input_ids"] + special[1:]
    reply = tok(" " + _sentence(rng))["input_ids"]
    out = prompt + reply + ([special[1]] if rng.random() < 0.7 else [])
    return prompt, out


@hidden("00.new_text")
def _(new_text, rng, scenario):
    tok = _tokenizer()
    cases = [_ids_case(tok, rng) for _ in range(8)]
    wrong = sum(
        str(new_text(tok, list(p), list(o))).strip() != _reference_new_text(tok, p, o).strip()
        for p, o in cases
    )
    assert not wrong, f"wrong on {wrong} of {len(cases)} unseen token sequences"


@functools.lru_cache(maxsize=1)
def _course_weight_bytes() -> int:
    from lab_utils.memory import ModelSpec
    from lab_utils.models import course_model_path

    return ModelSpec.from_hf_config(course_model_path()).num_params * 4  # float32


@hidden("00.decode_prediction")
def _(predicted_tokens_per_s, bandwidth, rng, scenario):
    from lab_utils.grading.provenance import verify
    from lab_utils.hostperf import bandwidth_from_samples

    assert verify(bandwidth), "the bandwidth object was not produced by this run's measurement"
    want = bandwidth_from_samples(bandwidth.raw_samples()) / _course_weight_bytes()
    got = float(predicted_tokens_per_s)
    assert abs(got - want) <= PREDICT_RTOL * want, (
        f"the prediction is more than {PREDICT_RTOL:.0%} away from the bound of the measured bandwidth"
    )
