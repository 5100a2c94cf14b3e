"""pytest plugin for an instructor's hidden tests, run in their own process by the grader.

A hidden test file lives in the instructor's folder as `labNN/test_*.py` or `test_NN_*.py`. Its
tests take the fixture `answers` (a dict of the student's saved answers, by variable name) and may
carry `@pytest.mark.points(2)` (default 1):

    import pytest

    @pytest.mark.points(2)
    def test_allocate_many(answers):
        manager = answers["PagedManager"](num_blocks=8, block_size=4)
        ...

Each test becomes a gradebook column `NN.hidden.<test name>`.
"""

from __future__ import annotations

import json

import pytest

_RESULTS: list[dict] = []


def pytest_addoption(parser):
    parser.addoption("--answers", action="store", help="folder of saved answers")
    parser.addoption("--hidden-report", action="store", help="where to write the JSON report")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): points this hidden test is worth")


@pytest.fixture(scope="session")
def answers(request):
    from lab_utils.grading.probe import load_answers

    found, _problems = load_answers(request.config.getoption("--answers"))
    return found


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        points = 1.0
        marker = getattr(report, "_points", None)
        if marker is not None:
            points = marker
        message = ""
        if report.outcome != "passed":
            message = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
        _RESULTS.append(
            {
                "name": report.nodeid.split("::")[-1],
                "outcome": report.outcome,
                "points": points,
                "message": message,
            }
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    mark = item.get_closest_marker("points")
    rep._points = float(mark.args[0]) if mark and mark.args else 1.0


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--hidden-report")
    if path:
        with open(path, "w") as f:
            json.dump(_RESULTS, f, indent=1)
