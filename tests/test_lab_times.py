"""scripts/lab_times.py: the script that measures the run times each lab states (issue 39 item 2)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import nbformat
import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lab_times", REPO / "scripts" / "lab_times.py")
lab_times = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_times)


def _notebook(path: Path, *cells: str) -> Path:
    params = nbformat.v4.new_code_cell('BACKEND = "auto"\nLIGHT = False')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, *(nbformat.v4.new_code_cell(c) for c in cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def test_unknown_labs_are_named_and_all_finds_every_solution():
    assert len(lab_times.labs_named("all")) == len(list((REPO / "solutions").glob("[0-9][0-9]_*.ipynb")))
    assert [p.name[:2] for p in lab_times.labs_named("3, 11")] == ["03", "11"]
    with pytest.raises(SystemExit, match="lab\\(s\\) 99"):
        lab_times.labs_named("11,99")


def test_slow_cells_are_listed_slowest_first_and_error_cells_counted(tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("a = 1", metadata={"papermill": {"duration": 2.0}}),
            nbformat.v4.new_code_cell("\nrun_sweep()", metadata={"papermill": {"duration": 9.5}}),
            nbformat.v4.new_code_cell("start()", metadata={"papermill": {"duration": 31.0}}),
            nbformat.v4.new_code_cell(
                "1 / 0",
                outputs=[
                    nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="x", traceback=[])
                ],
            ),
        ]
    )
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, str(path))
    slow, errors = lab_times.cell_times(path)
    assert [(c["cell"], c["first"]) for c in slow] == [(2, "start()"), (1, "run_sweep()")]
    assert errors == 1


@pytest.mark.slow  # two kernels
def test_a_run_past_its_limit_is_stopped_whole_and_an_error_cell_is_reported(tmp_path):
    sleeper = _notebook(tmp_path / "98_sleeper.ipynb", "import time\ntime.sleep(600)")
    row = lab_times.run_one(sleeper, light=True, timeout=8, out=tmp_path / "out")
    assert row["status"] == "stopped after 8 s" and row["mode"] == "light"
    time.sleep(1)
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "98_sleeper" in " ".join(p.info["cmdline"] or []) or "lab-times-98-" in p.cwd():
                left.append(p.pid)  # papermill names the notebook; its kernel runs in the work folder
        except psutil.Error:
            continue
    assert left == [], "papermill or its kernel outlived the limit"
    broken = _notebook(tmp_path / "97_broken.ipynb", "x = 1", "raise ValueError('a cell that fails')")
    row = lab_times.run_one(broken, light=False, timeout=120, out=tmp_path / "out")
    assert row["status"].startswith("papermill exit") and row["error_cells"] == 1
    assert "| 97 | default |" in lab_times.table([row], "here")
