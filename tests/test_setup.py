"""`make setup` prepares every lab; a lab opened after a partial set-up says what is missing."""

from __future__ import annotations

import sys

import pytest

from lab_utils import setup


def test_after_make_setup_every_step_is_ready():
    # `make test` runs `make setup` first, so on CI this is the state a newcomer gets from `make lab`
    assert setup.missing_steps() == [], "run `make setup`: " + ", ".join(setup.missing_steps())


def test_a_missing_step_is_reported_with_what_to_do(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRITON_VENV", str(tmp_path / "nowhere"))
    assert setup.missing_steps() == ["triton-env"]
    assert setup.report_setup() is False
    out = capsys.readouterr().out
    assert "MISSING  triton-env" in out and "make setup" in out


def test_run_step_streams_progress_and_reports_done(monkeypatch, tmp_path):
    flag = tmp_path / "done"
    step = setup.Step("demo", "a demo step", flag.exists,
                      lambda: [sys.executable, "-c", f"print('working'); open({str(flag)!r}, 'w').close()"])
    monkeypatch.setitem(setup.STEPS, "demo", step)
    lines: list[str] = []
    assert setup.missing_steps(["demo"]) == ["demo"]
    assert setup.run_step("demo", progress=lines.append) is True
    assert any("working" in line for line in lines) and lines[-1].startswith("[demo] ready")
    assert setup.missing_steps(["demo"]) == []


def test_unknown_step_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown set-up steps"):
        setup.missing_steps(["gpu-drivers"])
