"""Limited child processes for the grader: a wall-time limit, a memory limit, no core files, and
nothing left running afterwards.

Every command the grader starts (papermill, the answer checker, the hidden tests) goes through
`run_limited`. The child is started in its own session with `start_new_session=True` (safe in a
thread pool, unlike a `preexec_fn`) under a small guard: this file run as a script. The guard sets
its own limits (they are inherited by everything it starts), runs the command, and kills the whole
tree if the grader that started it dies (a SIGKILLed grader leaves no notebook running on its own).

The parent watches the resident memory of the whole tree (the kernel and any server the notebook
started), not the address space: vLLM and torch reserve far more virtual memory than they use.

This module imports only the standard library at the top, so the guard starts fast.
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class Status(str, enum.Enum):
    """How one submission's grading ended; the gradebook's status column starts with the value."""

    OK = "ok"
    CELL_ERRORS = "cell errors"  # some cells raised; every question was still scored
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory limit"
    KERNEL_DIED = "kernel died"
    KILLED = "killed"  # by a signal, from inside the notebook
    FAILED = "failed"  # the run stopped without a report
    NOT_A_NOTEBOOK = "not a notebook"
    EMPTY = "empty notebook"
    WRONG_LAB = "wrong lab"
    DUPLICATE = "duplicate"
    UNREADABLE = "unreadable"
    NO_QUESTIONS = "no graded questions"
    GRADER_ERROR = "grader error"

    def text(self, detail: str = "") -> str:
        """The status column: `value` or `value: detail` (no timings, so reruns compare equal)."""
        return f"{self.value}: {detail}" if detail else self.value

    @property
    def failed(self) -> bool:
        """Counted as a failure in the progress line (cell errors are the learner's, not a failure)."""
        return self not in (Status.OK, Status.CELL_ERRORS)

    @classmethod
    def of(cls, text: str) -> Status:
        """The status a status-column text starts with (GRADER_ERROR for an unknown one)."""
        for s in sorted(cls, key=lambda s: -len(s.value)):
            if text == s.value or text.startswith(s.value + ":") or text.startswith(s.value + " "):
                return s
        return cls.GRADER_ERROR


# --- the parent side ---------------------------------------------------------------------------


def tree_rss_mb(pid: int) -> float:
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
        except psutil.Error:  # it exited between listing and reading: it uses nothing now
            continue
    return total / 2**20


def kill_tree(pid: int) -> None:
    """Kill a process's descendants, then its process group (a Jupyter kernel may start its own
    session, so the group alone is not enough; the group goes last because it may hold the caller)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            continue  # already exited
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def run_limited(
    cmd: list[str], *, timeout: float, memory_mb: int, env: dict, cwd: Path, log: Path
) -> tuple[int | None, Status | None]:
    """Run cmd in its own session under a wall-time and a resident-memory limit.

    Returns (exit code, None) when it finished, or (None, Status.TIMEOUT | Status.MEMORY_LIMIT)
    when it was stopped. A negative exit code is the signal that ended it.
    """
    guarded = [cmd[0], str(Path(__file__).resolve()), "--guard", str(os.getpid()), "--", *cmd]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            guarded,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(cwd),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        stopped: Status | None = None
        code: int | None = None
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() > deadline:
                    stopped = Status.TIMEOUT
                elif memory_mb and tree_rss_mb(proc.pid) > memory_mb:
                    stopped = Status.MEMORY_LIMIT
                if stopped:
                    break
        finally:
            # a kernel or server left running by a crashed papermill is still ours to stop
            kill_tree(proc.pid)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # unkillable (D state); the guard's own watch stops it when it wakes
        return (None, stopped) if stopped else (code, None)


# --- the guard (this file run as a script) -----------------------------------------------------


def _guard(parent: int, cmd: list[str]) -> int:
    import resource
    import threading

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing kernel writes no core file
    child = subprocess.Popen(cmd)  # same session and group as the guard, limits inherited

    def watch() -> None:
        while child.poll() is None:
            if os.getppid() != parent:  # the grader died: stop everything this run started
                try:
                    kill_tree(os.getpid())
                finally:
                    os._exit(137)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    code = child.wait()
    if code < 0:  # die of the same signal, so the grader sees what killed the run
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] != "--guard" or sys.argv[3] != "--":
        sys.exit("usage: sandbox.py --guard PARENT_PID -- COMMAND ...")
    sys.exit(_guard(int(sys.argv[2]), sys.argv[4:]))
