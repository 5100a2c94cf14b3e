"""Grading a class: discovery, the cache of finished grades, the runs on local workers or Ray, and
the gradebook, summary and histogram."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from . import runner as _runner
from .discovery import discover
from .gradebook import (
    Job,
    Outcome,
    atomic_write,
    load_result,
    save_result,
    summary_text,
    write_gradebook,
    write_histogram,
)
from .gradebook import safe_name as _safe
from .grader import Grader
from .instructor import grading_key, instructor_seed, seed_warning, signing_key
from .registry import questions_for
from .sandbox import (
    STOP,
    Status,
)
from .untrusted import (
    markdown_text,
    plain,
)


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
