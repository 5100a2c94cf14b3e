"""`make test`'s pytest, in two processes at once: the solution runs, and everything else.

Measured on 2 cores (issue 50): one pytest process keeps the machine about 45% idle, because most of
a vLLM start is processes spawning and importing one after another, and most of the grader's
per-notebook cost is waiting on sandboxed kernels. So the suite runs as two streams:

- solutions: tests/test_notebooks.py for the labs in FIRST_STREAM_LABS (each lab's solution under
  the grader, then the bypass and second-seed judging and the time, silence and figure checks on
  those runs; they share the runs in-process), then tests/test_zz_no_leftovers.py;
- rest: every test file, tests/test_notebooks.py for the other labs included (LAB_SOLUTION_LABS
  tells it which), the student copies of every lab (tests/test_notebooks_student.py), and
  tests/test_zz_no_leftovers.py last.

When both have ended, tests/test_zz_grading_table.py assembles the CI table from the cells both
recorded. Each stream prints its lines as they come, prefixed with its name, and its own summary
(`-ra`, the slowest tests); the exit status is the first failing stream's. Extra arguments go to
every pytest (e.g. `--durations=40`, `-x`, `-m "not slow"`).

    python scripts/test_streams.py [PYTEST_ARGS...]
    python scripts/test_streams.py --serial [PYTEST_ARGS...]   # one process, file order, as before

`make test PYTEST_ARGS=--serial` does the latter; a named file or test id (`make test
PYTEST_ARGS=tests/test_kv.py`) also runs in one process. Each stream runs with `-v` (one line per test,
so the two streams' lines interleave readably).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
NOTEBOOKS = "tests/test_notebooks.py"
TABLE = "tests/test_zz_grading_table.py"
LAST = "tests/test_zz_no_leftovers.py"
NO_TESTS = 5  # pytest's exit status when a selection collects nothing (e.g. -m "not slow" in a stream)


# The labs whose solutions the first stream runs; the second runs the other labs' solutions (a lab
# added later too) beside its other files. Chosen from CI's durations so that both streams end about
# together: in the first two-stream run (every lab here, the student copies in the rest stream) the
# solutions stream ended after 46.1 min and the rest after 47.7, so every lab stays here for now.
FIRST_STREAM_LABS = tuple(f"{n:02d}" for n in range(16))


def streams() -> dict[str, tuple[list[str], list[str]]]:
    """Each stream's test files, in the order pytest runs them, and the labs whose solutions it runs."""
    files = sorted(str(p.relative_to(REPO)) for p in TESTS.glob("test_*.py"))
    labs = sorted(p.name[:2] for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
    first = [lab for lab in labs if lab in FIRST_STREAM_LABS]
    second = [lab for lab in labs if lab not in FIRST_STREAM_LABS]
    rest = [f for f in files if f not in (TABLE, LAST) and (f != NOTEBOOKS or second)]
    return {"solutions": ([NOTEBOOKS, LAST], first), "rest": ([*rest, LAST], second)}


def _pump(name: str, proc: subprocess.Popen, width: int) -> None:
    for raw in proc.stdout:
        sys.stdout.write(f"[{name:<{width}}] {raw.decode(errors='replace')}")
        sys.stdout.flush()


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 20
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    plan = streams()
    width = max(map(len, plan))
    procs: dict[str, subprocess.Popen] = {}
    started = time.monotonic()
    threads = []

    def on_signal(signum, _frame):
        _stop(list(procs.values()))
        raise SystemExit(128 + signum)

    for stale in (REPO / "out" / "grading-table").glob("*.json"):  # the table shows this run's cells only
        stale.unlink()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for name, (files, labs) in plan.items():
        proc = subprocess.Popen(
            [*pytest, "-v", *files, *args],
            cwd=REPO,
            env={**env, "LAB_SOLUTION_LABS": ",".join(labs) or "none"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped whole if make is interrupted
        )
        procs[name] = proc
        thread = threading.Thread(target=_pump, args=(name, proc, width), daemon=True)
        thread.start()
        threads.append(thread)
    ended: dict[str, tuple[int, float]] = {}
    try:
        while len(ended) < len(procs):
            for name, proc in procs.items():
                if name not in ended and proc.poll() is not None:
                    ended[name] = (proc.returncode, time.monotonic() - started)
            time.sleep(0.5)
    finally:
        _stop(list(procs.values()))
    for thread in threads:
        thread.join(timeout=10)
    table = subprocess.run([*pytest, "-q", "-s", TABLE], cwd=REPO)  # prints the table
    print()
    for name, (code, seconds) in ended.items():
        print(
            f"stream {name}: exit {code} after {seconds / 60:.1f} min ({len(plan[name][0])} files; solutions of labs {','.join(plan[name][1]) or 'none'})"
        )
    print(
        f"grading table: exit {table.returncode}; both streams: {(time.monotonic() - started) / 60:.1f} min"
    )
    codes = [code for code, _ in ended.values() if code not in (0, NO_TESTS)]
    if table.returncode not in (0, NO_TESTS):
        codes.append(table.returncode)
    return codes[0] if codes else 0


def main(argv: list[str]) -> int:
    named = any(not a.startswith("-") and (REPO / a.split("::")[0]).exists() for a in argv)
    if "--serial" in argv or named:  # asked for, or a path or test id was named: one process
        rest = [a for a in argv if a != "--serial"]
        return subprocess.run([sys.executable, "-m", "pytest", *rest], cwd=REPO).returncode
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
