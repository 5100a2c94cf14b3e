"""The Gradescope autograder (grader/gradescope.py): the bundle's shape, and its run_autograder run
against an /autograder-shaped folder, writing a results.json in Gradescope's format."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader.gradebook import Outcome, write_gradebook
from grader.gradescope import _feedback_rows, build_bundle, results_json

REPO = Path(__file__).resolve().parent.parent
EMPTY_NB = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "lab00.zip", "00")


def test_bundle_has_the_two_scripts_at_its_root_and_the_course_beside(bundle):
    with zipfile.ZipFile(bundle) as z:
        names = set(z.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
        run = z.read("run_autograder").decode()
    assert {
        "setup.sh",
        "run_autograder",
        "grader/__main__.py",
        "grader/gradescope.py",
        "lab_utils/__init__.py",
    } <= names
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert "--lab 00" in run and "gradescope-run" in run
    assert not any(n.startswith(("tests/", ".venv", "docs/")) for n in names)
    assert not any("instructor" in n and n.endswith((".key", "seed")) for n in names)


def test_bundle_refuses_a_lab_without_questions(tmp_path):
    with pytest.raises(ValueError, match="two digits"):
        build_bundle(tmp_path / "x.zip", "../0")


def _autograder(tmp_path: Path, bundle: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
    (root / "submission").mkdir(parents=True)
    for name, text in files.items():
        (root / "submission" / name).write_text(text)
    meta = {"users": [{"email": "ana@school.edu", "name": "Ana <b>"}], "id": 1}
    (root / "submission_metadata.json").write_text(json.dumps(meta))
    return root


def _run(root: Path, tmp_path: Path) -> dict:
    env = dict(os.environ)
    env.update(
        AUTOGRADER_ROOT=str(root),
        COURSE_PYTHON=sys.executable,
        LAB_INSTRUCTOR_DIR=str(tmp_path / "instructor"),
    )
    r = subprocess.run(
        ["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((root / "results" / "results.json").read_text())


def _valid(results: dict) -> None:
    assert set(results) == {"score", "execution_time", "output", "visibility", "tests"}
    assert isinstance(results["score"], int | float) and isinstance(results["output"], str)
    for t in results["tests"]:
        assert set(t) == {"name", "score", "max_score", "output", "visibility"}
        assert 0 <= t["score"] <= t["max_score"]


@pytest.mark.slow  # 11 s: the grader starts (sandbox probe, keys) for one notebook
def test_run_autograder_grades_an_empty_notebook_to_zero(tmp_path, bundle):
    root = _autograder(tmp_path, bundle, {"00_setup.ipynb": EMPTY_NB, "notes.txt": "hi"})
    results = _run(root, tmp_path)
    _valid(results)
    assert results["score"] == 0 and len(results["tests"]) >= 3
    assert "empty notebook" in results["output"]
    assert all(t["name"].startswith("00.") for t in results["tests"])


def test_run_autograder_without_a_notebook_says_so(tmp_path, bundle):
    root = _autograder(tmp_path, bundle, {"answers.txt": "42"})
    results = _run(root, tmp_path)
    _valid(results)
    assert results["tests"] == [] and "no .ipynb file in the submission" in results["output"]


def test_results_json_takes_each_questions_hint_from_the_feedback(tmp_path):
    write_gradebook(
        tmp_path, [Outcome("ana", "00", {"00.a": 1.0, "00.b": 0.0}, {"00.a": 1.0, "00.b": 2.0}, "ok")]
    )
    fb = tmp_path / "feedback" / "ana"
    fb.mkdir(parents=True)
    (fb / "00.md").write_text(
        "| question | points | status | hint |\n|---|---|---|---|\n| 00.a | 1/1 | passed |  |\n"
        "| 00.b | 0/2 | wrong | expected 3 \\| got \x1b[31m4 |\n"
    )
    results = results_json(tmp_path, "00", 12.4, ["note"])
    _valid(results)
    assert results["score"] == 1.0 and results["execution_time"] == 12
    assert [t["output"] for t in results["tests"]] == ["passed", "wrong: expected 3 | got 4"]
    assert _feedback_rows("| question | points | status | hint |") == {}
