"""The grader on crafted submissions: good, partial, and every kind of bad one, graded together."""

from __future__ import annotations

import csv
import os
import tempfile
import time
from pathlib import Path

import pytest
import submissions
from submissions import put

from grader.classrun import grade_class
from grader.grader import Outcome, write_gradebook
from lab_utils.grading import CHECK_MIME, questions_for, score
from lab_utils.grading.probe import instrument, load_answers

# Crafted submissions answer lab 07's questions that need no server and no model, so each
# notebook grades in seconds: a value computed from SCENARIO and two functions.
SCENARIO_CELL = "from lab_utils.grading import lab_scenario\nSCENARIO = lab_scenario('07', SEED)"
SERVED = (
    "def served_versions(on_disk, policy):\n"
    "    v = sorted(int(x) for x in on_disk)\n"
    "    if 'all' in policy:\n        return v\n"
    "    if 'specific' in policy:\n        return [x for x in v if x in set(policy['specific']['versions'])]\n"
    "    return v[-int(policy.get('latest', {}).get('num_versions', 1)):]"
)
EXTRA = "def extra_tensor_bytes(p, n, b=8):\n    return 2 * b * (p + n)"
PREDICT = (
    "def predicted_avg_batch(scenario):\n"
    "    return min(scenario['concurrency'], scenario['preferred_batch_size'])"
)
GOOD_ANSWERS = [SCENARIO_CELL, SERVED, EXTRA, PREDICT]
LAB = "07"
NB_NAME = "07_triton.ipynb"


def notebook(*sources: str):
    return submissions.notebook(*sources, parameters='BACKEND = "auto"\nLIGHT = False\nSEED = 0')


# --- unit tests (fast) -------------------------------------------------------------------------


def test_score_statuses():
    q = next(q for q in questions_for(LAB) if q.id == "07.extra_tensor_bytes")
    assert score(q, {}).status == "not answered"
    assert score(q, {"extra_tensor_bytes": lambda p, n, b=8: 2 * b * (p + n)}).earned == q.points
    wrong = score(q, {"extra_tensor_bytes": lambda p, n, b=8: 7})
    assert wrong.earned == 0 and wrong.status == "not yet right" and "2 *" not in wrong.message

    class Liar:  # an object claiming to equal everything must not pass
        def __eq__(self, other):
            return True

        def __lt__(self, other):
            return True

    assert score(q, {"extra_tensor_bytes": lambda *a: Liar()}).earned == 0


def test_probe_saves_answers_by_value(tmp_path):
    nb = notebook("x = 41", "def f(a):\n    return a + x", "x = 1")
    instrument(nb, ["f", "x"], str(tmp_path))
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert sum("grader-probe" in t for t in tags) == 5  # after each of 4 code cells + final
    ns: dict = {}
    for cell in nb.cells:
        exec(cell.source, ns)
    answers, problems = load_answers(tmp_path)
    assert answers["x"] == 1 and answers["f"](1) == 2 and not problems


def test_gradebook_layout(tmp_path):
    a = Outcome("ann", "00", {"00.a": 1.0, "00.b": 0.0}, {"00.a": 1.0, "00.b": 2.0}, "ok")
    b = Outcome("ben", "01", {"01.c": 0.5}, {"01.c": 1.0}, "timeout: stopped")
    path = write_gradebook(tmp_path, [b, a])
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["student", "lab", "00.a", "00.b", "01.c", "total", "status"]
    assert rows[1] == ["points_possible", "", "1", "2", "1", "4", ""]
    assert rows[2] == ["ann", "00", "1", "0", "", "1", "ok"]
    assert rows[3] == ["ben", "01", "", "", "0.5", "0.5", "timeout: stopped"]


def test_bad_cli_arguments(tmp_path):
    from grader.__main__ import main

    assert main(["grade", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "subs").mkdir()
    assert main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "o"), "--workers", "0"]) == 2


# --- a class of crafted submissions (slow: real kernels) ---------------------------------------

CRAFTED = {
    "good": notebook(*GOOD_ANSWERS),
    "partial": notebook(SCENARIO_CELL, SERVED, "def extra_tensor_bytes(p, n, b=8):\n    return b * (p + n)"),
    "hang": notebook(SCENARIO_CELL, SERVED, "while True:\n    pass", EXTRA),
    "kernel_death": notebook(
        SCENARIO_CELL, SERVED, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", EXTRA
    ),
    "invalid_json": '{"cells": [ this is not json',
    "tampered": notebook(
        "served_versions = lambda on_disk, policy: [99]\nextra_tensor_bytes = lambda *a: -1",
        # rewrite the check function, the registry, and the check file on disk, and fake a record
        "import lab_utils.grading as g, lab_utils.grading.registry as r, pathlib\n"
        "g.check = lambda *a, **k: print('full marks')\n"
        "for q in list(r._REGISTRY.values()):\n"
        "    r._REGISTRY[q.id] = r.Question(q.id, q.points, q.answers, lambda **kw: None)\n"
        "import lab_utils.grading.questions.lab07 as m\n"
        "pathlib.Path(m.__file__).write_text('from lab_utils.grading.registry import question\\n')\n"
        f"from IPython.display import display\n"
        f"display({{'{CHECK_MIME}': {{'id': '07.served_versions', 'points': 2, 'earned': 2, "
        "'status': 'correct', 'message': ''}, 'text/plain': 'x'}, raw=True)",
    ),
    "deleter": notebook(
        *GOOD_ANSWERS,
        "import os, shutil, lab_utils, glob\n"
        "shutil.rmtree(os.path.dirname(lab_utils.__file__))\n"
        "for f in glob.glob('*'):\n    os.remove(f)",
    ),
    "huge_output": notebook(SCENARIO_CELL, SERVED, "print('x' * 30_000_000)", EXTRA),
    "memory_hog": notebook(
        SCENARIO_CELL,
        SERVED,
        'import time\nhog = []\nfor _ in range(40):\n    hog.append(bytearray(2**28)); hog[-1][::4096] = b"x" * (2**28 // 4096); time.sleep(0.3)',
        EXTRA,
    ),
}

EXPECTED = {  # student: (public total, status prefix)
    "good": (5, "ok"),
    "partial": (2, "ok"),
    "hang": (2, "timeout"),
    "kernel_death": (2, "kernel died"),
    "invalid_json": (0, "not a notebook"),
    "tampered": (0, "cell errors"),  # the library is read-only inside the sandbox
    "deleter": (5, None),
    "huge_output": (3, None),
    "memory_hog": (2, "memory limit"),
}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    subs, out, hidden = root / "subs", root / "out", root / "hidden"
    for student, nb in CRAFTED.items():
        put(subs, student, nb)
    (subs / "good" / "notes.txt").write_text("a file next to the notebook")
    (subs / "stranger").mkdir()
    (subs / "stranger" / "homework.ipynb").write_text("{}")  # no lab number in the name
    (hidden / "lab07").mkdir(parents=True)
    (hidden / "lab07" / "test_hidden.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.points(2)\n"
        "def test_bytes_double_with_the_tokens(answers):\n"
        "    f = answers['extra_tensor_bytes']\n"
        "    assert f(20, 10, 4) == 2 * f(10, 5, 4)\n\n"
        "def test_all_serves_every_version(answers):\n"
        "    assert list(answers['served_versions']([3, 1, 2], {'all': {}})) == [1, 2, 3]\n"
    )
    messages: list[str] = []
    t0 = time.monotonic()
    # the grader's scratch folders go under this test's root, so the leftover check below looks only
    # for this run's processes (other test runs on the machine may be grading at the same time)
    scratch = root / "scratch"
    scratch.mkdir()
    saved, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = str(scratch)  # this process and the workers it starts
    try:
        outcomes = grade_class(
            subs, out, hidden, workers=2, timeout=45, memory_mb=4096, progress=messages.append
        )
    finally:
        tempfile.tempdir = saved
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
    return {
        "scratch": scratch,
        "subs": subs,
        "out": out,
        "hidden": hidden,
        "outcomes": outcomes,
        "messages": messages,
        "seconds": time.monotonic() - t0,
    }


def _rows(out: Path) -> dict[str, dict]:
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    return {r["student"]: r for r in rows}


@pytest.mark.slow
def test_every_submission_scores_what_it_earned(graded_class):
    rows = _rows(graded_class["out"])
    possible = sum(q.points for q in questions_for(LAB))
    assert rows["points_possible"]["total"] == f"{possible + 3:g}"  # public + 3 hidden
    for student, (public_total, status) in EXPECTED.items():
        row = rows[student]
        public = sum(float(row[q.id]) for q in questions_for(LAB))
        assert public == public_total, (student, row)
        if status:
            assert row["status"].startswith(status), (student, row["status"])


@pytest.mark.slow
def test_good_submission_gets_everything_including_hidden(graded_class):
    row = _rows(graded_class["out"])["good"]
    assert row["07.hidden.test_bytes_double_with_the_tokens"] == "2"
    assert row["07.hidden.test_all_serves_every_version"] == "1"
    assert row["total"] == "8" and row["status"] == "ok"


@pytest.mark.slow
def test_feedback_and_progress(graded_class):
    out = graded_class["out"]
    text = (out / "feedback" / "partial" / "07.md").read_text()
    assert "07.ensemble_config" in text and "not answered" in text
    assert "2 * b" not in text  # hints, never answers
    bad = (out / "feedback" / "invalid_json" / "07.md").read_text()
    assert "not valid notebook JSON" in bad
    msgs = graded_class["messages"]
    assert any("stranger/homework.ipynb" in m for m in msgs)
    assert sum(m.startswith("[") for m in msgs) == len(CRAFTED)


@pytest.mark.slow
def test_huge_output_is_truncated_in_the_kept_copy(graded_class):
    kept = graded_class["out"] / "executed" / "huge_output" / NB_NAME
    assert kept.exists() and kept.stat().st_size < 2_000_000


@pytest.mark.slow
def test_no_grading_process_left_behind(graded_class):
    import psutil

    me = psutil.Process()
    assert [p for p in me.children(recursive=True) if p.is_running() and p.status() != "zombie"] == []
    leftovers = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(graded_class["scratch"]) in cmd:
            leftovers.append(cmd)
    assert leftovers == []


@pytest.mark.slow
def test_rerun_resumes_and_regrades_only_changes(graded_class):
    subs, out, hidden = graded_class["subs"], graded_class["out"], graded_class["hidden"]
    before = (out / "gradebook.csv").read_text()
    messages: list[str] = []
    t0 = time.monotonic()
    grade_class(subs, out, hidden, workers=2, timeout=45, memory_mb=4096, progress=messages.append)
    assert time.monotonic() - t0 < 30
    assert (out / "gradebook.csv").read_text() == before
    assert any(f"{len(CRAFTED)} unchanged" in m for m in messages)
    # the partial student fixes an answer: only that notebook is graded again
    put(subs, "partial", notebook(*GOOD_ANSWERS))
    messages.clear()
    grade_class(subs, out, hidden, workers=1, timeout=45, memory_mb=4096, progress=messages.append)
    graded = [m for m in messages if m.startswith("[")]
    assert len(graded) == 1 and "partial" in graded[0]
    assert _rows(out)["partial"]["total"] == "8"


def test_a_prediction_is_fixed_where_its_check_cell_stands(tmp_path):
    """`PREDICTED = MEASURED` after the measurement changes nothing the grader sees."""
    nb = notebook(
        "p = 2",
        'check = lambda *a: None\ncheck("07.predicted_batch")',
        "measured = 5\np = measured",
        "q = 1",
        "q = measured",
    )
    instrument(nb, ["p", "q"], str(tmp_path), {"07.predicted_batch": ["p"], "07.other": ["q"]})
    ns: dict = {}
    for cell in nb.cells:
        exec(cell.source, ns)
    answers, _ = load_answers(tmp_path)
    assert answers["p"] == 2  # frozen after its check cell
    assert answers["q"] == 1  # no check cell: fixed at its first value
