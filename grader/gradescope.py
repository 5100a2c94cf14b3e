"""A Gradescope autograder that runs this grader: the bundle, and what runs inside it.

Gradescope's format (gradescope-autograders.readthedocs.io/en/latest/specs/): a zip whose root holds
`setup.sh` (run once, as root, to build the image) and `run_autograder` (run for each submission).
The zip is unpacked to /autograder/source, the submission lands in /autograder/submission, and the
script writes /autograder/results/results.json: `score`, `execution_time`, `output`, `visibility`
and `tests`, each with `name`, `score`, `max_score`, `output`, `visibility`.

`build_bundle` zips the course's tracked files the grader needs (grader/, lab_utils/, labs/,
solutions/, the requirements and set-up scripts) with those two scripts; `run` is what
`run_autograder` calls: it grades the one notebook of /autograder/submission for one lab with
`grade_class`, in the sandbox where the container allows bubblewrap (the output says so where it
does not), and writes results.json, one test per question. The instructor's keys are not in the
bundle: each container draws its own, so a regrade on Gradescope draws other hidden cases.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from .exchange import _md_cells
from .gradebook import safe_name
from .lms import read_gradebook
from .untrusted import Refused, plain, read_bytes, read_text

REPO = Path(__file__).resolve().parent.parent
BUNDLE_PATHS = (
    "grader",
    "lab_utils",
    "labs",
    "solutions",
    "requirements",
    "scripts",
    "Makefile",
    "pyproject.toml",
    "environment.yml",
)
MAX_NOTEBOOK = 50 * 2**20

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip make bubblewrap
cd /autograder/source
# the course environment, the course model and every lab's set-up (minutes; see the README)
make setup PYTHON="${PYTHON:-python3}"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade lab {lab} and write results/results.json.
set -u
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
cd "$ROOT/source"
PY="${{COURSE_PYTHON:-$ROOT/source/.venv/bin/python}}"
exec "$PY" -m grader gradescope-run --root "$ROOT" --lab {lab}
"""


def _tracked(repo: Path) -> list[str]:
    """The files under BUNDLE_PATHS that git tracks or would track (nothing it ignores: no venv, caches or keys)."""
    files = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            *BUNDLE_PATHS,
        ],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return [f.decode() for f in files if f]


def build_bundle(dest: Path, lab: str, repo: Path = REPO) -> Path:
    """The autograder zip for one lab: setup.sh and run_autograder at its root, the course beside."""
    if not re.fullmatch(r"\d\d", lab):
        raise ValueError(f"--lab must be two digits like 03, got {plain(lab, 20)!r}")
    from .registry import questions_for

    if not questions_for(lab):
        raise ValueError(f"lab {lab} has no graded questions")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER.format(lab=lab))):
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | 0o755) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
        for rel in _tracked(repo):
            path = repo / rel
            if path.is_file() and not path.is_symlink():
                z.write(path, rel)
    os.replace(tmp, dest)
    return dest


# --- inside the container -------------------------------------------------------------------------


def _student(root: Path) -> str:
    """A name for the submitter from submission_metadata.json, else "submission"."""
    try:
        meta = json.loads(read_bytes(root / "submission_metadata.json", 2**20))
        user = meta["users"][0]
        name = str(user.get("email") or user.get("name") or "")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        name = ""
    name = safe_name(name.split("@")[0])[:64].strip("._")
    return name or "submission"


def _pick_notebook(folder: Path, lab: str) -> tuple[Path | None, str]:
    """The submission's notebook for `lab`, or (None, why not)."""
    if not folder.is_dir():
        return None, "no submission folder"
    notebooks = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        return None, "no .ipynb file in the submission"
    own = [p for p in notebooks if p.name[:2] == lab] or notebooks
    if len(own) > 1:
        return None, f"{len(own)} notebooks ({', '.join(plain(p.name, 60) for p in own)}); submit one"
    return own[0], ""


def _feedback_rows(markdown: str) -> dict[str, str]:
    """question id -> 'status: hint' from the grader's feedback table."""
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in _md_cells(line)] if line.startswith("|") else []
        if len(cells) == 4 and cells[0] not in ("question", "---"):
            text = re.sub(r"\\([\\\[\]|])", r"\1", f"{cells[2]}: {cells[3]}" if cells[3] else cells[2])
            rows[cells[0]] = text
    return rows


def results_json(out: Path, lab: str, seconds: float, notes: list[str]) -> dict:
    """Gradescope's results.json from a graded OUT holding one student's row for `lab`."""
    book = read_gradebook(out)
    rows = [r for r in book.rows if r.lab == lab]
    qids = [q for q in book.questions if q.split(".", 1)[0] == lab]
    if not rows:
        return {
            "score": 0,
            "execution_time": round(seconds),
            "output": plain("\n".join([*notes, "nothing was graded"]), 5000, newlines=True),
            "visibility": "visible",
            "tests": [],
        }
    row = rows[0]
    feedback = ""
    fb = out / "feedback" / safe_name(row.student) / f"{lab}.md"
    try:
        feedback = read_text(fb, 2**20)
    except (OSError, Refused):
        pass
    hints = _feedback_rows(feedback)
    tests = [
        {
            "name": q,
            "score": row.scores.get(q, 0.0),
            "max_score": book.possible[q],
            "output": plain(hints.get(q, row.status), 2000),
            "visibility": "visible",
        }
        for q in qids
    ]
    output = "\n".join([*notes, f"Run: {row.status}", "", feedback])
    return {
        "score": row.total,
        "execution_time": round(seconds),
        "output": plain(output, 20000, newlines=True),
        "visibility": "visible",
        "tests": tests,
    }


def run(root: Path, lab: str) -> Path:
    """Grade /autograder/submission for `lab` and write /autograder/results/results.json."""
    from .classrun import grade_class
    from .sandbox import sandbox_problem

    t0 = time.monotonic()
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        subs = Path(tmp) / "submissions"
        out = Path(tmp) / "out"
        student = _student(root)
        nb, why = _pick_notebook(root / "submission", lab)
        if nb is not None:
            name = nb.name if nb.name[:2] == lab else f"{lab}_{nb.name}"
            try:
                data = read_bytes(nb, MAX_NOTEBOOK)
            except OSError as exc:
                why = f"the notebook cannot be read: {exc}"
            else:
                (subs / student).mkdir(parents=True)
                (subs / student / name).write_bytes(data)
        if why:
            notes.append(f"not graded: {why}")
            data = {
                "score": 0,
                "execution_time": round(time.monotonic() - t0),
                "output": plain("\n".join(notes), 5000, newlines=True),
                "visibility": "visible",
                "tests": [],
            }
        else:
            problem = sandbox_problem()
            if problem:
                notes.append(
                    f"The sandbox cannot run in this container ({problem}): graded without it, "
                    "in plain child processes."
                )
            grade_class(subs, out, sandboxed=not problem, progress=lambda line: None)
            data = results_json(out, lab, time.monotonic() - t0, notes)
    path = results / "results.json"
    path.write_text(json.dumps(data, indent=1))
    return path
