"""Grade a class: every submitted notebook runs in its own limited process; a gradebook comes out.

    python -m lab_utils.grading grade SUBMISSIONS --out OUT [--hidden-tests DIR] [--workers N]
                                      [--timeout SECONDS] [--memory-mb MB] [--force]

SUBMISSIONS holds one folder per student with that student's notebooks (`02_kv_cache.ipynb`: the
two leading digits name the lab). For each notebook:

1. it is copied, with the rest of the student's folder, into a private working folder, and a probe
   cell is inserted after every code cell to save the lab's answers outside the notebook;
2. papermill runs it in a new process group under a wall-time limit and a memory limit, with a
   private snapshot of lab_utils first on the path, so nothing a notebook does to files or modules
   can reach the grading of the others; every cell runs even after one raised;
3. a separate clean process checks the saved answers (the notebook's own check records are not
   trusted), and the instructor's hidden tests run in another;
4. OUT gets gradebook.csv (written atomically), feedback/<student>/<lab>.md, the executed
   notebooks, and a cache so a rerun regrades only what changed (--force regrades everything).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .registry import questions_for

GRADER_VERSION = "2"
LAB_RE = re.compile(r"^(\d\d)[_\-\w .]*\.ipynb$")
MAX_OUTPUT_CHARS = 20_000  # per output, in the executed copy kept for the instructor


@dataclass
class Job:
    student: str
    lab: str
    notebook: Path


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

    @property
    def total(self) -> float:
        return round(sum(self.scores.values()), 4)


# --- discovery ---------------------------------------------------------------------------------

def discover(submissions: Path) -> tuple[list[Job], list[str]]:
    """One job per notebook found; also a list of warnings about files that are not gradable."""
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS {submissions} is not a folder; it should hold one folder per student")
    jobs: list[Job] = []
    warnings: list[str] = []
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir()):
        found = False
        for nb in sorted(student_dir.glob("*.ipynb")):
            m = LAB_RE.match(nb.name)
            if not m:
                warnings.append(f"{student_dir.name}/{nb.name}: name does not start with a lab number "
                                "like 02_; skipped")
                continue
            jobs.append(Job(student_dir.name, m.group(1), nb))
            found = True
        if not found:
            warnings.append(f"{student_dir.name}: no notebook to grade")
    return jobs, warnings


# --- isolation helpers -------------------------------------------------------------------------

def _snapshot_lab_utils(dest: Path) -> Path:
    src = Path(__file__).resolve().parent.parent
    target = dest / "lab_utils"
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _limits():
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill a process, its group, and every descendant (a Jupyter kernel may start its own session)."""
    try:
        import psutil

        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
    except ImportError:
        children = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in children:
        try:
            child.kill()
        except Exception:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _run_limited(cmd: list[str], *, timeout: float, memory_mb: int, env: dict, cwd: Path,
                 log: Path) -> tuple[int | None, str]:
    """Run cmd in its own session under a wall-time and a memory limit.

    The memory limit watches the resident memory of the whole process tree (kernel and any server
    the notebook started included), not the address space: vLLM and torch reserve far more
    virtual memory than they use. Returns (exit code or None, "" | "timeout" | "memory").
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(cwd), preexec_fn=_limits())
        deadline = time.monotonic() + timeout
        reason = ""
        while True:
            try:
                code = proc.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                reason = "timeout"
            elif memory_mb and _tree_rss_mb(proc.pid) > memory_mb:
                reason = "memory"
            if reason:
                _kill_tree(proc)
                return None, reason
        # a kernel or server left running by a crashed papermill is still ours to stop
        _kill_tree(proc)
        return code, ""


# --- one notebook ------------------------------------------------------------------------------

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

    def __init__(self, out: Path, hidden_tests: Path | None = None, timeout: float = 900,
                 memory_mb: int = 8192, check_timeout: float = 300, python: str = sys.executable,
                 kernel: str = "python3", parameters: dict | None = None, seed: int | None = None,
                 keep_answers: bool = False):
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
        self.python = python
        self.kernel = kernel
        self.parameters = parameters or {}
        if "SEED" in self.parameters:
            raise ValueError("do not set SEED as a parameter: the grader draws each notebook's seed "
                             "from --seed")
        self.seed = int(seed) if seed is not None else instructor_seed()
        self.keep_answers = keep_answers  # copy each run's saved answers to OUT/answers (tests reuse them)
        self.scratch = Path(tempfile.mkdtemp(prefix="lab-grader-"))
        # checks run from a private copy no notebook can reach; each notebook gets its own copy
        self.snapshot = _snapshot_lab_utils(self.scratch / "checker")

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
        h = hashlib.sha256(self._fingerprint(job.lab).encode())
        h.update(job.notebook.read_bytes())
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
        work = Path(tempfile.mkdtemp(prefix=f"{_safe(job.student)}-{job.lab}-", dir=self.scratch))
        try:
            nb, problem = _read_notebook(job.notebook)
            if nb is None:
                outcome.status = f"not a notebook: {problem}"
                return outcome, _feedback(job, outcome, [], [], problem)
            if not qs:
                outcome.status = f"no graded questions for lab {job.lab}"
            run_dir = work / "run"
            shutil.copytree(job.notebook.parent, run_dir,
                            ignore=lambda d, names: [n for n in names if n.endswith(".ipynb") and n != job.notebook.name])
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
            code, killed = _run_limited(
                [self.python, "-m", "lab_utils.grading.execute", str(src), str(executed),
                 "--cwd", str(run_dir), "--cell-timeout", str(self.timeout),
                 "--status", str(status_file), "--kernel", self.kernel],
                timeout=self.timeout, memory_mb=self.memory_mb,
                env=self._env(_snapshot_lab_utils(work / "kernel-lib"), work, key), cwd=work,
                log=work / "execute.log")
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
        code, killed = _run_limited(
            [self.python, "-m", "lab_utils.grading.checkrun", "--lab", lab, "--answers", str(answers_dir),
             "--out", str(out), "--seed", str(seed)], timeout=self.check_timeout, memory_mb=self.memory_mb,
            env=self._env(work=work, key=key), cwd=work, log=work / "check.log")
        try:
            return json.loads(out.read_text())
        except (OSError, ValueError):
            reason = {"timeout": "timed out", "memory": "ran out of memory"}.get(killed, f"exited with {code}")
            return [{"id": q.id, "points": q.points, "earned": 0.0, "status": "error",
                     "message": f"the checking process {reason}"} for q in questions_for(lab)]

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
        _run_limited(
            [self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "lab_utils.grading.hidden",
             "--answers", str(answers_dir), "--hidden-report", str(report), "--rootdir", str(tests),
             "-o", "addopts=", str(tests)],
            timeout=self.check_timeout, memory_mb=self.memory_mb, env=self._env(work=work, key=key), cwd=tests,
            log=work / "hidden.log")
        try:
            return json.loads(report.read_text())
        except (OSError, ValueError):
            return [{"name": "hidden_tests", "outcome": "error", "points": 1.0,
                     "message": "the hidden tests did not report (timed out or crashed)"}]

    def _keep_executed(self, job: Job, executed: Path) -> None:
        import nbformat

        if not executed.exists():
            return
        try:
            nb = nbformat.read(str(executed), as_version=4)
        except Exception:
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
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read the file ({exc})"
    try:
        nb = nbformat.reads(raw, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"not valid notebook JSON ({first[:200]})"
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


def _run_status(code, killed: str, status_file: Path, timeout: float, memory_mb: int) -> str:
    if killed == "timeout":
        return f"timeout: stopped after {timeout:.0f} s; answers saved before then were graded"
    if killed == "memory":
        return (f"memory limit: used more than {memory_mb} MB and was stopped; answers saved "
                "before then were graded")
    try:
        info = json.loads(status_file.read_text())
    except (OSError, ValueError):
        info = {"outcome": "failed", "detail": ""}
    outcome = info.get("outcome", "failed")
    if code is not None and code < 0:
        sig = -code
        return f"killed by signal {sig}"
    if outcome == "ok":
        return "ok"
    if outcome == "cell errors":
        detail = info.get("detail", "")
        if "MemoryError" in detail:
            return "memory limit: a cell raised MemoryError"
        return f"cell errors: {detail[:160]}"
    if outcome == "kernel died":
        return "kernel died: the notebook's kernel stopped; answers saved before then were graded"
    if outcome == "cell timeout":
        return "timeout: a cell ran past the limit"
    if outcome == "started":
        return "failed: the run stopped without a report"
    return f"failed: {info.get('detail', '')[:160]}"


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
    lines = [f"# Lab {job.lab} — {job.student}", "",
             f"Score: **{outcome.total:g} / {possible:g}**", "", f"Run: {outcome.status}", ""]
    if problem:
        lines += [f"The notebook could not be graded: {problem}.",
                  "Submit the .ipynb file saved by JupyterLab (File > Save), not a renamed or edited copy.", ""]
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
            lines.append(f"- {h['name']}: {mark} ({h['points'] if mark == 'passed' else 0:g}/{h['points']:g})")
        lines.append("")
    return "\n".join(lines)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --- the gradebook -----------------------------------------------------------------------------

def write_gradebook(out: Path, outcomes: list[Outcome]) -> Path:
    """Write gradebook.csv atomically: a header, a points_possible row, one row per student and lab."""
    qids = sorted({q for o in outcomes for q in o.possible})
    possible = {}
    for o in outcomes:
        possible.update(o.possible)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["student", "lab", *qids, "total", "status"])
    w.writerow(["points_possible", "", *[f"{possible[q]:g}" for q in qids],
                f"{sum(possible.values()):g}", ""])
    for o in sorted(outcomes, key=lambda o: (o.student, o.lab)):
        w.writerow([o.student, o.lab, *[f"{o.scores[q]:g}" if q in o.scores else "" for q in qids],
                    f"{o.total:g}", o.status])
    path = out / "gradebook.csv"
    _atomic_write(path, buf.getvalue())
    return path


def grade_class(submissions: Path, out: Path, hidden_tests: Path | None = None, workers: int = 1,
                timeout: float = 900, memory_mb: int = 8192, force: bool = False,
                parameters: dict | None = None, progress=print, seed: int | None = None) -> list[Outcome]:
    """Grade every notebook under `submissions` into `out`; returns the outcomes."""
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    jobs, warnings = discover(submissions)
    for w in warnings:
        progress(f"warning: {w}")
    out.mkdir(parents=True, exist_ok=True)
    cache = out / ".cache"
    if seed is None:
        seed = instructor_seed(progress)
    grader = Grader(out, hidden_tests, timeout=timeout, memory_mb=memory_mb, parameters=parameters,
                    seed=seed)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    t0 = time.monotonic()
    try:
        todo: list[Job] = []
        for job in jobs:
            cached = _load_cached(cache, job, grader.job_key(job))
            if cached is not None and not force:
                outcomes.append(cached)
            else:
                todo.append(job)
        if len(jobs) - len(todo):
            progress(f"{len(jobs) - len(todo)} unchanged notebook(s) kept from the last run "
                     "(--force regrades them)")
        progress(f"grading {len(todo)} notebook(s) with {workers} worker(s), "
                 f"{timeout:.0f} s and {memory_mb} MB each")
        done = 0
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(grader.grade, job): job for job in todo}
            for fut in as_completed(futures):
                job = futures[fut]
                try:
                    outcome, feedback = fut.result()
                except Exception as exc:  # a bug in the grader must not lose the others' grades
                    outcome = Outcome(job.student, job.lab, status=f"grader error: {exc}"[:200])
                    for q in questions_for(job.lab):
                        outcome.possible[q.id] = q.points
                        outcome.scores[q.id] = 0.0
                    feedback = f"# Lab {job.lab} — {job.student}\n\nThe grader failed: {exc}\n"
                with lock:
                    done += 1
                    outcomes.append(outcome)
                    _atomic_write(out / "feedback" / _safe(job.student) / f"{job.lab}.md", feedback)
                    _save_cached(cache, outcome)
                    write_gradebook(out, outcomes)
                    elapsed = time.monotonic() - t0
                    eta = elapsed / done * (len(todo) - done)
                    progress(f"[{done}/{len(todo)}] {job.student} lab {job.lab}: "
                             f"{outcome.total:g}/{sum(outcome.possible.values()):g} — {outcome.status} "
                             f"({outcome.seconds:.0f} s; about {eta:.0f} s left)")
        path = write_gradebook(out, outcomes)
        progress(f"gradebook: {path}")
        return outcomes
    finally:
        grader.close()


def _cache_path(cache: Path, student: str, lab: str) -> Path:
    return cache / _safe(student) / f"{lab}.json"


def _load_cached(cache: Path, job: Job, key: str) -> Outcome | None:
    try:
        data = json.loads(_cache_path(cache, job.student, job.lab).read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    return Outcome(**data)


def _save_cached(cache: Path, outcome: Outcome) -> None:
    _atomic_write(_cache_path(cache, outcome.student, outcome.lab), json.dumps(asdict(outcome)))
