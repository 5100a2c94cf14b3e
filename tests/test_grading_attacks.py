"""The grader against a strong attacker (issue 38): what a run leaves cannot block or crash the
grader, a learner's text reaches the instructor as plain text, SEED reveals nothing, the sandbox is
an unprivileged host user, the limits count everything, and a saved grade is reused only when
nothing it depends on changed. Fast: no notebook runs here (the hostile class in
test_grading_hostile.py runs the same attacks end to end)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grader import fingerprint
from grader import grader as grader_module
from grader.gradebook import Job, Outcome, write_gradebook
from grader.grader import Grader, _feedback, _run_status, discover, hidden_key, job_seed, seed_warning
from grader.judge import CHECK_FAILED, _check_failed, _run, _type_only
from grader.sandbox import (
    STOP,
    Sandbox,
    Stopped,
    allow_list,
    course_roots,
    guarded,
    lease_uid,
    privileged,
    release_uid,
    sandbox_problem,
)
from grader.untrusted import MAX_NOTEBOOK_BYTES, Refused, csv_cell, markdown_text, plain, read_bytes

REPO = Path(__file__).resolve().parent.parent
needs_sandbox = pytest.mark.skipif(bool(sandbox_problem()), reason=sandbox_problem() or "no sandbox")
needs_root = pytest.mark.skipif(not privileged(), reason="the uid drop happens when the grader is root")


def _within(seconds: float, fn, *args):
    """fn(*args) in a thread; fails (instead of hanging the suite) when it takes longer."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- 1. nothing a run leaves blocks or crashes the grader ---------------------------------------


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path, size: int = 64 * 2**30) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_a_fifo_a_sparse_file_and_a_link_are_refused_without_waiting(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("instructor only")
    (tmp_path / "link").symlink_to(secret)
    for path in (_fifo(tmp_path / "fifo"), _sparse(tmp_path / "sparse"), tmp_path / "link"):
        with pytest.raises(Refused):
            _within(5, read_bytes, path, 2**20)
    assert read_bytes(secret, 100) == b"instructor only"


@pytest.mark.parametrize("kind", ["none", "huge", "garbage", "ansi"])
def test_a_hostile_status_report_gives_a_failed_row_never_a_grader_error(kind):
    """What the run's driver sends is data: missing, oversized, not JSON or full of control codes,
    it gives a plain 'failed' row."""
    forged = "\x1b[2K\x1b[1A\r[9/9] 19/19 — ok\x07\x1b]0;title\x07<script>x</script>"
    report = {
        "none": None,
        "huge": json.dumps({"outcome": "ok", "detail": "x" * 10**7}).encode(),
        "garbage": b"\xff\xfe{not json",
        "ansi": json.dumps({"outcome": "weird", "detail": forged}).encode(),
    }[kind]
    text = _within(5, _run_status, 0, None, report, 60, 1000)
    assert text.startswith("failed"), text
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    if kind == "none":
        assert "without a report" in text, text


def test_a_kept_executed_notebook_that_is_huge_or_broken_is_skipped(tmp_path):
    g = Grader(tmp_path / "out", seed=1, sandboxed=False, key="00" * 32)
    try:
        job = Job("ana", "07", tmp_path / "07_triton.ipynb")
        import nbformat  # noqa: F401 - imported here, so a loaded machine's slow first import is not timed

        _within(5, g._keep_executed, job, b"{" * (MAX_NOTEBOOK_BYTES + 1))
        _within(5, g._keep_executed, job, b"\xff not a notebook")
        _within(5, g._keep_executed, job, None)
        assert not (tmp_path / "out" / "executed").exists()
    finally:
        g.close()


def test_a_fifo_handed_in_as_a_notebook_is_a_row_not_a_hang(tmp_path):
    (tmp_path / "ana").mkdir()
    _fifo(tmp_path / "ana" / "07_triton.ipynb")
    jobs, _ = _within(5, discover, tmp_path)
    assert jobs[0].problem.startswith("unreadable") and "FIFO" in jobs[0].problem, jobs[0]


def test_ctrl_c_stops_the_class_within_seconds_and_keeps_finished_grades(tmp_path):
    from grader.runner import run_local
    from grader.sandbox import run_limited

    class Slow:
        stopped = False

        def grade(self, job):
            if job.student == "fast":
                return Outcome(job.student, job.lab), ""
            run_limited(
                ["sleep", "600"],
                timeout=600,
                memory_mb=0,
                env=dict(os.environ),
                cwd=tmp_path,
                log=tmp_path / "log",
            )
            return Outcome(job.student, job.lab, status="should never be reported"), ""

        def stop(self):
            self.stopped = True
            STOP.set()

    got = []

    def on_result(result):
        got.append(result)
        time.sleep(1.0)  # the slow one is running now
        raise KeyboardInterrupt

    jobs = [Job("slow", "07", tmp_path), Job("fast", "07", tmp_path)]
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_local(Slow(), jobs, 2, on_result)
    finally:
        STOP.clear()
    assert time.monotonic() - t0 < 15
    assert [r[0].student for r in got] == ["fast"]
    out = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True).stdout.split()
    mine = [p for p in out if _parent_is_me(int(p))]
    assert mine == [], "the interrupted run is still running"


def _parent_is_me(pid: int) -> bool:
    import psutil

    try:
        return any(p.pid == os.getpid() for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def test_a_stopped_grader_starts_no_run(tmp_path):
    g = Grader(tmp_path / "out", seed=1, sandboxed=False, key="00" * 32)
    try:
        g.stopping.set()
        with pytest.raises(Stopped):
            g._sandbox(None, None)
    finally:
        g.close()
    assert not g.scratch.exists()


# --- 2. plain text in, plain text out ------------------------------------------------------------

HOSTILE = (
    "\x1b[2K\r19/19 — ok\x1b]8;;javascript:alert(1)\x07x\x1b]8;;\x07 <img src=x onerror=alert(1)> "
    "<script>alert(1)</script> [click](javascript:alert(1)) \rScore: 19 / 19\x08\x9b31m|col|\u202e"
)


def test_plain_text_has_no_escapes_carriage_returns_or_controls():
    text = plain(HOSTILE)
    assert not any(ch in text for ch in "\x1b\r\x07\x08\x9b\u202e\n")
    assert "19/19" in text  # the learner's words stay readable, as data


def test_feedback_escapes_html_links_and_forged_lines(tmp_path):
    job = Job("eve<b>", "07", tmp_path / "07_triton.ipynb")
    outcome = Outcome(
        "eve<b>", "07", scores={"07.q": 0.0}, possible={"07.q": 2.0}, status=f"cell errors: {HOSTILE}"
    )
    results = [{"id": "07.q", "earned": 0.0, "points": 2.0, "status": "error", "message": HOSTILE}]
    text = _feedback(job, outcome, results, [{"name": "t<x>", "outcome": "failed", "points": 1.0}], "")
    for bad in ("<script", "<img", "<b>", "javascript:", "\r", "\x1b", "\u202e"):
        assert bad not in text, bad
    assert re.search(r"(?<!\\)\]\(", text) is None, "a Markdown link survived"
    score_lines = [line for line in text.splitlines() if line.startswith("Score")]
    assert score_lines == ["Score: **0 / 3**"] or score_lines == ["Score: **0 / 2**"], score_lines
    table = [line for line in text.splitlines() if line.startswith("| 07.q")]
    assert len(table) == 1 and table[0].count("|") - table[0].count("\\|") == 5  # no forged column


def test_gradebook_is_valid_csv_and_formula_safe_for_any_name_or_status(tmp_path):
    names = ['=HYPERLINK("http://x","y")', "+1", "-2", "@SUM(A1)", "\tTAB", 'a,b"c\nd', "\rcr"]
    outcomes = [
        Outcome(n, "07", {"07.q": 1.0}, {"07.q": 2.0}, status=f"=cmd|' /C calc'!A0 {HOSTILE}") for n in names
    ]
    path = write_gradebook(tmp_path, outcomes)
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert len(rows) == 2 + len(names)
    for row in rows[2:]:
        assert len(row) == 5
        for cell in (row[0], row[-1]):
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
            assert "\x1b" not in cell and "\r" not in cell and "\n" not in cell
            assert "<" not in cell and "javascript:" not in cell
    assert csv_cell("ok") == "ok" and csv_cell("-1").startswith("'")


def test_markdown_text_keeps_course_messages_readable():
    assert (
        markdown_text("expected `served_versions` to return a dict")
        == "expected `served_versions` to return a dict"
    )


def test_an_exception_on_a_hidden_case_shows_only_its_type():
    leak = "your answer raised ValueError: hidden inputs were (4096, 17, 'secret')"
    cut = _type_only(leak)
    assert cut.startswith("your answer raised ValueError") and "4096" not in cut and "secret" not in cut
    assert "4096" not in _type_only("your answer raised : 4096")


def test_an_exception_the_check_raised_is_not_blamed_on_the_answer():
    """A check that fails on its own (a case it generated, or a value it cannot use) says so: the
    learner is not told their answer raised, and the case's text stays hidden."""

    def check(answer):
        return max(x for x in answer() if x > 4096)  # empty: the check's own ValueError

    frac, status, message = _run(check, {"answer": lambda: [1, 2]}, {})
    assert frac is None and status == "error" and message.startswith(CHECK_FAILED), message
    cut = _check_failed(message)
    assert (
        "ValueError" in cut and "your answer raised" not in cut and "4096" not in cut and "empty" not in cut
    )

    def raises(**_):
        exc = ValueError("the learner's own words")
        exc.from_learner = True  # as the runner marks an exception that crossed from the sandbox
        raise exc

    assert _run(raises, {}, {})[2].startswith("your answer raised ValueError")
    assert "(an exception)" in _check_failed(CHECK_FAILED + ": 4096")  # no type name: none is made up


@needs_sandbox
def test_a_learner_exception_on_a_hidden_case_never_reaches_the_feedback(tmp_path):
    """07.extra_tensor_bytes: right on the public check's calls, then a ValueError carrying the
    hidden case's inputs; the result names the type only."""
    from submissions import judge_in_sandbox

    from lab_utils.grading.registry import get

    calls = [0]

    def counting(p, n, b=8):
        calls[0] += 1
        return 2 * b * (p + n)

    get("07.extra_tensor_bytes").fn(counting)
    source = (
        f"_seen = [0]\ndef extra_tensor_bytes(p, n, b=8):\n    _seen[0] += 1\n"
        f"    if _seen[0] > {calls[0]}:\n        raise ValueError(f'LEAK {{p}} {{n}} {{b}}')\n"
        "    return 2 * b * (p + n)\n"
    )
    ns: dict = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), ns)
    result = judge_in_sandbox("07", {"extra_tensor_bytes": ns["extra_tensor_bytes"]}, tmp_path)[
        "07.extra_tensor_bytes"
    ]
    assert result.earned == 0 and "LEAK" not in result.message and "ValueError" in result.message, result


# --- 3. SEED reveals nothing -----------------------------------------------------------------------


def test_seeds_and_hidden_cases_are_keyed_by_the_grading_key_not_the_seed():
    k1, k2 = b"\x01" * 32, b"\x02" * 32
    assert job_seed(31337, "ana", "11", k1) == job_seed(31337, "ana", "11", k1)  # reproducible
    assert job_seed(31337, "ana", "11", k1) != job_seed(31337, "ana", "11", k2)
    assert job_seed(31337, "ana", "11", k1) != job_seed(31338, "ana", "11", k1)  # the seed picks a variant
    assert hidden_key(31337, k1) != hidden_key(31337, k2) and len(hidden_key(1, k1)) == 64
    # the old SEED was a plain hash of (seed, student, lab): a search over seeds found it
    import hashlib

    old = int.from_bytes(hashlib.sha256(b"31337/ana/11").digest()[:4], "big") % (2**31 - 1) + 1
    assert job_seed(31337, "ana", "11", k1) != old


def test_the_grading_key_is_created_once_private_and_short_seeds_are_warned(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_INSTRUCTOR_DIR", str(tmp_path / "instructor"))
    notes: list[str] = []
    key = grader_module.grading_key(notes.append)
    assert len(key) == 32 and grader_module.grading_key(notes.append) == key and len(notes) == 1
    assert (tmp_path / "instructor" / "grading.key").stat().st_mode & 0o077 == 0
    assert "short" in seed_warning(31337) and seed_warning(2**70) == ""


# --- 6. the cache key is everything a grade depends on ---------------------------------------------


@pytest.fixture
def keyed(tmp_path, monkeypatch):
    folder = tmp_path / "subs" / "ana"
    folder.mkdir(parents=True)
    nb = folder / "07_triton.ipynb"
    nb.write_text("{}")
    (folder / "aux.py").write_text("ANSWER = 1\n")
    (folder / "09_other.ipynb").write_text("{}")
    hidden = tmp_path / "hidden"
    (hidden / "lab07").mkdir(parents=True)
    (hidden / "lab07" / "test_a.py").write_text("def test_a(answers):\n    pass\n")
    trees = {"grader": "g1", "lab_utils": "l1"}
    monkeypatch.setattr(grader_module, "tree_digest", lambda tree: trees[Path(tree).name])
    packages = {"list": "numpy==2.0"}
    monkeypatch.setattr(grader_module, "installed_packages", lambda: packages["list"])

    def key(**kw):
        g = Grader(
            tmp_path / "out", hidden_tests=hidden, sandboxed=False, **{"seed": 1, "key": "00" * 32, **kw}
        )
        try:
            return g.job_key(Job("ana", "07", nb))
        finally:
            g.close()

    return {"key": key, "folder": folder, "hidden": hidden, "trees": trees, "packages": packages}


def test_the_cache_key_changes_with_everything_a_grade_depends_on(keyed):
    key, base = keyed["key"], keyed["key"]()
    assert base and key() == base  # nothing changed: the saved grade is reused
    changes = []

    def changed(what: str) -> None:
        changes.append((what, key()))

    (keyed["folder"] / "aux.py").write_text("ANSWER = 2\n")
    changed("aux.py beside the notebook")
    (keyed["folder"] / "data").mkdir()
    (keyed["folder"] / "data" / "x.csv").write_text("1\n")
    changed("a file in a sub-folder")
    keyed["trees"]["lab_utils"] = "l2"
    changed("any file of lab_utils (engine, sim, kv, every lab's questions)")
    keyed["trees"]["grader"] = "g2"
    changed("any file of the grader")
    (keyed["hidden"] / "lab07" / "test_a.py").write_text("def test_a(answers):\n    assert 1\n")
    changed("a hidden test")
    keyed["packages"]["list"] = "numpy==2.1"
    changed("an installed package's version")
    keys = [base] + [k for _, k in changes]
    assert len(set(keys)) == len(keys), [w for (w, k), prev in zip(changes, keys) if k == prev]
    last = keys[-1]
    for kw in (
        {"seed": 2},
        {"key": "11" * 32},
        {"parameters": {"LIGHT": True}},
        {"timeout": 5.0},
        {"memory_mb": 99},
    ):
        assert keyed["key"](**kw) != last, kw
    (keyed["folder"] / "09_other.ipynb").write_text('{"other lab": 1}')
    assert key() == last  # another lab's notebook is not part of this grade


def test_tree_digest_sees_every_file_and_no_cache(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "data.json").write_text("{}")
    first = fingerprint.tree_digest(tmp_path / "pkg")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"1")
    assert fingerprint.tree_digest(tmp_path / "pkg") == first
    (tmp_path / "pkg" / "sub" / "data.json").write_text("[]")
    assert fingerprint.tree_digest(tmp_path / "pkg") != first
    _fifo(tmp_path / "pkg" / "pipe")
    _within(5, fingerprint.tree_digest, tmp_path / "pkg")  # a FIFO is never opened


# --- 4, 5. the sandbox is an unprivileged host user, with limits that count everything ------------


def _inside(code: str, box: Sandbox | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    box = box or Sandbox()
    uid = lease_uid()
    box.uid = uid
    try:
        cmd = guarded(box.wrap([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin", "HOME": "/tmp/work"}))
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    finally:
        release_uid(uid)


@needs_sandbox
@needs_root
def test_a_root_only_file_is_unreadable_inside(tmp_path):
    # inside a folder on the allow list (the course cache): file permissions still hold there
    cache = Path(course_roots()["course cache"])
    cache.mkdir(parents=True, exist_ok=True)
    secret = cache / f"lab-grader-secret-{os.getpid()}"
    secret.write_text("root only")
    secret.chmod(0o600)
    try:
        out = _inside(
            "import os\n"
            f"try:\n    print('READ', open({str(secret)!r}).read())\nexcept OSError as e:\n    print('DENIED', e.errno)\n"
            "print('UID', os.getuid())\n"
        )
    finally:
        secret.unlink()
    assert "DENIED 13" in out.stdout and "READ" not in out.stdout, out.stdout + out.stderr
    uid = int(out.stdout.split("UID")[1].split()[0])
    assert uid not in (0, 65534) and uid >= 640_000, out.stdout


@needs_sandbox
def test_an_environment_reached_through_a_link_runs_inside(tmp_path, monkeypatch):
    """A .venv that is a symlink (a clone linking another checkout's environment): the run calls
    the interpreter by the link's path, so the link must exist inside too (prlimit failed to
    execute it before)."""
    import grader.sandbox as sandbox

    link = tmp_path / "linked-venv"
    link.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    roots = {**sandbox.course_roots(), "environment": str(link)}
    monkeypatch.setattr(sandbox, "course_roots", lambda: roots)
    box = Sandbox()
    python = str(link / "bin" / Path(sys.executable).name)
    uid = lease_uid()
    box.uid = uid
    try:
        argv = box.wrap([python, "-c", "import sys; print('ran', sys.prefix)"], {"PATH": "/usr/bin:/bin"})
        links = [argv[i + 1 : i + 3] for i, a in enumerate(argv) if a == "--symlink"]
        assert [os.path.realpath(sys.prefix), str(link)] in links, links
        done = subprocess.run(
            guarded(argv), capture_output=True, text=True, timeout=60, start_new_session=True
        )
    finally:
        release_uid(uid)
    assert done.returncode == 0 and f"ran {link}" in done.stdout, done.stdout + done.stderr


# virtual file systems a mount table lists by what they are, never by a host path
_VIRTUAL_FS = {"tmpfs", "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "bpf"}


@needs_sandbox
def test_every_file_readable_inside_is_on_the_allow_list(tmp_path):
    """Issue 47 item 1: walk the whole sandbox as the run's uid; every readable file lies under an
    allowed folder, world-readable canaries outside the list (another project, the repository's own
    solutions/ and tests/) do not exist inside, and the mount table names only the bind points."""
    canaries = [Path("/var/tmp") / f"lab-canary-{os.getpid()}", REPO / "out" / f"lab-canary-{os.getpid()}"]
    for folder in canaries:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
        (folder / "canary.txt").write_text("visible?")
        (folder / "canary.txt").chmod(0o644)
    box = Sandbox()
    allowed = allow_list(box.course_folder())
    inner = {"/proc", "/sys", "/dev", "/tmp"}  # the run's own (or kernel) views
    code = f"""
import json, os
allowed, inner = {allowed!r}, {sorted(inner)!r}
def ok(p):
    return any(p == a or p.startswith(a.rstrip('/') + '/') for a in allowed + inner)
outside, files = [], 0
for top, dirs, names in os.walk('/'):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in inner]
    for n in names:
        p = os.path.join(top, n)
        if os.access(p, os.R_OK):
            files += 1
            if not ok(p) and not ok(os.path.realpath(p)):
                outside.append(p)
canaries = {[str(c / "canary.txt") for c in canaries]!r} + {[str(REPO / d) for d in ("solutions", "tests", "grader", ".git")]!r}
mounts = [line.split() for line in open('/proc/self/mountinfo')]
print(json.dumps({{"files": files, "outside": outside[:20],
                  "seen": [c for c in canaries if os.path.exists(c)],
                  "mounts": [(m[3], m[4], m[m.index('-') + 1]) for m in mounts],
                  "course": os.environ.get("LAB_REPO_ROOT")}}))
"""
    try:
        out = _inside(code, box, timeout=300)
    finally:
        for folder in canaries:
            shutil.rmtree(folder, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["files"] > 1000, seen["files"]  # the walk did run (Python and the course are there)
    assert seen["outside"] == [], seen["outside"]
    assert seen["seen"] == [], seen["seen"]
    assert seen["course"] == box.course_folder() and not (Path(seen["course"]) / "solutions").exists()
    for root, point, fs in seen["mounts"]:
        if fs in _VIRTUAL_FS:
            continue
        # a bind's source is the bind point itself, or a file of a bound system folder (/etc/localtime)
        assert root == point or any(root == a or root.startswith(a + "/") for a in allowed), (root, point)


@needs_sandbox
def test_the_published_solution_is_out_of_reach_at_run_time(tmp_path):
    """The attack of issue 47: find the course root from LAB_REPO_ROOT or two folders above
    lab_utils, and read solutions/ there."""
    out = _inside(
        "import os, pathlib, lab_utils\n"
        "roots = {os.environ.get('LAB_REPO_ROOT', ''), str(pathlib.Path(lab_utils.__file__).resolve().parent.parent)}\n"
        f"roots.add({str(REPO)!r})\n"
        "print('FOUND', sorted(str(p) for r in roots if r for p in pathlib.Path(r).glob('solutions/*.ipynb')))\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "FOUND []" in out.stdout, out.stdout


@needs_sandbox
def test_version_history_and_host_paths_are_hidden(tmp_path):
    scratch = tmp_path / "host-scratch-marker"
    scratch.mkdir()
    box = Sandbox(hide=[str(tmp_path)], read_only={str(scratch): "/tmp/in"})
    out = _inside(
        "import os, glob\n"
        f"print('GIT', sorted(os.listdir({str(REPO / '.git')!r})) if os.path.isdir({str(REPO / '.git')!r}) else 'none')\n"
        "print('CMD', [open(p, 'rb').read() for p in glob.glob('/proc/[0-9]*/cmdline')])\n"
        "print('PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n",
        box,
    )
    assert out.returncode == 0, out.stderr
    assert "GIT []" in out.stdout or "GIT none" in out.stdout, out.stdout
    assert "host-scratch-marker" not in out.stdout and str(tmp_path) not in out.stdout, out.stdout
    pids = json.loads(out.stdout.strip().splitlines()[-1].split("PIDS", 1)[1])
    assert max(pids) < 50, pids  # its own PID namespace: no host process is listed


@needs_sandbox
def test_tmp_is_capped_and_a_new_session_stays_in_the_run(tmp_path):
    out = _inside(
        "import os, resource\n"
        "sid = os.getsid(0); os.setsid(); print('SAME', os.getsid(0) == sid)\n"
        "print('NPROC', resource.getrlimit(resource.RLIMIT_NPROC)[0])\n"
        "try:\n"
        "    with open('/tmp/work/big', 'wb') as f:\n"
        "        for _ in range(64):\n"
        "            f.write(b'x' * 2**20)\n"
        "    print('WROTE 64')\n"
        "except OSError as e:\n"
        "    print('FULL', e.errno)\n",
        Sandbox(tmp_mb=16),
    )
    # the setsid filter is off (grader/sandbox.py: it stopped the course's servers from being
    # stopped), so a new session is allowed again; the /tmp cap and the pids limit still hold
    assert "SAME" in out.stdout and "FULL 28" in out.stdout, out.stdout + out.stderr
    assert 0 < int(out.stdout.split("NPROC")[1].split()[0]) <= 4096


def test_tmp_is_a_share_of_the_memory_limit(tmp_path):
    g = Grader(tmp_path / "out", seed=1, sandboxed=False, key="00" * 32, memory_mb=1000, tmp_mb=4096)
    try:
        assert g.tmp_mb_for("07") == 500
    finally:
        g.close()


BUSY = "import time\nt0 = time.process_time()\nwhile time.process_time() - t0 < {cpu}:\n    pass\n"
ATTACK = (
    "import os, time\n"
    "kids = 0\n"
    "for _ in range(400):\n"  # a fork bomb, capped by the run's process limit
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        os.setsid()\n"  # each busy loop in its own session (a share of its own, before)
    "        end = time.time() + {seconds}\n"
    "        while time.time() < end:\n"
    "            pass\n"
    "        os._exit(0)\n"
    "    kids += 1\n"
    "print('KIDS', kids, flush=True)\n"
    "time.sleep({seconds})\n"
)


@needs_sandbox
@needs_root
def test_a_fork_bomb_and_cpu_hog_leave_a_neighbours_time_in_bounds():
    """A neighbour needing 1 s of CPU, alone and beside a run that forks until its process limit
    (40 here) and spins in every child, each in its own session: the neighbour still finishes in
    a few times its own time (before: one CPU share per session, so 1/40 of the machine). Both
    runs have the share a two-worker grader gives (sandbox._throttle)."""
    share = max(1.0, (os.cpu_count() or 1) / 2)
    t0 = time.monotonic()
    alone = _inside(BUSY.format(cpu=1.0), Sandbox(cpus=share))
    base = time.monotonic() - t0
    assert alone.returncode == 0, alone.stderr
    hog = threading.Thread(
        target=lambda: box.update(out=_inside(ATTACK.format(seconds=12), Sandbox(nproc=40, cpus=share), 60))
    )
    box: dict = {}
    hog.start()
    time.sleep(3)  # the bomb is spinning
    t0 = time.monotonic()
    beside = _inside(BUSY.format(cpu=1.0), Sandbox(cpus=share))
    under_attack = time.monotonic() - t0
    hog.join(60)
    assert beside.returncode == 0, beside.stderr
    kids = int(box["out"].stdout.split("KIDS")[1].split()[0])
    assert 5 <= kids < 40, box["out"].stdout  # the limit stopped the bomb
    assert under_attack < max(4 * base, base + 6), (base, under_attack)


def test_two_workers_writing_the_same_prints_at_once_both_get_the_file():
    """The grader's workers share one folder of reference fingerprints; two writing the same set at
    once raced on one temporary file (a CI run: the loser's row became a grader error)."""
    from grader.library import prints_file

    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def write(n: int) -> None:
        barrier.wait()
        try:
            for i in range(30):
                path = prints_file({f"race-{n % 2}-{i}": "spec"})
                assert json.loads(path.read_text()) == {f"race-{n % 2}-{i}": "spec"}
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


@needs_sandbox
def test_a_run_writing_to_every_descriptor_it_holds_grows_no_host_file(tmp_path):
    """Issue 47 item 3: inside the sandbox a run writes 48 MB to each descriptor it holds; its
    output reaches the host through a pipe the grader reads into the log up to a cap."""
    from grader.sandbox import LOG_CAP_BYTES, run_limited

    code = (
        "import os\n"
        "held = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
        "print('HELD', held, flush=True)\n"
        "for fd in held:\n"
        "    for _ in range(48):\n"
        "        try:\n"
        "            os.write(fd, b'z' * 2**20)\n"
        "        except OSError:\n"
        "            break\n"
    )
    log = tmp_path / "run.log"
    code_, killed = run_limited(
        [sys.executable, "-c", code],
        timeout=120,
        memory_mb=0,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp/work"},
        cwd=tmp_path,
        log=log,
        sandbox=Sandbox(),
    )
    assert killed is None and code_ == 0, log.read_bytes()[-500:]
    text = log.read_bytes()
    assert b"HELD [0, 1, 2" in text, text[:200]
    assert log.stat().st_size <= LOG_CAP_BYTES + 4096, log.stat().st_size
    assert all(p.stat().st_size <= LOG_CAP_BYTES + 4096 for p in tmp_path.rglob("*") if p.is_file())


@needs_sandbox
def test_answers_that_sleep_cannot_hold_the_judge_past_its_budget(tmp_path):
    """Issue 47 item 5: one judge budget per submission, scaled by the lab's question count; past it,
    the questions not yet judged score 0 with a status that says so."""
    from grader.judge import judge_budget
    from grader.memorise import save_answers
    from grader.registry import questions_for

    def sleeper(*args, **kwargs):
        time.sleep(600)

    qs = questions_for("11")
    names = sorted({n for q in qs for n in q.answers})
    save_answers({n: sleeper for n in names}, tmp_path / "answers")
    grader = Grader(tmp_path / "out", seed=3, copies="off", key="00" * 32, judge_s_per_question=2.0)
    t0 = time.monotonic()
    try:
        results = grader.judge_saved("11", tmp_path / "answers")
    finally:
        grader.close()
    took = time.monotonic() - t0
    budget = judge_budget(len(qs), 2.0)
    assert took < budget + 20, (took, budget)  # one runner's start and stop past the line at most
    assert all(r.earned == 0 for r in results)
    skipped = [r for r in results if "budget" in r.message]
    assert skipped and len(skipped) < len(results), [r.message for r in results]
