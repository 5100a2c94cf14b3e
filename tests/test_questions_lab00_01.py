"""Labs 00 and 01's graded questions: solutions earn full marks under any seed, transcription earns nothing.

For every question: reference answers (written here, not run from the notebook) score full marks
under two seeds; a wrong-but-plausible answer fails; the lookup tables of the public cases fail the
hidden check; the forbidden reference, by identity or wrapped, scores zero; None scores zero; and
the memorised submission of a whole lab scores at most a quarter of its points under another seed.
Lab 00's questions read the course model's tokenizer, so those tests are marked slow.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from grader.judge import score_graded
from grader.memorise import memorised_answers
from grader.registry import hidden_check
from lab_utils.grading import get, lab_scenario, questions_for

GiB = 1 << 30
SEEDS = (3, 11)
OTHER_SEED = 29


# --- reference answers ------------------------------------------------------------------------


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def vllm_capacity(kv_cache_bytes, bytes_per_token, block_size, max_model_len):
    blocks = kv_cache_bytes // (block_size * bytes_per_token)
    per_request = math.ceil(max_model_len / block_size)
    if blocks - 1 < per_request:
        return None
    conc = blocks / per_request
    return int(conc * max_model_len), conc


def parallel_plan(total_gib, usable_gib_per_gpu, num_heads, num_kv_heads, gpus_per_node=8):
    allowed = [t for t in range(1, gpus_per_node + 1) if num_heads % t == 0 and num_kv_heads % t == 0]
    for t in allowed:
        if total_gib / t <= usable_gib_per_gpu:
            return t, 1
    return allowed[-1], math.ceil(total_gib / (allowed[-1] * usable_gib_per_gpu))


def decode_step(batch_size, weight_bytes, kv_bytes_per_seq, flops_per_seq, bandwidth_bytes_per_s, peak_flops):
    t_mem = (weight_bytes + batch_size * kv_bytes_per_seq) / bandwidth_bytes_per_s
    t_comp = batch_size * flops_per_seq / peak_flops
    return batch_size / max(t_mem, t_comp), ("memory" if t_mem >= t_comp else "compute")


def expected_tokens_per_pass(alpha, k):
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def prefill_ttft_s(num_params, prompt_tokens, peak_tflops, mfu, tensor_parallel_size, pipeline_parallel_size):
    return 2 * num_params * prompt_tokens / (tensor_parallel_size * peak_tflops * 1e12 * mfu)


_NBYTES = {"float32": 4, "bfloat16": 2, "fp8": 1}


def request_kv_bytes(config, num_tokens, dtype_bytes):
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or config["hidden_size"] // heads
    kinds = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    held = sum(
        min(num_tokens, config["sliding_window"]) if k == "sliding_attention" else num_tokens for k in kinds
    )
    return 2 * kv * hd * dtype_bytes * held


def _windows_ignored(config, num_tokens, dtype_bytes):
    return request_kv_bytes({k: v for k, v in config.items() if k != "layer_types"}, num_tokens, dtype_bytes)


def scenario_plan(s):
    from lab_utils.memory import GPUS, ModelSpec, weight_bytes

    spec, gpu = ModelSpec(**s["model"]), GPUS[s["gpu"]]
    per_token = kv_bytes_per_token(
        spec.num_layers, spec.num_kv_heads, spec.head_dim, _NBYTES[s["kv_cache_dtype"]]
    )
    total = (
        weight_bytes(spec, s["weights"]) + s["concurrent_requests"] * s["context_tokens"] * per_token
    ) / GiB
    usable = s["gpu_memory_utilization"] * gpu.memory_bytes / GiB - s["reserve_gib"]
    return parallel_plan(total, usable, spec.num_attention_heads, spec.num_kv_heads, s["gpus_per_node"])


def scenario_spec_speedup(s):
    return expected_tokens_per_pass(s["spec_alpha"], s["spec_k"]) / (1 + s["spec_k"] * s["draft_cost_ratio"])


def scenario_ttft_s(s):
    from lab_utils.memory import GPUS

    m = s["model"]
    q, kv = m["num_attention_heads"] * m["head_dim"], m["num_kv_heads"] * m["head_dim"]
    weights = m["num_layers"] * m["hidden_size"] * (2 * q + 2 * kv + 3 * m["intermediate_size"])
    return prefill_ttft_s(
        weights, s["prompt_tokens"], GPUS[s["gpu"]].bf16_tflops, s["mfu"], *s["ttft_parallel"]
    )


def predicted_vllm(v):
    per_token = kv_bytes_per_token(30, 3, 64, _NBYTES[v["dtype"]])
    return vllm_capacity(v["kv_cache_gib"] * GiB, per_token, v["block_size"], v["max_model_len"])


def lab01_answers(seed: int) -> dict:
    return {
        "kv_bytes_per_token": kv_bytes_per_token,
        "request_kv_bytes": request_kv_bytes,
        "vllm_capacity": vllm_capacity,
        "predicted_vllm": predicted_vllm,
        "parallel_plan": parallel_plan,
        "scenario_plan": scenario_plan,
        "decode_step": decode_step,
        "expected_tokens_per_pass": expected_tokens_per_pass,
        "scenario_spec_speedup": scenario_spec_speedup,
        "prefill_ttft_s": prefill_ttft_s,
        "scenario_ttft_s": scenario_ttft_s,
    }


def queries_per_kv_head(config):
    config = config.get("text_config", config)
    return config["num_attention_heads"] // (
        config.get("num_key_value_heads") or config["num_attention_heads"]
    )


def _top_level_heads(config):  # the previous answer: a multimodal wrapper's heads are not at the top
    return config["num_attention_heads"] // (
        config.get("num_key_value_heads") or config["num_attention_heads"]
    )


def request_prompt_tokens(tokenizer, messages):
    return [
        len(
            tokenizer.apply_chat_template(
                messages[: i + 1], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for i, m in enumerate(messages)
        if m["role"] == "user"
    ]


def stream_deltas(tokenizer, prompt_ids, output_ids, stop):
    """tokenizers' DecodeStream for the half characters; the stop strings by hand."""
    from tokenizers.decoders import DecodeStream

    stream, text, sent, out, ended = DecodeStream(skip_special_tokens=True), "", "", [], False
    new = output_ids[len(prompt_ids) :]
    for i, token in enumerate(new):
        piece = stream.step(tokenizer._tokenizer, token)  # None: half a character, or a special token
        if ended or (piece is None and i < len(new) - 1):
            out.append("")
            continue
        text += piece or ""
        cuts = [text.find(s) for s in stop if s and s in text]
        visible = text[: min(cuts)] if cuts else text
        if not cuts and i < len(new) - 1:  # an ending that may become a stop string waits
            wait = max((k for s in stop for k in range(1, len(s)) if visible.endswith(s[:k])), default=0)
            visible = visible[: len(visible) - wait]
        ended = bool(cuts)
        out.append(visible[len(sent) :])
        sent = visible
    return out


def _decode_stream_only(tokenizer, prompt_ids, output_ids, stop):
    """Half characters handled by the library, stop strings ignored."""
    return stream_deltas(tokenizer, prompt_ids, output_ids, [])


def _cut_without_waiting(tokenizer, prompt_ids, output_ids, stop):
    """Cuts at a stop string but sends every ending at once (a client may see the start of a stop)."""
    out, text, sent, ended = [], "", "", False
    for d in stream_deltas(tokenizer, prompt_ids, output_ids, []):
        text += d
        cuts = [text.find(s) for s in stop if s and s in text]
        visible = text[: min(cuts)] if cuts else text
        out.append("" if ended else visible[len(sent) :])
        if not ended:
            sent = visible
        ended = ended or bool(cuts)
    return out


def predicted_tokens_per_s(config, bytes_per_s, dtype_bytes):
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or h // heads
    layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * config["intermediate_size"]
    return bytes_per_s / ((config["num_hidden_layers"] * layer + config["vocab_size"] * h) * dtype_bytes)


def _all_weights_tokens_per_s(config, bytes_per_s, dtype_bytes):
    """Counts the embedding table as read (twice when untied): the bound every-weight counting gives."""
    h = config["hidden_size"]
    extra = 0 if config.get("tie_word_embeddings") else config["vocab_size"] * h
    return 1 / (
        1 / predicted_tokens_per_s(config, bytes_per_s, dtype_bytes) + extra * dtype_bytes / bytes_per_s
    )


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from transformers import AutoTokenizer

    from lab_utils.models import course_model_path

    return AutoTokenizer.from_pretrained(course_model_path())


def lab00_answers(seed: int) -> dict:
    return {
        "queries_per_kv_head": queries_per_kv_head,
        "request_prompt_tokens": request_prompt_tokens,
        "stream_deltas": stream_deltas,
        "predicted_tokens_per_s": predicted_tokens_per_s,
    }


# --- wrong but plausible answers, forbidden references ------------------------------------------

WRONG = {
    "00.queries_per_kv_head": {"queries_per_kv_head": _top_level_heads},
    "00.count_chat_tokens": {  # the whole conversation once, as if the API kept state
        "request_prompt_tokens": lambda tok, m: [
            len(
                tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)[
                    "input_ids"
                ]
            )
        ]
    },
    "00.stream_deltas": {"stream_deltas": _decode_stream_only},  # the library's half of the work
    "00.decode_prediction": {"predicted_tokens_per_s": _all_weights_tokens_per_s},
    "01.kv_bytes_per_token": {"kv_bytes_per_token": lambda L, H, D, B: L * H * D * B},
    "01.vllm_capacity": {
        "vllm_capacity": lambda kv, t, b, m: (None if kv // (b * t) < -(-m // b) else (kv // t, kv // t / m))
    },
    "01.parallel_plan": {"parallel_plan": lambda total, usable, h, kv, n=8: (max(1, int(total / usable)), 1)},
    "01.decode_roofline": {"decode_step": lambda b, w, kv, f, bw, pk: (b * bw / (w + b * kv), "memory")},
    "01.spec_decode": {"expected_tokens_per_pass": lambda a, k: 1 + a * k},
    "01.prefill_ttft": {"prefill_ttft_s": lambda n, p, t, m, tp, pp: 2 * n * p / (tp * pp * t * 1e12 * m)},
}


def _spec_for_bytes_per_token(per_token: int):
    from lab_utils.memory import ModelSpec

    d = per_token // 2  # one layer, one KV head, 1-byte elements
    return ModelSpec("x", 1, d, 1, 1, d, 1, 1)


def _forbidden_cases():
    import importlib

    from grader import drill_calc as calc
    from lab_utils.memory import kv as memkv

    memrec = importlib.import_module("lab_utils.memory.recommend")
    from lab_utils.memory.spec import ModelSpec

    def kv_wrapped(L, H, D, B):
        return memkv.kv_cache_bytes_per_token(
            ModelSpec("x", L, H * D, H, H, D, 1, 1), {1: "fp8", 2: "bfloat16", 4: "float32"}[B]
        )

    def cap_wrapped(kv, per_token, block, max_len):
        r = memkv.vllm_kv_cache_report(kv, _spec_for_bytes_per_token(per_token), "fp8", block, max_len)
        return (r.kv_cache_tokens, r.max_concurrency) if r.fits else None

    def plan_wrapped(total, usable, h, kv, n=8):
        return calc.gpus_needed(total, 0.0, usable, 1.0, 0.0, h, kv, n) or 8, 1

    return {
        "01.kv_bytes_per_token": ("kv_bytes_per_token", memkv.kv_cache_bytes_per_token, kv_wrapped),
        "01.vllm_capacity": ("vllm_capacity", memkv.vllm_kv_cache_report, cap_wrapped),
        "01.parallel_plan": ("parallel_plan", calc.gpus_needed, plan_wrapped),
        # the drills' ridge_point and prefill_ttft_s the wrappers called left the copy (issue 47)
        "01.decode_roofline": ("decode_step", memrec.decode_tokens_per_s, None),
        "01.spec_decode": (
            "expected_tokens_per_pass",
            calc.spec_expected_tokens,
            lambda a, k: calc.spec_expected_tokens(a, k),
        ),
        "01.prefill_ttft": ("prefill_ttft_s", ModelSpec.prefill_flops, None),
        "00.queries_per_kv_head": (
            "queries_per_kv_head",
            ModelSpec,
            lambda c: (lambda s: s.num_attention_heads // s.num_kv_heads)(ModelSpec.from_hf_config(c)),
        ),
        "00.decode_prediction": (
            "predicted_tokens_per_s",
            calc.batch1_decode_tokens_per_s,
            lambda cfg, bw, b: bw
            / (
                b
                * (
                    ModelSpec.from_hf_config(cfg).non_embedding_params
                    + cfg["vocab_size"] * cfg["hidden_size"]
                )
            ),
        ),
    }


# --- the tests ----------------------------------------------------------------------------------

LAB01 = [q.id for q in questions_for("01")]
LAB00 = [q.id for q in questions_for("00")]
slow = pytest.mark.slow


def _answers(qid: str, seed: int) -> dict:
    return lab01_answers(seed) if qid.startswith("01.") else lab00_answers(seed)


def _ids(lab_ids, needs_model):
    return [pytest.param(q, marks=slow) if needs_model else q for q in lab_ids]


ALL = _ids(LAB01, False) + _ids(LAB00, True)


def test_question_sets():
    assert set(LAB01) == {
        "01.kv_bytes_per_token",
        "01.vllm_capacity",
        "01.parallel_plan",
        "01.decode_roofline",
        "01.spec_decode",
        "01.prefill_ttft",
    }
    assert set(LAB00) == {
        "00.queries_per_kv_head",
        "00.count_chat_tokens",
        "00.stream_deltas",
        "00.decode_prediction",
    }
    for lab in ("00", "01"):
        qs = questions_for(lab)
        assert all(hidden_check(q.id) is not None for q in qs)
        assert sum(q.predict for q in qs) >= 1
    assert lab_scenario("01", 1) != lab_scenario("01", 2) and lab_scenario("01", 7) == lab_scenario("01", 7)


@pytest.mark.parametrize("qid", ALL)
def test_reference_scores_full_marks_under_two_seeds(qid):
    q = get(qid)
    for seed in SEEDS:
        result = score_graded(q, _answers(qid, seed), seed=seed)
        assert result.earned == q.points, (seed, result)


@pytest.mark.parametrize("qid", ALL)
def test_wrong_but_plausible_fails(qid):
    q = get(qid)
    answers = {**_answers(qid, SEEDS[0]), **WRONG[qid]}
    assert score_graded(q, answers, seed=SEEDS[0]).earned == 0


@pytest.mark.parametrize("qid", ALL)
def test_none_scores_zero(qid):
    q = get(qid)
    good = _answers(qid, SEEDS[0])
    for name in q.answers:
        assert score_graded(q, {**good, name: None}, seed=SEEDS[0]).earned == 0, name


@pytest.mark.parametrize(
    "qid", [q for q in LAB01 if get(q).forbid] + [pytest.param(q, marks=slow) for q in LAB00 if get(q).forbid]
)
def test_forbidden_reference_scores_zero(qid):
    q = get(qid)
    name, ref, wrapper = _forbidden_cases()[qid]
    good = _answers(qid, SEEDS[0])
    assert score_graded(q, {**good, name: ref}, seed=SEEDS[0]).earned == 0
    if wrapper is not None:
        result = score_graded(q, {**good, name: wrapper}, seed=SEEDS[0])
        assert result.earned == 0 and result.status == "uses the reference", result


@pytest.mark.parametrize("lab", [pytest.param("00", marks=slow), "01"])
def test_lookup_tables_and_typed_in_values_fail(lab):
    solution = lab00_answers(SEEDS[0]) if lab == "00" else lab01_answers(SEEDS[0])
    memorised = memorised_answers(lab, solution)
    earned = {q.id: score_graded(q, memorised, seed=OTHER_SEED).earned for q in questions_for(lab)}
    possible = sum(q.points for q in questions_for(lab))
    assert sum(earned.values()) <= 0.25 * possible, earned
    # every question holding a function: its lookup table of the public cases fails the hidden cases
    for q in questions_for(lab):
        if any(callable(solution[n]) for n in q.answers):
            assert earned[q.id] == 0, q.id


def test_notebooks_import_no_reference():
    import ast
    import json

    root = Path(__file__).resolve().parent.parent / "solutions"
    for name, lab in (("01_memory_math.ipynb", "01"), ("00_setup.ipynb", "00")):
        imported = set()
        for cell in json.loads((root / name).read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.ImportFrom):
                    imported |= {f"{node.module}:{a.name}" for a in node.names} | {node.module}
                elif isinstance(node, ast.Import):
                    imported |= {a.name for a in node.names}
        for q in questions_for(lab):
            for spec in q.forbid:
                module, attr = spec.split(":")
                package = module.rsplit(".", 1)[0]
                assert spec not in imported and f"{package}:{attr}" not in imported, (name, spec)
                assert module not in imported, (name, module)


def test_ttft_counts_the_parameters_a_token_goes_through():
    """The embedding is a lookup: a TTFT from every parameter is wrong for the scenarios."""
    seed = 5
    answers = _answers("01.prefill_ttft", seed)
    from lab_utils.memory import GPUS, ModelSpec

    def simple_ttft(s):
        spec, gpu = ModelSpec(**s["model"]), GPUS[s["gpu"]]
        return prefill_ttft_s(
            spec.num_params, s["prompt_tokens"], gpu.bf16_tflops, s["mfu"], *s["ttft_parallel"]
        )

    q = get("01.prefill_ttft")
    assert score_graded(q, answers, seed).earned == q.points
    assert score_graded(q, {**answers, "scenario_ttft_s": simple_ttft}, seed).earned < 0.8 * q.points


def test_request_kv_bytes_must_know_sliding_windows_and_missing_fields():
    q, good = get("01.kv_bytes_per_token"), lab01_answers(5)
    assert score_graded(q, {**good, "request_kv_bytes": _windows_ignored}, 5).earned == 0

    def head_dim_always_derived(config, n, b):
        return request_kv_bytes({k: v for k, v in config.items() if k != "head_dim"}, n, b)

    assert score_graded(q, {**good, "request_kv_bytes": head_dim_always_derived}, 5).earned < 0.9 * q.points

    def window_on_every_layer(config, n, b):  # the Qwen2 trap: a window in the config, switched off
        if "sliding_window" in config and "layer_types" not in config:
            config = {**config, "layer_types": ["sliding_attention"] * config["num_hidden_layers"]}
        return request_kv_bytes(config, n, b)

    assert score_graded(q, {**good, "request_kv_bytes": window_on_every_layer}, 5).earned < q.points


def test_scenario_answers_typed_in_or_copied_score_little():
    """A scenario answer that ignores its argument (the notebook's own value, typed in) fails the
    grader's scenarios; a prediction copied from vLLM's log of this run does too."""
    seed = 5
    good = lab01_answers(seed)
    s = lab_scenario("01", seed)
    typed = {
        "scenario_plan": lambda _s, v=scenario_plan(s): v,
        "scenario_spec_speedup": lambda _s, v=scenario_spec_speedup(s): v,
        "scenario_ttft_s": lambda _s, v=scenario_ttft_s(s): v,
        "predicted_vllm": lambda _s, v=predicted_vllm(s["vllm"]): v,
    }
    for qid, name in (
        ("01.parallel_plan", "scenario_plan"),
        ("01.spec_decode", "scenario_spec_speedup"),
        ("01.prefill_ttft", "scenario_ttft_s"),
        ("01.vllm_capacity", "predicted_vllm"),
    ):
        q = get(qid)
        r = score_graded(q, {**good, name: typed[name]}, seed)
        assert r.earned < 0.5 * q.points, (qid, r)

    # the scenario's GPU fixed instead of read from the argument
    def fixed_gpu(sc):
        return scenario_ttft_s({**sc, "gpu": s["gpu"]})

    assert score_graded(get("01.prefill_ttft"), {**good, "scenario_ttft_s": fixed_gpu}, seed).earned < 2


@slow
def test_stream_deltas_must_hold_back_what_may_become_a_stop_string():
    """Half characters alone (what tokenizers' DecodeStream does) earn nothing; cutting at the stop
    string without holding its beginning back is wrong on the cases where a stop string spans tokens."""
    q, good = get("00.stream_deltas"), lab00_answers(SEEDS[0])
    assert score_graded(q, good, SEEDS[0]).earned == q.points
    assert score_graded(q, {**good, "stream_deltas": _decode_stream_only}, SEEDS[0]).earned == 0
    hasty = score_graded(q, {**good, "stream_deltas": _cut_without_waiting}, SEEDS[0])
    assert hasty.earned == 0, hasty  # the public case already shows ' there' too early


def test_multimodal_configs_count_the_language_model():
    q = get("00.queries_per_kv_head")
    assert score_graded(q, {"queries_per_kv_head": queries_per_kv_head}, SEEDS[1]).earned == q.points
    assert score_graded(q, {"queries_per_kv_head": _top_level_heads}, SEEDS[1]).earned == 0


def test_ttft_may_not_read_the_calculators_parameter_counts():
    """ModelSpec's parameter counts are the answer's second half: read in the sandbox, they refuse."""
    from lab_utils.memory import GPUS, ModelSpec

    seed = 5
    good = _answers("01.prefill_ttft", seed)

    def via(attr):
        def scenario_ttft(s):
            spec = ModelSpec(**s["model"])
            n = getattr(spec, attr)
            n = n(s["prompt_tokens"]) / (2 * s["prompt_tokens"]) if attr == "prefill_flops" else n
            if attr == "num_params":
                n -= spec.embedding_params
            return prefill_ttft_s(
                n, s["prompt_tokens"], GPUS[s["gpu"]].bf16_tflops, s["mfu"], *s["ttft_parallel"]
            )

        return scenario_ttft

    q = get("01.prefill_ttft")
    for attr in ("non_embedding_params", "num_params", "prefill_flops"):
        r = score_graded(q, {**good, "scenario_ttft_s": via(attr)}, seed)
        assert r.earned == 0 and r.status == "uses the reference", (attr, r)


def test_the_vllm_functions_the_lab_points_to_exist():
    """Lab 01 sends the learner to vLLM's source for the logged KV capacity: those names must exist.

    The lab's helper finds them in kv_cache_utils (0.32) or kv_cache_planning (0.33)."""
    import inspect

    from lab_utils.memory.kv import vllm_kv_capacity_module

    text = Path(inspect.getfile(vllm_kv_capacity_module())).read_text()
    for name in ("def get_kv_cache_capacity(", "def get_max_concurrency_for_kv_cache_config("):
        assert name in text, name
    assert "kv_cache_config.num_blocks" in text
