"""pytest plugin for an instructor's hidden tests, run in their own process by the grader.

The tests run on the judge's side; the student's answers stay inside a sandboxed runner, and
`answers["name"]` is the answer as plain data or a proxy (grader.remote): call it, read its
attributes, convert with int()/float()/list().

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
    parser.addoption("--runner-config", action="store", help="JSON: answers folder, sandbox, environment")
    parser.addoption("--hidden-report", action="store", help="where to write the JSON report")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): points this hidden test is worth")


class _Answers:
    """answers["name"]: one runner for the session, started on first use."""

    def __init__(self, config: dict):
        self.config = config
        self.runner = None

    def __getitem__(self, name: str):
        from pathlib import Path

        from grader.remote import Runner
        from grader.sandbox import Sandbox

        if self.runner is None:
            c = self.config
            box = Sandbox(**c["sandbox"]) if c.get("sandbox") else None
            self.runner = Runner(
                Path(c["answers"]),
                [],
                box,
                c["python"],
                c["env"],
                Path(c["log"]),
                timeout=float(c["timeout"]),
            )
        try:
            return self.runner.answer(name)
        except LookupError:
            raise KeyError(name) from None

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


@pytest.fixture(scope="session")
def answers(request):
    with open(request.config.getoption("--runner-config")) as f:
        found = _Answers(json.load(f))
    yield found
    found.close()


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
