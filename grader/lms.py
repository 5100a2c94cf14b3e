"""Grades where the school keeps them: gradebook.csv as a Canvas or Moodle import file, or a plain
one-row-per-student table.

The source is OUT/gradebook.csv as grader/gradebook.py writes it (a header `student, lab, <question
ids...>, total, status`, a `points_possible` row, one row per student and lab), and OUT/collect.json
when the class came from nbgrader's exchange (it names each lab's assignment and marks late work).
Every file here has one row per student and one column per lab (the lab's total), which is what
both importers expect:

- Canvas (Grades > Import): `Student, ID, SIS User ID, SIS Login ID, Section`, then one column per
  assignment, and a `Points Possible` row. Canvas matches a row by ID, SIS User ID or SIS Login ID;
  the grader knows only the student id it graded (the hub's user name), so it goes in `SIS Login
  ID`, which must be the school's login for the row to match. A column whose name Canvas does not
  know becomes a new assignment when the import is confirmed.
- Moodle (Grade administration > Import > CSV file): an identifier column (`Username`, mapped to
  the user field "username"), one grade column per lab and a feedback column per lab (the status,
  late work), each mapped to its grade item in the import form.

Learner strings are hostile: every text cell is made plain (no control characters or newlines),
quoted by the csv module, and never starts with a character a spreadsheet reads as a formula.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from .exchange import read_manifest
from .gradebook import atomic_write
from .untrusted import plain, read_text

FORMATS = ("canvas", "moodle", "csv")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "|", "%")


def text_cell(value: object, limit: int = 500) -> str:
    """A learner's string as one CSV cell: plain, one line, never a formula."""
    s = plain(value, limit)
    if s.startswith(_FORMULA_START):
        s = "'" + s
    return s


@dataclass
class Row:
    student: str
    lab: str
    scores: dict[str, float]
    total: float
    status: str
    notes: list[str] = field(default_factory=list)  # late work and the like, from collect.json


@dataclass
class Gradebook:
    questions: list[str]
    possible: dict[str, float]  # question id -> points
    rows: list[Row]
    assignments: dict[str, str] = field(default_factory=dict)  # lab -> nbgrader assignment name

    @property
    def labs(self) -> list[str]:
        return sorted({r.lab for r in self.rows if r.lab and r.lab != "--"})

    def lab_possible(self, lab: str) -> float:
        return sum(p for q, p in self.possible.items() if q.split(".", 1)[0] == lab)

    def column(self, lab: str) -> str:
        """The LMS column of a lab: its nbgrader assignment name when there is one, else `Lab NN`."""
        return text_cell(self.assignments.get(lab) or f"Lab {lab}", 100)


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{where}: {plain(text, 40)!r} is not a number") from None


def read_gradebook(out: Path) -> Gradebook:
    """OUT/gradebook.csv (and OUT/collect.json when present), checked; ValueError with the line."""
    path = out / "gradebook.csv" if out.is_dir() else out
    try:
        text = read_text(path, 256 * 2**20)
    except FileNotFoundError:
        raise ValueError(f"{path} not found: grade the class first (python -m grader grade)") from None
    except OSError as exc:
        raise ValueError(f"{path}: {exc}") from None
    lines = list(csv.reader(io.StringIO(text)))
    if len(lines) < 2 or lines[0][:2] != ["student", "lab"] or lines[0][-2:] != ["total", "status"]:
        raise ValueError(f"{path} is not a gradebook (header student, lab, ..., total, status)")
    header = lines[0]
    qids = header[2:-2]
    if lines[1][:1] != ["points_possible"] or len(lines[1]) != len(header):
        raise ValueError(f"{path}: line 2 should be the points_possible row")
    possible = {q: _number(v, f"{path}:2") for q, v in zip(qids, lines[1][2:-2])}
    rows = []
    for n, line in enumerate(lines[2:], start=3):
        if not line:
            continue
        if len(line) != len(header):
            raise ValueError(f"{path}:{n}: {len(line)} cells, the header has {len(header)}")
        scores = {q: _number(v, f"{path}:{n}") for q, v in zip(qids, line[2:-2]) if v != ""}
        rows.append(Row(line[0], line[1], scores, _number(line[-2], f"{path}:{n}"), line[-1]))
    book = Gradebook(qids, possible, rows)
    subs, _ = read_manifest(out) if out.is_dir() else ([], {})
    notes = {(s.student, s.lab): s.notes for s in subs}
    for sub in subs:
        if sub.lab and not sub.status:
            book.assignments.setdefault(sub.lab, sub.assignment)
    for row in rows:
        row.notes = list(notes.get((row.student, row.lab), []))
    return book


def _by_student(book: Gradebook) -> dict[str, dict[str, Row]]:
    table: dict[str, dict[str, Row]] = {}
    for row in book.rows:
        if row.lab in book.labs:
            table.setdefault(row.student, {})[row.lab] = row
    return table


def _feedback_cell(row: Row) -> str:
    return text_cell("; ".join([row.status, *[n for n in row.notes if n.startswith("late:")]]))


def canvas_csv(book: Gradebook) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    labs = book.labs
    w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *[book.column(l) for l in labs]])
    w.writerow(["Points Possible", "", "", "", "", *[f"{book.lab_possible(l):g}" for l in labs]])
    for student, by_lab in sorted(_by_student(book).items()):
        name = text_cell(student, 100)
        cells = [f"{by_lab[l].total:g}" if l in by_lab else "" for l in labs]
        w.writerow([name, "", "", name, "", *cells])
    return buf.getvalue()


def moodle_csv(book: Gradebook) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    labs = book.labs
    header = ["Username"]
    for l in labs:
        header += [book.column(l), f"{book.column(l)} feedback"]
    w.writerow(header)
    for student, by_lab in sorted(_by_student(book).items()):
        line = [text_cell(student, 100)]
        for l in labs:
            row = by_lab.get(l)
            line += [f"{row.total:g}", _feedback_cell(row)] if row else ["", ""]
        w.writerow(line)
    return buf.getvalue()


def wide_csv(book: Gradebook) -> str:
    """One row per student: each lab's total and status, and whether it came in late."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    labs = book.labs
    header = ["student"]
    for l in labs:
        header += [f"{l} total", f"{l} status", f"{l} late"]
    w.writerow(header)
    w.writerow(["points_possible", *[x for l in labs for x in (f"{book.lab_possible(l):g}", "", "")]])
    for student, by_lab in sorted(_by_student(book).items()):
        line = [text_cell(student, 100)]
        for l in labs:
            row = by_lab.get(l)
            if row is None:
                line += ["", "not submitted", ""]
            else:
                late = "; ".join(n for n in row.notes if n.startswith("late:"))
                line += [f"{row.total:g}", text_cell(row.status), text_cell(late)]
        w.writerow(line)
    return buf.getvalue()


def export(out: Path, dest: Path, fmt: str) -> Path:
    """Write the gradebook in OUT as `fmt` (canvas, moodle or csv) to `dest`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    book = read_gradebook(out)
    if not book.labs:
        raise ValueError(f"{out}: the gradebook has no graded lab to export")
    text = {"canvas": canvas_csv, "moodle": moodle_csv, "csv": wide_csv}[fmt](book)
    atomic_write(dest, text)
    return dest
