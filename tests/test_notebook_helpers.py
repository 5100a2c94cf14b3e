"""lab_utils.notebook: a cell that needs an unwritten answer says what to write and goes on."""

import pytest

from lab_utils.notebook import answer_or_none, attempt


def _stub(*_):
    raise NotImplementedError("your answer here")


def test_answer_or_none_returns_the_answer_or_none_with_one_line(capsys):
    assert answer_or_none(lambda: 2 + 2, "write it") == 4
    assert capsys.readouterr().out == ""
    assert answer_or_none(lambda: _stub(1), "write f in section 2 to see x") is None
    assert capsys.readouterr().out == "⏭ not written yet: write f in section 2 to see x\n"
    assert answer_or_none(lambda: undefined_answer, "write y") is None  # noqa: F821
    out = capsys.readouterr().out
    assert (
        out.startswith("⏭ not written yet: write y (") and "undefined_answer" in out and out.count("\n") == 1
    )


def test_attempt_stops_the_block_quietly_and_says_whether_it_ran(capsys):
    with attempt("write f") as a:
        _stub()
        raise AssertionError("not reached")
    assert not a.ok and capsys.readouterr().out == "⏭ not written yet: write f\n"
    with attempt("write g") as b:
        pass
    assert b.ok and capsys.readouterr().out == ""


def test_a_bug_in_a_written_answer_still_raises():
    with pytest.raises(ZeroDivisionError):
        with attempt("write f"):
            _ = 1 / 0
    with pytest.raises(KeyError):
        answer_or_none(lambda: {}["x"], "write f")


def test_progress_prints_done_total_and_time_left_in_the_tested_form(capsys):
    import re

    from lab_utils.notebook import PROGRESS_PATTERN, progress

    assert list(progress(range(3), "sweep", every_s=1e9)) == [0, 1, 2]
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["sweep: 1/3 done", "sweep: 3/3 done"]
    assert all(re.search(PROGRESS_PATTERN, ln) for ln in lines)


def test_waiting_says_it_runs_in_the_tested_form(capsys):
    import re
    import time

    from lab_utils.notebook import PROGRESS_PATTERN, waiting

    with waiting("engine start-up", every_s=0.05) as w:
        time.sleep(0.2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("engine start-up: not ready yet after 0 s") and re.search(
        PROGRESS_PATTERN, lines[0]
    )
    assert lines[-1] == "engine start-up: ready after 0 s" and w.seconds >= 0.2
    with pytest.raises(KeyError), waiting("failing step", every_s=10):
        raise KeyError("x")
    assert capsys.readouterr().out == ""  # no "ready" line for a block that raised
