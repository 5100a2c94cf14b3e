"""The gradebook: one result file per graded notebook, and gradebook.csv rebuilt from them.

Each finished (student, lab) is saved at once as OUT/.cache/<student>/<lab>.json, written atomically
(a temporary file renamed over the old one) together with the key of what was graded (the
notebook's bytes, the grader, the lab's questions, the seed, the limits) and signed with a key kept
in the instructor's folder, so an entry edited by hand is not trusted. gradebook.csv is then rebuilt
atomically from all outcomes. A grader killed part-way therefore loses at most the notebooks in
flight; the same command run again finds every saved result whose key still matches and grades
only the rest, and its gradebook equals an uninterrupted run's (the CSV holds no timings).
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .sandbox import Status
from .untrusted import csv_cell, plain, read_bytes


@dataclass
class Job:
    student: str
    lab: str
    notebook: Path
    problem: str = ""  # set at discovery when the file cannot be graded at all (a status text)


@dataclass
class Outcome:
    """What one (student, lab) notebook scored, and why it scored less than it ran."""

    student: str
    lab: str
    scores: dict[str, float] = field(default_factory=dict)  # question id -> points earned
    possible: dict[str, float] = field(default_factory=dict)  # question id -> points possible
    status: str = "ok"
    seconds: float = 0.0
    key: str = ""
    flags: list[str] = field(default_factory=list)  # for the instructor: resemblances, not zeroed

    @property
    def total(self) -> float:
        return round(sum(self.scores.values()), 4)

    @property
    def kind(self) -> Status:
        return Status.of(self.status)


def safe_name(name: str) -> str:
    return re.sub(r"[^\w.\-]", "_", name)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if isinstance(data, bytes):
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        else:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # the rename happened or the file was never created
        raise


def write_gradebook(out: Path, outcomes: list[Outcome]) -> Path:
    """Write gradebook.csv atomically: a header, a points_possible row, one row per student and lab."""
    qids = sorted({q for o in outcomes for q in o.possible})
    possible: dict[str, float] = {}
    for o in outcomes:
        possible.update(o.possible)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["student", "lab", *qids, "total", "status"])
    w.writerow(
        ["points_possible", "", *[f"{possible[q]:g}" for q in qids], f"{sum(possible.values()):g}", ""]
    )
    for o in sorted(outcomes, key=lambda o: (o.student, o.lab)):
        w.writerow(
            [
                csv_cell(o.student),  # plain text, never a spreadsheet formula
                csv_cell(o.lab),
                *[f"{o.scores[q]:g}" if q in o.scores else "" for q in qids],
                f"{o.total:g}",
                csv_cell(o.status),
            ]
        )
    path = out / "gradebook.csv"
    atomic_write(path, buf.getvalue())
    return path


# --- per-job result files (the cache a rerun resumes from) -------------------------------------


def result_path(cache: Path, student: str, lab: str) -> Path:
    return cache / safe_name(student) / f"{lab}.json"


def _signature(secret: bytes, data: dict) -> str:
    body = json.dumps({k: v for k, v in data.items() if k != "signature"}, sort_keys=True).encode()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def load_result(cache: Path, job: Job, key: str, secret: bytes) -> Outcome | None:
    """The saved outcome of this job if it was graded from exactly this input and its signature
    (under the instructor's key) holds, else None: an edited, foreign or grader-failed entry is
    graded again."""
    if not key:
        return None
    try:
        data = json.loads(read_bytes(result_path(cache, job.student, job.lab), 2**20))
    except (OSError, ValueError, RecursionError):
        return None  # never graded, or a file from an older grader: grade again
    if not isinstance(data, dict) or data.get("key") != key or data.get("student") != job.student:
        return None
    claimed = data.get("signature")
    if not isinstance(claimed, str) or not hmac.compare_digest(claimed, _signature(secret, data)):
        return None
    data.pop("signature")
    try:
        outcome = Outcome(**data)
    except TypeError:
        return None
    if outcome.kind is Status.GRADER_ERROR:
        return None
    return outcome


def save_result(cache: Path, outcome: Outcome, secret: bytes) -> None:
    """Save one outcome, signed with the instructor's key."""
    data = asdict(outcome)
    data["signature"] = _signature(secret, data)
    atomic_write(result_path(cache, outcome.student, outcome.lab), json.dumps(data))


# --- the end-of-run report ---------------------------------------------------------------------


def question_summary(outcomes: list[Outcome]) -> list[dict]:
    """Per question: how many rows, the mean and spread (population standard deviation) of the
    points, and how many scored zero."""
    rows = []
    for qid in sorted({q for o in outcomes for q in o.possible}):
        pts = [o.scores.get(qid, 0.0) for o in outcomes if qid in o.possible]
        possible = next(o.possible[qid] for o in outcomes if qid in o.possible)
        mean = sum(pts) / len(pts)
        spread = math.sqrt(sum((p - mean) ** 2 for p in pts) / len(pts))
        rows.append(
            {
                "question": qid,
                "possible": possible,
                "n": len(pts),
                "mean": mean,
                "spread": spread,
                "zeros": sum(p == 0 for p in pts),
            }
        )
    return rows


def summary_text(outcomes: list[Outcome]) -> str:
    rows = question_summary(outcomes)
    flagged = [
        plain(f"{o.student}/{o.lab}: {f}", 500)
        for o in sorted(outcomes, key=lambda o: (o.student, o.lab))
        for f in o.flags
    ]
    if not rows:
        return "no graded questions"
    width = max(len(r["question"]) for r in rows)
    lines = [f"{'question':{width}s}  points     n   mean  spread  zeros"]
    for r in rows:
        lines.append(
            f"{r['question']:{width}s}  {r['possible']:6g}  {r['n']:4d}  {r['mean']:5.2f}  "
            f"{r['spread']:6.2f}  {r['zeros']:5d}"
        )
    if flagged:
        lines += ["", "flags (not zeroed; worth a look):", *[f"  {f}" for f in flagged]]
    return "\n".join(lines)


def write_histogram(out: Path, outcomes: list[Outcome]) -> Path | None:
    """OUT/totals.png: a histogram of total scores, one panel per lab (matplotlib, Agg backend)."""
    labs = sorted({o.lab for o in outcomes if o.possible})
    if not labs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(labs), 1, figsize=(6, 2.6 * len(labs)), squeeze=False)
    for ax, lab in zip(axes[:, 0], labs):
        rows = [o for o in outcomes if o.lab == lab]
        possible = max(sum(o.possible.values()) for o in rows)
        ax.hist(
            [o.total for o in rows],
            bins=max(1, min(20, int(math.ceil(possible)))),
            range=(0, max(possible, 1e-9)),
            color="#4477aa",
            edgecolor="white",
        )
        ax.set_title(f"lab {lab}: totals of {len(rows)} submission(s)")
        ax.set_xlabel(f"points (of {possible:g})")
        ax.set_ylabel("submissions")
    fig.tight_layout()
    path = out / "totals.png"
    tmp = out / ".totals.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path
