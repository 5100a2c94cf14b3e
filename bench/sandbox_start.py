"""How long the grader's sandbox takes to start, against the same command started without it.

    .venv/bin/python bench/sandbox_start.py [--runs 20]

Runs `python -c pass` (the interpreter the runner uses) plainly and inside `grader.sandbox.Sandbox`
with the grader's options, alternating, and prints the median and spread of each and the overhead.
The goal (issue 27) is a sandbox start-up under 1 s per notebook.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.sandbox import Sandbox, sandbox_problem  # noqa: E402


def _time(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if why := sandbox_problem():
        print(f"no sandbox here: {why}")
        return 1
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    plain_cmd = [sys.executable, "-c", "pass"]
    plain, boxed = [], []
    for _ in range(args.runs):  # alternated, so drift hits both alike
        plain.append(_time(plain_cmd, env))
        boxed.append(_time(Sandbox(hide=["/root/.config"]).wrap(plain_cmd, env), env))
    from lab_utils.hostperf import machine_line

    print(machine_line())
    for name, xs in (("plain", plain), ("sandboxed", boxed)):
        print(
            f"{name:10s} median {statistics.median(xs) * 1000:7.1f} ms  spread {statistics.pstdev(xs) * 1000:6.1f} ms"
        )
    extra = statistics.median(boxed) - statistics.median(plain)
    print(
        f"sandbox start-up overhead {extra * 1000:.1f} ms per start (goal < 1000 ms); ratio sandboxed/plain "
        f"{statistics.median(boxed) / statistics.median(plain):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
