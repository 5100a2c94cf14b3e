"""Stage 4 of grading, record: what leaves the grader for one notebook.

The learner's feedback (Markdown, every learner-chosen string as plain text) and the executed
notebook kept for the instructor (papermill's own copy from the run's report pipe, outputs
truncated). The gradebook itself is gradebook.py. Imports only the modules before it.
"""

from __future__ import annotations

import re

from .gradebook import Job, Outcome
from .untrusted import markdown_text

MAX_OUTPUT_CHARS = 20_000  # per output, in the executed copy kept for the instructor


def _safe(name: str) -> str:
    return re.sub(r"[^\w.\-]", "_", name)


def truncate_outputs(nb) -> None:
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and len(out.get("text", "")) > MAX_OUTPUT_CHARS:
                out["text"] = out["text"][:MAX_OUTPUT_CHARS] + "\n[... output truncated by the grader ...]\n"
            data = out.get("data", {})
            for mime, value in list(data.items()):
                if isinstance(value, str) and len(value) > MAX_OUTPUT_CHARS * 10:
                    data[mime] = value[:200] + " [... truncated by the grader ...]"


def feedback(job: Job, outcome: Outcome, results: list[dict], hidden: list[dict], problem: str) -> str:
    """The learner's feedback (Markdown). Every string that a learner's code or file names could
    have chosen is printed as plain text (markdown_text): no HTML, links, escapes or CRs."""
    possible = sum(outcome.possible.values())
    lines = [
        f"# Lab {markdown_text(job.lab, 10)} — {markdown_text(job.student, 100)}",
        "",
        f"Score: **{outcome.total:g} / {possible:g}**",
        "",
        f"Run: {markdown_text(outcome.status, 400)}",
        "",
    ]
    if problem:
        lines += [
            f"The notebook could not be graded: {markdown_text(problem, 400)}.",
            "Submit the .ipynb file saved by JupyterLab (File > Save), not a renamed or edited copy.",
            "",
        ]
    if results:
        lines += ["| question | points | status | hint |", "|---|---|---|---|"]
        for r in results:
            hint = markdown_text(r.get("message") or "", 400)
            status = markdown_text(r["status"], 60)
            lines.append(f"| {r['id']} | {r['earned']:g}/{r['points']:g} | {status} | {hint} |")
        lines.append("")
    if hidden:
        lines += ["Hidden tests:", ""]
        for h in hidden:
            mark = "passed" if h["outcome"] == "passed" else "failed"
            lines.append(
                f"- {markdown_text(h['name'], 100)}: {mark} ({h['points'] if mark == 'passed' else 0:g}/{h['points']:g})"
            )
        lines.append("")
    return "\n".join(lines)
