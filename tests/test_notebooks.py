"""Every lab, end to end, through the instructor's grader: CI proves each grade certifies work.

For every lab in solutions/ (labs added later are picked up automatically):

- the solution runs in CPU mode under grading seed A and scores full marks;
- that run's wall time through the grader is within 2x, either way, of the time the lab's title
  states ("`LIGHT = True` through the grader in CI N s", scripts/lab_times.py reads it);
- the same run's saved answers become four bypass submissions (`grader.memorise`): *memorised*
  (values typed in, answer functions replaced by lookup tables of the public checks' cases),
  *imported* (each forbidden reference under the answer's name), *pasted* (each reference's source
  pasted in) and *copied prediction* (each prediction assigned from its measurement); judged in the
  sandbox under seed B, each earns at most a tenth of the points; no notebook runs again for this;
- the seed-A run's answers, judged under seed B (another scenario, other hidden cases), still score
  full marks (judging only: the notebook itself runs under seed B as the student copy below);
- the generated student copy (answers stubbed) runs to its last cell with no error cell (each cell
  that needs an unwritten answer says what to write and goes on) and scores zero.

All runs use LIGHT=True (the smallest workloads that still run every cell), so the suite fits CI's
time on a 2-core machine. LAB_FULL=1 runs the solutions at their default sizes, as a learner would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from grader.grader import Grader, Job
from grader.memorise import (
    copied_prediction_answers,
    imported_answers,
    memorised_answers,
    pasted_answers,
    runtime_copy_answers,
    save_answers,
)
from lab_utils.grading import questions_for
from lab_utils.grading.probe import load_answers

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in SOLUTIONS]
NOTEBOOK_TIMEOUT = float(os.environ.get("LAB_NOTEBOOK_TIMEOUT", 1200))
SEED_A, SEED_B = 20261201, 777  # two grading seeds; each notebook's scenario seed derives from them
SKIP_SERVERS = {"RUN_VLLM": False, "RUN_REAL": False}
_spec = importlib.util.spec_from_file_location("lab_times", REPO / "scripts" / "lab_times.py")
lab_times = importlib.util.module_from_spec(_spec)  # the stated-time parser and the 2x comparison
_spec.loader.exec_module(lab_times)


def _grade(path: Path, out: Path, parameters: dict, seed: int, figure_check: bool = False) -> tuple:
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


def _params(**extra) -> dict:
    base = {"BACKEND": "cpu"} if os.environ.get("LAB_FULL") == "1" else {"BACKEND": "cpu", "LIGHT": True}
    return {**base, **extra}


_RUNS: dict[str, tuple] = {}
_SECONDS: dict[str, float] = {}  # each solution run's wall time through the grader: what a title states


@pytest.fixture(scope="session")
def solution_run(tmp_path_factory):
    """The seed-A run of a solution, executed once per session and shared by the tests below."""

    def run(path: Path):
        if path.name not in _RUNS:
            out = tmp_path_factory.mktemp(f"sol-{path.name[:2]}")
            started = time.monotonic()
            _RUNS[path.name] = (*_grade(path, out, _params(), SEED_A, figure_check=True), out)
            _SECONDS[path.name] = time.monotonic() - started
        return _RUNS[path.name]

    return run


def _memory_state() -> str:
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


def _last_student_cell_ran(out: Path, name: str) -> bool:
    nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and "grader-probe" not in c.metadata.get("tags", [])]
    return code[-1].execution_count is not None


def _error_cells(out: Path, name: str) -> list[str]:
    """'cell N: Error: message' for each code cell of an executed notebook that raised."""
    nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
    return [
        f"cell {i}: {o.get('ename')}: {str(o.get('evalue'))[:200]}"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_solution_scores_full_marks(path, solution_run):
    outcome, feedback, out = solution_run(path)
    assert outcome.status == "ok", f"{outcome.status}\n{feedback}\n{_memory_state()}"
    assert outcome.scores == outcome.possible, feedback
    assert set(outcome.possible) == {q.id for q in questions_for(path.name[:2])}
    assert _last_student_cell_ran(out, path.name)


BYPASSES = ("memorised", "imported", "pasted", "runtime copy", "copied prediction")
BYPASS_SHARE = 0.10  # each bypass earns at most this share of a lab's points
TABLE = REPO / "out" / "grading-table"


def _record(lab: str, column: str, earned: float, possible: float) -> None:
    """One cell of the CI table (out/grading-table.md, assembled by test_zz_grading_table)."""
    TABLE.mkdir(parents=True, exist_ok=True)
    (TABLE / f"{lab}-{column.replace(' ', '_')}.json").write_text(
        json.dumps({"lab": lab, "column": column, "earned": earned, "possible": possible})
    )


def _bypass(kind: str, lab: str, answers: dict):
    if kind == "memorised":
        return memorised_answers(lab, answers), None
    if kind == "imported":
        return imported_answers(lab, answers), None
    if kind == "pasted":
        return pasted_answers(lab, answers)
    if kind == "runtime copy":
        return runtime_copy_answers(lab, answers)
    return copied_prediction_answers(lab, answers), None


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_bypass_submissions_score_at_most_a_tenth(path, solution_run, tmp_path):
    """Memorised, imported-reference, pasted-reference and copied-prediction submissions, each built
    from the seed-A run's answers and judged in the sandbox under seed B, earn at most 10%."""
    outcome, feedback, out = solution_run(path)
    lab = path.name[:2]
    answers, problems = load_answers(out / "answers" / "ci" / lab)
    assert answers, f"the solution run saved no answers ({problems})"
    _record(lab, "solution", outcome.total, sum(outcome.possible.values()))
    grader = Grader(tmp_path / "out", seed=SEED_B, copies="off")
    report = []
    try:
        for kind in BYPASSES:
            fake, nb = _bypass(kind, lab, answers)
            folder = tmp_path / kind.replace(" ", "_")
            save_answers(fake, folder)
            results = grader.judge_saved(lab, folder, notebook=nb)
            earned, possible = sum(r.earned for r in results), sum(r.points for r in results)
            _record(lab, kind, earned, possible)
            detail = ", ".join(f"{r.id} {r.earned:g}" for r in results if r.earned)
            report.append((kind, earned, possible, detail))
    finally:
        grader.close()
    over = [r for r in report if r[1] > BYPASS_SHARE * r[2]]
    assert not over, "\n".join(f"{k}: {e:g}/{p:g} ({d})" for k, e, p, d in over)


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_solution_scores_full_marks_under_a_second_seed(path, solution_run, tmp_path):
    """The seed-A run's answers, judged in the sandbox under seed B (its own scenario and hidden
    cases), still score full marks. The notebook itself already runs under seed B as the student
    copy (test_student_copy_runs_to_the_end_and_scores_zero), so it is not run a third time."""
    outcome, feedback, out = solution_run(path)
    lab = path.name[:2]
    answers_dir = out / "answers" / "ci" / lab
    grader = Grader(tmp_path / "out", seed=SEED_B, copies="off")
    try:
        results = grader.judge_saved(lab, answers_dir)
    finally:
        grader.close()
    assert {r.id for r in results} == {q.id for q in questions_for(lab)}
    short = [
        f"{r.id} {r.earned:g}/{r.points:g} ({r.status}: {r.message})" for r in results if r.earned != r.points
    ]
    assert not short, "under seed B these scored less than full marks:\n" + "\n".join(short)


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_student_copy_runs_to_the_end_and_scores_zero(path, tmp_path):
    lab = REPO / "labs" / path.name
    outcome, feedback = _grade(lab, tmp_path, {"BACKEND": "cpu", "LIGHT": True, **SKIP_SERVERS}, SEED_B)
    # Run All reaches the end with no error cell: each cell that needs an answer not written yet says
    # so in one line (lab_utils.notebook) and the cells that do not need it still run
    assert outcome.status == "ok", f"{outcome.status}: {_error_cells(tmp_path, path.name)}"
    assert all(v == 0 for v in outcome.scores.values()), feedback
    assert len(outcome.scores) == len(questions_for(path.name[:2])) >= 2
    _record(path.name[:2], "stub", outcome.total, sum(outcome.possible.values()))
    assert _last_student_cell_ran(tmp_path, path.name)


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_zz_stated_light_time_within_2x_of_this_run(path):
    """The LIGHT time a lab's title states (`LIGHT = True` through the grader in CI N s) is within 2x,
    either way, of this session's solution run through the grader (timed in `solution_run`; nothing
    runs again here). tests/test_lab_times.py checks the form and the comparison without a run."""
    if os.environ.get("LAB_FULL") == "1":
        pytest.skip("LAB_FULL=1 ran the default sizes: the title's figure is for LIGHT = True")
    if path.name not in _SECONDS:
        pytest.skip(f"{path.stem}'s solution did not run in this session")
    outcome = _RUNS[path.name][0]
    if outcome.status != "ok":
        pytest.skip(f"{path.stem}'s solution run ended {outcome.status}: its time is not the lab's")
    problem = lab_times.time_problem(path.stem, lab_times.stated_light_seconds(path), _SECONDS[path.name])
    assert problem is None, problem


@pytest.mark.slow
def test_zz_grading_table():
    """Assemble the CI table, one row per lab (written to out/grading-table.md and printed)."""
    cells = [json.loads(p.read_text()) for p in sorted(TABLE.glob("*.json"))] if TABLE.exists() else []
    if not cells:
        pytest.skip("no lab was graded in this session")
    columns = ["solution", "stub", *BYPASSES, "published solution"]
    from grader.originality import is_copy

    for path in SOLUTIONS:  # the published solution handed in as a learner's own: status copy, 0 points
        copied, _ = is_copy(nbformat.read(str(path), as_version=4), path.name[:2])
        cells.append(
            {
                "lab": path.name[:2],
                "column": "published solution",
                "earned": 0.0 if copied else None,
                "possible": sum(q.points for q in questions_for(path.name[:2])),
            }
        )
    by = {(c["lab"], c["column"]): c for c in cells}
    lines = ["| lab | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for lab in sorted({c["lab"] for c in cells}):
        row = []
        for col in columns:
            c = by.get((lab, col))
            row.append("—" if c is None or c["earned"] is None else f"{c['earned']:g}/{c['possible']:g}")
        lines.append(f"| {lab} | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    (REPO / "out").mkdir(exist_ok=True)
    (REPO / "out" / "grading-table.md").write_text(text)
    print("\n" + text)


SILENT_LIMIT_S = 15.0  # a cell that runs longer says what it does, done/total and the time left
SILENT_FAIL_S = 20.0  # the rule is "about 15 s": a silent cell at 15-20 s is listed, one past 20 s fails


@pytest.mark.slow
def test_zz_no_silent_minute():
    """Every cell of this session's solution runs (papermill's per-cell durations in the executed copies)
    that took longer than 15 s printed progress in lab_utils.notebook's form, or a server's start-up lines.
    Each silent one is listed in out/silent-cells.md; one past SILENT_FAIL_S fails the test."""
    import re

    from lab_utils.notebook import PROGRESS_PATTERN

    if not _RUNS:
        pytest.skip("no solution ran in this session")
    silent = []
    for name, (*_, out) in sorted(_RUNS.items()):
        nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
        for i, cell in enumerate(nb.cells):
            took = (cell.metadata.get("papermill") or {}).get("duration") or 0
            if cell.cell_type != "code" or took <= SILENT_LIMIT_S:
                continue
            text = "".join(
                o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
            )
            if not re.search(PROGRESS_PATTERN, text) and not re.search(
                r"\d+%\|.*\|\s*\d+/\d+", text
            ):  # or tqdm
                first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")[:70]
                silent.append((took, f"{name} cell {i} ({took:.0f} s, no progress): {first}"))
    (REPO / "out").mkdir(exist_ok=True)  # the list, for the next pass over the labs (CI keeps out/)
    (REPO / "out" / "silent-cells.md").write_text(
        "".join(f"- {line}\n" for _, line in silent) or "none: every cell over 15 s printed progress\n"
    )
    print("\n".join(line for _, line in silent))
    too_long = [line for took, line in silent if took > SILENT_FAIL_S]
    assert not too_long, "\n".join(too_long)


# Labs whose LIGHT solution run was verified to show only figures that read (papermill, BACKEND cpu,
# LAB_FIGURE_CHECK, or CI's own solution runs): 00 and 11 on 2026-12-03; the rest on 2026-12-04,
# after fixes in 01, 03, 05, 08, 09, 12 and 13 (a fresh-clone make test listed 03 and 09 as the
# last two; papermill runs of both were clean after). A problem in one of them fails the test; a lab
# added later is listed in out/figure-problems.md without failing until a run shows it clean.
FIGURES_VERIFIED = {f"{n:02d}" for n in range(15)}


def _solution_cell(nb, count) -> int | None:
    """The index in the solution notebook of the executed cell numbered `count` (the grader's probe
    cells and papermill's injected parameters are not in the solution)."""
    index = -1
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "grader-probe" in tags or "injected-parameters" in tags:
            continue
        index += 1
        if cell.cell_type == "code" and cell.get("execution_count") == count:
            return index
    return None


@pytest.mark.slow
def test_zz_solution_figures_read():
    """Every figure this session's solution runs showed (checked in the kernel just before it was
    rendered: lab_utils.viz.figure_check, readable.problems with matplotlib's bounding boxes) reads:
    no overlapping tick labels, no legend over data, no texts over each other or off the figure, no
    empty figure. Each figure with a problem is listed in out/figure-problems.md."""
    if not _RUNS:
        pytest.skip("no solution ran in this session")
    listed, failing, counts = [], [], []
    for name, (*_, out) in sorted(_RUNS.items()):
        lab = name[:2]
        record = out / "figures" / "ci" / f"{lab}.jsonl"
        lines = record.read_text().splitlines() if record.exists() else []
        figures = [json.loads(line) for line in lines if line.strip()]
        counts.append(f"{lab}: {len(figures)}")
        nb = nbformat.read(str(out / "executed" / "ci" / name), as_version=4)
        for fig in figures:
            found = fig["problems"] + ([f"the check raised {fig['error']}"] if fig.get("error") else [])
            if not found:
                continue
            cell = _solution_cell(nb, fig.get("cell"))
            where = f"{name} cell {cell}" if cell is not None else f"{name} (execution {fig.get('cell')})"
            title = f" {fig['figure']!r}" if fig.get("figure") else ""
            text = f"{where}{title} ({fig.get('source', '')}): " + "; ".join(found)
            listed.append(
                text if lab in FIGURES_VERIFIED else f"{text} [not yet verified: listed, not failed]"
            )
            if lab in FIGURES_VERIFIED:
                failing.append(text)
    (REPO / "out").mkdir(exist_ok=True)
    (REPO / "out" / "figure-problems.md").write_text(
        f"Figures shown per lab: {', '.join(counts)}\n\n"
        + ("".join(f"- {line}\n" for line in listed) or "none: every figure shown reads\n")
    )
    print("\n".join(listed))
    assert not failing, "\n".join(failing)
