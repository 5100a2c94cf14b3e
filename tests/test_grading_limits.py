"""Limits that fit the lab: lab 10's solution as a learner submits it (LIGHT = False: two vLLM
replicas behind vLLM's router, the full workloads) scores full marks with the grader's default
limits, inside the sandbox. Memory is measured as proportional set size, so the pages the two
replicas share are counted once.

Slow (about a quarter of an hour on 2 cores): it runs when LAB_GRADE_FULL=1 is set, as `make test`
on a lab machine may; the sandboxed LIGHT runs of every lab are in test_notebooks.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.grader import Grader, Job
from lab_utils.grading import lab_limits, questions_for

REPO = Path(__file__).resolve().parent.parent


def test_labs_declare_limits_the_grader_uses():
    for lab in ("05", "09", "10"):
        limits = lab_limits(lab)
        assert limits["memory_mb"] >= 8192 and limits["timeout"] >= 900, (lab, limits)
    assert lab_limits("10")["memory_mb"] > lab_limits("02")["memory_mb"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LAB_GRADE_FULL") != "1", reason="set LAB_GRADE_FULL=1 (about 15 minutes)")
def test_lab10_as_submitted_scores_full_marks_with_the_default_limits(tmp_path):
    path = next((REPO / "solutions").glob("10_*.ipynb"))
    grader = Grader(tmp_path / "out", seed=31, parameters={"BACKEND": "cpu"}, copies="off")
    try:
        assert grader.memory_for("10") == lab_limits("10")["memory_mb"]  # no override: the lab's own
        outcome, feedback = grader.grade(Job("ci", "10", path))
    finally:
        grader.close()
    assert outcome.status == "ok", f"{outcome.status}\n{feedback}"
    assert outcome.scores == outcome.possible and len(outcome.possible) == len(questions_for("10")), feedback
