"""Every lab, end to end, through the instructor's grader: CI proves each grade certifies work.

For every lab in solutions/ (labs added later are picked up automatically):

- the solution runs in CPU mode under grading seed A and scores full marks;
- the same run's saved answers, turned into a *memorised* submission (values typed in, measured
  objects re-typed as dicts, answer functions replaced by lookup tables of the public checks'
  cases), score at most a quarter of the points under seed B — no notebook is run again for this;
- the solution runs again under seed B and still scores full marks; this second run skips the
  sections behind RUN_VLLM / RUN_REAL (their answers are measurements the grader re-derives from
  raw samples, and the seed-A run already proved them), so every question whose answers it
  produced must score full;
- the generated student copy (answers stubbed) runs to its last cell and scores zero.

All runs use LIGHT=True (the smallest workloads that still run every cell), so the suite fits CI's
time on a 2-core machine. LAB_FULL=1 runs the solutions at their default sizes, as a learner would.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from grader.grader import Grader, Job
from grader.memorise import memorised_answers, save_answers
from lab_utils.grading import questions_for
from lab_utils.grading.probe import load_answers

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in SOLUTIONS]
NOTEBOOK_TIMEOUT = float(os.environ.get("LAB_NOTEBOOK_TIMEOUT", 1200))
SEED_A, SEED_B = 20261201, 777  # two grading seeds; each notebook's scenario seed derives from them
SKIP_SERVERS = {"RUN_VLLM": False, "RUN_REAL": False}


def _grade(path: Path, out: Path, parameters: dict, seed: int) -> tuple:
    grader = Grader(
        out,
        timeout=NOTEBOOK_TIMEOUT,
        memory_mb=16384,
        parameters=parameters,
        seed=seed,
        keep_answers=True,
        copies="off",  # the published solution itself: the copy check is proven in test_originality
    )
    try:
        return grader.grade(Job("ci", path.name[:2], path))
    finally:
        grader.close()


def _params(**extra) -> dict:
    base = {"BACKEND": "cpu"} if os.environ.get("LAB_FULL") == "1" else {"BACKEND": "cpu", "LIGHT": True}
    return {**base, **extra}


_RUNS: dict[str, tuple] = {}


@pytest.fixture(scope="session")
def solution_run(tmp_path_factory):
    """The seed-A run of a solution, executed once per session and shared by the tests below."""

    def run(path: Path):
        if path.name not in _RUNS:
            out = tmp_path_factory.mktemp(f"sol-{path.name[:2]}")
            _RUNS[path.name] = (*_grade(path, out, _params(), SEED_A), out)
        return _RUNS[path.name]

    return run


def _last_student_cell_ran(out: Path, name: str) -> bool:
    nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and "grader-probe" not in c.metadata.get("tags", [])]
    return code[-1].execution_count is not None


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_solution_scores_full_marks(path, solution_run):
    outcome, feedback, out = solution_run(path)
    assert outcome.status == "ok", f"{outcome.status}\n{feedback}"
    assert outcome.scores == outcome.possible, feedback
    assert set(outcome.possible) == {q.id for q in questions_for(path.name[:2])}
    assert _last_student_cell_ran(out, path.name)


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_memorised_submission_scores_at_most_a_quarter(path, solution_run, tmp_path):
    outcome, feedback, out = solution_run(path)
    lab = path.name[:2]
    answers, problems = load_answers(out / "answers" / "ci" / lab)
    assert answers, f"the solution run saved no answers ({problems})"
    fake = memorised_answers(lab, answers)
    folder = tmp_path / "memorised"
    save_answers(fake, folder)
    grader = Grader(tmp_path / "out", seed=SEED_B, copies="off")
    try:  # judged as the grader judges a notebook: in the sandbox, hidden cases from seed B's key
        results = grader.judge_saved(lab, folder)
    finally:
        grader.close()
    earned = sum(r.earned for r in results)
    possible = sum(r.points for r in results)
    detail = "\n".join(f"{r.id}: {r.earned:g}/{r.points:g} {r.status}" for r in results)
    assert earned <= 0.25 * possible, f"memorised submission scored {earned:g}/{possible:g}:\n{detail}"


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_solution_scores_full_marks_under_a_second_seed(path, tmp_path):
    lab = path.name[:2]
    outcome, feedback = _grade(path, tmp_path, _params(**SKIP_SERVERS), SEED_B)
    saved, _ = load_answers(tmp_path / "answers" / "ci" / lab)
    exercised = [q for q in questions_for(lab) if all(n in saved for n in q.answers)]
    short = [q.id for q in exercised if outcome.scores[q.id] != q.points]
    assert not short, f"under seed B these scored less than full marks: {short}\n{feedback}"
    assert exercised, "no question's answers were computed outside the server sections"


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_student_copy_runs_to_the_end_and_scores_zero(path, tmp_path):
    lab = REPO / "labs" / path.name
    outcome, feedback = _grade(lab, tmp_path, {"BACKEND": "cpu", "LIGHT": True, **SKIP_SERVERS}, SEED_B)
    assert outcome.status == "ok" or outcome.status.startswith("cell errors"), outcome.status
    assert all(v == 0 for v in outcome.scores.values()), feedback
    assert len(outcome.scores) == len(questions_for(path.name[:2])) >= 2
    assert _last_student_cell_ran(tmp_path, path.name)
