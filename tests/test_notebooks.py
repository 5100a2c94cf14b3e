"""Every lab, end to end, through the instructor's grader: CI proves each check can fail.

- each solution notebook runs in CPU mode and scores full marks;
- each generated student copy (answers stubbed) runs to its last cell and scores zero on every
  question.

Both run with LIGHT=True (the smallest workloads that still run every cell), so the suite fits CI's
time on a 2-core machine. The solutions start every real server; the student copies skip the
sections that a lab puts behind RUN_VLLM / RUN_REAL (those sections hold no answer of their own
that a stub could reach). LAB_FULL=1 runs the solutions at their default sizes, as a learner would.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from lab_utils.grading import questions_for
from lab_utils.grading.grader import Grader, Job

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
NOTEBOOK_TIMEOUT = float(os.environ.get("LAB_NOTEBOOK_TIMEOUT", 1200))


def _grade(path: Path, out: Path, parameters: dict) -> tuple:
    grader = Grader(out, timeout=NOTEBOOK_TIMEOUT, memory_mb=16384, parameters=parameters)
    try:
        return grader.grade(Job("ci", path.name[:2], path))
    finally:
        grader.close()


def _last_student_cell_ran(out: Path, name: str) -> bool:
    nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"
            and "grader-probe" not in c.metadata.get("tags", [])]
    return code[-1].execution_count is not None


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_scores_full_marks(path, tmp_path):
    params = {"BACKEND": "cpu"} if os.environ.get("LAB_FULL") == "1" else {"BACKEND": "cpu", "LIGHT": True}
    outcome, feedback = _grade(path, tmp_path, params)
    assert outcome.status == "ok", f"{outcome.status}\n{feedback}"
    assert outcome.scores == outcome.possible, feedback
    assert set(outcome.possible) == {q.id for q in questions_for(path.name[:2])}
    assert _last_student_cell_ran(tmp_path, path.name)


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_student_copy_runs_to_the_end_and_scores_zero(path, tmp_path):
    lab = REPO / "labs" / path.name
    outcome, feedback = _grade(lab, tmp_path, {"BACKEND": "cpu", "LIGHT": True,
                                               "RUN_VLLM": False, "RUN_REAL": False})
    assert outcome.status == "ok" or outcome.status.startswith("cell errors"), outcome.status
    assert all(v == 0 for v in outcome.scores.values()), feedback
    assert len(outcome.scores) == len(questions_for(path.name[:2])) >= 2
    assert _last_student_cell_ran(tmp_path, path.name)
