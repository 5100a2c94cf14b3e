"""A class with hostile learners in it: each hostile submission scores 0 with a row, the good ones
keep full marks, and nothing is left running (issue: the grader as a trusted judge).

Every notebook answers lab 07's three function questions that need no server; the good ones answer
them right, each hostile one tries one attack instead. The class is graded once through the
command line, in the sandbox, with small disk limits so the disk fillers stop quickly.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from submissions import BYTES, KV, SERVED, notebook, put

REPO = Path(__file__).resolve().parent.parent
SEED = 5151
MARKER = "lab-hostile-daemon-7f3a"  # in the command line of the double-forked process

GOOD = (SERVED, BYTES, KV)
ANSWERS = ("served_versions", "extra_tensor_bytes", "trtllm_kv_tokens")


def _self_scoring() -> str:
    """Answers that try to write the grade file of the checker and leave."""
    body = (
        "    import os, sys, json, glob\n"
        "    for path in glob.glob('/tmp/**/scores*.json', recursive=True) + [a for a in sys.argv if a.endswith('.json')]:\n"
        "        try:\n"
        "            open(path, 'w').write(json.dumps([{'id': q, 'points': 9, 'earned': 9, 'status': 'correct'}"
        " for q in ['07.served_versions', '07.extra_tensor_bytes', '07.trtllm_kv_tokens']]))\n"
        "        except OSError:\n"
        "            pass\n"
        "    os._exit(0)\n"
    )
    return "\n".join(f"def {name}(*args, **kwargs):\n{body}" for name in ANSWERS)


def _checker_rewrite() -> str:
    """Copies the library next to the work folder and edits its checker, and tries the real one."""
    return (
        "import os, shutil, lab_utils, pathlib\n"
        "src = pathlib.Path(lab_utils.__file__).parent\n"
        "for dest in ['../lab_utils', 'lab_utils', '/tmp/lab_utils']:\n"
        "    try:\n"
        "        shutil.copytree(src, dest, dirs_exist_ok=True)\n"
        "        pathlib.Path(dest, 'grading', 'scoring.py').write_text('def score(*a, **k):\\n    return 1\\n')\n"
        "    except OSError as exc:\n"
        "        print('copy refused', dest, exc)\n"
        "for target in [src / 'grading' / 'scoring.py', src / 'grading' / 'questions' / 'lab07.py']:\n"
        "    try:\n"
        "        target.write_text('')\n"
        "    except OSError as exc:\n"
        "        print('write refused', exc)\n"
    )


def _snoop(seed_file: Path) -> str:
    """Reads the instructor's seed, the environment, the grader's processes and the hidden checks."""
    return (
        "import os, glob\n"
        "seen = []\n"
        f"for path in [{str(seed_file)!r}, os.path.expanduser('~/.config/llm-serving-lab/instructor/seed')]:\n"
        "    try:\n"
        "        seen.append('SEED-FILE:' + open(path).read())\n"
        "    except OSError:\n"
        "        pass\n"
        "seen += ['ENV:' + k for k in os.environ if k.startswith(('LAB_INSTRUCTOR', 'PYTEST', 'SUDO'))]\n"
        "for cmd in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    text = open(cmd, 'rb').read().replace(b'\\0', b' ').decode(errors='replace')\n"
        "    if '--seed' in text:\n"
        "        seen.append('PROC:' + text)\n"
        "try:\n"
        "    import grader.hidden.lab07 as h\n"
        "    seen.append('HIDDEN:' + ','.join(dir(h)))\n"
        "except Exception as exc:\n"
        "    print('no hidden checks:', type(exc).__name__)\n"
        "try:\n"
        "    from lab_utils.grading.questions.lab07 import _trt_tokens as trtllm_kv_tokens\n"
        "    seen.append('REFERENCE')\n"
        "except Exception as exc:\n"
        "    print('no reference:', type(exc).__name__)\n"
        "print('SEEN', seen)\n"
    )


DOUBLE_FORK = (
    "import os, subprocess, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(10000)', {MARKER!r}])\n"
    "    os._exit(0)\n"
)
FILL_TMP = (
    "chunk = b'x' * 2**20\n"
    "with open('filler.bin', 'wb') as f:\n"
    "    for _ in range(10_000):\n"
    "        f.write(chunk)\n"
)
FILL_OUT = (
    "import glob, os\n"
    "chunk = b'x' * 2**20\n"
    "with open('/tmp/out/filler.bin', 'wb') as f:\n"
    "    for _ in range(10_000):\n"
    "        f.write(chunk)\n"
)
STUB = "def served_versions(on_disk, policy):\n    raise NotImplementedError\n"


def _leave_status(make: str) -> str:
    """Replaces the run's status file (`make` builds the new one at `p`), then kills papermill so
    that nothing writes it again (issue 38: a FIFO there hung the grader for good)."""
    return (
        "import json, os, signal\n"
        "p = '/tmp/out/status.json'\n"
        "os.unlink(p)\n"
        f"{make}\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    )


FIFO_STATUS = _leave_status("os.mkfifo(p)")
SPARSE_STATUS = _leave_status("open(p, 'wb').truncate(64 * 2**30)")
FORGED = "\\x1b[2K\\r[9/9] ######## 0 failed | a_good lab 07: 19/19 — ok <script>alert(1)</script>"
ANSI_STATUS = _leave_status(
    f"open(p, 'w').write(json.dumps({{'outcome': 'cell errors', 'detail': '{FORGED}'}}))"
)


def _class(subs: Path, seed_file: Path) -> dict[str, tuple[float, str | None]]:
    """Write the class; returns student -> (expected total, expected status prefix or None)."""
    # names sort so that each attack comes before a good student and an untouched stub
    students = {
        "a_good": (notebook(*GOOD), (5, "ok")),
        "b_self_scoring": (notebook(_self_scoring()), (0, None)),
        "c_checker_rewrite": (notebook(_checker_rewrite()), (0, None)),
        "d_stub_after_rewrite": (notebook(STUB), (0, None)),
        "e_snoop": (notebook(_snoop(seed_file)), (0, None)),
        "f_double_fork": (notebook(DOUBLE_FORK), (0, None)),
        "g_fill_tmp": (notebook(FILL_TMP), (0, "cell errors")),
        "h_fill_out": (notebook(FILL_OUT), (0, "disk limit")),
        "i_good_after": (notebook(*GOOD), (5, "ok")),
        "k_fifo_status": (notebook(*GOOD, FIFO_STATUS), (5, "failed")),
        "l_sparse_status": (notebook(*GOOD, SPARSE_STATUS), (5, "failed")),
        "m_forged_status": (notebook(*GOOD, ANSI_STATUS), (5, "cell errors")),
    }
    for name, (nb, _) in students.items():
        put(subs, name, nb)
    (subs / "j_linked").symlink_to("/")
    return {name: want for name, (_, want) in students.items()}


def _rows(out: Path) -> dict[str, dict]:
    return {r["student"]: r for r in csv.DictReader((out / "gradebook.csv").open())}


def _grade(subs: Path, out: Path, env: dict, *extra: str) -> str:
    cmd = [sys.executable, "-m", "grader", "grade", str(subs), "--out", str(out), "--seed", str(SEED)]
    cmd += ["--timeout", "120", "--disk-mb", "32", "--tmp-mb", "128", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _daemons() -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if MARKER in " ".join(p.info["cmdline"] or []):
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    subs, out, instructor = root / "subs", root / "out", root / "instructor"
    instructor.mkdir()
    seed_file = instructor / "seed"
    seed_file.write_text("987654321\n")
    expected = _class(subs, seed_file)
    scratch = root / "tmp"
    scratch.mkdir()
    env = {**os.environ, "LAB_INSTRUCTOR_DIR": str(instructor), "TMPDIR": str(scratch)}
    t0 = time.monotonic()
    log = _grade(subs, out, env)
    return {
        "subs": subs,
        "out": out,
        "env": env,
        "log": log,
        "expected": expected,
        "scratch": scratch,
        "seconds": time.monotonic() - t0,
    }


@pytest.mark.slow
def test_each_hostile_submission_scores_zero_and_the_good_ones_keep_full_marks(hostile_class):
    got = _rows(hostile_class["out"])
    for student, (total, status) in hostile_class["expected"].items():
        row = got[student]
        assert float(row["total"]) == total, (student, row)
        if status:
            assert row["status"].startswith(status), (student, row["status"])
    assert got["j_linked"]["status"].startswith("refused"), got["j_linked"]
    assert "sandbox" in hostile_class["log"]


@pytest.mark.slow
def test_a_status_left_as_a_fifo_a_sparse_file_or_escapes_is_a_plain_row(hostile_class):
    """The FIFO and the 64 GiB sparse file: a failed row that names the refused file (cached like
    any other, see the rerun below), no hang and no grader error; the forged status reaches the
    gradebook, the console and the feedback as plain text."""
    got = _rows(hostile_class["out"])
    for student in ("k_fifo_status", "l_sparse_status"):
        assert "refused" in got[student]["status"], got[student]
    forged = got["m_forged_status"]["status"]
    feedback = (hostile_class["out"] / "feedback" / "m_forged_status" / "07.md").read_text()
    for text in (forged, hostile_class["log"], feedback):
        assert "\x1b" not in text and "\r" not in text
    assert "<script>" not in forged and "<script>" not in feedback
    assert not list(Path(hostile_class["scratch"]).glob("lab-grader-*")), "a scratch folder was left"


@pytest.mark.slow
def test_the_snoop_saw_nothing(hostile_class):
    nb = nbformat.read(str(hostile_class["out"] / "executed" / "e_snoop" / "07_triton.ipynb"), as_version=4)
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "SEEN []" in text, text[:3000]
    assert "987654321" not in text and "no hidden checks" in text and "no reference" in text


@pytest.mark.slow
def test_nothing_is_left_running(hostile_class):
    assert _daemons() == [], "the double-forked process outlived its grading"


@pytest.mark.slow
def test_an_edited_saved_grade_is_graded_again(hostile_class, tmp_path):
    out = hostile_class["out"]
    saved = out / ".cache" / "d_stub_after_rewrite" / "07.json"
    data = json.loads(saved.read_text())
    data["scores"] = {q: 99.0 for q in data["scores"]}
    saved.write_text(json.dumps(data))
    log = _grade(hostile_class["subs"], out, hostile_class["env"])
    assert float(_rows(out)["d_stub_after_rewrite"]["total"]) == 0
    assert "grading 1 notebook(s)" in log, log  # only the edited one; the others were kept
    assert _daemons() == []
