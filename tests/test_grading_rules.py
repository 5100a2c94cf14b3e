"""The grading core's rules on a toy lab: seeds, hidden checks, forbidden references,
the memorised submission, the instructor's seed. Quick: no notebook runs."""

from __future__ import annotations

import functools

import pytest

from grader import registry as judge_registry
from grader.grader import instructor_seed, job_seed
from grader.judge import score_graded
from grader.memorise import memorised_answers
from grader.registry import hidden
from lab_utils.grading import registry
from lab_utils.grading.registry import get, lab_scenario, question, scenario
from lab_utils.grading.scoring import CORRECT, NOT_ANSWERED, REFERENCE, WRONG, score

LAB = "98"


def _reference_area(w: float, h: float) -> float:
    return w * h


@pytest.fixture(autouse=True, scope="module")
def toy_lab():
    @scenario(LAB)
    def _(rng):
        return {"w": rng.randint(2, 50), "h": rng.randint(2, 50)}

    @question(f"{LAB}.area", points=2, answers=["area"], forbid=[f"{__name__}:_reference_area"])
    def _(area):
        assert float(area(2, 3)) > 0, "an area is positive"
        assert float(area(2, 3)) == float(area(3, 2)), "order of sides does not matter"

    @hidden(f"{LAB}.area")
    def _(area, rng, scenario):
        cases = [(rng.uniform(0.1, 9), rng.uniform(0.1, 9)) for _ in range(20)]
        bad = sum(abs(float(area(w, h)) - w * h) > 1e-9 for w, h in cases)
        assert not bad, f"wrong on {bad} of {len(cases)} unseen cases"

    @question(f"{LAB}.scenario_area", points=1, answers=["scenario_area"])
    def _(scenario_area):
        assert float(scenario_area) > 0, "compute it from SCENARIO"

    @hidden(f"{LAB}.scenario_area")
    def _(scenario_area, rng, scenario):
        assert float(scenario_area) == scenario["w"] * scenario["h"], "recompute from SCENARIO"

    yield
    for qid in (f"{LAB}.area", f"{LAB}.scenario_area"):
        registry._REGISTRY.pop(qid, None)
        judge_registry._HIDDEN.pop(qid, None)
    registry._SCENARIOS.pop(LAB, None)


def test_scenarios_are_a_function_of_the_seed():
    assert lab_scenario(LAB, 0) == lab_scenario(LAB, 0)
    assert len({tuple(lab_scenario(LAB, s).values()) for s in range(6)}) > 1
    with pytest.raises(ValueError, match="SEED must be an integer"):
        lab_scenario(LAB, "abc")


def test_right_answers_score_full_under_any_seed():
    s = lab_scenario(LAB, 41)
    answers = {"area": lambda w, h: w * h, "scenario_area": s["w"] * s["h"]}
    for q in (get(f"{LAB}.area"), get(f"{LAB}.scenario_area")):
        assert score_graded(q, answers, 41).status == CORRECT
    assert score_graded(get(f"{LAB}.area"), answers, 42).status == CORRECT


def test_a_lookup_table_passes_public_but_not_hidden():
    table = {(2, 3): 6, (3, 2): 6}
    answers = {"area": lambda w, h: table[(w, h)]}
    q = get(f"{LAB}.area")
    assert score(q, answers).status == CORRECT
    graded = score_graded(q, answers, 5)
    assert graded.earned == 0


def test_a_typed_in_value_only_matches_its_own_seed():
    s = lab_scenario(LAB, 7)
    typed = {"scenario_area": s["w"] * s["h"]}
    q = get(f"{LAB}.scenario_area")
    assert score_graded(q, typed, 7).status == CORRECT
    other = next(
        seed
        for seed in range(8, 100)
        if lab_scenario(LAB, seed) != s
        and lab_scenario(LAB, seed)["w"] * lab_scenario(LAB, seed)["h"] != typed["scenario_area"]
    )
    assert score_graded(q, typed, other).earned == 0


@pytest.mark.parametrize(
    "answer",
    [
        _reference_area,  # the reference itself
        functools.partial(_reference_area),  # wrapped in a partial
        lambda w, h: _reference_area(w, h),  # called from the learner's own function
    ],
)
def test_the_reference_scores_zero_by_identity_and_by_behaviour(answer):
    result = score_graded(get(f"{LAB}.area"), {"area": answer}, 3)
    assert result.earned == 0 and result.status == REFERENCE, result


def test_none_and_missing_answers_score_zero():
    q = get(f"{LAB}.area")
    assert score(q, {"area": None}).status == NOT_ANSWERED
    assert score(q, {}).status == NOT_ANSWERED


def test_wrong_answers_say_so_without_the_answer():
    result = score_graded(get(f"{LAB}.area"), {"area": lambda w, h: w + h}, 3)
    assert result.status == WRONG and "*" not in result.message


def test_memorised_submission_scores_nothing_here():
    s = lab_scenario(LAB, 11)
    answers = {"area": lambda w, h: w * h, "scenario_area": s["w"] * s["h"]}
    fake = memorised_answers(LAB, answers)
    assert score(get(f"{LAB}.area"), fake).status == CORRECT  # it does pass the public check
    other = job_seed(99, "ci", LAB)
    total = sum(
        score_graded(q, fake, other).earned for q in (get(f"{LAB}.area"), get(f"{LAB}.scenario_area"))
    )
    assert total == 0


def test_instructor_seed_is_created_once_and_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_INSTRUCTOR_DIR", str(tmp_path / "instructor"))
    notes: list[str] = []
    first = instructor_seed(notes.append)
    assert instructor_seed(notes.append) == first and len(notes) == 1
    (tmp_path / "instructor" / "seed").write_text("not a number")
    with pytest.raises(ValueError, match="one integer"):
        instructor_seed()


def test_job_seeds_differ_by_student_and_lab_and_are_never_public():
    seeds = {job_seed(1, s, lab) for s in ("ana", "bo") for lab in ("01", "02")}
    assert len(seeds) == 4 and 0 not in seeds
    assert job_seed(1, "ana", "01") != job_seed(2, "ana", "01")
