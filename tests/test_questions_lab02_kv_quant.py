"""Lab 02's quantized-KV questions (issue 51 item 4), in process: the published solution's answers
pass the public and hidden checks under two seeds, and a typical mistake in each fails its hidden
check (the grade tells the mistake from the answer)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import nbformat
import pytest

from grader.registry import hidden_check
from lab_utils.grading import get, lab_scenario

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "02_kv_cache_paged_attention.ipynb"
QUESTIONS = {
    "02.kv_quant_capacity": "kv_capacity",
    "02.stream_agreement": "stream_agreement",
    "02.kv_gate": "ship_or_hold",
}


@pytest.fixture(scope="module")
def solution() -> dict:
    """The solution's answer functions (each `def` of the cells that define them, run alone)."""
    import ast

    ns: dict = {"__name__": "__main__", "math": math}
    for cell in nbformat.read(str(SOLUTION), as_version=4).cells:
        if cell.cell_type != "code" or not any(f"def {n}(" in cell.source for n in QUESTIONS.values()):
            continue
        tree = ast.parse(cell.source)
        defs = [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name in QUESTIONS.values()
        ]
        exec(compile(ast.Module(body=defs, type_ignores=[]), "<solution>", "exec"), ns)
    assert set(QUESTIONS.values()) <= set(ns)
    return ns


def _run(qid: str, answer, seed: int = 3) -> bool:
    try:
        result = hidden_check(qid)(answer, rng=random.Random(seed), scenario=lab_scenario("02", 0))
    except AssertionError:
        return False
    return result is None


@pytest.mark.parametrize("seed", [3, 20261201])
@pytest.mark.parametrize("qid", sorted(QUESTIONS))
def test_the_solution_passes_the_public_and_hidden_checks(qid, seed, solution):
    answer = solution[QUESTIONS[qid]]
    assert get(qid).fn(answer) is None
    assert _run(qid, answer, seed)


# --- 02.kv_quant_capacity -------------------------------------------------------------------------

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}


def _capacity(scale_of, mla_vectors: int = 1, mla_heads: bool = False, round_up: bool = False):
    def kv_capacity(model, dtype, budget, block_size):
        e, s = _BYTES[dtype], scale_of(dtype, model)
        if "kv_lora_rank" in model and not mla_heads:
            per_token = (
                model["num_layers"]
                * mla_vectors
                * ((model["kv_lora_rank"] + model["qk_rope_head_dim"]) * e + s)
            )
        else:
            dim = model.get("head_dim") or model["kv_lora_rank"] + model["qk_rope_head_dim"]
            per_token = model["num_layers"] * 2 * model["num_kv_heads"] * (dim * e + s)
        per_block = block_size * per_token
        return per_token, -(-budget // per_block) if round_up else budget // per_block

    return kv_capacity


def test_the_variants_below_are_right_when_their_mistake_is_left_out():
    assert _run("02.kv_quant_capacity", _capacity(lambda d, m: 4 * (d == "int8")))


@pytest.mark.parametrize(
    "wrong",
    [
        _capacity(lambda d, m: 0),  # forgets int8's scales
        _capacity(lambda d, m: 4 * (d in ("int8", "fp8_e4m3", "fp8_e5m2"))),  # a per-token scale for fp8 too
        _capacity(
            lambda d, m: 4 * (d == "int8") / max(1, 2 * m.get("num_kv_heads", 1))
        ),  # one scale per layer
        _capacity(lambda d, m: 4 * (d == "int8"), mla_vectors=2),  # MLA latent cached as K and as V
        _capacity(lambda d, m: 4 * (d == "int8"), mla_heads=True),  # MLA as per-head K/V
        _capacity(lambda d, m: 4 * (d == "int8"), round_up=True),  # counts a partial block
    ],
    ids=["no-int8-scale", "fp8-scale", "scale-per-layer", "mla-twice", "mla-per-head", "partial-block"],
)
def test_a_capacity_mistake_fails(wrong):
    assert not _run("02.kv_quant_capacity", wrong)


# --- 02.stream_agreement --------------------------------------------------------------------------


def test_ignoring_a_length_difference_fails():
    def agreement(pairs):  # zip stops at the shorter stream: a prefix looks identical
        first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in pairs]
        return sum(d is None for d in first) / len(pairs), first

    assert not _run("02.stream_agreement", agreement)


def test_counting_from_one_fails(solution):
    def agreement(pairs):
        share, first = solution["stream_agreement"](pairs)
        return share, [None if d is None else d + 1 for d in first]

    assert not _run("02.stream_agreement", agreement)


def test_the_share_of_equal_tokens_is_not_the_share_of_identical_prompts(solution):
    def agreement(pairs):
        _, first = solution["stream_agreement"](pairs)
        same = sum(a == b for x, y in pairs for a, b in zip(x, y))
        return same / max(1, sum(len(x) for x, _ in pairs)), first

    assert not _run("02.stream_agreement", agreement)


# --- 02.kv_gate ------------------------------------------------------------------------------------


def _gate(low_of):
    def ship_or_hold(pairs, min_agreement, confidence):
        n, k = len(pairs), sum(list(a) == list(b) for a, b in pairs)
        return "ship" if low_of(k, n, confidence) >= min_agreement else "hold"

    return ship_or_hold


def _exact_low(k, n, confidence, alpha_share=0.5):
    from grader.hidden.lab02 import clopper_pearson_low

    return clopper_pearson_low(k, n, 1 - (1 - confidence) * 2 * alpha_share)


def test_the_grader_interval_is_the_course_clopper_pearson():
    from grader.hidden.lab02 import clopper_pearson_low
    from lab_utils.accuracy_gate import clopper_pearson

    rng = random.Random(5)
    for _ in range(40):
        n = rng.randint(1, 400)
        k, c = rng.randint(0, n), rng.choice([0.9, 0.95, 0.99])
        assert math.isclose(clopper_pearson_low(k, n, c), clopper_pearson(k, n, c)[0], abs_tol=1e-9)


def test_the_point_estimate_fails():
    assert not _run("02.kv_gate", _gate(lambda k, n, c: k / n))


def test_a_one_sided_interval_fails():
    assert not _run("02.kv_gate", _gate(lambda k, n, c: _exact_low(k, n, c, alpha_share=1.0)))


def test_the_normal_approximation_fails():
    z = {0.9: 1.6449, 0.95: 1.96, 0.99: 2.5758}

    def wald(k, n, c):
        p = k / n
        return p - z[c] * math.sqrt(p * (1 - p) / n)

    assert not _run("02.kv_gate", _gate(wald))


def test_the_exact_interval_passes():
    assert _run("02.kv_gate", _gate(_exact_low))
