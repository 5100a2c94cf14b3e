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

The notebooks run on a local pool of worker threads or as Ray tasks (runner.py). One idea a file:
discovery.py finds the notebooks and copies a student's folder, instructor.py holds the private
seed and keys, this module grades one notebook (Grader), classrun.py grades a class. This module
keeps the names callers import from it (__all__).

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

import dataclasses
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

from lab_utils.grading.registry import lab_limits, lab_scenario
from lab_utils.grading.scoring import REFERENCE

from .discovery import MAX_DEPTH, MAX_FILE_BYTES, copy_submission, discover
from .fingerprint import file_digest, folder_digest, installed_packages, tree_digest
from .gradebook import (
    Job,
    Outcome,
    atomic_write,
    safe_name,
    write_gradebook,
)
from .instructor import grading_key, hidden_key, instructor_dir, instructor_seed, job_seed, seed_warning
from .judge import JUDGE_S_PER_QUESTION, Context, judge_budget, judge_lab
from .originality import pasted_references
from .record import MAX_OUTPUT_CHARS, feedback, truncate_outputs
from .registry import questions_for
from .run import apply_parameters, run_status
from .sandbox import (
    INSIDE_WORK,
    REPORT_FD,
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
    vllm_model_info_dir,
)
from .screen import read_notebook, screen
from .untrusted import (
    MAX_NOTEBOOK_BYTES,
    MAX_STATUS_BYTES,
    copy_tree,
    read_bytes,
)


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here and --no-sandbox was not given."""


def _gpu_visible() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


GRADER_VERSION = "4"

__all__ = [  # the names callers import from here (the stages before it); a class: classrun.grade_class
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_OUTPUT_CHARS",
    "Grader",
    "Job",
    "Outcome",
    "SandboxUnavailable",
    "Status",
    "copy_submission",
    "discover",
    "grading_key",
    "hidden_key",
    "instructor_dir",
    "instructor_seed",
    "job_seed",
    "seed_warning",
    "write_gradebook",
]

# kept for callers of the old private names (the code lives in the stage modules)
_atomic_write = atomic_write
_safe = safe_name
_feedback = feedback
_run_status = run_status
_read_notebook = read_notebook
_apply_parameters = apply_parameters
_truncate_outputs = truncate_outputs


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
        figure_check: bool = False,
        judge_s_per_question: float = JUDGE_S_PER_QUESTION,
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
        # CI: the kernel checks every figure it shows (lab_utils.viz.figure_check) into
        # OUT/figures/<student>/<lab>.jsonl, one JSON line per figure
        self.figure_check = figure_check
        if judge_s_per_question <= 0:
            raise ValueError(f"the judge's seconds per question must be positive, got {judge_s_per_question}")
        self.judge_s_per_question = judge_s_per_question
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
            "judge_s_per_question": self.judge_s_per_question,
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
        limits = [
            self.timeout_for(lab),
            self.memory_for(lab),
            self.check_timeout,
            self.disk_mb,
            self.tmp_mb,
            self.judge_s_per_question,
        ]
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
        # each at its own path: the run's mount table names no host folder it cannot see
        if job_in is not None:
            box.read_only[str(job_in)] = str(job_in)
        if job_out is not None:
            box.writable[str(job_out)] = str(job_out)
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
        info = vllm_model_info_dir()
        if info:  # read-only inside too, at the same path (sandbox.course_roots); execute.py copies it
            env["LAB_VLLM_MODEL_INFO"] = info
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
        """Grade one notebook through the stages: screen, run, judge, record. Returns the outcome
        and the feedback text."""
        t0 = time.monotonic()
        qs = questions_for(job.lab)
        outcome = Outcome(job.student, job.lab, key=self.job_key(job))
        for q in qs:
            outcome.possible[q.id] = q.points
            outcome.scores[q.id] = 0.0
        if job.problem:
            outcome.status = job.problem
            return outcome, feedback(job, outcome, [], [], job.problem)
        self._check_stop()
        work = Path(tempfile.mkdtemp(prefix=f"{_safe(job.student)}-{job.lab}-", dir=self.scratch))
        uid = lease_uid()
        try:
            # 1. screen: the file as data
            screened = screen(job.notebook, job.lab, qs, self.copies)
            outcome.flags += screened.flags
            if screened.nb is None:
                outcome.status = screened.problem
                return outcome, feedback(job, outcome, [], [], screened.problem)
            if not qs:
                outcome.status = Status.NO_QUESTIONS.text(f"lab {job.lab} has none")
            job_in, job_out = work / "in", work / "out"
            job_out.mkdir(parents=True)
            if why := copy_submission(job.notebook.parent, job_in / "files", job.notebook.name):
                outcome.status = Status.REFUSED.text(why)
                return outcome, feedback(job, outcome, [], [], outcome.status)
            (job_in / "files" / job.notebook.name).unlink(missing_ok=True)  # the instrumented copy runs
            answers_dir = job_out / "answers"
            answers_dir.mkdir()
            if self.sandboxed and privileged():  # the run's own uid writes there, and nowhere else
                for folder in (job_out, answers_dir):
                    os.chown(folder, uid, uid)
            seed = job_seed(self.seed, job.student, job.lab, self.key)
            # 2. run: the notebook in the sandbox
            status, reports = self._run(job, screened.nb, qs, seed, work, job_in, job_out, uid, outcome)
            if qs:
                outcome.status = status
            # 3. judge: the learner's code has finished running; from here it is only called
            self._check_stop()
            results = [
                r.to_dict() for r in judge_lab(job.lab, self._context(job, work, answers_dir, seed, uid))
            ]
            for r in results:  # a reference pasted in under the answer's name scores zero
                if r["id"] in screened.pasted.zeroed:
                    r.update(earned=0.0, status=REFERENCE, message=screened.pasted.zeroed[r["id"]])
            hidden = self._hidden(job.lab, answers_dir, work, uid)
            # 4. record
            for r in results:
                outcome.scores[r["id"]] = float(r["earned"])
            for h in hidden:
                qid = f"{job.lab}.hidden.{h['name']}"
                outcome.possible[qid] = h["points"]
                outcome.scores[qid] = h["points"] if h["outcome"] == "passed" else 0.0
            if not self.sandboxed:
                outcome.status = f"{outcome.status} (unsandboxed)"
            self._keep_executed(job, reports.get("notebook"))
            if self.figure_check:
                self._keep_figures(job, job_out / "figures.jsonl")
            if self.keep_answers:
                dest = self.out / "answers" / _safe(job.student) / job.lab
                shutil.rmtree(dest, ignore_errors=True)
                copy_tree(answers_dir, dest)  # regular files only: a FIFO or link is left out
                (dest / "_seed").write_text(str(seed))
            return outcome, feedback(job, outcome, results, hidden, "")
        finally:
            outcome.seconds = round(time.monotonic() - t0, 1)
            shutil.rmtree(work, ignore_errors=True)
            release_uid(uid)

    def _run(self, job: Job, nb, qs, seed: int, work: Path, job_in: Path, job_out: Path, uid: int, outcome):
        """Stage 2: instrument the notebook, run it in the sandbox; (status text, reports)."""
        from lab_utils.grading.probe import instrument

        answers_dir = job_out / "answers"
        names = sorted({n for q in qs for n in q.answers} | self._hidden_names(job.lab))
        apply_parameters(nb, {**self.parameters, "SEED": seed})
        # predictions are fixed where their check cell stands (names only predictions read)
        others = {n for q in qs if not q.predict for n in q.answers}
        predictions = {q.id: [n for n in q.answers if n not in others] for q in qs if q.predict}
        unchecked = instrument(nb, names, str(answers_dir), predictions)
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
        env = self._env(home, self._inside(work / "results.json", f"{INSIDE_WORK}/results.json"))
        if self.figure_check:
            env["LAB_FIGURE_CHECK"] = str(job_out / "figures.jsonl")
        # the run's status and executed notebook come over a pipe only the run's driver holds
        # (never a file the learner's uid could rewrite)
        reports: dict = {}
        code, killed = run_limited(
            [
                self.python,
                "-m",
                "lab_utils.grading.execute",
                str(job_in / "submitted.ipynb"),
                "-",
                "--cwd",
                run,
                "--copy-from",
                str(job_in / "files"),
                "--cell-timeout",
                str(timeout),
                "--report-fd",
                REPORT_FD,
                "--kernel",
                self.kernel,
            ],
            timeout=timeout,
            memory_mb=memory_mb,
            env=env,
            cwd=work,
            log=work / "execute.log",
            sandbox=self._sandbox(job_in, job_out, uid, job.lab),
            watch_dir=job_out,
            disk_mb=self.disk_mb,
            reports=reports,
        )
        return run_status(code, killed, reports.get("status"), timeout, memory_mb, self.disk_mb), reports

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
            budget_s=judge_budget(len(questions_for(job.lab)), self.judge_s_per_question),
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

    def _keep_figures(self, job: Job, figures: Path) -> None:
        dest = self.out / "figures" / _safe(job.student) / f"{job.lab}.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:  # written inside the sandbox: read under a cap, like the executed notebook
            dest.write_bytes(read_bytes(figures, MAX_NOTEBOOK_BYTES))
        except (OSError, ValueError):
            dest.write_text("")  # no figure was shown, or the file could not be read

    def _keep_executed(self, job: Job, executed: bytes | None) -> None:
        import nbformat

        if executed is None or len(executed) > MAX_NOTEBOOK_BYTES:
            return  # the run sent no notebook (killed before its first save), or one past the cap
        try:  # papermill's own copy, sent by the run's driver over its report pipe
            nb = nbformat.reads(executed.decode("utf-8"), as_version=4)
        except Exception:  # a kernel that broke its outputs: nothing worth keeping
            return
        truncate_outputs(nb)
        dest = self.out / "executed" / _safe(job.student) / job.notebook.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(dest, nbformat.writes(nb))
