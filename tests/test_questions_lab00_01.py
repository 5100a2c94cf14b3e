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


def lab01_answers(seed: int) -> dict:
    from lab_utils.memory import GPUS, ModelSpec, weight_bytes

    s = lab_scenario("01", seed)
    spec, gpu = ModelSpec(**s["model"]), GPUS[s["gpu"]]
    nbytes = {"float32": 4, "bfloat16": 2, "fp8": 1}
    total = (
        weight_bytes(spec, s["weights"])
        + s["concurrent_requests"]
        * s["context_tokens"]
        * kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, nbytes[s["kv_cache_dtype"]])
    ) / GiB
    usable = s["gpu_memory_utilization"] * gpu.memory_bytes / GiB - s["reserve_gib"]
    v = s["vllm"]
    return {
        "kv_bytes_per_token": kv_bytes_per_token,
        "vllm_capacity": vllm_capacity,
        "predicted_vllm": vllm_capacity(
            v["kv_cache_gib"] * GiB,
            kv_bytes_per_token(30, 3, 64, nbytes[v["dtype"]]),
            v["block_size"],
            v["max_model_len"],
        ),
        "parallel_plan": parallel_plan,
        "scenario_plan": parallel_plan(
            total, usable, spec.num_attention_heads, spec.num_kv_heads, s["gpus_per_node"]
        ),
        "decode_step": decode_step,
        "expected_tokens_per_pass": expected_tokens_per_pass,
        "scenario_spec_speedup": expected_tokens_per_pass(s["spec_alpha"], s["spec_k"])
        / (1 + s["spec_k"] * s["draft_cost_ratio"]),
        "prefill_ttft_s": prefill_ttft_s,
        "scenario_ttft_s": prefill_ttft_s(
            spec.non_embedding_params, s["prompt_tokens"], gpu.bf16_tflops, s["mfu"], *s["ttft_parallel"]
        ),
    }


def queries_per_kv_head(config):
    return config["num_attention_heads"] // (
        config.get("num_key_value_heads") or config["num_attention_heads"]
    )


def count_chat_tokens(tokenizer, messages):
    return len(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


def new_text(tokenizer, prompt_ids, output_ids):
    return tokenizer.decode(output_ids[len(prompt_ids) :], skip_special_tokens=True)


_BANDWIDTH = []


def _bandwidth():
    if not _BANDWIDTH:
        from lab_utils.hostperf import measure_read_bandwidth

        _BANDWIDTH.append(measure_read_bandwidth(megabytes=32, repeats=2))
    return _BANDWIDTH[0]


def _weight_bytes_from_file() -> int:
    """float32 weight bytes from the safetensors header (independent of the question's count)."""
    import json
    import struct

    from lab_utils.models import course_model_path

    raw = (Path(course_model_path()) / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k != "__metadata__")


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from transformers import AutoTokenizer

    from lab_utils.models import course_model_path

    return AutoTokenizer.from_pretrained(course_model_path())


@functools.lru_cache(maxsize=4)
def _lab00_scenario_tokens(seed: int) -> int:
    return count_chat_tokens(_tokenizer(), lab_scenario("00", seed)["conversation"])


def lab00_answers(seed: int) -> dict:
    bw = _bandwidth()
    return {
        "queries_per_kv_head": queries_per_kv_head,
        "count_chat_tokens": count_chat_tokens,
        "scenario_prompt_tokens": _lab00_scenario_tokens(seed),
        "new_text": new_text,
        "predicted_tokens_per_s": bw.bytes_per_s / _weight_bytes_from_file(),
        "bandwidth": bw,
    }


# --- wrong but plausible answers, forbidden references ------------------------------------------

WRONG = {
    "00.queries_per_kv_head": {"queries_per_kv_head": lambda c: c.get("num_key_value_heads", 1)},
    "00.count_chat_tokens": {
        "count_chat_tokens": lambda tok, m: sum(len(tok(x["content"])["input_ids"]) for x in m)
    },
    "00.new_text": {"new_text": lambda tok, p, o: tok.decode(o, skip_special_tokens=True)},
    "00.decode_prediction": {"predicted_tokens_per_s": 1e6},
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

    from lab_utils.drills import calc
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

    def decode_wrapped(b, w, kv, f, bw, pk):
        ridge = calc.ridge_point(pk / 1e12, bw / 1e9)
        return decode_step(b, w, kv, f, bw, pk)[0], ("memory" if b * f / (w + b * kv) < ridge else "compute")

    return {
        "01.kv_bytes_per_token": ("kv_bytes_per_token", memkv.kv_cache_bytes_per_token, kv_wrapped),
        "01.vllm_capacity": ("vllm_capacity", memkv.vllm_kv_cache_report, cap_wrapped),
        "01.parallel_plan": ("parallel_plan", calc.gpus_needed, plan_wrapped),
        "01.decode_roofline": ("decode_step", memrec.decode_tokens_per_s, decode_wrapped),
        "01.spec_decode": (
            "expected_tokens_per_pass",
            calc.spec_expected_tokens,
            lambda a, k: calc.spec_expected_tokens(a, k),
        ),
        "01.prefill_ttft": (
            "prefill_ttft_s",
            calc.prefill_ttft_s,
            lambda n, p, t, m, tp, pp: calc.prefill_ttft_s(n, p, t, m, tp),
        ),
        "00.decode_prediction": ("predicted_tokens_per_s", calc.batch1_decode_tokens_per_s, None),
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
        "00.new_text",
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
    """The embedding is a lookup: a TTFT from every parameter is wrong for the scenario."""
    seed = 5
    answers = _answers("01.prefill_ttft", seed)
    s = lab_scenario("01", seed)
    from lab_utils.memory import GPUS, ModelSpec

    spec, gpu = ModelSpec(**s["model"]), GPUS[s["gpu"]]
    fn = answers["prefill_ttft_s"]
    simple = {
        **answers,
        "scenario_ttft_s": fn(
            spec.num_params, s["prompt_tokens"], gpu.bf16_tflops, s["mfu"], *s["ttft_parallel"]
        ),
    }
    q = get("01.prefill_ttft")
    assert score_graded(q, answers, seed).earned == q.points
    assert score_graded(q, simple, seed).earned == 0
