"""Grade a class: every submitted notebook runs in its own limited process; a gradebook comes out.

    python -m lab_utils.grading grade SUBMISSIONS --out OUT [--hidden-tests DIR] [--workers N]
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
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

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
from .registry import all_questions, questions_for
from .sandbox import Status, run_limited

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
    """ "" if the file can be read, else why not."""
    try:
        with open(path, "rb") as f:
            f.read(1)
        return ""
    except OSError as exc:
        return f"cannot read {path.name}: {exc.strerror or type(exc).__name__}"


def discover(submissions: Path) -> tuple[list[Job], list[str]]:
    """One job per (student, lab) found; jobs that cannot be graded carry their `problem` (a status
    text). Also a list of warnings about files that belong to no lab."""
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS {submissions} is not a folder; it should hold one folder per student")
    jobs: list[Job] = []
    warnings: list[str] = []
    folders = sorted(p for p in submissions.iterdir() if p.is_dir())
    for p in sorted(submissions.iterdir()):
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
        tree = ast.parse(code)
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


def _snapshot_lab_utils(dest: Path) -> Path:
    src = Path(__file__).resolve().parent.parent
    shutil.copytree(src, dest / "lab_utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def instructor_dir() -> Path:
    """The instructor's private folder (`LAB_INSTRUCTOR_DIR`, default ~/.config/llm-serving-lab/instructor)."""
    override = os.environ.get("LAB_INSTRUCTOR_DIR")
    return Path(override) if override else Path.home() / ".config" / "llm-serving-lab" / "instructor"


def instructor_seed(progress=print) -> int:
    """The class's grading seed, kept in the instructor's folder and never in a learner's copy.

    Created at random on first use. Keep it: regrading with the same seed gives the same grades.
    """
    path = instructor_dir() / "seed"
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        import secrets

        seed = secrets.randbelow(2**31 - 1) + 1
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, f"{seed}\n")
        os.chmod(path, 0o600)
        progress(f"created a grading seed in {path}; keep that file private and keep it for regrades")
        return seed
    except ValueError:
        raise ValueError(f"{path} should hold one integer (the grading seed); fix or delete it") from None


def job_seed(seed: int, student: str, lab: str) -> int:
    """The scenario seed one student's notebook of one lab runs with (never 0, the public seed)."""
    digest = hashlib.sha256(f"{int(seed)}/{student}/{lab}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31 - 1) + 1


class Grader:
    """Grades jobs one at a time (thread-safe; the CLI runs several in parallel)."""

    def __init__(
        self,
        out: Path,
        hidden_tests: Path | None = None,
        timeout: float = 900,
        memory_mb: int = 8192,
        check_timeout: float = 300,
        python: str | None = None,
        kernel: str = "python3",
        parameters: dict | None = None,
        seed: int | None = None,
        keep_answers: bool = False,
    ):
        if timeout <= 0:
            raise ValueError(f"--timeout must be positive seconds, got {timeout}")
        if memory_mb < 0:
            raise ValueError(f"--memory-mb must be 0 (no limit) or a positive number, got {memory_mb}")
        if hidden_tests is not None and not hidden_tests.is_dir():
            raise ValueError(f"--hidden-tests {hidden_tests} is not a folder")
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
        self.keep_answers = keep_answers  # copy each run's saved answers to OUT/answers (tests reuse them)
        self.scratch = Path(tempfile.mkdtemp(prefix="lab-grader-"))
        # checks run from a private copy no notebook can reach; each notebook gets its own copy
        self.snapshot = _snapshot_lab_utils(self.scratch / "checker")

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
        }

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _fingerprint(self, lab: str) -> str:
        """What a cached grade depends on besides the notebook: the grader, the lab's questions,
        its hidden tests and the parameters. (Other library changes: regrade with --force.)"""
        h = hashlib.sha256(GRADER_VERSION.encode())
        grading = self.snapshot / "lab_utils" / "grading"
        files = sorted(grading.glob("*.py")) + [grading / "questions" / f"lab{lab}.py"]
        files += self._hidden_files(lab)
        for p in files:
            if p.exists():
                h.update(p.name.encode())
                h.update(p.read_bytes())
        h.update(json.dumps(self.parameters, sort_keys=True).encode())
        h.update(str(self.seed).encode())
        return h.hexdigest()

    def job_key(self, job: Job) -> str:
        """What a saved grade was computed from; "" (never reused) when the file cannot be read."""
        if job.problem:
            return ""
        h = hashlib.sha256(self._fingerprint(job.lab).encode())
        h.update(job.student.encode() + b"\0")
        try:
            h.update(job.notebook.read_bytes())
        except OSError:
            return ""
        return h.hexdigest()

    def _env(self, snapshot: Path | None = None, work: Path | None = None, key: str = "") -> dict:
        env = dict(os.environ)
        if key:  # measured answers are stamped with this run's key (provenance.py)
            env["LAB_PROVENANCE_KEY"] = key
        if work is not None:  # a graded run must not write into the instructor's own results file
            env["LAB_RESULTS_FILE"] = str(work / "results.json")
        first = str(snapshot or self.snapshot)
        env["PYTHONPATH"] = os.pathsep.join([first] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # the private lab_utils copy still finds the repository's .venv-triton and data folders
        env.setdefault("LAB_REPO_ROOT", str(Path(__file__).resolve().parent.parent.parent))
        env["MPLBACKEND"] = "Agg"
        env.pop("JPY_PARENT_PID", None)
        return env

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
        work = Path(tempfile.mkdtemp(prefix=f"{_safe(job.student)}-{job.lab}-", dir=self.scratch))
        try:
            nb, problem = _read_notebook(job.notebook)
            if nb is None or (problem := content_problem(nb, job.lab)):
                outcome.status = problem
                return outcome, _feedback(job, outcome, [], [], problem)
            if not qs:
                outcome.status = Status.NO_QUESTIONS.text(f"lab {job.lab} has none")
            run_dir = work / "run"
            shutil.copytree(
                job.notebook.parent,
                run_dir,
                ignore=lambda d, names: [n for n in names if n.endswith(".ipynb") and n != job.notebook.name],
            )
            answers_dir = work / "answers"
            answers_dir.mkdir()
            from .probe import instrument

            names = sorted({n for q in qs for n in q.answers} | self._hidden_names(job.lab))
            seed = job_seed(self.seed, job.student, job.lab)
            import secrets

            key = secrets.token_hex(16)
            _apply_parameters(nb, {**self.parameters, "SEED": seed})
            instrument(nb, names, str(answers_dir))
            import nbformat

            src = work / "submitted.ipynb"
            executed = work / "executed.ipynb"
            nbformat.write(nb, str(src))
            status_file = work / "status.json"
            code, killed = run_limited(
                [
                    self.python,
                    "-m",
                    "lab_utils.grading.execute",
                    str(src),
                    str(executed),
                    "--cwd",
                    str(run_dir),
                    "--cell-timeout",
                    str(self.timeout),
                    "--status",
                    str(status_file),
                    "--kernel",
                    self.kernel,
                ],
                timeout=self.timeout,
                memory_mb=self.memory_mb,
                env=self._env(_snapshot_lab_utils(work / "kernel-lib"), work, key),
                cwd=work,
                log=work / "execute.log",
            )
            if qs:
                outcome.status = _run_status(code, killed, status_file, self.timeout, self.memory_mb)
            results = self._check(job.lab, answers_dir, work, seed, key)
            hidden = self._hidden(job.lab, answers_dir, work, key)
            for r in results:
                outcome.scores[r["id"]] = float(r["earned"])
            for h in hidden:
                qid = f"{job.lab}.hidden.{h['name']}"
                outcome.possible[qid] = h["points"]
                outcome.scores[qid] = h["points"] if h["outcome"] == "passed" else 0.0
            self._keep_executed(job, executed)
            if self.keep_answers:
                dest = self.out / "answers" / _safe(job.student) / job.lab
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(answers_dir, dest)
                (dest / "_seed").write_text(str(seed))
            return outcome, _feedback(job, outcome, results, hidden, "")
        finally:
            outcome.seconds = round(time.monotonic() - t0, 1)
            shutil.rmtree(work, ignore_errors=True)

    def _check(self, lab: str, answers_dir: Path, work: Path, seed: int, key: str) -> list[dict]:
        out = work / "scores.json"
        code, killed = run_limited(
            [
                self.python,
                "-m",
                "lab_utils.grading.checkrun",
                "--lab",
                lab,
                "--answers",
                str(answers_dir),
                "--out",
                str(out),
                "--seed",
                str(seed),
            ],
            timeout=self.check_timeout,
            memory_mb=self.memory_mb,
            env=self._env(work=work, key=key),
            cwd=work,
            log=work / "check.log",
        )
        try:
            return json.loads(out.read_text())
        except (OSError, ValueError):
            reason = {Status.TIMEOUT: "timed out", Status.MEMORY_LIMIT: "ran out of memory"}.get(
                killed, f"exited with {code}"
            )
            return [
                {
                    "id": q.id,
                    "points": q.points,
                    "earned": 0.0,
                    "status": "error",
                    "message": f"the checking process {reason}",
                }
                for q in questions_for(lab)
            ]

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

    def _hidden(self, lab: str, answers_dir: Path, work: Path, key: str = "") -> list[dict]:
        files = self._hidden_files(lab)
        if not files:
            return []
        tests = work / "hidden"
        tests.mkdir()
        for f in files:
            shutil.copy(f, tests / f.name)
        report = work / "hidden.json"
        run_limited(
            [
                self.python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "lab_utils.grading.hidden",
                "--answers",
                str(answers_dir),
                "--hidden-report",
                str(report),
                "--rootdir",
                str(tests),
                "-o",
                "addopts=",
                str(tests),
            ],
            timeout=self.check_timeout,
            memory_mb=self.memory_mb,
            env=self._env(work=work, key=key),
            cwd=tests,
            log=work / "hidden.log",
        )
        try:
            return json.loads(report.read_text())
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

        if not executed.exists():
            return
        try:
            nb = nbformat.read(str(executed), as_version=4)
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


def _run_status(code, killed: Status | None, status_file: Path, timeout: float, memory_mb: int) -> str:
    if killed is Status.TIMEOUT:
        return Status.TIMEOUT.text(f"stopped after {timeout:.0f} s; answers saved before then were graded")
    if killed is Status.MEMORY_LIMIT:
        return Status.MEMORY_LIMIT.text(
            f"used more than {memory_mb} MB and was stopped; answers saved before then were graded"
        )
    try:
        info = json.loads(status_file.read_text())
    except (OSError, ValueError):
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
    possible = sum(outcome.possible.values())
    lines = [
        f"# Lab {job.lab} — {job.student}",
        "",
        f"Score: **{outcome.total:g} / {possible:g}**",
        "",
        f"Run: {outcome.status}",
        "",
    ]
    if problem:
        lines += [
            f"The notebook could not be graded: {problem}.",
            "Submit the .ipynb file saved by JupyterLab (File > Save), not a renamed or edited copy.",
            "",
        ]
    if results:
        lines += ["| question | points | status | hint |", "|---|---|---|---|"]
        for r in results:
            hint = (r.get("message") or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r['id']} | {r['earned']:g}/{r['points']:g} | {r['status']} | {hint} |")
        lines.append("")
    if hidden:
        lines += ["Hidden tests:", ""]
        for h in hidden:
            mark = "passed" if h["outcome"] == "passed" else "failed"
            lines.append(
                f"- {h['name']}: {mark} ({h['points'] if mark == 'passed' else 0:g}/{h['points']:g})"
            )
        lines.append("")
    return "\n".join(lines)


# --- a class -----------------------------------------------------------------------------------


def grade_class(
    submissions: Path,
    out: Path,
    hidden_tests: Path | None = None,
    workers: int = 1,
    timeout: float = 900,
    memory_mb: int = 8192,
    force: bool = False,
    parameters: dict | None = None,
    progress=print,
    seed: int | None = None,
    ray: bool = False,
    ray_address: str | None = None,
) -> list[Outcome]:
    """Grade every notebook under `submissions` into `out`; returns the outcomes.

    `ray=True` (or a `ray_address`) runs each notebook as a Ray task; `workers` is then the number
    of CPUs of the local Ray cluster started for the run (ignored with an address).
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    jobs, warnings = discover(submissions)
    for w in warnings:
        progress(f"warning: {w}")
    out.mkdir(parents=True, exist_ok=True)
    cache = out / ".cache"
    if seed is None:
        seed = instructor_seed(progress)
    grader = Grader(out, hidden_tests, timeout=timeout, memory_mb=memory_mb, parameters=parameters, seed=seed)
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
                progress(f"not graded: {job.student}/{job.notebook.name}: {outcome.status}")
                continue
            cached = None if force else load_result(cache, job, grader.job_key(job))
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
        progress(f"grading {len(todo)} notebook(s) on {where}, {timeout:.0f} s and {memory_mb} MB each")
        write_gradebook(out, outcomes)
        bar = _runner.Progress(len(todo), progress)

        def finished(result) -> None:
            job, outcome, feedback, executed, error = result
            if outcome is None:
                outcome = _runner.error_outcome(job, error, questions_for(job.lab))
                feedback = f"# Lab {job.lab} — {job.student}\n\nThe grader failed: {error}\n"
            else:
                outcome.key = grader.job_key(job)  # the key of what this run read, whoever graded it
            with lock:
                if executed is not None:
                    atomic_write(out / "executed" / _safe(job.student) / job.notebook.name, executed)
                atomic_write(out / "feedback" / _safe(job.student) / f"{job.lab}.md", feedback)
                if outcome.kind is not Status.GRADER_ERROR:  # a grader error is graded again next run
                    save_result(cache, outcome)
                outcomes.append(outcome)
                write_gradebook(out, outcomes)
                bar.update(outcome)

        if ray or ray_address:
            _runner.run_ray(
                grader.config(), todo, finished, address=ray_address, num_cpus=workers, progress=progress
            )
        else:
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
