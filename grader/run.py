"""Stage 2 of grading, run: the learner's notebook executed in the sandbox under its limits.

The notebook gets the grader's parameters and a probe after each cell that saves the lab's answers
(lab_utils.grading.probe); papermill runs it inside the sandbox (sandbox.py) through
lab_utils.grading.execute, whose status and executed notebook come back over a pipe. Imports only
the stages before it and the sandbox.
"""

from __future__ import annotations

import json

from .sandbox import Status
from .untrusted import MAX_STATUS_BYTES, plain


def apply_parameters(nb, parameters: dict) -> None:
    if not parameters:
        return
    import nbformat

    lines = [f"{k} = {v!r}" for k, v in parameters.items()]
    cell = nbformat.v4.new_code_cell("# parameters set by the grader\n" + "\n".join(lines))
    cell.metadata["tags"] = ["injected-parameters"]
    idx = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    nb.cells.insert(idx + 1, cell)


def run_status(
    code, killed: Status | None, reported: bytes | None, timeout: float, memory_mb: int, disk_mb: int = 0
) -> str:
    """The status column of a run, from how it ended and what its driver reported on its pipe."""
    if killed is Status.DISK_LIMIT:
        return Status.DISK_LIMIT.text(
            f"wrote more than {disk_mb} MB of output and was stopped; answers saved before then were graded"
        )
    if killed is Status.TIMEOUT:
        return Status.TIMEOUT.text(f"stopped after {timeout:.0f} s; answers saved before then were graded")
    if killed is Status.MEMORY_LIMIT:
        return Status.MEMORY_LIMIT.text(
            f"used more than {memory_mb} MB and was stopped; answers saved before then were graded"
        )
    try:  # sent by the run's driver: small JSON, read as data
        if reported is None or len(reported) > MAX_STATUS_BYTES:
            raise ValueError("no report")
        info = json.loads(reported)
        info = {
            "outcome": str(info.get("outcome", "failed")),
            "detail": plain(" ".join(str(info.get("detail", "")).split())),
        }
    except (ValueError, AttributeError, RecursionError, UnicodeDecodeError):
        info = {"outcome": "started", "detail": ""}  # no report: the run stopped without one
    outcome = info.get("outcome", "failed")
    if code is not None and code < 0:
        return Status.KILLED.text(f"by signal {-code}")
    if outcome == "ok":
        return Status.OK.text()
    if outcome == "cell errors":
        detail = info.get("detail", "")
        if "MemoryError" in detail:
            return Status.MEMORY_LIMIT.text("a cell raised MemoryError")
        return Status.CELL_ERRORS.text(detail[:160])
    if outcome == "memory limit":
        return Status.MEMORY_LIMIT.text(info.get("detail", "")[:160])
    if outcome == "kernel died":
        return Status.KERNEL_DIED.text("the notebook's kernel stopped; answers saved before then were graded")
    if outcome == "cell timeout":
        return Status.TIMEOUT.text("a cell ran past the limit")
    if outcome == "started":
        return Status.FAILED.text("the run stopped without a report")
    return Status.FAILED.text(info.get("detail", "")[:160])
