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


@pytest.fixture(autouse=True)
def _limits_restored():
    """A test that caps the pytest process (an address-space cap, a CPU limit) must lift it: every
    later test, and every kernel and server they start, inherits it (a CI run once failed two later
    tests on a cap left behind: a MemoryError in lab 04's kernel, a failed mmap of the model)."""
    import resource

    kinds = (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE)
    before = {k: resource.getrlimit(k) for k in kinds}
    yield
    changed = {k: v for k, v in before.items() if resource.getrlimit(k) != v}
    for k, v in changed.items():
        resource.setrlimit(k, v)
    assert not changed, f"the test left process limits changed: {sorted(changed)}"
