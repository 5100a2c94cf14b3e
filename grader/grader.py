"""Grade a class: every submitted notebook runs in its own limited process; a gradebook comes out.

    python -m grader grade SUBMISSIONS --out OUT [--hidden-tests DIR] [--workers N]
                                      [--timeout SECONDS] [--memory-mb MB] [--force] [--ray]

SUBMISSIONS holds one folder per student with that student's notebooks (`02_kv_cache.ipynb`: the
two leading digits name the lab). For each notebook:

1. it is copied, with the rest of the student's folder, into a private working folder, and a probe
   cell is inserted after every code cell to save the lab's answers outside the notebook;
2. papermill runs it in its own session under a wall-time limit and a memory limit
   (sandbox.py), with a private snapshot of lab_utils first on the path, so nothing a notebook does
   to files or modules can reach the grading of the others; every cell runs even after one raised;
3. a separate clean process checks the saved answers (the notebook's own check records are not
   trusted), and the instructor's hidden tests run in another;
4. OUT gets one result file per notebook as soon as it is graded and gradebook.csv rebuilt
   atomically (gradebook.py), feedback/<student>/<lab>.md, the executed notebooks, a per-question
   summary and a histogram of totals. A rerun grades only what is missing or changed (--force
   regrades everything), so a grader killed part-way resumes where it stopped.

The notebooks run on a local pool of worker threads or as Ray tasks (runner.py). This module keeps
the names callers import: Grader, Job, Outcome, grade_class, job_seed, instructor_seed,
instructor_dir, write_gradebook.

Inputs that cannot be graded each get a row with a clear status and no run:
- `not a notebook`: a file named for a lab (`02_...`) that is not a .ipynb (when the folder has no
  notebook for that lab), or a .ipynb that is not valid notebook JSON;
- `unreadable`: the file cannot be read (permissions, a dangling link, a folder named .ipynb);
- `empty notebook`: no code in it (or a 0-byte file);
- `wrong lab`: the notebook's `lab_scenario("NN", ...)` call names another lab, or (without such a
  call) it defines none of its lab's answer names but at least two of another lab's;
- `duplicate`: two notebooks for the same lab in one folder, or two student folders whose names
  are equal ignoring case, spaces and punctuation (`Ana`, `ana`): which one counts is the
  instructor's call, so neither is graded until the folders are merged.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import hmac
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from lab_utils.grading import safe_ast
from lab_utils.grading.registry import lab_limits, lab_scenario
from lab_utils.grading.scoring import REFERENCE

from .fingerprint import file_digest, folder_digest, installed_packages, tree_digest
from .gradebook import (
    Job,
    Outcome,
    atomic_write,
    load_result,
    safe_name,
    save_result,
    summary_text,
    write_gradebook,
    write_histogram,
)
from .judge import Context, judge_lab
from .originality import is_copy, pasted_references
from .registry import all_questions, questions_for
from .runner import MAX_FOLDER_BYTES  # the whole folder (also the cap on what a Ray task ships)
from .sandbox import (
    INSIDE_IN,
    INSIDE_OUT,
    INSIDE_WORK,
    STOP,
    Sandbox,
    Status,
    Stopped,
    _needed,
    lease_uid,
    privileged,
    release_uid,
    run_limited,
    sandbox_problem,
    share_course_files,
)
from .untrusted import (
    MAX_NOTEBOOK_BYTES,
    MAX_STATUS_BYTES,
    Refused,
    copy_tree,
    markdown_text,
    plain,
    read_bytes,
)


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here and --no-sandbox was not given."""


def _gpu_visible() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


GRADER_VERSION = "3"
LAB_RE = re.compile(r"^(\d\d)[_\-\w .]*\.ipynb$")
LAB_PREFIX_RE = re.compile(r"^(\d\d)[_\-. ]")
MAX_OUTPUT_CHARS = 20_000  # per output, in the executed copy kept for the instructor

__all__ = [
    "Grader",
    "Job",
    "Outcome",
    "Status",
    "discover",
    "grade_class",
    "instructor_dir",
    "instructor_seed",
    "job_seed",
    "write_gradebook",
]

# kept for callers of the old private names
_atomic_write = atomic_write
_safe = safe_name


# --- discovery ---------------------------------------------------------------------------------


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
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
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


# --- one notebook ------------------------------------------------------------------------------


def instructor_dir() -> Path:
    """The instructor's private folder (`LAB_INSTRUCTOR_DIR`, default ~/.config/llm-serving-lab/instructor)."""
    override = os.environ.get("LAB_INSTRUCTOR_DIR")
    return Path(override) if override else Path.home() / ".config" / "llm-serving-lab" / "instructor"


def _private_file(name: str, make, progress=print) -> str:
    path = instructor_dir() / name
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        atomic_write(path, f"{value}\n")
        os.chmod(path, 0o600)
        progress(f"created {path}; keep that file private and keep it for regrades")
        return str(value)


def instructor_seed(progress=print) -> int:
    """The class's grading seed, kept in the instructor's folder and never in a learner's copy.

    Created at random on first use. Keep it: regrading with the same seed gives the same grades.
    """
    import secrets

    text = _private_file("seed", lambda: secrets.randbelow(2**31 - 1) + 1, progress)
    try:
        return int(text)
    except ValueError:
        path = instructor_dir() / "seed"
        raise ValueError(f"{path} should hold one integer (the grading seed); fix or delete it") from None


def signing_key(progress=print) -> bytes:
    """The key saved grades are signed with (instructor folder, created on first use)."""
    import secrets

    return _private_file("signing.key", lambda: secrets.token_hex(32), progress).encode()


def grading_key(progress=print) -> bytes:
    """The full-strength secret (32 random bytes, instructor folder, created on first use) that
    every notebook's SEED and every hidden case derive from; the grading seed only picks a variant,
    so a notebook that sees its SEED learns nothing it can search the seed space with."""
    import secrets

    text = _private_file("grading.key", lambda: secrets.token_hex(32), progress)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        path = instructor_dir() / "grading.key"
        raise ValueError(f"{path} should hold 32 random bytes in hex (the grading key); fix or delete it")
    return key


SHORT_SEED_BITS = 64


def seed_warning(seed: int) -> str:
    """A note for an explicit --seed that an exhaustive search could cover (shorter than 64 bits)."""
    if abs(int(seed)).bit_length() >= SHORT_SEED_BITS:
        return ""
    return (
        f"warning: --seed {seed} is short ({abs(int(seed)).bit_length()} bits); it only selects a variant. "
        f"Scenarios and hidden cases are keyed by {instructor_dir() / 'grading.key'}: keep that file private "
        "and keep it for regrades"
    )


def job_seed(seed: int, student: str, lab: str, key: bytes | None = None) -> int:
    """The scenario seed one student's notebook of one lab runs with (never 0, the public seed):
    an HMAC of the grading key (`grading_key()` when not given) with the seed, student and lab."""
    key = grading_key() if key is None else key
    mac = hmac.new(key, f"scenario/{int(seed)}/{student}/{lab}".encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:4], "big") % (2**31 - 1) + 1


def hidden_key(seed: int, key: bytes) -> str:
    """The key the hidden checks draw their cases from: the grading key mixed with the seed."""
    return hmac.new(key, f"hidden/{int(seed)}".encode(), hashlib.sha256).hexdigest()


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


def _venv_bin() -> str:
    return str(Path(sys.executable).parent)


class Grader:
    """Grades jobs one at a time (thread-safe; the CLI runs several in parallel).

    Every run of learner code happens in a sandbox (sandbox.py) unless `sandboxed=False`
    (`--no-sandbox`), and every row graded without one says `unsandboxed`.
    """

    def __init__(
        self,
        out: Path,
        hidden_tests: Path | None = None,
        timeout: float | None = None,
        memory_mb: int | None = None,
        check_timeout: float = 120,
        python: str | None = None,
        kernel: str = "python3",
        parameters: dict | None = None,
        seed: int | None = None,
        keep_answers: bool = False,
        sandboxed: bool = True,
        disk_mb: int = 512,
        tmp_mb: int = 4096,
        protect: list[Path] | None = None,
        copies: str = "zero",
        key: str | None = None,
    ):
        if timeout is not None and timeout <= 0:
            raise ValueError(f"--timeout must be positive seconds, got {timeout}")
        if memory_mb is not None and memory_mb < 0:
            raise ValueError(f"--memory-mb must be 0 (no limit) or a positive number, got {memory_mb}")
        if hidden_tests is not None and not hidden_tests.is_dir():
            raise ValueError(f"--hidden-tests {hidden_tests} is not a folder")
        if sandboxed and (why := sandbox_problem()):
            raise SandboxUnavailable(
                f"cannot sandbox learner code: {why}. Install it, or pass --no-sandbox to grade without "
                "a sandbox (every row then says 'unsandboxed'; a hostile notebook could read your files)"
            )
        self.out = out
        self.hidden = hidden_tests
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.check_timeout = check_timeout
        self.python = python or sys.executable
        self.kernel = kernel
        self.parameters = parameters or {}
        if "SEED" in self.parameters:
            raise ValueError(
                "do not set SEED as a parameter: the grader draws each notebook's seed from --seed"
            )
        self.seed = int(seed) if seed is not None else instructor_seed()
        self.key = bytes.fromhex(key) if key else grading_key()  # hex in config(): a Ray task's copy
        self.keep_answers = keep_answers  # copy each run's saved answers to OUT/answers (tests reuse them)
        self.sandboxed = sandboxed
        self.disk_mb = disk_mb
        self.tmp_mb = tmp_mb
        self.protect = [Path(p) for p in (protect or [])]  # more folders no sandbox may see
        if copies not in ("zero", "flag", "off"):
            raise ValueError(f"--copies must be zero or flag, got {copies!r}")
        self.copies = copies  # a copy of the published solution: scores 0, is flagged, or (CI) unchecked
        self.cpus = 0.0  # each run's CPU share while the machine is busy (grade_class: cores / workers)
        self.scratch = Path(tempfile.mkdtemp(prefix="lab-grader-"))
        os.chmod(self.scratch, 0o700)
        self.stopping = threading.Event()  # set on Ctrl-C: no new run starts, running ones are killed
        self._fingerprints: dict[str, str] = {}
        if sandboxed and privileged():
            share_course_files(_needed())

    def config(self) -> dict:
        """What another process needs to build an equal Grader (a Ray task on any node)."""
        return {
            "hidden_tests": self.hidden,
            "timeout": self.timeout,
            "memory_mb": self.memory_mb,
            "check_timeout": self.check_timeout,
            "kernel": self.kernel,
            "parameters": dict(self.parameters),
            "seed": self.seed,
            "sandboxed": self.sandboxed,
            "disk_mb": self.disk_mb,
            "tmp_mb": self.tmp_mb,
            "copies": self.copies,
            "key": self.key.hex(),
        }

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def stop(self) -> None:
        """Ctrl-C: every run in flight is killed, and none starts (grade() then raises Stopped)."""
        self.stopping.set()
        STOP.set()

    def _check_stop(self) -> None:
        if self.stopping.is_set():
            raise Stopped("the grader was interrupted")

    def memory_for(self, lab: str) -> int:
        """The memory limit of one notebook: --memory-mb when given, else what the lab declares."""
        return self.memory_mb if self.memory_mb is not None else lab_limits(lab)["memory_mb"]

    def timeout_for(self, lab: str) -> float:
        """The wall-time limit of one notebook: --timeout when given, else what the lab declares."""
        return float(self.timeout) if self.timeout is not None else float(lab_limits(lab)["timeout"])

    def _fingerprint(self, lab: str) -> str:
        """What a saved grade depends on besides the student's folder: the whole grader and course
        library (every file, not only the lab's), the hidden tests, the installed packages, the
        parameters, the seed, the grading key and the limits (computed once per lab)."""
        if lab in self._fingerprints:
            return self._fingerprints[lab]
        h = hashlib.sha256(GRADER_VERSION.encode())
        repo = Path(__file__).resolve().parent.parent
        for tree in (repo / "grader", repo / "lab_utils"):
            h.update(tree_digest(tree).encode())
        for p in self._hidden_files(lab):
            h.update(p.name.encode() + b"\0" + file_digest(p).encode())
        h.update(installed_packages().encode())
        limits = [self.timeout_for(lab), self.memory_for(lab), self.check_timeout, self.disk_mb, self.tmp_mb]
        h.update(
            json.dumps(
                [self.parameters, limits, self.sandboxed, self.copies, self.kernel],
                sort_keys=True,
                default=str,
            ).encode()
        )
        h.update(str(self.seed).encode())
        h.update(hashlib.sha256(self.key).digest())
        self._fingerprints[lab] = h.hexdigest()
        return self._fingerprints[lab]

    def job_key(self, job: Job) -> str:
        """What a saved grade was computed from; "" (never reused) when the file cannot be read."""
        if job.problem:
            return ""
        h = hashlib.sha256(self._fingerprint(job.lab).encode())
        h.update(job.student.encode() + b"\0")
        try:
            h.update(job.notebook.read_bytes())
            h.update(folder_digest(job.notebook.parent, keep=job.notebook.name).encode())
        except OSError:
            return ""
        return h.hexdigest()

    # --- the sandbox ---

    def _hidden_paths(self) -> list[str]:
        """Host folders no sandbox may see: the instructor's, the output, the grader's own code, the
        hidden tests, the submissions and any the caller named."""
        paths = [instructor_dir(), self.out, self.scratch, Path(__file__).resolve().parent, *self.protect]
        if self.hidden:
            paths.append(self.hidden)
        seen, out = set(), []
        for p in paths:
            try:
                r = str(Path(p).resolve())
            except OSError:
                continue
            if r not in seen and r != "/":
                seen.add(r)
                out.append(r)
        return out

    def tmp_mb_for(self, lab: str) -> int:
        """The private /tmp of a run: --tmp-mb, but at most half the memory limit (it is memory)."""
        memory = self.memory_for(lab)
        return max(16, min(self.tmp_mb, memory // 2)) if memory else self.tmp_mb

    def _sandbox(
        self, job_in: Path | None, job_out: Path | None, uid: int | None = None, lab: str | None = None
    ) -> Sandbox | None:
        if self.stopping.is_set():
            raise Stopped("the grader was interrupted")
        if not self.sandboxed:
            return None
        # both tmpfs are memory outside the run's measured set: a run's are capped inside its limit
        # (/dev/shm: an eighth, at most 512 MB, which vLLM's CPU workers need); a judge runner's small
        tmp_mb = self.tmp_mb_for(lab) if lab else min(self.tmp_mb, 1024)
        memory = self.memory_for(lab) if lab else 0
        shm_mb = min(512, max(64, memory // 8)) if memory else (512 if lab else 64)
        box = Sandbox(
            hide=self._hidden_paths(), tmp_mb=tmp_mb, shm_mb=shm_mb, gpu=_gpu_visible(), cpus=self.cpus
        )
        if uid is not None:
            box.uid = uid
        if job_in is not None:
            box.read_only[str(job_in)] = INSIDE_IN
        if job_out is not None:
            box.writable[str(job_out)] = INSIDE_OUT
        return box

    def _env(self, home: str, results: str) -> dict:
        """The minimal environment of learner code: no instructor variables, keys or arguments."""
        env = {
            "PATH": os.pathsep.join([_venv_bin(), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": home,
            "TMPDIR": "/tmp" if self.sandboxed else tempfile.gettempdir(),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "MPLBACKEND": "Agg",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "LAB_RESULTS_FILE": results,  # never the instructor's own results file
            # the course library finds the repository's .venv-triton and data folders
            "LAB_REPO_ROOT": str(Path(__file__).resolve().parent.parent),
        }
        from lab_utils.models import cache_dir

        env["COURSE_CACHE"] = str(cache_dir())  # the prepared course model, read-only inside
        # no network inside anyway; HF_HUB_OFFLINE=1 would also stop huggingface_hub's clients from
        # reaching the labs' own servers on 127.0.0.1, so it is passed on only when the instructor set it
        for name in (
            "COURSE_MODEL",
            "CUDA_VISIBLE_DEVICES",
            "LAB_ENGINE_FAST",
            "OMP_NUM_THREADS",
            "HF_HUB_OFFLINE",
        ):
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def _inside(self, host: Path, inside: str) -> str:
        return inside if self.sandboxed else str(host)

    def grade(self, job: Job) -> tuple[Outcome, str]:
        """Grade one notebook; returns the outcome and the feedback text."""
        t0 = time.monotonic()
        qs = questions_for(job.lab)
        outcome = Outcome(job.student, job.lab, key=self.job_key(job))
        for q in qs:
            outcome.possible[q.id] = q.points
            outcome.scores[q.id] = 0.0
        if job.problem:
            outcome.status = job.problem
            return outcome, _feedback(job, outcome, [], [], job.problem)
        self._check_stop()
        work = Path(tempfile.mkdtemp(prefix=f"{_safe(job.student)}-{job.lab}-", dir=self.scratch))
        uid = lease_uid()
        try:
            nb, problem = _read_notebook(job.notebook)
            if nb is None or (problem := content_problem(nb, job.lab)):
                outcome.status = problem
                return outcome, _feedback(job, outcome, [], [], problem)
            if not qs:
                outcome.status = Status.NO_QUESTIONS.text(f"lab {job.lab} has none")
            if self.copies != "off":
                copied, note = is_copy(nb, job.lab)
                if copied and self.copies == "zero":
                    outcome.status = Status.COPY.text(note)
                    return outcome, _feedback(job, outcome, [], [], outcome.status)
                if copied:
                    outcome.flags.append(f"copy of the published solution ({note})")
            pasted = pasted_references(nb, qs)
            outcome.flags += pasted.flags
            job_in, job_out = work / "in", work / "out"
            job_out.mkdir(parents=True)
            if why := copy_submission(job.notebook.parent, job_in / "files", job.notebook.name):
                outcome.status = Status.REFUSED.text(why)
                return outcome, _feedback(job, outcome, [], [], outcome.status)
            (job_in / "files" / job.notebook.name).unlink(missing_ok=True)  # the instrumented copy runs
            answers_dir = job_out / "answers"
            answers_dir.mkdir()
            if self.sandboxed and privileged():  # the run's own uid writes there, and nowhere else
                for folder in (job_out, answers_dir):
                    os.chown(folder, uid, uid)
            from lab_utils.grading.probe import instrument

            names = sorted({n for q in qs for n in q.answers} | self._hidden_names(job.lab))
            seed = job_seed(self.seed, job.student, job.lab, self.key)
            _apply_parameters(nb, {**self.parameters, "SEED": seed})
            # predictions are fixed where their check cell stands (names only predictions read)
            others = {n for q in qs if not q.predict for n in q.answers}
            predictions = {q.id: [n for n in q.answers if n not in others] for q in qs if q.predict}
            unchecked = instrument(nb, names, self._inside(answers_dir, f"{INSIDE_OUT}/answers"), predictions)
            outcome.flags += [
                f"{q}: the prediction's check cell was removed (fixed at its first value)" for q in unchecked
            ]
            import nbformat

            nbformat.write(nb, str(job_in / "submitted.ipynb"))
            home = self._inside(work / "home", f"{INSIDE_WORK}/home")
            run = self._inside(work / "run", f"{INSIDE_WORK}/run")
            if not self.sandboxed:
                (work / "home").mkdir()
            timeout, memory_mb = self.timeout_for(job.lab), self.memory_for(job.lab)
            code, killed = run_limited(
                [
                    self.python,
                    "-m",
                    "lab_utils.grading.execute",
                    self._inside(job_in / "submitted.ipynb", f"{INSIDE_IN}/submitted.ipynb"),
                    self._inside(job_out / "executed.ipynb", f"{INSIDE_OUT}/executed.ipynb"),
                    "--cwd",
                    run,
                    "--copy-from",
                    self._inside(job_in / "files", f"{INSIDE_IN}/files"),
                    "--cell-timeout",
                    str(timeout),
                    "--status",
                    self._inside(job_out / "status.json", f"{INSIDE_OUT}/status.json"),
                    "--kernel",
                    self.kernel,
                ],
                timeout=timeout,
                memory_mb=memory_mb,
                env=self._env(home, self._inside(work / "results.json", f"{INSIDE_WORK}/results.json")),
                cwd=work,
                log=work / "execute.log",
                sandbox=self._sandbox(job_in, job_out, uid, job.lab),
                watch_dir=job_out,
                disk_mb=self.disk_mb,
            )
            if qs:
                outcome.status = _run_status(
                    code, killed, job_out / "status.json", timeout, memory_mb, self.disk_mb
                )
            # the learner's code has finished running; from here it is only called, one question at a time
            self._check_stop()
            results = [
                r.to_dict() for r in judge_lab(job.lab, self._context(job, work, answers_dir, seed, uid))
            ]
            for r in results:  # a reference pasted in under the answer's name scores zero
                if r["id"] in pasted.zeroed:
                    r.update(earned=0.0, status=REFERENCE, message=pasted.zeroed[r["id"]])
            hidden = self._hidden(job.lab, answers_dir, work, uid)
            for r in results:
                outcome.scores[r["id"]] = float(r["earned"])
            for h in hidden:
                qid = f"{job.lab}.hidden.{h['name']}"
                outcome.possible[qid] = h["points"]
                outcome.scores[qid] = h["points"] if h["outcome"] == "passed" else 0.0
            if not self.sandboxed:
                outcome.status = f"{outcome.status} (unsandboxed)"
            self._keep_executed(job, job_out / "executed.ipynb")
            if self.keep_answers:
                dest = self.out / "answers" / _safe(job.student) / job.lab
                shutil.rmtree(dest, ignore_errors=True)
                copy_tree(answers_dir, dest)  # regular files only: a FIFO or link is left out
                (dest / "_seed").write_text(str(seed))
            return outcome, _feedback(job, outcome, results, hidden, "")
        finally:
            outcome.seconds = round(time.monotonic() - t0, 1)
            shutil.rmtree(work, ignore_errors=True)
            release_uid(uid)

    def _context(self, job: Job, work: Path, answers_dir: Path, seed: int, uid: int | None = None) -> Context:
        try:
            scen = lab_scenario(job.lab, seed)
        except KeyError:
            scen = {}
        runner_home = self._inside(work / "home", f"{INSIDE_WORK}/home")
        return Context(
            answers_dir=answers_dir,
            work=work,
            student=job.student,
            key=hidden_key(self.seed, self.key),
            scenario=scen,
            sandbox=lambda: self._sandbox(None, None, uid),
            python=self.python,
            env=self._env(runner_home, self._inside(work / "results.json", f"{INSIDE_WORK}/results.json")),
            per_question=self.check_timeout,
        )

    def judge_saved(
        self, lab: str, answers_dir: Path, student: str = "ci", seed: int | None = None, notebook=None
    ) -> list:
        """Judge answers saved by an earlier run (tests: the bypass submissions), as `grade` does;
        `notebook`, when given, is the source the pasted-reference check reads."""
        work = Path(tempfile.mkdtemp(prefix="judge-", dir=self.scratch))
        try:
            (work / "home").mkdir()
            s = job_seed(self.seed, student, lab, self.key) if seed is None else seed
            results = judge_lab(lab, self._context(Job(student, lab, answers_dir), work, answers_dir, s))
            if notebook is not None:
                pasted = pasted_references(notebook, questions_for(lab))
                for r in results:
                    if r.id in pasted.zeroed:
                        r.earned, r.status, r.message = 0.0, REFERENCE, pasted.zeroed[r.id]
            return results
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _hidden_files(self, lab: str) -> list[Path]:
        if not self.hidden:
            return []
        files = sorted(self.hidden.glob(f"test_{lab}_*.py"))
        for sub in (f"lab{lab}", lab):
            if (self.hidden / sub).is_dir():
                files += sorted((self.hidden / sub).glob("test_*.py"))
        return files

    def _hidden_names(self, lab: str) -> set[str]:
        """Answer names the hidden tests read (`answers["name"]`), so the probe saves them too."""
        names: set[str] = set()
        for f in self._hidden_files(lab):
            names |= set(re.findall(r"answers\[\s*['\"](\w+)['\"]\s*\]", f.read_text()))
        return names

    def _hidden(self, lab: str, answers_dir: Path, work: Path, uid: int | None = None) -> list[dict]:
        """The instructor's pytest hidden tests, run here (outside the sandbox) against the answers,
        which stay in a sandboxed runner (grader.hidden_tests)."""
        files = self._hidden_files(lab)
        if not files:
            return []
        tests = work / "hidden"
        tests.mkdir()
        for f in files:
            shutil.copy(f, tests / f.name)
        report = work / "hidden.json"
        box = self._sandbox(None, None, uid)
        config = {
            "answers": str(answers_dir),
            "python": self.python,
            "env": self._env(self._inside(work / "home", f"{INSIDE_WORK}/home"), "/dev/null"),
            "sandbox": None if box is None else dataclasses.asdict(box),
            "log": str(work / "hidden-runner.log"),
            "timeout": self.check_timeout,
        }
        (work / "runner.json").write_text(json.dumps(config))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
        )
        run_limited(
            [
                self.python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "grader.hidden_tests",
                "--runner-config",
                str(work / "runner.json"),
                "--hidden-report",
                str(report),
                "--rootdir",
                str(tests),
                "-o",
                "addopts=",
                str(tests),
            ],
            timeout=self.check_timeout * max(1, len(files)),
            memory_mb=0,
            env=env,
            cwd=tests,
            log=work / "hidden.log",
        )
        try:
            return json.loads(read_bytes(report, MAX_STATUS_BYTES * 16))
        except (OSError, ValueError):
            return [
                {
                    "name": "hidden_tests",
                    "outcome": "error",
                    "points": 1.0,
                    "message": "the hidden tests did not report (timed out or crashed)",
                }
            ]

    def _keep_executed(self, job: Job, executed: Path) -> None:
        import nbformat

        try:  # written inside the sandbox: a regular file under the cap, or nothing is kept
            nb = nbformat.reads(read_bytes(executed, MAX_NOTEBOOK_BYTES).decode("utf-8"), as_version=4)
        except Exception:  # a notebook that broke its own output file: nothing worth keeping
            return
        _truncate_outputs(nb)
        dest = self.out / "executed" / _safe(job.student) / job.notebook.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(dest, nbformat.writes(nb))


def _safe(name: str) -> str:
    return re.sub(r"[^\w.\-]", "_", name)


def _read_notebook(path: Path):
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


def _apply_parameters(nb, parameters: dict) -> None:
    if not parameters:
        return
    import nbformat

    lines = [f"{k} = {v!r}" for k, v in parameters.items()]
    cell = nbformat.v4.new_code_cell("# parameters set by the grader\n" + "\n".join(lines))
    cell.metadata["tags"] = ["injected-parameters"]
    idx = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    nb.cells.insert(idx + 1, cell)


def _run_status(
    code, killed: Status | None, status_file: Path, timeout: float, memory_mb: int, disk_mb: int = 0
) -> str:
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
    try:  # written inside the sandbox: a small regular file, read as data, never waited on
        info = json.loads(read_bytes(status_file, MAX_STATUS_BYTES))
        info = {
            "outcome": str(info.get("outcome", "failed")),
            "detail": plain(" ".join(str(info.get("detail", "")).split())),
        }
    except Refused as exc:
        info = {"outcome": "failed", "detail": f"the status file was refused: {exc}"}
    except (OSError, ValueError, AttributeError, RecursionError):
        info = {"outcome": "failed", "detail": ""}
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


def _truncate_outputs(nb) -> None:
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


def _feedback(job: Job, outcome: Outcome, results: list[dict], hidden: list[dict], problem: str) -> str:
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


# --- a class -----------------------------------------------------------------------------------


def grade_class(
    submissions: Path,
    out: Path,
    hidden_tests: Path | None = None,
    workers: int = 1,
    timeout: float | None = None,
    memory_mb: int | None = None,
    force: bool = False,
    parameters: dict | None = None,
    progress=print,
    seed: int | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    sandboxed: bool = True,
    disk_mb: int = 512,
    tmp_mb: int = 4096,
    copies: str = "zero",
) -> list[Outcome]:
    """Grade every notebook under `submissions` into `out`; returns the outcomes.

    `ray=True` (or a `ray_address`) runs each notebook as a Ray task; `workers` is then the number
    of CPUs of the local Ray cluster started for the run (ignored with an address).
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    STOP.clear()
    jobs, warnings = discover(submissions)
    for w in warnings:
        progress(plain(f"warning: {w}", 500))
    out.mkdir(parents=True, exist_ok=True)
    cache = out / ".cache"
    if seed is None:
        seed = instructor_seed(progress)
    elif note := seed_warning(seed):
        progress(note)
    secret = signing_key(progress)
    key = grading_key(progress)
    grader = Grader(
        out,
        hidden_tests,
        timeout=timeout,
        memory_mb=memory_mb,
        parameters=parameters,
        seed=seed,
        sandboxed=sandboxed,
        disk_mb=disk_mb,
        tmp_mb=tmp_mb,
        protect=[submissions],
        copies=copies,
        key=key.hex(),
    )
    if not sandboxed:
        progress("warning: grading WITHOUT a sandbox (--no-sandbox); every row says 'unsandboxed'")
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    try:
        todo: list[Job] = []
        kept = 0
        for job in jobs:
            if job.problem:  # nothing to run: a row with the reason, every run
                outcome, feedback = grader.grade(job)
                outcomes.append(outcome)
                atomic_write(out / "feedback" / _safe(job.student) / f"{job.lab}.md", feedback)
                progress(plain(f"not graded: {job.student}/{job.notebook.name}: {outcome.status}", 500))
                continue
            cached = None if force else load_result(cache, job, grader.job_key(job), secret)
            if cached is not None:
                outcomes.append(cached)
                kept += 1
            else:
                todo.append(job)
        if kept:
            progress(f"{kept} unchanged notebook(s) kept from the last run (--force regrades them)")
        where = (
            f"Ray at {ray_address}"
            if ray_address
            else f"a local Ray cluster of {workers} CPU(s)"
            if ray
            else f"{workers} worker(s)"
        )
        limits = (
            f"{timeout:.0f} s" if timeout is not None else "the lab's time",
            f"{memory_mb} MB" if memory_mb is not None else "the lab's memory",
        )
        box = "in a sandbox" if sandboxed else "UNSANDBOXED"
        progress(f"grading {len(todo)} notebook(s) on {where}, {box}, {limits[0]} and {limits[1]} each")
        write_gradebook(out, outcomes)
        bar = _runner.Progress(len(todo), progress)

        def finished(result) -> None:
            job, outcome, feedback, executed, error = result
            if outcome is None:
                outcome = _runner.error_outcome(job, error, questions_for(job.lab))
                feedback = (
                    f"# Lab {job.lab} — {markdown_text(job.student, 100)}\n\n"
                    f"The grader failed: {markdown_text(error, 400)}\n"
                )
            else:
                outcome.key = grader.job_key(job)  # the key of what this run read, whoever graded it
            with lock:
                if executed is not None:
                    atomic_write(out / "executed" / _safe(job.student) / job.notebook.name, executed)
                atomic_write(out / "feedback" / _safe(job.student) / f"{job.lab}.md", feedback)
                if outcome.kind is not Status.GRADER_ERROR:  # a grader error is graded again next run
                    save_result(cache, outcome, secret)
                outcomes.append(outcome)
                write_gradebook(out, outcomes)
                bar.update(outcome)

        if ray or ray_address:
            _runner.run_ray(
                grader.config(), todo, finished, address=ray_address, num_cpus=workers, progress=progress
            )
        else:
            if workers > 1:  # runs side by side: none may take a neighbour's cores (sandbox._throttle)
                grader.cpus = max(1.0, (os.cpu_count() or 1) / workers)
            _runner.run_local(grader, todo, workers, finished)
        path = write_gradebook(out, outcomes)
        progress(f"gradebook: {path}")
        report = summary_text(outcomes)
        atomic_write(out / "summary.txt", report + "\n")
        progress("per question (points earned across submissions):\n" + report)
        hist = write_histogram(out, outcomes)
        if hist:
            progress(f"histogram of totals: {hist}")
        return outcomes
    finally:
        grader.close()


from . import runner as _runner  # noqa: E402  (runner imports Grader lazily; no cycle at import time)
