"""The public check a learner runs in the notebook: immediate feedback, never the answer.

Each call also emits a machine-readable record (MIME type `CHECK_MIME`) into the cell's output,
so an executed notebook says what every question scored. The instructor's grader does not trust
those records; it re-checks the saved answers in a separate process (see grader.py).
"""

from __future__ import annotations

import html
import sys

from .registry import get
from .scoring import CORRECT, NOT_ANSWERED, PARTIAL, Result, score

CHECK_MIME = "application/vnd.llm-serving-lab.check+json"

_ICON = {CORRECT: "✅", PARTIAL: "🟡", NOT_ANSWERED: "⬜"}


def check(qid: str, namespace: dict | None = None) -> Result:
    """Check question `qid` against the caller's globals and show the result.

    Args:
        qid: the question id printed in the notebook, e.g. "02.allocate".
        namespace: where to look the answers up; the calling notebook's globals by default.
    Returns:
        the Result (points earned, status, a hint).
    """
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    result = score(get(qid), namespace)
    _show(result)
    return result


def _show(result: Result) -> None:
    icon = _ICON.get(result.status, "❌")
    line = f"{icon} {result.id}: {result.status} ({result.earned:g}/{result.points:g} points)"
    if result.status == CORRECT:
        line += " — public check passed; the grader also tries cases you have not seen"
    if result.message:
        line += f" — {result.message}"
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(
                {
                    CHECK_MIME: result.to_dict(),
                    "text/plain": line,
                    "text/html": f"<b>{html.escape(line)}</b>",
                },
                raw=True,
            )
            return
    except ImportError:
        pass
    print(line)


def recorded_results(nb) -> dict[str, dict]:
    """The check records found in an executed notebook (nbformat node), last one per question."""
    found: dict[str, dict] = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {}) if out.get("output_type") in ("display_data", "execute_result") else {}
            if CHECK_MIME in data:
                rec = data[CHECK_MIME]
                found[rec["id"]] = dict(rec)
    return found
