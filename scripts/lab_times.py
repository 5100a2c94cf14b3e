#!/usr/bin/env python3
"""Measure each lab's run time, as the "Run time on 2 cores" line at the top of a lab states it.

Runs the solution notebooks (a learner's finished Run All) headless with papermill, in the default
mode (LIGHT = False), in LIGHT mode, or both, on the CPU, and writes one table: the lab, the mode,
the wall time, the error cells and the cells that take the time. The machine is named in the table
(CPU model, cores, date): the numbers are this machine's on this day.

    python scripts/lab_times.py [--labs 00,12|all] [--mode default|light|both]
                                [--timeout S] [--out out/lab-times]

Each run gets its own process group, stopped whole when it passes --timeout; the servers a lab
starts stop with their kernel (lab_utils.servers). Writes OUT/lab-times.md, OUT/lab-times.json and
the executed notebooks under OUT/executed/. Exit status 0 when every run ended without an error cell.

The LIGHT figure a lab's title states is CI's: the solution's run through the grader in
tests/test_notebooks.py. `stated_light_seconds` reads it from the title in one form (STATED_FORM),
and `time_problem` says when a run is more than OFF_FACTOR off it; tests/test_lab_times.py holds
every lab to the form, tests/test_notebooks.py compares the figure with the session's solution runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SLOW_CELL_S = 5.0  # cells at least this long are listed as where the time goes
# The one form in which a solution's title cell states its LIGHT run through the grader in CI
STATED_LIGHT = re.compile(r"`LIGHT = True` through the grader in CI (\d+(?:\.\d+)?) s\b")
STATED_FORM = "`LIGHT = True` through the grader in CI N s (CI run of YYYY-MM-DD, 2 cores)"
OFF_FACTOR = 2.0  # a stated figure more than this far from a measured run, either way, is wrong
# ... and more than this many seconds from it: the grader's own start (sandbox, kernel, copy check)
# costs 15-25 s on 2 cores whatever the lab does, so a 12 s figure measured at 25 s on a busy
# machine is noise, not a text that misleads a learner
OFF_SLACK_S = 30.0


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {dt.date.today().isoformat()}"


def labs_named(spec: str) -> list[Path]:
    every = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
    if spec == "all":
        return every
    wanted = {s.strip().zfill(2) for s in spec.split(",") if s.strip()}
    found = [p for p in every if p.name[:2] in wanted]
    missing = wanted - {p.name[:2] for p in found}
    if missing:
        raise SystemExit(f"no solution notebook for lab(s) {', '.join(sorted(missing))}: see solutions/")
    return found


def cell_times(executed: Path) -> tuple[list[dict], int]:
    """[{cell, seconds, first line}] of the code cells over SLOW_CELL_S, slowest first, and the
    number of cells that raised."""
    nb = json.loads(executed.read_text())
    slow, errors = [], 0
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            errors += 1
        took = (cell.get("metadata", {}).get("papermill") or {}).get("duration") or 0
        if took >= SLOW_CELL_S:
            source = "".join(cell.get("source", ""))
            first = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")[:60]
            slow.append({"cell": i, "seconds": round(took, 1), "first": first})
    return sorted(slow, key=lambda c: -c["seconds"]), errors


def stated_light_seconds(path: Path) -> float:
    """The seconds a solution's title cell (its first markdown cell) states for its LIGHT run through
    the grader in CI, read from the one sentence of STATED_FORM.

    Raises:
        ValueError: naming the lab and the sentence to add, when the title states it not once.
    """
    cells = json.loads(path.read_text()).get("cells", [])
    title = next((c for c in cells if c.get("cell_type") == "markdown"), {})
    found = STATED_LIGHT.findall("".join(title.get("source", "")))
    if len(found) == 1:
        return float(found[0])
    how = "states it twice" if found else "does not state it"
    raise ValueError(
        f"{path.name}: the title cell {how} in the one form the tests read; put exactly one "
        f'"{STATED_FORM}" in its run-time paragraph, N being the duration of '
        f"tests/test_notebooks.py::test_solution_scores_full_marks[{path.stem}] in CI's last run"
    )


def time_problem(
    lab: str, stated: float, measured: float, factor: float = OFF_FACTOR, slack: float = OFF_SLACK_S
) -> str | None:
    """None when `measured` seconds are within `factor` of the `stated` ones either way, or within
    `slack` seconds of them; else what is off and what to change."""
    if stated / factor <= measured <= stated * factor or abs(measured - stated) <= slack:
        return None
    way = "slower" if measured > stated else "faster"
    return (
        f"{lab}: the title states `LIGHT = True` through the grader in CI {stated:g} s, but this "
        f"session's solution run took {measured:.0f} s, more than {factor:g}x {way}. If this run is "
        f"CI's and the lab changed, put {measured:.0f} s and the run's date in the title's sentence; "
        f"if the run is slow for another reason, find the cell (papermill's durations, "
        f"out/silent-cells.md) and make it fast again"
    )


def shared_time_problem(lab: str, stated: float, wall: float, fair: float, **kw) -> str | None:
    """time_problem for a run that shared the machine: `wall` its wall seconds, `fair` those less the
    other processes' share of the cores (tests/notebook_runs.Timed). Too slow only if `fair` is; too
    fast only if `wall` is (other processes never make a run faster)."""
    if wall < stated:
        return time_problem(lab, stated, wall, **kw)
    if fair <= stated:
        return None
    problem = time_problem(lab, stated, fair, **kw)
    if problem and fair < wall:
        problem += (
            f" (its wall time was {wall:.0f} s; {fair:.0f} s after taking away the share of the cores "
            "that other processes used meanwhile)"
        )
    return problem


def run_one(path: Path, light: bool, timeout: float, out: Path) -> dict:
    mode = "light" if light else "default"
    executed = out / "executed" / mode / path.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"lab-times-{path.name[:2]}-"))
    cmd = [sys.executable, "-m", "papermill", str(path), str(executed), "--cwd", str(work)]
    cmd += ["-p", "BACKEND", "cpu", "-p", "LIGHT", str(light), "--log-output", "--progress-bar"]
    started = time.monotonic()
    log = out / "logs" / f"{path.stem}-{mode}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            status = "ok" if rc == 0 else f"papermill exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            status = f"stopped after {timeout:.0f} s"
    seconds = time.monotonic() - started
    slow, errors = cell_times(executed) if executed.exists() else ([], 0)
    return {
        "lab": path.name[:2],
        "notebook": path.name,
        "mode": mode,
        "seconds": round(seconds, 1),
        "status": status,
        "error_cells": errors,
        "slow_cells": slow,
    }


def table(rows: list[dict], where: str) -> str:
    lines = [
        f"# Lab run times ({where})",
        "",
        'Solution notebooks run headless by papermill (BACKEND = "cpu"); wall time includes the kernel\'s',
        f"start. Cells of {SLOW_CELL_S:g} s or more are listed, slowest first.",
        "",
        "| lab | mode | seconds | status | error cells | where the time goes |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = "; ".join(f"cell {c['cell']} {c['seconds']:g} s ({c['first']})" for c in r["slow_cells"][:3])
        cells = cells.replace("|", "\\|")
        lines.append(
            f"| {r['lab']} | {r['mode']} | {r['seconds']:g} | {r['status']} | {r['error_cells']} | {cells} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", default="all", help="comma-separated lab numbers, or all")
    parser.add_argument("--mode", choices=("default", "light", "both"), default="both")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "lab-times")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    paths = labs_named(args.labs)
    modes = {"default": [False], "light": [True], "both": [False, True]}[args.mode]
    args.out.mkdir(parents=True, exist_ok=True)
    where = machine()
    print(f"measuring {len(paths) * len(modes)} run(s) on {where}", flush=True)
    rows = []
    for k, path in enumerate(paths, 1):
        for light in modes:
            row = run_one(path, light, args.timeout, args.out)
            rows.append(row)
            print(
                f"[{k}/{len(paths)}] {row['notebook']} {row['mode']}: {row['seconds']:g} s, {row['status']}, "
                f"{row['error_cells']} error cell(s)",
                flush=True,
            )
            (args.out / "lab-times.json").write_text(json.dumps({"machine": where, "runs": rows}, indent=1))
            (args.out / "lab-times.md").write_text(table(rows, where))
    print(table(rows, where))
    return 0 if all(r["status"] == "ok" and r["error_cells"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
