"""Run one instrumented notebook with papermill (the grader starts this in its own process).

    python -m lab_utils.grading.execute IN.ipynb OUT.ipynb --cwd DIR [--copy-from DIR] --cell-timeout S --status F

The grader runs this inside the sandbox (grader/sandbox.py).

Every cell runs even after one raised (errors are recorded, not fatal), so each question gets its
chance. The outcome goes to the status file as JSON: {"outcome": "ok" | "cell errors" |
"kernel died" | "cell timeout" | "failed", "detail": ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--copy-from", default=None, help="copy this folder's files into --cwd first")
    parser.add_argument("--cell-timeout", type=float, default=600)
    parser.add_argument("--status", required=True)
    parser.add_argument("--kernel", default="python3")
    args = parser.parse_args(argv)

    import os
    import shutil

    if args.copy_from:  # the student's other files, from the read-only input into the private work folder
        shutil.copytree(args.copy_from, args.cwd, symlinks=True, dirs_exist_ok=True)
    os.makedirs(args.cwd, exist_ok=True)
    os.makedirs(os.environ.get("HOME", args.cwd), exist_ok=True)

    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    def report(outcome: str, detail: str = "") -> None:
        with open(args.status, "w") as f:
            json.dump({"outcome": outcome, "detail": detail[-2000:]}, f)

    report("started")
    try:
        pm.execute_notebook(
            args.input,
            args.output,
            kernel_name=args.kernel,
            cwd=args.cwd,
            execution_timeout=args.cell_timeout,
            progress_bar=False,
            log_output=False,
            request_save_on_cell_execute=True,
            allow_errors=True,
        )
        report("ok")
    except PapermillExecutionError as exc:
        report("cell errors", f"{exc.ename}: {exc.evalue}")
    except MemoryError:
        report("memory limit", "the grader process ran out of memory (huge outputs?)")
    except Exception as exc:
        name = type(exc).__name__
        text = "".join(traceback.format_exception_only(type(exc), exc))
        if name == "DeadKernelError" or "dead" in text.lower() and "kernel" in text.lower():
            report("kernel died", text)
        elif name in ("CellTimeoutError", "TimeoutError") or "timed out" in text.lower():
            report("cell timeout", text)
        else:
            report("failed", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
