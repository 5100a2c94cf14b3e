"""The grader on crafted submissions: good, partial, and every kind of bad one, graded together."""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from lab_utils.grading import CHECK_MIME, questions_for, score
from lab_utils.grading.grader import grade_class, write_gradebook, Outcome
from lab_utils.grading.probe import instrument, load_answers

GOOD_ANSWERS = [
    "queries_per_kv_head = 3",
    "def count_chat_tokens(tokenizer, messages):\n"
    "    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,"
    " return_dict=True)['input_ids'])",
    "capital_answer = 'The capital of France is Paris.'",
]


def notebook(*sources: str):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('BACKEND = "auto"\nLIGHT = False')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def write(folder: Path, student: str, nb, name: str = "00_setup.ipynb") -> Path:
    path = folder / student / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, str(path))
    return path


# --- unit tests (fast) -------------------------------------------------------------------------

def test_score_statuses():
    q = questions_for("00")[[q.id for q in questions_for("00")].index("00.queries_per_kv_head")]
    assert score(q, {}).status == "not answered"
    assert score(q, {"queries_per_kv_head": 3}).earned == q.points
    wrong = score(q, {"queries_per_kv_head": 4})
    assert wrong.earned == 0 and wrong.status == "not yet right" and "3" not in wrong.message

    class Liar:  # an object claiming to equal everything must not pass
        def __eq__(self, other):
            return True
    assert score(q, {"queries_per_kv_head": Liar()}).earned == 0


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
    from lab_utils.grading.__main__ import main

    assert main(["grade", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "subs").mkdir()
    assert main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "o"), "--workers", "0"]) == 2


# --- a class of crafted submissions (slow: real kernels) ---------------------------------------

CRAFTED = {
    "good": notebook(*GOOD_ANSWERS),
    "partial": notebook(GOOD_ANSWERS[0], "capital_answer = 'Lyon'"),
    "hang": notebook(GOOD_ANSWERS[0], "while True:\n    pass", GOOD_ANSWERS[2]),
    "kernel_death": notebook(GOOD_ANSWERS[0], "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                             GOOD_ANSWERS[2]),
    "invalid_json": '{"cells": [ this is not json',
    "tampered": notebook(
        "queries_per_kv_head = 99\ncapital_answer = 'Rome'",
        # rewrite the check function, the registry, and the check file on disk, and fake a record
        "import lab_utils.grading as g, lab_utils.grading.registry as r, pathlib\n"
        "g.check = lambda *a, **k: print('full marks')\n"
        "for q in list(r._REGISTRY.values()):\n"
        "    r._REGISTRY[q.id] = r.Question(q.id, q.points, q.answers, lambda **kw: None)\n"
        "import lab_utils.grading.questions.lab00 as m\n"
        "pathlib.Path(m.__file__).write_text('from lab_utils.grading.registry import question\\n')\n"
        f"from IPython.display import display\n"
        f"display({{'{CHECK_MIME}': {{'id': '00.queries_per_kv_head', 'points': 1, 'earned': 1, "
        "'status': 'correct', 'message': ''}, 'text/plain': 'x'}, raw=True)",
    ),
    "deleter": notebook(
        *GOOD_ANSWERS,
        "import os, shutil, lab_utils, glob\n"
        "shutil.rmtree(os.path.dirname(lab_utils.__file__))\n"
        "for f in glob.glob('*'):\n    os.remove(f)",
    ),
    "huge_output": notebook(GOOD_ANSWERS[0], "print('x' * 30_000_000)", GOOD_ANSWERS[2]),
    "memory_hog": notebook(GOOD_ANSWERS[0], "import time\nhog = []\nfor _ in range(40):\n    hog.append(bytearray(2**28)); hog[-1][::4096] = b\"x\" * (2**28 // 4096); time.sleep(0.3)", GOOD_ANSWERS[2]),
}

EXPECTED = {  # student: (total, status prefix)
    "good": (4, "ok"),
    "partial": (1, "ok"),
    "hang": (1, "timeout"),
    "kernel_death": (1, "kernel died"),
    "invalid_json": (0, "not a notebook"),
    "tampered": (0, "ok"),
    "deleter": (4, None),
    "huge_output": (2, None),
    "memory_hog": (1, "memory limit"),
}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    subs, out, hidden = root / "subs", root / "out", root / "hidden"
    for student, nb in CRAFTED.items():
        write(subs, student, nb)
    (subs / "good" / "notes.txt").write_text("a file next to the notebook")
    (subs / "stranger").mkdir()
    (subs / "stranger" / "homework.ipynb").write_text("{}")  # no lab number in the name
    (hidden / "lab00").mkdir(parents=True)
    (hidden / "lab00" / "test_hidden.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.points(2)\n"
        "def test_counts_more_than_text(answers):\n"
        "    from transformers import AutoTokenizer\n"
        "    from lab_utils.models import course_model_path\n"
        "    tok = AutoTokenizer.from_pretrained(course_model_path())\n"
        "    msgs = [{'role': 'user', 'content': 'hello there'}]\n"
        "    assert answers['count_chat_tokens'](tok, msgs) > len(tok('hello there')['input_ids'])\n\n"
        "def test_capital_is_short(answers):\n"
        "    assert len(answers['capital_answer']) < 200\n"
    )
    messages: list[str] = []
    t0 = time.monotonic()
    outcomes = grade_class(subs, out, hidden, workers=2, timeout=45, memory_mb=4096,
                           progress=messages.append)
    return {"subs": subs, "out": out, "hidden": hidden, "outcomes": outcomes,
            "messages": messages, "seconds": time.monotonic() - t0}


def _rows(out: Path) -> dict[str, dict]:
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    return {r["student"]: r for r in rows}


@pytest.mark.slow
def test_every_submission_scores_what_it_earned(graded_class):
    rows = _rows(graded_class["out"])
    assert rows["points_possible"]["total"] == "7"  # 4 public + 3 hidden
    for student, (public_total, status) in EXPECTED.items():
        row = rows[student]
        public = sum(float(row[q.id]) for q in questions_for("00"))
        assert public == public_total, (student, row)
        if status:
            assert row["status"].startswith(status), (student, row["status"])


@pytest.mark.slow
def test_good_submission_gets_everything_including_hidden(graded_class):
    row = _rows(graded_class["out"])["good"]
    assert row["00.hidden.test_counts_more_than_text"] == "2"
    assert row["00.hidden.test_capital_is_short"] == "1"
    assert row["total"] == "7" and row["status"] == "ok"


@pytest.mark.slow
def test_feedback_and_progress(graded_class):
    out = graded_class["out"]
    text = (out / "feedback" / "partial" / "00.md").read_text()
    assert "00.count_chat_tokens" in text and "not answered" in text
    assert "Paris" not in text  # hints, never answers
    bad = (out / "feedback" / "invalid_json" / "00.md").read_text()
    assert "not valid notebook JSON" in bad
    msgs = graded_class["messages"]
    assert any("stranger/homework.ipynb" in m for m in msgs)
    assert sum(m.startswith("[") for m in msgs) == len(CRAFTED)


@pytest.mark.slow
def test_huge_output_is_truncated_in_the_kept_copy(graded_class):
    kept = graded_class["out"] / "executed" / "huge_output" / "00_setup.ipynb"
    assert kept.exists() and kept.stat().st_size < 2_000_000


@pytest.mark.slow
def test_no_grading_process_left_behind(graded_class):
    import psutil

    me = psutil.Process()
    assert [p for p in me.children(recursive=True) if p.is_running() and p.status() != "zombie"] == []
    leftovers = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "lab-grader-" in cmd:
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
    write(subs, "partial", notebook(*GOOD_ANSWERS))
    messages.clear()
    grade_class(subs, out, hidden, workers=1, timeout=45, memory_mb=4096, progress=messages.append)
    graded = [m for m in messages if m.startswith("[")]
    assert len(graded) == 1 and "partial" in graded[0]
    assert _rows(out)["partial"]["total"] == "7"
