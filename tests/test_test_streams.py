"""scripts/test_streams.py (make test's two pytest processes) leaves no test file and no lab out."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("test_streams", REPO / "scripts" / "test_streams.py")
streams_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams_mod)


def test_every_file_runs_once_and_every_lab_in_exactly_one_stream():
    plan = streams_mod.streams()
    assert len(plan) == 2
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py"))
    ran = [f for fs, _ in plan.values() for f in fs]
    last = streams_mod.LAST
    assert all(fs[-1] == last for fs, _ in plan.values()), "each stream checks its own leftovers last"
    once = [f for f in ran if f != last]
    table = streams_mod.TABLE
    assert table not in once, "the table is assembled after both streams"
    notebooks = streams_mod.NOTEBOOKS
    assert sorted(f for f in set(once) if f != notebooks) == sorted(
        f for f in files if f not in (last, table, notebooks)
    )
    assert len([f for f in once if f != notebooks]) == len(set(once) - {notebooks}), "a file ran twice"
    labs = sorted(p.name[:2] for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
    split = [lab for _, ls in plan.values() for lab in ls]
    assert sorted(split) == labs, "each lab's solution runs in exactly one stream"
    for fs, ls in plan.values():
        assert (notebooks in fs) == bool(ls), "a stream runs test_notebooks.py exactly when it has labs"


def test_a_named_file_runs_in_one_process(monkeypatch):
    calls = []

    class Done:
        returncode = 0

    monkeypatch.setattr(streams_mod.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Done())
    monkeypatch.setattr(streams_mod, "run", lambda args: (_ for _ in ()).throw(AssertionError("streamed")))
    assert streams_mod.main(["-q", "tests/test_kv.py::test_x"]) == 0
    assert streams_mod.main(["--serial", "-x"]) == 0
    assert (
        calls[0][-2:] == ["-q", "tests/test_kv.py::test_x"]
        and calls[1][-1] == "-x"
        and "--serial" not in calls[1]
    )
