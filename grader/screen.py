"""Stage 1 of grading, screen: is this a notebook of the lab, and is it a copy?

Reads the submitted file as data (never runs it): a notebook that cannot be graded gets a status
and no run (`read_notebook`, `content_problem` in discovery.py); the published solution handed in
as the learner's own, and references pasted under an answer's name, are found here
(originality.py). Imports only the modules before it: discovery, originality, gradebook, sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .discovery import content_problem
from .originality import is_copy, pasted_references
from .sandbox import Status


@dataclass
class Screened:
    """What screening found: the notebook (None when it cannot be graded), why not, and flags."""

    nb: object | None
    problem: str = ""  # a status text: the row gets it and no run
    flags: list[str] = field(default_factory=list)
    pasted: object | None = None  # originality.pasted_references(...): answers that are references


def read_notebook(path: Path):
    """(notebook, "") or (None, the status text saying why it cannot be graded)."""
    import nbformat

    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, Status.UNREADABLE.text(f"cannot read the file ({exc.strerror or type(exc).__name__})")
    except UnicodeDecodeError:
        return None, Status.NOT_A_NOTEBOOK.text("not valid notebook JSON (the file is not UTF-8 text)")
    if not raw.strip():
        return None, Status.EMPTY.text("the file is empty")
    try:
        nb = nbformat.reads(raw, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, Status.NOT_A_NOTEBOOK.text(f"not valid notebook JSON ({first[:200]})")
    return nb, ""


def screen(path: Path, lab: str, questions, copies: str) -> Screened:
    """Screen one submitted notebook. `copies`: "zero" (a copy of the published solution scores 0),
    "flag" (graded, and flagged) or "off"."""
    nb, problem = read_notebook(path)
    if nb is None or (problem := content_problem(nb, lab)):
        return Screened(None, problem)
    found = Screened(nb)
    if copies != "off":
        copied, note = is_copy(nb, lab)
        if copied and copies == "zero":
            return Screened(None, Status.COPY.text(note))
        if copied:
            found.flags.append(f"copy of the published solution ({note})")
    found.pasted = pasted_references(nb, questions)
    found.flags += found.pasted.flags
    return found
