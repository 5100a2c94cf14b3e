"""`python -m lab_utils.setup` reports stale grader folders and server logs, and removes them when asked."""

from __future__ import annotations

import os
import time

from lab_utils import setup


def _age(path, hours: float) -> None:
    t = time.time() - hours * 3600
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(root, name), (t, t))
    os.utime(path, (t, t))


def test_stale_leftovers_are_reported_then_removed_only_when_asked(tmp_path, capsys):
    old_grader = tmp_path / "lab-grader-abc123"
    (old_grader / "task").mkdir(parents=True)
    (old_grader / "task" / "out.json").write_text("{}")
    old_logs = tmp_path / "llm-serving-lab-logs-xyz"
    old_logs.mkdir()
    (old_logs / "vllm-8000.log").write_text("x" * 1000)
    legacy = tmp_path / "llm-serving-lab-logs"
    legacy.mkdir()
    fresh = tmp_path / "lab-grader-busy"
    (fresh / "inner").mkdir(parents=True)
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()
    for p in (old_grader, old_logs, legacy, unrelated):
        _age(p, 48)
    _age(fresh, 48)
    (fresh / "inner" / "now.txt").write_text("still grading")  # touched just now: in use

    found = setup.stale_leftovers(24, tmp=tmp_path)
    assert [s.path.name for s in found] == [
        "lab-grader-abc123",
        "llm-serving-lab-logs",
        "llm-serving-lab-logs-xyz",
    ]
    assert all(s.idle_hours >= 47 for s in found) and found[2].size_bytes == 1000

    assert setup.report_stale(24, tmp=tmp_path) == 3
    out = capsys.readouterr().out
    assert "--remove-stale" in out and old_grader.exists()  # reported, not removed

    assert setup.report_stale(24, remove=True, tmp=tmp_path) == 3
    assert not old_grader.exists() and not old_logs.exists() and not legacy.exists()
    assert fresh.exists() and unrelated.exists()
    assert setup.stale_leftovers(24, tmp=tmp_path) == []


def test_the_running_interpreters_log_folder_is_never_stale(tmp_path, monkeypatch):
    from lab_utils.servers import base

    mine = tmp_path / "llm-serving-lab-logs-mine"
    mine.mkdir()
    _age(mine, 100)
    monkeypatch.setattr(base, "_LOG_DIR", mine)
    assert setup.stale_leftovers(1, tmp=tmp_path) == []
