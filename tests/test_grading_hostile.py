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
# the run's one writable host folder (its answers go there): found from its own mount table
_OUT = (
    "import os\n"
    "out = [m.split()[4] for m in open('/proc/self/mountinfo') if m.split()[4].endswith('/out')"
    " and m.split()[5].startswith('rw')][0]\n"
)
FILL_OUT = (
    _OUT + "chunk = b'x' * 2**20\n"
    "with open(os.path.join(out, 'filler.bin'), 'wb') as f:\n"
    "    for _ in range(10_000):\n"
    "        f.write(chunk)\n"
)
STUB = "def served_versions(on_disk, policy):\n    raise NotImplementedError\n"


FORGED = "\\x1b[2K\\r[9/9] ######## 0 failed | a_good lab 07: 19/19 — ok <script>alert(1)</script>"
# issue 47 item 4: a last cell writes the grader's old status and notebook files, read-only,
# the way a forger would; the second variant also kills the run's driver so nothing sends a report
_FORGE = (
    _OUT + "import json, signal\n"
    "marker = 'FORG' + 'ED-NB'\n"
    "for name, data in [('status.json', json.dumps({'outcome': 'memory limit', 'detail': '"
    + FORGED
    + "'})),\n"
    "                   ('executed.ipynb', json.dumps({'cells': [], 'metadata': {}, 'nbformat': 4,"
    " 'nbformat_minor': 5, 'note': marker}))]:\n"
    "    for folder in (out, '/tmp/out', '/tmp/work'):\n"
    "        try:\n"
    "            os.makedirs(folder, exist_ok=True)\n"
    "            open(os.path.join(folder, name), 'w').write(data)\n"
    "            os.chmod(os.path.join(folder, name), 0o444)\n"
    "        except OSError:\n"
    "            pass\n"
)
FORGE_STATUS = _FORGE
FORGE_AND_KILL = _FORGE + "os.kill(os.getppid(), signal.SIGKILL)\n"
# issue 47 item 3: write past the disk limit to every descriptor the kernel holds
FLOOD_FDS = (
    "import os\n"
    "chunk = b'y' * 2**20\n"
    "for fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):\n"
    "    try:\n"
    "        if os.readlink(f'/proc/self/fd/{fd}').startswith(('socket:', 'anon_inode:')):\n"
    "            continue  # the kernel's own connection to papermill\n"
    "    except OSError:\n"
    "        continue\n"
    "    for _ in range(48):\n"
    "        try:\n"
    "            os.write(fd, chunk)\n"
    "        except OSError:\n"
    "            break\n"
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
        "k_flood_fds": (notebook(*GOOD, FLOOD_FDS), (5, None)),
        "l_forge_and_kill": (
            notebook(*GOOD, FORGE_AND_KILL),
            (5, "failed: the run stopped without a report"),
        ),
        "m_forged_status": (notebook(*GOOD, FORGE_STATUS), (5, "ok")),
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
def test_a_forged_status_and_notebook_never_reach_the_gradebook(hostile_class):
    """Issue 47 item 4: the status files a last cell wrote (read-only) are not the grader's word;
    the row says what the run's driver reported, and the kept notebook is papermill's own. A run
    whose driver was killed has no report, and says so. Nothing a learner wrote is rendered."""
    got = _rows(hostile_class["out"])
    out = hostile_class["out"]
    for student in ("m_forged_status", "l_forge_and_kill"):
        status = got[student]["status"]
        feedback = (out / "feedback" / student / "07.md").read_text()
        assert "memory limit" not in status and "memory limit" not in feedback, (student, status)
        for text in (status, hostile_class["log"], feedback):
            assert "\x1b" not in text and "\r" not in text and "<script>" not in status
    kept = (out / "executed" / "m_forged_status" / "07_triton.ipynb").read_text()
    assert "FORGED-NB" not in kept and "served_versions" in kept
    assert not list(Path(hostile_class["scratch"]).glob("lab-grader-*")), "a scratch folder was left"


@pytest.mark.slow
def test_no_host_file_grows_past_the_limits_through_a_descriptor(hostile_class):
    """Issue 47 item 3: the notebook wrote 48 MB to each descriptor it held (the disk limit is 32
    MB); the output came through pipes, kept up to the log cap, and no file of the grader's grew."""
    from grader.sandbox import LOG_CAP_BYTES

    assert float(_rows(hostile_class["out"])["k_flood_fds"]["total"]) == 5
    sizes = [p.stat().st_size for p in Path(hostile_class["out"]).rglob("*") if p.is_file()]
    sizes += [p.stat().st_size for p in Path(hostile_class["scratch"]).rglob("*") if p.is_file()]
    assert max(sizes) < max(32 * 2**20, LOG_CAP_BYTES + 2**20), max(sizes)


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
