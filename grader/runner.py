"""Where the notebooks run: a local pool of worker threads (the default), or Ray tasks.

Both call the same `Grader.grade` on each job, so the limits and the sandbox are the same; both
hand every finished result to `on_result` in the calling thread's order of completion, which saves
it before the next one is reported.

With Ray each submission is one task (one CPU). The task receives the student's folder as bytes,
so it runs on any node of a cluster; it grades into a private folder on that node and returns the
outcome, the feedback and the executed notebook for the driver to write. A task whose worker dies
is retried once by Ray; one that still fails gets a "grader error" row and is graded again by the
next run. Ray is imported only when asked for.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from .discovery import MAX_FOLDER_BYTES  # also the cap on a student's folder shipped to a Ray task
from .gradebook import Job, Outcome
from .sandbox import Status, Stopped, kill_tree
from .untrusted import plain, read_bytes

RAY_START_WAIT_S = float(os.environ.get("LAB_RAY_START_WAIT_S", 120))
# Ray's own start-up timeouts, raised for a local cluster on a loaded machine (its raylet gives up
# after 15 s when the metrics agent is slow to start, its workers after 60 s); the local cluster's
# processes read them from the environment. Values already set by the instructor win.
RAY_PATIENCE = {
    "RAY_agent_register_timeout_ms": str(int(RAY_START_WAIT_S * 1000)),
    "RAY_worker_register_timeout_seconds": str(int(RAY_START_WAIT_S)),
    "RAY_raylet_start_wait_time_s": str(int(RAY_START_WAIT_S)),
}

Result = tuple[Job, Outcome | None, str, bytes | None, str]  # job, outcome, feedback, executed, error


class Progress:
    """One console line per finished notebook: a bar, done/total, failures, time left."""

    def __init__(self, total: int, emit: Callable[[str], None], width: int = 20):
        self.total, self.emit, self.width = total, emit, width
        self.done = self.failed = 0
        self.t0 = time.monotonic()

    def update(self, outcome: Outcome) -> str:
        self.done += 1
        self.failed += outcome.kind.failed
        elapsed = time.monotonic() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        filled = round(self.width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (self.width - filled)
        line = (
            f"[{self.done}/{self.total}] {bar} {self.failed} failed, about {left:.0f} s left | "
            f"{plain(outcome.student, 80)} lab {outcome.lab}: {outcome.total:g}/{sum(outcome.possible.values()):g}"
            f" — {plain(outcome.status, 300)} ({outcome.seconds:.0f} s)"
        )
        self.emit(line)
        return line


def run_local(grader, jobs: list[Job], workers: int, on_result: Callable[[Result], None]) -> None:
    """Grade `jobs` on `workers` threads. Ctrl-C (or any exception here) stops the class within
    seconds: no new run starts, the runs in flight are killed and their grades dropped; every grade
    already handed to `on_result` is kept."""
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = {pool.submit(grader.grade, job): job for job in jobs}
    try:
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                outcome, feedback = fut.result()
            except Stopped:
                continue
            except Exception as exc:  # a bug in the grader must not lose the others' grades
                on_result((job, None, "", None, f"{type(exc).__name__}: {exc}"))
                continue
            on_result((job, outcome, feedback, None, ""))
    except BaseException:
        grader.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        kill_runs()
        deadline = time.monotonic() + STOP_WAIT_S
        for fut in futures:  # the runs' processes are gone: their threads end at once
            try:
                fut.exception(timeout=max(0.0, deadline - time.monotonic()))
            except BaseException:
                continue
        raise
    pool.shutdown(wait=True)


STOP_WAIT_S = 10.0


def kill_runs() -> None:
    """Kill every run this process started (each one's guard names this process), and their trees."""
    import psutil

    me = str(os.getpid())
    try:
        children = psutil.Process().children(recursive=False)
    except psutil.Error:
        return
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "--guard" in cmd and me in cmd:
            kill_tree(child.pid)


# --- Ray ---------------------------------------------------------------------------------------


def _folder_bytes(job: Job) -> dict[str, bytes]:
    """The files of the student's folder a run needs: the notebook, and the non-notebook files."""
    files: dict[str, bytes] = {}
    size = 0
    for p in sorted(job.notebook.parent.rglob("*")):
        if p.is_symlink() or not p.is_file() or (p.suffix == ".ipynb" and p != job.notebook):
            continue  # a link is never followed (the local run refuses the folder; so does the task)
        data = read_bytes(p, MAX_FOLDER_BYTES)
        size += len(data)
        if size > MAX_FOLDER_BYTES:
            raise ValueError(f"{job.student}'s folder is larger than {MAX_FOLDER_BYTES >> 20} MB")
        files[str(p.relative_to(job.notebook.parent))] = data
    return files


def grade_shipped(
    config: dict, student: str, lab: str, name: str, files: dict[str, bytes]
) -> tuple[dict, str, bytes | None]:
    """A Ray task's body: rebuild the student's folder here, grade it, return what the driver writes."""
    from .grader import Grader

    home = Path(tempfile.mkdtemp(prefix="lab-grader-task-"))
    try:
        folder = home / "submission"
        for rel, data in files.items():
            dest = folder / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        grader = Grader(home / "out", **config)
        try:
            outcome, feedback = grader.grade(Job(student, lab, folder / name))
        finally:
            grader.close()
        executed = home / "out" / "executed"
        kept = next(executed.rglob(name), None) if executed.exists() else None
        return asdict(outcome), feedback, kept.read_bytes() if kept else None
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_ray(
    config: dict,
    jobs: list[Job],
    on_result: Callable[[Result], None],
    *,
    address: str | None,
    num_cpus: int,
    progress: Callable[[str], None],
) -> None:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--ray needs Ray: pip install -r requirements/course-cpu.txt (plain `ray`)"
        ) from None

    repo = Path(__file__).resolve().parent.parent
    packages = [repo / "lab_utils", repo / "grader"]  # the course library and the judge
    started = False
    if not ray.is_initialized():
        if address:
            # an existing cluster gets this checkout's lab_utils with every task
            kwargs = {"address": address, "runtime_env": {"py_modules": [str(p) for p in packages]}}
        else:
            for name, value in RAY_PATIENCE.items():
                os.environ.setdefault(name, value)
            path = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
            kwargs = {
                "num_cpus": num_cpus,
                "include_dashboard": False,
                "runtime_env": {"env_vars": {"PYTHONPATH": path}},
            }
        try:
            with _patient_ray_start(ray):
                ray.init(log_to_driver=False, **kwargs)
        except Exception as exc:
            ray.shutdown()
            raise RuntimeError(f"Ray did not start: {exc}") from exc
        if not address:
            progress(f"started a local Ray cluster with {num_cpus} CPU(s)")
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=1)(grade_shipped)
        pending = {}
        for job in jobs:
            try:
                files = _folder_bytes(job)
            except (OSError, ValueError) as exc:
                on_result((job, None, "", None, f"cannot ship the folder: {exc}"))
                continue
            ref = task.remote(config, job.student, job.lab, job.notebook.name, files)
            pending[ref] = job
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    data, feedback, executed = ray.get(ref)
                except Exception as exc:  # the task failed twice (worker died) or raised
                    on_result((job, None, "", None, f"ray task failed: {type(exc).__name__}: {exc}"))
                    continue
                on_result((job, Outcome(**data), feedback, executed, ""))
    finally:
        if started:
            ray.shutdown()


@contextlib.contextmanager
def _patient_ray_start(ray):
    """Let a local Ray node start on a loaded machine (both limits are constants in Ray 2.60).

    1. The raylet waits 15 s for its dashboard agent to write its ports to files, then aborts
       (ray-project/ray issue 65983, open). With plain `ray` (no dashboard extras) the agent runs
       in minimal mode and always writes -1 ("not in use") for its listen and metrics ports, so
       those files are written with -1 before the raylet starts (the agent later writes the same),
       and the runtime-env agent gets a fixed free port written the same way (it binds the port
       it is given).
    2. `Node.__init__` gives up 30 s after the raylet started; while `ray.init` runs, its node
       lookup (`ray._private.services.get_node`) retries for up to RAY_START_WAIT_S
       (env LAB_RAY_START_WAIT_S).
    Both patches are undone when `ray.init` returns; another Ray version keeps its own behaviour.
    """
    private = getattr(ray, "_private", None)
    services = getattr(private, "services", None)
    raylet = getattr(ray, "_raylet", None)
    original_get = getattr(services, "get_node", None)
    original_start = getattr(services, "start_raylet", None)
    names = [
        getattr(raylet, n, None)
        for n in ("DASHBOARD_AGENT_LISTEN_PORT_NAME", "METRICS_AGENT_PORT_NAME", "METRICS_EXPORT_PORT_NAME")
    ]
    persist = getattr(raylet, "persist_port", None)
    dependency_error = getattr(getattr(private, "utils", None), "get_dashboard_dependency_error", None)
    if None in (original_get, original_start, persist, dependency_error, *names):
        yield
        return
    minimal = dependency_error() is not None
    params = inspect.signature(original_start).parameters
    runtime_env_name = getattr(raylet, "RUNTIME_ENV_AGENT_PORT_NAME", None)
    if runtime_env_name is None:
        yield
        return

    def get_node(*args, **kwargs):
        deadline = time.monotonic() + RAY_START_WAIT_S
        while True:
            try:
                return original_get(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def start_raylet(*args, **kwargs):
        bound = inspect.signature(original_start).bind(*args, **kwargs)
        given = bound.arguments
        session_dir, node_id = given.get("session_dir"), given.get("node_id")
        if minimal and session_dir and node_id:
            for name in names:
                persist(session_dir, node_id, name, -1)
            if "runtime_env_agent_port" in given or "runtime_env_agent_port" in params:
                port = given.get("runtime_env_agent_port") or _free_port()
                given["runtime_env_agent_port"] = port  # the agent binds the port it is given
                persist(session_dir, node_id, runtime_env_name, port)
        return original_start(*bound.args, **bound.kwargs)

    services.get_node = get_node
    services.start_raylet = start_raylet
    try:
        yield
    finally:
        services.get_node = original_get
        services.start_raylet = original_start


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def error_outcome(job: Job, error: str, questions) -> Outcome:
    outcome = Outcome(job.student, job.lab, status=Status.GRADER_ERROR.text(error[:200]))
    for q in questions:
        outcome.possible[q.id] = q.points
        outcome.scores[q.id] = 0.0
    return outcome
