"""What the notebook tests share: a grader run of one notebook, and the CI table's cells.

tests/test_notebooks.py runs the solutions (and judges their answers), tests/test_notebooks_student.py
the student copies, tests/test_zz_grading_table.py assembles the table from the cells both record.
`make test` runs the solutions in one pytest process and everything else in another
(scripts/test_streams.py), so what they share goes through files, not module state.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import nbformat

from grader.grader import Grader, Job

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in SOLUTIONS]
# the labs whose solutions this process runs (tests/test_notebooks.py): all, unless LAB_SOLUTION_LABS
# names some ("05,12,15"); scripts/test_streams.py splits the labs between its two pytest processes
ONLY = {lab.strip() for lab in os.environ.get("LAB_SOLUTION_LABS", "").split(",") if lab.strip()}
RUN_HERE = [p for p in SOLUTIONS if not ONLY or p.name[:2] in ONLY]
RUN_HERE_IDS = [p.stem for p in RUN_HERE]
NOTEBOOK_TIMEOUT = float(os.environ.get("LAB_NOTEBOOK_TIMEOUT", 1200))
SEED_A, SEED_B = 20261201, 777  # two grading seeds; each notebook's scenario seed derives from them
SKIP_SERVERS = {"RUN_VLLM": False, "RUN_REAL": False}


def grade(path: Path, out: Path, parameters: dict, seed: int, figure_check: bool = False) -> tuple:
    grader = Grader(
        out,
        timeout=NOTEBOOK_TIMEOUT,
        memory_mb=16384,
        parameters=parameters,
        seed=seed,
        keep_answers=True,
        copies="off",  # the published solution itself: the copy check is proven in test_originality
        figure_check=figure_check,  # OUT/figures/ci/NN.jsonl: each shown figure's readability problems
    )
    try:
        return grader.grade(Job("ci", path.name[:2], path))
    finally:
        grader.close()


def params(**extra) -> dict:
    base = {"BACKEND": "cpu"} if os.environ.get("LAB_FULL") == "1" else {"BACKEND": "cpu", "LIGHT": True}
    return {**base, **extra}


def memory_state() -> str:
    """What a memory failure needs to be told apart: the machine's memory, this process's address-space
    limit (kernels inherit it), and the largest processes."""
    import resource

    import psutil

    vm = psutil.virtual_memory()
    top = []
    for p in psutil.process_iter(["pid", "name", "memory_info"]):
        info = p.info.get("memory_info")
        if info is not None:
            top.append((info.rss, p.info["pid"], p.info["name"]))
    top = sorted(top, reverse=True)[:5]
    return (
        f"memory: {vm.available / 2**30:.1f} GiB available of {vm.total / 2**30:.1f}; "
        f"RLIMIT_AS of pytest {resource.getrlimit(resource.RLIMIT_AS)}; largest: "
        + ", ".join(f"{name} ({pid}) {rss / 2**30:.1f} GiB" for rss, pid, name in top)
    )


def last_student_cell_ran(out: Path, name: str) -> bool:
    nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and "grader-probe" not in c.metadata.get("tags", [])]
    return code[-1].execution_count is not None


def error_cells(out: Path, name: str) -> list[str]:
    """'cell N: Error: message' for each code cell of an executed notebook that raised."""
    nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
    return [
        f"cell {i}: {o.get('ename')}: {str(o.get('evalue'))[:200]}"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


BYPASSES = ("memorised", "imported", "pasted", "runtime copy", "copied prediction")
BYPASS_SHARE = 0.10  # each bypass earns at most this share of a lab's points
TABLE = REPO / "out" / "grading-table"


def record(lab: str, column: str, earned: float, possible: float) -> None:
    """One cell of the CI table (out/grading-table.md, assembled by test_zz_grading_table)."""
    TABLE.mkdir(parents=True, exist_ok=True)
    (TABLE / f"{lab}-{column.replace(' ', '_')}.json").write_text(
        json.dumps({"lab": lab, "column": column, "earned": earned, "possible": possible})
    )


def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has used since boot (/proc/stat: all but idle and
    iowait; steal counts, it is time someone else took)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (the grader waits for each)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Timed:
    """Wall seconds of a block, and the CPU seconds other processes used meanwhile (`others_cpu_s`):
    `make test` runs two pytest processes at once (scripts/test_streams.py), so part of a solution
    run's wall time is the other stream's. `fair_s` takes away the other processes' share of the
    machine's cores: what the run would have taken alone, as the lab states it."""

    def __enter__(self):
        self.wall_s = self.others_cpu_s = 0.0
        self._t, self._busy, self._own = time.monotonic(), _machine_busy_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc):
        self.wall_s = time.monotonic() - self._t
        own = _own_cpu_s() - self._own
        self.others_cpu_s = max(0.0, _machine_busy_s() - self._busy - own)
        return False

    @property
    def fair_s(self) -> float:
        return max(0.0, self.wall_s - self.others_cpu_s / (os.cpu_count() or 1))
