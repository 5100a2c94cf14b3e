"""Shared fixtures. Tests that need the course model or start a server are marked slow."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("MPLBACKEND", "Agg")
# tests never touch an instructor's seed or a learner's results file
_SCRATCH = tempfile.mkdtemp(prefix="lab-tests-")
os.environ.setdefault("LAB_INSTRUCTOR_DIR", os.path.join(_SCRATCH, "instructor"))
os.environ.setdefault("LAB_RESULTS_FILE", os.path.join(_SCRATCH, "results.json"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def course_model() -> Path:
    """The prepared course model folder (prepared once per machine; `make setup` does it)."""
    from lab_utils.models import course_model_path

    return course_model_path()
