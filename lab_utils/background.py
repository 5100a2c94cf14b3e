"""The set-up that `make lab` leaves for later, built in the background while JupyterLab is open.

`make lab` prepares what lab 00 needs (the environment and the course model), starts this builder
and opens JupyterLab. The builder runs the other set-up targets of the Makefile one at a time (the
draft model, the Triton environment, lab 12's adapters and Prometheus, lab 13's MoE, bubblewrap),
appends each one's output to `out/setup-background/build.log` and keeps its state in `state.json`
beside it. A lab's setup cell reads that state (`lab_utils.setup.report_setup`): a step still being
built is shown with its progress and the time left, and the lab waits for the steps it needs.

    python -m lab_utils.background start TARGET... [--make CMD]   # unless a builder already runs
    python -m lab_utils.background status
    python -m lab_utils.background stop      # the step in progress is ended; the next `make lab` resumes

Only one builder runs at a time: it holds an exclusive lock on `builder.lock` for its whole life,
so a second `make lab` finds it and starts nothing. Stopping it ends the step in progress (every
step writes its result under a temporary name and renames it last, so nothing half-built is ever
taken for done), except an apt install, which is left to finish: an interrupted dpkg needs repair.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .runtime import repo_root

# Typical seconds of each target, for the "about N s left" a lab shows before a step has said how far
# it is: a fresh-clone `make setup` on an AMD EPYC, 2 shared cores, 2026-12-05 (draft 281 s, adapters
# 166 s, triton-env 49 s, moe 13 s plus make's start); prometheus and bubblewrap were already
# installed there, so theirs are allowances for an apt install, not measurements.
TYPICAL_S = {
    "draft": 280,
    "triton-env": 50,
    "adapters": 170,
    "prometheus": 40,
    "moe": 20,
    "reasoning": 260,
    "sandbox": 15,
}
# Targets that install system packages with apt: never interrupted (an interrupted dpkg needs repair).
APT_TARGETS = {"prometheus": "prometheus", "sandbox": "bwrap"}
# Which labs wait for which background target (a step of lab_utils.setup, or a system tool).
LABS_NEEDING = {
    "draft": ("04", "05", "11"),
    "triton-env": ("07",),
    "adapters": ("12",),
    "prometheus": ("12",),
    "moe": ("13",),
    "reasoning": ("15",),
    "sandbox": (),
}
_LEFT = re.compile(r"about (\d+) s left")


def folder() -> Path:
    """Where the builder keeps its log, state and lock (LAB_BACKGROUND_DIR overrides it)."""
    override = os.environ.get("LAB_BACKGROUND_DIR")
    return Path(override) if override else repo_root() / "out" / "setup-background"


def log_path() -> Path:
    return folder() / "build.log"


def target_done(name: str) -> bool:
    """True when a target has nothing left to do (a set-up step that is ready, a tool on PATH)."""
    if name in APT_TARGETS:
        return shutil.which(APT_TARGETS[name]) is not None
    from .setup import STEPS

    return name in STEPS and STEPS[name].done()


# ------------------------------------------------------------------------------------------ state
@dataclass
class Job:
    """One target of the builder and where it stands."""

    name: str
    status: str = "queued"  # queued | running | done | failed | stopped
    started: float | None = None  # time.time()
    seconds: float | None = None


def _read_state() -> dict | None:
    try:
        state = json.loads((folder() / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("jobs"), list) else None


def _write_state(state: dict) -> None:
    path = folder() / "state.json"
    tmp = path.with_name(f"state.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def builder_alive() -> bool:
    """True while a builder holds the lock (a crashed builder's lock goes with its process)."""
    import fcntl

    try:
        fd = os.open(folder() / "builder.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def status() -> dict | None:
    """The running builder's state: {"pid", "started", "jobs": [{"name", "status", ...}]}; None
    when no builder runs. A job a dead builder left "running" or "queued" reads as "stopped"."""
    state = _read_state()
    if state is None:
        return None
    if not builder_alive():
        for job in state["jobs"]:
            if job["status"] in ("queued", "running"):
                job["status"] = "stopped"
        state["alive"] = False
        return state
    state["alive"] = True
    return state


def last_log_line(max_bytes: int = 4096) -> str:
    """The last non-empty line of the build log (a progress bar's last redraw)."""
    try:
        with open(log_path(), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [p.strip() for p in re.split(r"[\r\n]+", tail) if p.strip()]
    return lines[-1][-160:] if lines else ""


def seconds_left(state: dict, name: str, now: float | None = None) -> float | None:
    """About how long until `name` is built: what the running job has left (its own "about N s
    left" when it prints one, else its typical time) plus the typical times of the jobs queued
    before it and of `name` itself. None when `name` is not queued or running."""
    now = time.time() if now is None else now
    left = 0.0
    for job in state["jobs"]:
        if job["status"] == "running":
            said = _LEFT.findall(last_log_line())
            spent = now - (job.get("started") or now)
            left += float(said[-1]) if said else max(TYPICAL_S.get(job["name"], 60) - spent, 5.0)
        elif job["status"] == "queued":
            left += TYPICAL_S.get(job["name"], 60)
        else:
            continue
        if job["name"] == name:
            return left
    return None


def describe(state: dict, name: str) -> str:
    """One line: where `name` stands in the builder, with the time left."""
    jobs = [j["name"] for j in state["jobs"]]
    job = next((j for j in state["jobs"] if j["name"] == name), None)
    if job is None:
        return f"{name}: not one of the builder's steps ({', '.join(jobs)})"
    where = f"step {jobs.index(name) + 1}/{len(jobs)} of the background set-up"
    left = seconds_left(state, name)
    if job["status"] == "running":
        spent = time.time() - (job.get("started") or time.time())
        return f"building now ({where}), {spent:.0f} s so far, about {left:.0f} s left"
    if job["status"] == "queued":
        return f"queued ({where}), about {left:.0f} s left"
    if job["status"] == "done":
        return f"built in the background in {job.get('seconds') or 0:.0f} s"
    return f"{job['status']} in the background (log: {log_path()})"


# ----------------------------------------------------------------------------------------- builder
def _clean_env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(targets: list[str], make: list[str]) -> int:
    """The builder itself: hold the lock, run `make TARGET` for each target in turn, record each."""
    import fcntl

    folder().mkdir(parents=True, exist_ok=True)
    lock = os.open(folder() / "builder.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("another background builder holds the lock; this one exits", flush=True)
        return 0
    jobs = [Job(t) for t in targets]
    state = {"pid": os.getpid(), "started": time.time(), "make": make, "jobs": [vars(j) for j in jobs]}
    current: dict = {"proc": None, "job": None}
    stopping = {"asked": False}

    def save() -> None:
        state["jobs"] = [vars(j) for j in jobs]
        _write_state(state)

    def on_stop(signum, frame) -> None:
        stopping["asked"] = True
        proc, job = current["proc"], current["job"]
        if proc is not None and job is not None and job.name not in APT_TARGETS:
            print(f"== stop asked: ending {job.name} ==", flush=True)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        elif job is not None:
            print(f"== stop asked: {job.name} installs with apt and is left to finish ==", flush=True)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_stop)
    save()
    t_all = time.monotonic()
    print(f"== background set-up, pid {os.getpid()}: {' '.join(targets)} ==", flush=True)
    for job in jobs:
        if stopping["asked"]:
            job.status = "stopped"
            continue
        if target_done(job.name):
            job.status, job.seconds = "done", 0.0
            save()
            continue
        job.status, job.started = "running", time.time()
        save()
        print(f"== [{job.name}] started {time.strftime('%H:%M:%S')} ==", flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [*make, job.name],
            cwd=str(repo_root()),
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
            start_new_session=True,  # its own group: a stop ends make and everything it started
        )
        current.update(proc=proc, job=job)
        if stopping["asked"]:  # asked between the start and the line above
            on_stop(signal.SIGTERM, None)
        try:
            code = proc.wait(timeout=None)
        finally:
            current.update(proc=None, job=None)
        job.seconds = time.monotonic() - t0
        if stopping["asked"] and code != 0:
            job.status = "stopped"
            _kill_group(proc.pid)
        else:
            job.status = "done" if code == 0 else "failed"
        save()
        print(f"== [{job.name}] {job.status} after {job.seconds:.0f} s (exit {code}) ==", flush=True)
    done = sum(j.status == "done" for j in jobs)
    print(
        f"== background set-up {'stopped' if stopping['asked'] else 'finished'} after "
        f"{time.monotonic() - t_all:.0f} s: {done}/{len(jobs)} done ==",
        flush=True,
    )
    state["ended"] = time.time()
    save()
    os.close(lock)  # releases the lock: the builder is gone
    return 0


def _kill_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGKILL what is left of a stopped step's process group after `grace_s`."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start(targets: list[str], make: list[str]) -> int:
    """Start a builder for the targets not yet done, unless one already runs. Returns its pid or 0."""
    folder().mkdir(parents=True, exist_ok=True)
    if builder_alive():
        state = _read_state() or {}
        print(f"background set-up: a builder is already running (pid {state.get('pid')}); log: {log_path()}")
        return 0
    todo = [t for t in targets if not target_done(t)]
    if not todo:
        print("background set-up: nothing to build, every step is ready")
        return 0
    with open(log_path(), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lab_utils.background", "run", *todo, "--make", shlex.join(make)],
            cwd=str(repo_root()),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(_clean_env(), PYTHONPATH=str(repo_root())),
            start_new_session=True,  # Ctrl-C in the terminal reaches JupyterLab, not the builder
        )
    total = sum(TYPICAL_S.get(t, 60) for t in todo)
    print(
        f"background set-up (pid {proc.pid}): {', '.join(todo)}, one at a time, about {total // 60 + 1} min; "
        f"log: {log_path()}; `python -m lab_utils.background status` shows where it is"
    )
    return proc.pid


def stop(wait_s: float = 300.0) -> None:
    """Ask the builder to stop and wait until it has (an apt install in progress is left to finish)."""
    state = _read_state()
    if state is None or not builder_alive():
        return
    try:
        os.kill(int(state["pid"]), signal.SIGTERM)
    except (ProcessLookupError, KeyError, ValueError):
        return
    t0 = last = time.monotonic()
    while builder_alive() and time.monotonic() - t0 < wait_s:
        time.sleep(0.5)
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            print(f"background set-up: stopping, not ready yet after {last - t0:.0f} s ({last_log_line()})")
    after = status() or state
    done = [j["name"] for j in after["jobs"] if j["status"] == "done"]
    left = [j["name"] for j in after["jobs"] if j["status"] != "done"]
    print(
        f"background set-up stopped: built {', '.join(done) or 'nothing'}"
        + (
            f"; not built yet: {', '.join(left)} (the next `make lab` or `make setup` builds them)"
            if left
            else ""
        )
    )


def print_status() -> None:
    state = status()
    if state is None:
        print("background set-up: never started here")
        return
    print(f"background set-up (pid {state.get('pid')}): {'running' if state['alive'] else 'not running'}")
    for job in state["jobs"]:
        print(f"  {job['name']:11s} {describe(state, job['name']) if state['alive'] else job['status']}")
    print(f"  log: {log_path()}; last line: {last_log_line()}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab_utils.background")
    parser.add_argument("action", choices=["start", "run", "stop", "status"])
    parser.add_argument("targets", nargs="*", help="Makefile targets, built in this order")
    parser.add_argument(
        "--make", default="make --no-print-directory", help="the make command (with variables)"
    )
    args = parser.parse_args(argv)
    make = shlex.split(args.make)
    if args.action == "start":
        start(args.targets, make)
    elif args.action == "run":
        return run(args.targets, make)
    elif args.action == "stop":
        stop()
    else:
        print_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
