"""Finding a class's notebooks: one job per (student, lab), the problems that stop a notebook from
being graded, and the copy of a student's folder a run works in."""

from __future__ import annotations

import ast
import os
import re
import shutil
from pathlib import Path

from lab_utils.grading import safe_ast

from .gradebook import (
    Job,
)
from .registry import all_questions
from .sandbox import (
    Status,
)
from .untrusted import (
    Refused,
    read_bytes,
)

LAB_RE = re.compile(r"^(\d\d)[_\-\w .]*\.ipynb$")
LAB_PREFIX_RE = re.compile(r"^(\d\d)[_\-. ]")

MAX_FOLDER_BYTES = 200 * 2**20  # a student's whole folder (also the cap on what a Ray task ships)


def _student_key(name: str) -> str:
    return re.sub(r"[\W_]+", "", name).casefold()


def _readable(path: Path) -> str:
    """ "" if the file is a regular file that can be read, else why not (a FIFO is never opened)."""
    try:
        read_bytes(path, MAX_FILE_BYTES)
        return ""
    except Refused as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {path.name}: {exc.strerror or type(exc).__name__}"


def discover(submissions: Path) -> tuple[list[Job], list[str]]:
    """One job per (student, lab) found; jobs that cannot be graded carry their `problem` (a status
    text). Also a list of warnings about files that belong to no lab."""
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS {submissions} is not a folder; it should hold one folder per student")
    jobs: list[Job] = []
    warnings: list[str] = []
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.is_symlink())
    for p in sorted(submissions.iterdir()):
        if p.is_symlink():  # a link to / or to another student's folder: a row that says so, no run
            jobs.append(
                Job(
                    p.name,
                    "--",
                    p,
                    Status.REFUSED.text("the student folder is a symbolic link; hand in a real folder"),
                )
            )
            continue
        if not p.is_dir():
            warnings.append(
                f"{p.name}: not a student folder (put each student's files in a folder "
                "named for the student; unpack archives first); skipped"
            )
    same: dict[str, list[str]] = {}
    for d in folders:
        same.setdefault(_student_key(d.name), []).append(d.name)
    for student_dir in folders:
        student = student_dir.name
        by_lab: dict[str, list[Path]] = {}
        others: dict[str, list[Path]] = {}
        for f in sorted(student_dir.iterdir()):
            if f.name.endswith(".ipynb"):
                m = LAB_RE.match(f.name)
                if not m:
                    warnings.append(
                        f"{student}/{f.name}: name does not start with a lab number like 02_; skipped"
                    )
                    continue
                by_lab.setdefault(m.group(1), []).append(f)
            elif (m := LAB_PREFIX_RE.match(f.name)) and not f.name.startswith("."):
                others.setdefault(m.group(1), []).append(f)
        for lab, files in others.items():
            if lab not in by_lab:  # a lab's work handed in as something other than a notebook
                f = files[0]
                jobs.append(
                    Job(
                        student,
                        lab,
                        f,
                        Status.NOT_A_NOTEBOOK.text(
                            f"{f.name} is not a .ipynb file; submit the notebook saved by JupyterLab"
                        ),
                    )
                )
        if not by_lab and not others:
            warnings.append(f"{student}: no notebook to grade")
        twins = same[_student_key(student)]
        for lab, files in sorted(by_lab.items()):
            nb = files[0]
            if len(twins) > 1:
                problem = Status.DUPLICATE.text(
                    f"student folders {' and '.join(twins)} have the same name ignoring case and "
                    "punctuation; merge them into one folder"
                )
            elif len(files) > 1:
                problem = Status.DUPLICATE.text(
                    f"{len(files)} notebooks for lab {lab} ({', '.join(f.name for f in files)}); keep one"
                )
            elif nb.is_symlink():
                problem = Status.REFUSED.text(f"{nb.name} is a symbolic link; hand in the notebook itself")
            elif why := _readable(nb):
                problem = Status.UNREADABLE.text(why)
            else:
                problem = ""
            jobs.append(Job(student, lab, nb, problem))
    jobs.sort(key=lambda j: (j.student, j.lab))
    return jobs, warnings


def _defined_names(source: str) -> set[str]:
    """Top-level names a cell defines (functions, classes, assignments); magics are skipped."""
    code = safe_ast.without_magics(source)
    try:
        tree = safe_ast.parse(code)
    except SyntaxError:
        return {a or b for a, b in re.findall(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", code, re.M)}
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
    return names


def content_problem(nb, lab: str) -> str:
    """A status text when a parsed notebook cannot be this lab's work: empty, or another lab's."""
    code = [c.source for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    if not code:
        return Status.EMPTY.text("the notebook has no code in it")
    text = "\n".join(code)
    called = sorted(set(re.findall(r"lab_scenario\(\s*['\"](\d\d)['\"]", text)))
    if called and lab not in called:
        return Status.WRONG_LAB.text(
            f'named for lab {lab} but its code is lab {called[0]}\'s (lab_scenario("{called[0]}"...)); '
            f"rename it {called[0]}_... if that is the work meant"
        )
    if called:
        return ""
    defined: set[str] = set()
    for src in code:
        defined |= _defined_names(src)
    hits: dict[str, int] = {}
    for q in all_questions():
        hits.setdefault(q.lab, 0)
        hits[q.lab] += len(defined & set(q.answers))
    if hits.get(lab, 0) == 0:
        best = max((n, other) for other, n in hits.items() if other != lab) if len(hits) > 1 else (0, "")
        if best[0] >= 2:
            return Status.WRONG_LAB.text(
                f"named for lab {lab} but it defines lab {best[1]}'s answers and none of lab {lab}'s"
            )
    return ""


MAX_FILE_BYTES = 50 * 2**20  # one file in a student's folder
MAX_DEPTH = 8
MAX_FILES = 2000


def copy_submission(src: Path, dest: Path, keep: str) -> str:
    """Copy a student's folder (without their other labs' notebooks) into `dest`; "" or why not.

    Symlinks, devices, sockets and pipes are refused, as are files over MAX_FILE_BYTES, folders over
    MAX_FOLDER_BYTES, MAX_FILES files or MAX_DEPTH levels: the student gets a row with the reason.
    """
    total = count = 0
    dest.mkdir(parents=True, exist_ok=True)
    stack = [(src, dest, 0)]
    while stack:
        here, there, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"folders nested deeper than {MAX_DEPTH} levels ({here.relative_to(src)})"
        for entry in sorted(os.scandir(here), key=lambda e: e.name):
            rel = Path(entry.path).relative_to(src)
            if entry.is_symlink():
                return f"{rel} is a symbolic link; hand in real files"
            if entry.is_dir(follow_symlinks=False):
                (there / entry.name).mkdir()
                stack.append((Path(entry.path), there / entry.name, depth + 1))
                continue
            if not entry.is_file(follow_symlinks=False):
                return f"{rel} is not a regular file (a device, socket or pipe)"
            if depth == 0 and entry.name.endswith(".ipynb") and entry.name != keep:
                continue
            size = entry.stat(follow_symlinks=False).st_size
            total += size
            count += 1
            if size > MAX_FILE_BYTES:
                return f"{rel} is larger than {MAX_FILE_BYTES >> 20} MB"
            if total > MAX_FOLDER_BYTES:
                return f"the folder holds more than {MAX_FOLDER_BYTES >> 20} MB"
            if count > MAX_FILES:
                return f"the folder holds more than {MAX_FILES} files"
            shutil.copyfile(entry.path, there / entry.name, follow_symlinks=False)
    return ""
