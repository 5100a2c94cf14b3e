"""Grades for the LMS (grader/lms.py) and the class report (grader/report.py), from a gradebook
written by grader/gradebook.py with hostile student names and statuses."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader import lms
from grader.__main__ import main
from grader.exchange import Submission, write_manifest
from grader.gradebook import Outcome, atomic_write, save_result, write_gradebook
from grader.report import question_rows, write_report

EVIL = '=HYPERLINK("http://x","<script>alert(1)</script>")'
SECRET = b"k" * 32
REPO_OUT = Path(__file__).resolve().parent.parent / "out"


def _class(out: Path) -> list[Outcome]:
    possible = {"00.a": 2.0, "00.b": 3.0}
    outcomes = [
        Outcome("alice", "00", {"00.a": 2.0, "00.b": 3.0}, dict(possible), "ok", seconds=41.5),
        Outcome("bob", "00", {"00.a": 2.0, "00.b": 0.0}, dict(possible), "cell errors", seconds=63.0),
        Outcome(
            EVIL,
            "00",
            {"00.a": 0.0, "00.b": 1.5},
            dict(possible),
            "ok",
            seconds=12.0,
            flags=[f"copy? {EVIL}"],
        ),
        Outcome("carol", "01", {"01.x": 1.0}, {"01.x": 4.0}, "timeout: <b>900 s</b>", seconds=900.0),
    ]
    write_gradebook(out, outcomes)
    for o in outcomes:
        save_result(out / ".cache", o, SECRET)
    subs = [
        Submission(
            "bob",
            "00_setup",
            "00",
            "/x",
            timestamp="t",
            notes=["late: submitted 2026-12-06 10:00 UTC, 1 h 0 min after the due date"],
        ),
        Submission("alice", "00_setup", "00", "/x", timestamp="t"),
    ]
    write_manifest(out, Path("/exchange"), subs, None)
    return outcomes


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_canvas_csv_is_one_row_per_student_with_points_possible(tmp_path):
    _class(tmp_path)
    rows = _rows(lms.canvas_csv(lms.read_gradebook(tmp_path)))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "00_setup", "Lab 01"]
    assert rows[1] == ["Points Possible", "", "", "", "", "5", "4"]
    by = {r[0]: r for r in rows[2:]}
    assert by["alice"] == ["alice", "", "", "alice", "", "5", ""]
    assert by["carol"][5:] == ["", "1"]
    evil = [r for r in rows[2:] if "HYPERLINK" in r[0]][0]
    assert evil[0].startswith("'=") and evil[3].startswith("'=")  # never a formula


def test_moodle_csv_has_a_grade_and_a_feedback_column_per_lab(tmp_path):
    _class(tmp_path)
    rows = _rows(lms.moodle_csv(lms.read_gradebook(tmp_path)))
    assert rows[0] == ["Username", "00_setup", "00_setup feedback", "Lab 01", "Lab 01 feedback"]
    by = {r[0]: r for r in rows[1:]}
    assert by["bob"][1:3] == [
        "2",
        "cell errors; late: submitted 2026-12-06 10:00 UTC, 1 h 0 min after the due date",
    ]
    assert by["carol"][3:] == ["1", "timeout: &lt;b&gt;900 s&lt;/b&gt;"]  # as the gradebook escaped it


def test_every_cell_of_every_format_is_safe_for_a_spreadsheet(tmp_path):
    _class(tmp_path)
    for fmt in lms.FORMATS:
        path = lms.export(tmp_path, tmp_path / f"{fmt}.csv", fmt)
        text = path.read_text()
        for row in _rows(text):
            for cell in row:
                assert not cell.startswith(("=", "+", "@", "\t", "\r")), (fmt, cell)
                assert not (cell.startswith("-") and not re.fullmatch(r"-?\d+(\.\d+)?", cell)), (fmt, cell)
                assert "\n" not in cell and "\x1b" not in cell
    assert "late" in (tmp_path / "csv.csv").read_text()


def test_text_cell_guards_formulas_and_controls():
    assert lms.text_cell("=1+1") == "'=1+1"
    assert lms.text_cell("@SUM(A1)") == "'@SUM(A1)"
    assert lms.text_cell("-2+3") == "'-2+3"
    assert lms.text_cell("a\nb\x1b[31mc") == "a bc"
    assert lms.text_cell("plain") == "plain"


def test_bad_gradebooks_give_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not found: grade the class first"):
        lms.read_gradebook(tmp_path)
    (tmp_path / "gradebook.csv").write_text("name,score\nx,1\n")
    with pytest.raises(ValueError, match="is not a gradebook"):
        lms.read_gradebook(tmp_path)
    (tmp_path / "gradebook.csv").write_text(
        "student,lab,00.a,total,status\npoints_possible,,2,2,\nx,00,two,2,ok\n"
    )
    with pytest.raises(ValueError, match=r"gradebook.csv:3: 'two' is not a number"):
        lms.read_gradebook(tmp_path)
    with pytest.raises(ValueError, match="unknown format"):
        lms.export(tmp_path, tmp_path / "x", "excel")


def test_report_is_self_contained_and_escapes_learner_strings(tmp_path):
    outcomes = _class(tmp_path)
    path = write_report(tmp_path, secret=SECRET)
    page = path.read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:|//)", page)  # nothing loaded from outside
    assert "default-src 'none'" in page and page.count("<svg") >= 5
    assert "63.0" in page and "900.0" in page  # run times from the signed results
    assert "late: submitted 2026-12-06" in page and "copy? " in page
    # the hardest question first: 00.b (mean 1.5 of 3) before 00.a (mean 1.33 of 2 = 0.67 share)
    stats = question_rows(lms.read_gradebook(tmp_path), [])
    assert stats == []
    from grader.report import rows_from_outcomes

    order = [s["question"] for s in question_rows(lms.read_gradebook(tmp_path), rows_from_outcomes(outcomes))]
    assert order == ["01.x", "00.b", "00.a"]
    assert page.index("00.b") < page.index("00.a")


def test_report_ignores_a_forged_result_file(tmp_path):
    _class(tmp_path)
    forged = tmp_path / ".cache" / "alice" / "00.json"
    data = json.loads(forged.read_text())
    data["seconds"] = 12345.0
    atomic_write(forged, json.dumps(data))
    page = write_report(tmp_path, secret=SECRET).read_text()
    assert "12345" not in page


def test_cli_export_and_report_with_clear_errors(tmp_path, capsys):
    _class(tmp_path)
    assert main(["export", str(tmp_path), "--format", "canvas"]) == 0
    assert (tmp_path / "canvas.csv").exists()
    assert main(["export", str(tmp_path / "nowhere"), "--format", "moodle"]) == 2
    assert "not found: grade the class first" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--format", "gradescope"]) == 2
    assert "gradescope-bundle" in capsys.readouterr().err
    assert main(["return", str(tmp_path), "--course-dir", str(tmp_path / "none")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_cli_help_lists_the_class_commands():
    out = subprocess.run(
        [sys.executable, "-m", "grader", "--help"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
    ).stdout
    for cmd in ["collect", "return", "export", "report", "gradescope-bundle"]:
        assert cmd in out


CHROMIUM = Path("/usr/lib/chromium/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is absent (make test-tools installs it)")
def test_report_renders_in_headless_chromium_without_loading_anything(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    _class(tmp_path)
    path = write_report(tmp_path, secret=SECRET)
    shot = REPO_OUT / "class-report.png"
    shot.parent.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        seen: list[str] = []
        page.on("request", lambda r: seen.append(r.url))
        page.on("dialog", lambda d: seen.append("dialog " + d.message))
        page.goto(path.as_uri())
        page.screenshot(path=str(shot), full_page=True)
        assert page.locator("svg").count() >= 5 and page.locator("h2").count() == 5
        assert "<script>alert(1)</script>" in page.inner_text("body")  # shown as text, never run
        browser.close()
    assert seen == [path.as_uri()]
