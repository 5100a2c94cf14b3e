"""nbgrader's exchange read as it is, hostile folders included, and feedback written where
nbgrader's release_feedback/fetch_feedback look for it (grader/exchange.py)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

import pytest

from grader import exchange
from grader.exchange import collect, feedback_html, lab_of, parse_timestamp, read_manifest, write_feedback
from grader.sandbox import Status

NB = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def _submit(folder: Path, nb: str = "00_setup.ipynb", stamp: str | None = "2026-12-05 10:00:00.000000 UTC"):
    folder.mkdir(parents=True)
    (folder / nb).write_text(NB)
    if stamp is not None:
        (folder / "timestamp.txt").write_text(stamp)
    (folder / "submission_secret.txt").write_text("s3cret-" + folder.parent.name)
    return folder


def test_assignment_names_map_to_labs():
    assert [lab_of(n) for n in ["00_setup", "lab03", "Lab-12 moe", "03", "ps1", "003x", "lab"]] == [
        "00",
        "03",
        "12",
        "03",
        "",
        "",
        "",
    ]


def test_timestamps_as_nbgrader_writes_them():
    utc = parse_timestamp("2026-12-05 09:10:11.123456 UTC")
    assert utc == dt.datetime(2026, 12, 5, 9, 10, 11, 123456, tzinfo=dt.UTC)
    assert parse_timestamp("2026-12-05 10:10:11.123456 +0100") == utc
    assert parse_timestamp("2026-12-05 10:10:11.123456 Europe/Paris") == utc
    assert parse_timestamp("2026-12-05T09:10:11.123456") == utc  # no zone: UTC
    for bad in ["", "yesterday", "2026-12-05 10:00 Mars/Olympus", "9" * 100]:
        with pytest.raises(ValueError):
            parse_timestamp(bad)


def test_submitted_layout_collected_with_late_and_missing_timestamps(tmp_path):
    course = tmp_path / "course"
    _submit(course / "submitted" / "alice" / "00_setup")
    _submit(course / "submitted" / "bob" / "00_setup", stamp="2026-12-06 12:30:00.000000 UTC")
    _submit(course / "submitted" / "carol" / "00_setup", stamp=None)
    _submit(course / "submitted" / "dave" / "00_setup", stamp="not a time")
    _submit(course / "submitted" / "erin" / "ps1")  # no lab number: skipped with a warning
    due = parse_timestamp("2026-12-05 12:00 UTC")
    subs, warnings = collect(course, tmp_path / "out" / "collected", due)
    by = {s.student: s for s in subs}
    assert sorted(by) == ["alice", "bob", "carol", "dave"]
    assert all(not s.status for s in subs)
    assert by["alice"].notes == [] and not by["alice"].late
    assert by["bob"].notes == ["late: submitted 2026-12-06 12:30 UTC, 1 d 0 h 30 min after the due date"]
    assert by["carol"].notes == ["no timestamp.txt: not checked against the due date"]
    assert by["dave"].notes[0].startswith("timestamp.txt unreadable")
    assert any("erin/ps1" in w for w in warnings)
    collected = tmp_path / "out" / "collected"
    assert sorted(p.name for p in (collected / "alice").iterdir()) == ["00_setup.ipynb"]  # no secret copied
    assert by["alice"].secret == "s3cret-alice" and by["alice"].notebook == "00_setup"


def test_inbound_takes_each_students_latest_and_renames_to_the_lab(tmp_path):
    inbound = tmp_path / "exchange" / "llm101" / "inbound"
    _submit(inbound / "alice+lab02+2026-12-05 09:00:00.000000 UTC+AbCdEfGh1234", nb="work.ipynb")
    newer = _submit(inbound / "alice+lab02+2026-12-05 11:00:00.000000 UTC+ZyXwVuTs9876", nb="work.ipynb")
    (newer / "notes.txt").write_text("mine")
    _submit(inbound / "bob+lab02+2026-12-05 08:00:00.000000 UTC", nb="02_kv.ipynb")  # no random tail
    (inbound / "garbage").mkdir()
    subs, warnings = collect(tmp_path / "exchange" / "llm101", tmp_path / "c")
    assert [(s.student, s.lab, s.collected) for s in subs] == [
        ("alice", "02", "02_work.ipynb"),
        ("bob", "02", "02_kv.ipynb"),
    ]
    assert subs[0].source == str(newer)
    assert (tmp_path / "c" / "alice" / "notes.txt").read_text() == "mine"
    assert any("garbage" in w for w in warnings)


def test_hostile_submissions_get_a_status_and_never_stop_the_others(tmp_path):
    sub = tmp_path / "course" / "submitted"
    _submit(sub / "ok" / "00_setup")
    linked = _submit(sub / "linker" / "00_setup", nb="x.txt")
    (linked / "00_setup.ipynb").symlink_to("/etc/passwd")
    huge = _submit(sub / "huge" / "00_setup")
    with open(huge / "big.bin", "wb") as f:
        f.truncate(exchange.MAX_FILE_BYTES + 1)  # sparse: no disk used
    fifo = _submit(sub / "fifo" / "00_setup")
    os.mkfifo(fifo / "pipe")
    (sub / "empty" / "00_setup").mkdir(parents=True)
    _submit(sub / "two" / "00_setup")
    (sub / "two" / "00_setup" / "00_other.ipynb").write_text(NB)
    _submit(sub / "-rf" / "00_setup")
    _submit(sub / "twice" / "00_setup")
    _submit(sub / "twice" / "lab00")
    (sub / "ghost").symlink_to(sub / "ok")
    (sub / "ok" / "lab01").symlink_to(sub / "ok" / "00_setup")
    bigstamp = _submit(sub / "stamp" / "00_setup", stamp="2026-12-05 10:00:00 UTC" + " " * 10000)
    assert bigstamp.exists()

    subs, _ = collect(tmp_path / "course", tmp_path / "c")
    status = {(s.student, s.assignment): s.status for s in subs}
    assert status[("ok", "00_setup")] == ""
    assert status[("linker", "00_setup")] == Status.REFUSED.text(
        "00_setup.ipynb is a symbolic link; hand in real files"
    )
    assert status[("huge", "00_setup")].startswith("refused: big.bin is larger than 50 MB")
    assert status[("fifo", "00_setup")].startswith("refused: pipe is not a regular file")
    assert status[("empty", "00_setup")] == "not a notebook: no .ipynb file in the submission"
    assert status[("two", "00_setup")].startswith("duplicate: 2 notebooks")
    assert status[("-rf", "00_setup")].startswith("refused: student id '-rf' is not a plain name")
    assert status[("twice", "00_setup")].startswith("duplicate: assignments 00_setup, lab00 are all lab 00")
    assert status[("ghost", "--")] == "refused: the student folder is a symbolic link"
    assert status[("ok", "lab01")].startswith("refused: the assignment folder is a symbolic link")
    assert status[("stamp", "00_setup")] == ""  # graded; the oversized timestamp is a note
    assert [s.notes for s in subs if s.student == "stamp"][0][0].startswith("timestamp.txt refused")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["ok", "stamp"]

    rows = exchange.refused_outcomes(subs, lambda lab: {f"{lab}.q": 2.0})
    assert {(r.student, r.lab, r.total) for r in rows} >= {("huge", "00", 0.0), ("ghost", "--", 0.0)}
    assert all(r.kind is not Status.GRADER_ERROR for r in rows)


def test_inbound_folder_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    inbound = tmp_path / "ex" / "c" / "inbound"
    _submit(inbound / "victim+00_setup+2026-12-05 09:00:00.000000 UTC+abc")
    uid = os.getuid()
    monkeypatch.setattr(exchange.pwd, "getpwnam", lambda name: type("P", (), {"pw_uid": uid + 4242})())
    monkeypatch.setattr(exchange.os, "getuid", lambda: uid + 1)
    subs, warnings = collect(tmp_path / "ex" / "c", tmp_path / "out")
    assert subs[0].status.startswith("refused: the submission folder belongs to")
    subs, _ = collect(tmp_path / "ex" / "c", tmp_path / "out", check_owner=False)
    assert subs[0].status == ""


def test_feedback_lands_where_release_feedback_and_fetch_feedback_look(tmp_path):
    course = tmp_path / "course"
    _submit(course / "submitted" / "alice" / "lab00", nb="00_setup.ipynb", stamp="2026-12-05 10:00:00.5 UTC")
    _submit(course / "submitted" / "bob" / "lab00", nb="00_setup.ipynb")
    (course / "submitted" / "bob" / "lab00" / "submission_secret.txt").unlink()
    out = tmp_path / "out"
    subs, _ = collect(course, out / "collected", parse_timestamp("2026-12-05 09:00 UTC"))
    exchange.write_manifest(out, course, subs, None)
    assert oct(os.stat(out / "collect.json").st_mode & 0o777) == "0o600"
    md = "# Lab 00 — alice\n\nScore: **1 / 2**\n\n| question | points | status | hint |\n|---|---|---|---|\n"
    md += "| 00.q | 1/2 | wrong | got &lt;script&gt;alert(1)&lt;/script&gt; \\| x |\n"
    (out / "feedback" / "alice").mkdir(parents=True)
    (out / "feedback" / "alice" / "00.md").write_text(md)
    ex = tmp_path / "exchange" / "llm101"
    ex.mkdir(parents=True)
    written, skipped = write_feedback(out, course, ex)
    folder = course / "feedback" / "alice" / "lab00"
    assert written == [folder / "00_setup.html"]
    assert (folder / "timestamp.txt").read_text() == "2026-12-05 10:00:00.5 UTC"
    assert (folder / "submission_secret.txt").read_text() == "s3cret-alice"
    page = (folder / "00_setup.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; | x" in page
    assert "<strong>1 / 2</strong>" in page and "late: submitted 2026-12-05 10:00 UTC" in page
    digest = hashlib.md5(b"s3cret-alice" + b"00_setup").hexdigest()  # nbgrader.utils.notebook_hash
    assert (ex / "feedback" / f"{digest}.html").read_text() == page
    assert oct(os.stat(ex / "feedback").st_mode & 0o777) == "0o711"
    assert skipped == ["bob/lab00: no submission_secret.txt, so nbgrader has no place for its feedback"]
    assert read_manifest(out)[0][0].secret == "s3cret-alice"


def test_feedback_html_escapes_everything_a_learner_chose():
    page = feedback_html("# Lab 00 — <img src=x onerror=alert(1)>\n\n- a \\[link\\](javascript:x)\n", "t<")
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<title>t&lt;</title>" in page and "default-src 'none'" in page


@pytest.mark.slow  # about 15 s: grade_class starts for real (the notebooks are empty: nothing runs)
def test_grade_collects_from_the_exchange_and_return_feeds_nbgrader(tmp_path, capsys):
    from grader.__main__ import main

    inbound = tmp_path / "exchange" / "llm101" / "inbound"
    _submit(inbound / "ana+00_setup+2026-12-05 09:00:00.000000 UTC+aaaaaaaaaaaa")
    _submit(
        inbound / "ben+00_setup+2026-12-05 11:00:00.000000 UTC+bbbbbbbbbbbb", stamp="2026-12-05 11:00:00 UTC"
    )
    bad = _submit(inbound / "eve+00_setup+2026-12-05 09:30:00.000000 UTC+cccccccccccc")
    (bad / "00_setup.ipynb").unlink()
    (bad / "00_setup.ipynb").symlink_to("/etc/shadow")
    out, course = tmp_path / "out", tmp_path / "course"
    course.mkdir()
    argv = ["grade", str(tmp_path / "exchange" / "llm101"), "--out", str(out), "--due", "2026-12-05T10:00Z"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "collected 2 of 3 submission(s)" in printed and "report:" in printed
    rows = {line.split(",")[0]: line for line in (out / "gradebook.csv").read_text().splitlines()[2:]}
    assert sorted(rows) == ["ana", "ben", "eve"]
    assert "empty notebook" in rows["ana"] and "refused: 00_setup.ipynb is a symbolic link" in rows["eve"]
    page = (out / "report.html").read_text()
    assert "late: submitted 2026-12-05 11:00 UTC, 1 h 0 min after the due date" in page
    assert main(["return", str(out), "--course-dir", str(course)]) == 0
    assert (course / "feedback" / "ben" / "00_setup" / "00_setup.html").exists()
    assert (course / "feedback" / "eve" / "00_setup" / "00_setup.html").exists()  # why it was refused
    assert "refused" in (course / "feedback" / "eve" / "00_setup" / "00_setup.html").read_text()
