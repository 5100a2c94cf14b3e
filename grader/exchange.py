"""nbgrader's exchange on the instructor's side: collect submissions for the grader, return feedback.

nbgrader 0.9.6 keeps a class in two layouts, both read here as they are:

    <exchange>/<course>/inbound/<student>+<assignment>+<timestamp>[+<random>]/   (what `submit` writes)
    <course_dir>/submitted/<student>/<assignment>/                               (what `collect` writes)

each holding the notebook(s), `timestamp.txt` and `submission_secret.txt`. `collect` copies each
(student, assignment) into the grader's layout, `<dest>/<student>/NN_<name>.ipynb`, where NN is the
lab the assignment's name starts with (`03_batching`, `lab03`), and writes a manifest (collect.json)
of what it took and why it took nothing: a link, a special or huge file, a name that is not a plain
name, no notebook, an unreadable or missing timestamp. Each refused submission keeps its row, so
one hostile folder never stops the others.

`write_feedback` puts the grader's feedback back where nbgrader's `release_feedback` looks for it:
`<course_dir>/feedback/<student>/<assignment>/{<nb>.html,timestamp.txt,submission_secret.txt}`
(the html named after the submitted notebook, the other two copied from the submission). With an
exchange root it can also release it itself: `<exchange>/<course>/feedback/<md5(secret + nb)>.html`,
the file `fetch_feedback` looks for.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import os
import pwd
import re
import shutil
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .discovery import MAX_DEPTH, MAX_FILE_BYTES, MAX_FILES
from .gradebook import Outcome, atomic_write, safe_name
from .runner import MAX_FOLDER_BYTES
from .sandbox import Status
from .untrusted import Refused, plain, read_bytes, read_text

ASSIGNMENT_LAB_RE = re.compile(r"^(?:lab[ _\-.]?)?(\d\d)(?!\d)", re.I)
# a student id we put in a path: a unix user name, an e-mail, a number; never '..', '/' or controls
STUDENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@\-]{0,63}$")
SMALL_FILE = 4096  # timestamp.txt, submission_secret.txt


def lab_of(assignment: str) -> str:
    """The lab ("03") an nbgrader assignment name starts with, or ""."""
    m = ASSIGNMENT_LAB_RE.match(assignment)
    return m.group(1) if m else ""


def parse_timestamp(text: str) -> dt.datetime:
    """A timestamp as nbgrader writes it ("2026-12-05 09:10:11.123456 UTC"; its default format is
    "%Y-%m-%d %H:%M:%S.%f %Z") or ISO 8601, as an aware UTC datetime. A time without a zone is UTC.
    ValueError when it is neither."""
    s = text.strip()
    if not s or len(s) > 64:
        raise ValueError(f"not a timestamp: {plain(s, 70)!r}")
    parts = s.split(" ")
    tz: dt.tzinfo | None = None
    if len(parts) == 3:
        name = parts[2]
        s = " ".join(parts[:2])
        if name.upper() in ("UTC", "GMT", "Z"):
            tz = dt.UTC
        elif re.fullmatch(r"[+-]\d{4}", name):
            sign = 1 if name[0] == "+" else -1
            tz = dt.timezone(sign * dt.timedelta(hours=int(name[1:3]), minutes=int(name[3:5])))
        else:
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

            try:
                tz = ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {plain(name, 40)!r}") from None
    try:
        stamp = dt.datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(f"not a timestamp: {plain(text, 70)!r}") from None
    if tz is not None:
        stamp = stamp.replace(tzinfo=tz)
    elif stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.astimezone(dt.UTC)


def _late_text(when: dt.datetime, due: dt.datetime) -> str:
    seconds = int((when - due).total_seconds())
    days, rest = divmod(seconds // 60, 24 * 60)
    hours, mins = divmod(rest, 60)
    span = (f"{days} d " if days else "") + (f"{hours} h " if hours or days else "") + f"{mins} min"
    if seconds < 60:
        span = f"{seconds} s"
    return f"late: submitted {when:%Y-%m-%d %H:%M} UTC, {span} after the due date"


@dataclass
class Submission:
    """One (student, assignment) found in the exchange, and what collecting it gave."""

    student: str
    assignment: str
    lab: str
    source: str  # the submission's folder
    timestamp: str = ""  # timestamp.txt as written ("" when missing)
    secret: str = ""  # submission_secret.txt ("" when missing: nbgrader cannot return feedback)
    notebook: str = ""  # the submitted notebook's name, without .ipynb (nbgrader's notebook id)
    collected: str = ""  # the file name the grader reads in <dest>/<student>/
    status: str = ""  # "" when collected, else a status text (a gradebook row with no run)
    notes: list[str] = field(default_factory=list)  # late, no timestamp, owner: for the instructor

    @property
    def late(self) -> bool:
        return any(n.startswith("late:") for n in self.notes)


def _owner_problem(path: Path, student: str) -> str:
    """Why a folder in inbound/ is not the student's own (nbgrader only warns), or ""."""
    try:
        expected = pwd.getpwnam(student).pw_uid
    except (KeyError, UnicodeEncodeError):
        return ""  # not a unix user here (ids from an LMS): nothing to compare
    owner = path.lstat().st_uid
    if owner in (expected, os.getuid()):
        return ""
    try:
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        name = f"uid {owner}"
    return f"the submission folder belongs to {name}, not to {student}"


def _inbound(inbound: Path, warnings: list[str], check_owner: bool) -> list[Submission]:
    """The latest submission of each (student, assignment) in an exchange's inbound/."""
    latest: dict[tuple[str, str], tuple[dt.datetime, Submission]] = {}
    refused: dict[tuple[str, str], Submission] = {}
    for entry in sorted(inbound.iterdir()):
        parts = entry.name.split("+")
        found = None
        for cut in (2, 1):  # with the random tail nbgrader adds, then without
            if len(parts) >= cut + 2:
                try:
                    when = parse_timestamp(parts[-cut])
                except ValueError:
                    continue
                found = ("+".join(parts[: -cut - 1]), parts[-cut - 1], when)
                break
        if found is None:
            warnings.append(f"inbound/{plain(entry.name, 120)}: not <student>+<assignment>+<time>; skipped")
            continue
        student, assignment, when = found
        sub = Submission(student, assignment, lab_of(assignment), str(entry))
        if entry.is_symlink() or not entry.is_dir():
            sub.status = Status.REFUSED.text("the submission is a symbolic link or not a folder")
        elif check_owner and (why := _owner_problem(entry, student)):
            sub.status = Status.REFUSED.text(why)
        if sub.status:
            refused.setdefault((student, assignment), sub)
            warnings.append(f"inbound/{plain(entry.name, 120)}: {sub.status}")
            continue
        key = (student, assignment)
        if key not in latest or when > latest[key][0]:
            latest[key] = (when, sub)
    subs = [s for _, s in latest.values()]
    subs += [s for key, s in refused.items() if key not in latest]
    return subs


def _submitted(submitted: Path, warnings: list[str]) -> list[Submission]:
    """Every submitted/<student>/<assignment>/ of an nbgrader course folder."""
    subs = []
    for student_dir in sorted(submitted.iterdir()):
        if student_dir.is_symlink():
            subs.append(
                Submission(
                    student_dir.name,
                    "--",
                    "",
                    str(student_dir),
                    status=Status.REFUSED.text("the student folder is a symbolic link"),
                )
            )
            continue
        if not student_dir.is_dir():
            warnings.append(f"submitted/{plain(student_dir.name, 120)}: not a folder; skipped")
            continue
        for entry in sorted(student_dir.iterdir()):
            sub = Submission(student_dir.name, entry.name, lab_of(entry.name), str(entry))
            if entry.is_symlink() or not entry.is_dir():
                sub.status = Status.REFUSED.text("the assignment folder is a symbolic link or not a folder")
            subs.append(sub)
    return subs


def find_submissions(source: Path, check_owner: bool = True) -> tuple[list[Submission], list[str]]:
    """The submissions in an nbgrader exchange course folder, its inbound/, a course directory or its
    submitted/; and warnings about what is not a submission."""
    warnings: list[str] = []
    if (source / "inbound").is_dir():
        source = source / "inbound"
    elif (source / "submitted").is_dir():
        source = source / "submitted"
    if not source.is_dir():
        raise ValueError(f"{source} is not a folder: give nbgrader's exchange course folder or submitted/")
    if source.name == "inbound":
        subs = _inbound(source, warnings, check_owner)
    else:
        subs = _submitted(source, warnings)
    kept = []
    for sub in subs:
        if not sub.lab and not sub.status:
            warnings.append(
                f"{plain(sub.student, 80)}/{plain(sub.assignment, 80)}: the assignment's name does not "
                "start with a lab number (03_batching, lab03); skipped"
            )
            continue
        if not STUDENT_RE.match(sub.student):
            sub.status = Status.REFUSED.text(
                f"student id {plain(sub.student, 80)!r} is not a plain name (letters, digits, _ . @ -)"
            )
        kept.append(sub)
    return sorted(kept, key=lambda s: (s.student, s.lab, s.assignment)), warnings


def _read_small(folder: Path, name: str) -> tuple[str, str]:
    """(text, "") of a small metadata file, or ("", why not)."""
    try:
        return read_text(folder / name, SMALL_FILE).strip(), ""
    except FileNotFoundError:
        return "", f"no {name}"
    except OSError as exc:
        return "", f"{name} refused ({exc})"


def _check_tree(src: Path) -> str:
    """ "" when a submission folder holds only regular files within the grader's limits, else why not."""
    total = count = 0
    stack = [(src, 0)]
    while stack:
        here, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"folders nested deeper than {MAX_DEPTH} levels"
        for entry in os.scandir(here):
            rel = plain(os.path.relpath(entry.path, src), 120)
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return f"{rel} is a symbolic link; hand in real files"
            if stat.S_ISDIR(st.st_mode):
                stack.append((Path(entry.path), depth + 1))
                continue
            if not stat.S_ISREG(st.st_mode):
                return f"{rel} is not a regular file (a device, socket or pipe)"
            count += 1
            total += st.st_size
            if st.st_size > MAX_FILE_BYTES:
                return f"{rel} is larger than {MAX_FILE_BYTES >> 20} MB"
            if total > MAX_FOLDER_BYTES:
                return f"the submission holds more than {MAX_FOLDER_BYTES >> 20} MB"
            if count > MAX_FILES:
                return f"the submission holds more than {MAX_FILES} files"
    return ""


def _copy_tree(src: Path, dest: Path, skip: set[str], rename: dict[str, str]) -> None:
    """Copy a checked folder; every file is read again without following links or blocking."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name in skip or entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), dest / entry.name, set(), {})
        elif entry.is_file(follow_symlinks=False):
            target = dest / rename.get(entry.name, entry.name)
            if not target.exists():  # the first assignment's file wins a name two share
                target.write_bytes(read_bytes(entry.path, MAX_FILE_BYTES))


def _collect_one(sub: Submission, dest: Path, due: dt.datetime | None) -> None:
    folder = Path(sub.source)
    stamp, why = _read_small(folder, "timestamp.txt")
    if stamp:
        try:
            when = parse_timestamp(stamp)
            sub.timestamp = stamp
            if due is not None and when > due:
                sub.notes.append(_late_text(when, due))
        except ValueError as exc:
            why = f"timestamp.txt unreadable ({exc})"
    if why:
        sub.notes.append(f"{why}: not checked against the due date" if due else why)
    sub.secret, why = _read_small(folder, "submission_secret.txt")
    if why:
        sub.notes.append(f"{why}: nbgrader cannot return this feedback")
    notebooks = sorted(p.name for p in folder.iterdir() if p.name.endswith(".ipynb"))  # names only
    own = [n for n in notebooks if n[:2] == sub.lab and not n[2:3].isdigit()] or notebooks
    if len(own) == 1:  # its feedback's name, even when the submission is refused below
        sub.notebook = own[0][: -len(".ipynb")]
    if problem := _check_tree(folder):
        sub.status = Status.REFUSED.text(problem)
        return
    if not notebooks:
        sub.status = Status.NOT_A_NOTEBOOK.text("no .ipynb file in the submission")
        return
    if len(own) > 1:
        names = ", ".join(plain(n, 80) for n in own)
        sub.status = Status.DUPLICATE.text(f"{len(own)} notebooks ({names}); submit one")
        return
    name = own[0]
    sub.collected = name if name.startswith(sub.lab + "_") else f"{sub.lab}_{name}"
    others = {n for n in notebooks if n != name} | {"timestamp.txt", "submission_secret.txt"}
    _copy_tree(folder, dest / sub.student, others, {name: sub.collected})


def collect(
    source: Path, dest: Path, due: dt.datetime | None = None, check_owner: bool = True
) -> tuple[list[Submission], list[str]]:
    """Copy every submission in `source` (nbgrader's layout) to `dest` in the grader's layout.

    `dest` is emptied first: it is the grader's copy, rebuilt from the exchange on every run.
    Returns the submissions (a refused one has its `status`) and warnings."""
    subs, warnings = find_submissions(source, check_owner)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    by_lab: dict[tuple[str, str], list[Submission]] = {}
    for sub in subs:
        by_lab.setdefault((sub.student, sub.lab), []).append(sub)
    for sub in subs:
        twins = by_lab[(sub.student, sub.lab)]
        if sub.status:
            continue
        if len(twins) > 1:
            sub.status = Status.DUPLICATE.text(
                f"assignments {', '.join(plain(t.assignment, 60) for t in twins)} are all lab {sub.lab}"
            )
            continue
        try:
            _collect_one(sub, dest, due)
        except OSError as exc:  # a file changed or vanished while it was read
            sub.status = Status.UNREADABLE.text(plain(str(exc), 200))
    return subs, warnings


# --- the manifest ---------------------------------------------------------------------------------


def write_manifest(out: Path, source: Path, subs: list[Submission], due: dt.datetime | None) -> Path:
    """OUT/collect.json (mode 600: it holds the submission secrets)."""
    data = {
        "source": str(source),
        "due": due.isoformat() if due else None,
        "submissions": [asdict(s) for s in subs],
    }
    path = out / "collect.json"
    atomic_write(path, json.dumps(data, indent=1))
    os.chmod(path, 0o600)
    return path


def read_manifest(out: Path) -> tuple[list[Submission], dict]:
    """The submissions of OUT/collect.json ([] when OUT was not collected from an exchange)."""
    try:
        data = json.loads(read_bytes(out / "collect.json", 64 * 2**20))
    except FileNotFoundError:
        return [], {}
    fields = Submission.__dataclass_fields__
    subs = [Submission(**{k: v for k, v in s.items() if k in fields}) for s in data.get("submissions", [])]
    return subs, data


def refused_outcomes(subs: list[Submission], possible_for) -> list[Outcome]:
    """A gradebook row for each submission that was not collected (0 points, its status)."""
    rows = []
    for sub in subs:
        if sub.status:
            possible = possible_for(sub.lab) if sub.lab else {}
            rows.append(
                Outcome(
                    sub.student,
                    sub.lab or "--",
                    {q: 0.0 for q in possible},
                    possible,
                    sub.status,
                    flags=list(sub.notes),
                )
            )
    return rows


def add_notes(outcomes: list[Outcome], subs: list[Submission]) -> None:
    """Put each collected submission's notes (late, no timestamp) on its outcome's flags."""
    notes = {(s.student, s.lab): s.notes for s in subs if not s.status}
    for o in outcomes:
        for note in notes.get((o.student, o.lab), []):
            if note not in o.flags:
                o.flags.append(note)


# --- feedback back into nbgrader's layout --------------------------------------------------------

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.4}}
table{{border-collapse:collapse}}td,th{{border:1px solid #bbb;padding:.3em .6em;text-align:left;vertical-align:top}}
th{{background:#eee}}</style></head><body>
{body}
</body></html>
"""


def _md_cells(line: str) -> list[str]:
    """The cells of a Markdown table row, split on unescaped '|'."""
    cells = re.split(r"(?<!\\)\|", line.strip())
    return cells[1:-1] if len(cells) >= 2 else cells


def _inline(text: str) -> str:
    """Markdown text the grader wrote (learner strings already made plain) as HTML: escapes undone
    to the plain string, then HTML-escaped once; only **bold** becomes markup."""
    s = re.sub(r"\\([\\\[\]|])", r"\1", text)
    s = html.escape(html.unescape(s), quote=True)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)


def feedback_html(markdown: str, title: str) -> str:
    """The grader's Markdown feedback as one self-contained HTML page (no script can run in it)."""
    body: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# "):
            body.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            body.append("<table>")
            for n, row in enumerate(r for r in rows if not re.fullmatch(r"\|(-+\|)+", r.strip())):
                tag = "th" if n == 0 else "td"
                body.append(
                    "<tr>" + "".join(f"<{tag}>{_inline(c.strip())}</{tag}>" for c in _md_cells(row)) + "</tr>"
                )
            body.append("</table>")
            continue
        elif line.startswith("- "):
            body.append("<ul>")
            while i < len(lines) and lines[i].startswith("- "):
                body.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            body.append("</ul>")
            continue
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
        i += 1
    return _PAGE.format(title=html.escape(plain(title, 200)), body="\n".join(body))


def _feedback_markdown(out: Path, sub: Submission) -> str:
    path = out / "feedback" / safe_name(sub.student) / f"{sub.lab}.md"
    try:
        return read_text(path, 4 * 2**20)
    except (FileNotFoundError, Refused):
        status = sub.status or "not graded yet"
        return f"# Lab {sub.lab} — {sub.student}\n\nThe notebook could not be graded: {status}.\n"


def _give_to_owner(course_dir: Path, folder: Path, names: list[str]) -> None:
    """As root, hand what was written to the course folder's owner (the instructor who runs
    release_feedback); the files stay closed to everyone else."""
    st = course_dir.stat()
    if os.getuid() != 0 or st.st_uid == 0:
        return
    here = folder
    while here != course_dir:
        os.chown(here, st.st_uid, st.st_gid)
        here = here.parent
    for name in names:
        os.chown(folder / name, st.st_uid, st.st_gid)


def write_feedback(
    out: Path,
    course_dir: Path,
    exchange_course: Path | None = None,
    notes_in_feedback: bool = True,
) -> tuple[list[Path], list[str]]:
    """Feedback of every collected submission in OUT, as nbgrader's release_feedback reads it.

    Writes `<course_dir>/feedback/<student>/<assignment>/{<nb>.html,timestamp.txt,
    submission_secret.txt}`; with `exchange_course` (`<exchange>/<course>`) also releases each page
    to `<exchange_course>/feedback/<md5(secret + nb)>.html`, as `release_feedback` does. Returns the
    pages written and the reasons for those not written."""
    subs, _ = read_manifest(out)
    if not subs:
        raise ValueError(f"{out}/collect.json not found: collect from nbgrader's exchange first")
    written: list[Path] = []
    skipped: list[str] = []
    for sub in subs:
        who = f"{plain(sub.student, 80)}/{plain(sub.assignment, 80)}"
        if not STUDENT_RE.match(sub.student) or sub.assignment in ("", ".", "..") or "/" in sub.assignment:
            skipped.append(f"{who}: not a name a feedback folder can have")
            continue
        if not sub.notebook or not sub.secret:
            why = "no notebook was submitted" if not sub.notebook else "no submission_secret.txt"
            skipped.append(f"{who}: {why}, so nbgrader has no place for its feedback")
            continue
        md = _feedback_markdown(out, sub)
        if notes_in_feedback:
            late = [n for n in sub.notes if n.startswith("late:")]
            if late:
                md += "\n" + "\n".join(f"- {n}" for n in late) + "\n"
        page = feedback_html(md, f"Lab {sub.lab}: feedback for {sub.student}")
        folder = course_dir / "feedback" / sub.student / sub.assignment
        atomic_write(folder / f"{sub.notebook}.html", page)
        atomic_write(folder / "timestamp.txt", sub.timestamp)
        atomic_write(folder / "submission_secret.txt", sub.secret)
        # release_feedback copies the page with its mode: learners read it from the exchange
        os.chmod(folder / f"{sub.notebook}.html", 0o644)
        _give_to_owner(course_dir, folder, [f"{sub.notebook}.html", "timestamp.txt", "submission_secret.txt"])
        written.append(folder / f"{sub.notebook}.html")
        if exchange_course is not None:
            released_dir = exchange_course / "feedback"
            if not released_dir.is_dir():  # as nbgrader makes it: learners may not list it
                released_dir.mkdir(parents=True)
                os.chmod(released_dir, 0o711)
            digest = hashlib.md5((sub.secret + sub.notebook).encode()).hexdigest()
            released = exchange_course / "feedback" / f"{digest}.html"
            atomic_write(released, page)
            os.chmod(released, 0o644)  # learners find it by its hash; the folder is not listable
    return written, skipped


def is_nbgrader_layout(path: Path) -> bool:
    """Whether `path` is nbgrader's (an exchange course folder, inbound/, a course folder or
    submitted/) rather than the grader's own one-folder-per-student layout."""
    if path.name in ("inbound", "submitted") or (path / "inbound").is_dir() or (path / "submitted").is_dir():
        return path.is_dir()
    try:
        return any(
            (a / "timestamp.txt").is_file()
            for s in path.iterdir()
            if s.is_dir() and not s.is_symlink()
            for a in s.iterdir()
            if a.is_dir() and not a.is_symlink()
        )
    except OSError:
        return False
