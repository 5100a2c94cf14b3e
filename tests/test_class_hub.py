"""The class hub (docker/hub/): cgroup limits per learner server, the scripts' refusals, and, where
the hub is installed and we are root, a real hub with two learners and nbgrader's exchange flow
(release, fetch, submit, collect by the grader, return, release_feedback, fetch_feedback)."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HUB = REPO / "docker" / "hub"
HUB_VENV = Path(os.environ.get("HUB_VENV", "/opt/llm-serving-hub/venv"))
sys.path.insert(0, str(HUB))
import cgroups  # noqa: E402


def _fake_hierarchy(root: Path) -> Path:
    for c in cgroups.CONTROLLERS:
        (root / c).mkdir(parents=True)
    return root


def test_each_server_gets_its_own_groups_with_its_limits(tmp_path, monkeypatch):
    root = _fake_hierarchy(tmp_path / "cg")
    monkeypatch.setattr(cgroups, "own_group", lambda c, proc="": "/hub" if c == "memory" else "/")
    (root / "memory" / "hub").mkdir()
    assert cgroups.problem(root) == ""
    procs = cgroups.prepare("ana", cgroups.Limits(512 * 2**20, 1.5, 256), root)
    assert procs == [
        root / "memory" / "hub" / "llm-serving-hub" / "ana" / "cgroup.procs",
        root / "cpu" / "llm-serving-hub" / "ana" / "cgroup.procs",
        root / "pids" / "llm-serving-hub" / "ana" / "cgroup.procs",
    ]
    ana = root / "memory" / "hub" / "llm-serving-hub" / "ana"
    assert (ana / "memory.limit_in_bytes").read_text() == str(512 * 2**20)
    assert (root / "cpu" / "llm-serving-hub" / "ana" / "cpu.cfs_quota_us").read_text() == "150000"
    assert (root / "pids" / "llm-serving-hub" / "ana" / "pids.max").read_text() == "256"
    cgroups.join(procs, pid=4242)
    assert procs[0].read_text() == "4242"
    for p in procs:
        p.unlink()
    for f in ("memory.limit_in_bytes",):
        (ana / f).unlink()
    (root / "cpu" / "llm-serving-hub" / "ana" / "cpu.cfs_quota_us").unlink()
    (root / "cpu" / "llm-serving-hub" / "ana" / "cpu.cfs_period_us").unlink()
    (root / "pids" / "llm-serving-hub" / "ana" / "pids.max").unlink()
    cgroups.remove("ana", root)
    assert not ana.exists()


def test_cgroup_problems_and_sizes_are_explained(tmp_path):
    assert "no cgroup v1 'memory' hierarchy" in cgroups.problem(tmp_path)
    assert cgroups.parse_bytes("4G") == 4 * 2**30 and cgroups.parse_bytes("512M") == 512 * 2**20
    assert cgroups.parse_bytes(None) == 0 and cgroups.parse_bytes(1000) == 1000
    with pytest.raises(ValueError, match="not a memory size"):
        cgroups.parse_bytes("lots")
    with pytest.raises(ValueError):
        cgroups.Limits(memory_bytes=-1)
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/a/b\n3:cpu,cpuacct:/\n")
    assert cgroups.own_group("memory", str(proc)) == "/a/b" and cgroups.own_group("pids", str(proc)) == "/"


def test_hub_files_parse_and_the_script_refuses_bad_input():
    py_compile.compile(str(HUB / "jupyterhub_config.py"), doraise=True)
    py_compile.compile(str(HUB / "smoke.py"), doraise=True)
    text = (HUB / "jupyterhub_config.py").read_text()
    assert 'c.JupyterHub.ip = os.environ.get("HUB_IP", "127.0.0.1")' in text
    usage = subprocess.run(["bash", str(HUB / "hub.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "hub.sh install" in usage.stdout
    if os.getuid() == 0:
        bad = subprocess.run(
            ["bash", str(HUB / "hub.sh"), "users", "Not A Name"], capture_output=True, text=True
        )
        assert bad.returncode == 2 and "is not a unix user name" in bad.stderr
    reqs = (HUB / "requirements.txt").read_text()
    assert "jupyterhub==6.1.1" in reqs and "nbgrader==0.9.6" in reqs


# --- a real hub ------------------------------------------------------------------------------------

LEARNERS = ["llmhubt1", "llmhubt2"]
INSTRUCTOR = "llmhubti"


def _skip_reason() -> str:
    if os.getuid() != 0:
        return "the class hub needs root (real unix users)"
    if not (HUB_VENV / "bin" / "jupyterhub").exists():
        return (
            f"the class hub is not installed in {HUB_VENV}: run `bash docker/hub/hub.sh install` as root "
            "(about 25 s) or `make hub`, then run this test again"
        )
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as(user: str, cmd: str, cwd: str) -> subprocess.CompletedProcess:
    home = os.path.expanduser(f"~{user}")
    env = f"HOME={home} PATH={HUB_VENV}/bin:/usr/bin:/bin"
    return subprocess.run(
        ["runuser", "-u", user, "--", "sh", "-c", f"export {env} && cd '{cwd}' && {cmd}"],
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "-")
def test_a_real_hub_two_learners_and_nbgrader_feedback_round_trip(tmp_path):
    for user in [*LEARNERS, INSTRUCTOR]:
        if subprocess.run(["id", user], capture_output=True).returncode:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], check=True)
        os.chmod(os.path.expanduser(f"~{user}"), 0o700)
    shared = Path(tempfile.mkdtemp(prefix="hubtest-", dir="/tmp"))
    os.chmod(shared, 0o755)
    exchange = shared / "exchange"
    exchange.mkdir()
    os.chmod(exchange, 0o777)
    course = Path(os.path.expanduser(f"~{INSTRUCTOR}")) / "course"
    shutil.rmtree(course, ignore_errors=True)
    (course / "source" / "00_setup").mkdir(parents=True)
    shutil.copy(REPO / "labs" / "00_setup.ipynb", course / "source" / "00_setup")
    subprocess.run(["chown", "-R", f"{INSTRUCTOR}:", str(course)], check=True)
    os.chmod(course / "source", 0o700)
    flags = f"--Exchange.root={exchange} --CourseDirectory.course_id=t101"
    port = _free_port()
    env = dict(
        os.environ,
        HUB_STATE=str(tmp_path / "state"),
        HUB_PORT=str(port),
        HUB_AUTH="shared",
        HUB_SHARED_PASSWORD="learners-password",
        HUB_ADMIN_PASSWORD="a" * 40,
        HUB_USERS=" ".join(LEARNERS),
        HUB_ADMINS=INSTRUCTOR,
        HUB_VENV=str(HUB_VENV),
    )
    t0 = time.monotonic()
    hub = subprocess.Popen(
        ["bash", str(HUB / "hub.sh"), "start"],
        env=env,
        stdout=open(tmp_path / "hub.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        import urllib.request

        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/api/", timeout=2)
                break
            except OSError:
                assert time.monotonic() - t0 < 30, (tmp_path / "hub.log").read_text()[-3000:]
                time.sleep(0.25)
        started = time.monotonic() - t0
        smoke = subprocess.run(
            [
                str(HUB_VENV / "bin" / "python"),
                str(HUB / "smoke.py"),
                f"http://127.0.0.1:{port}",
                "learners-password",
                *LEARNERS,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        report = json.loads(smoke.stdout)
        if not cgroups.problem():
            for user in LEARNERS:
                assert report["learners"][user]["groups"]["memory"].endswith(f"/llm-serving-hub/{user}")

        # nbgrader's exchange: hand out, fetch, submit (as the learners), collect with the grader
        cwd = str(course)
        r = _as(
            INSTRUCTOR,
            f"nbgrader generate_assignment 00_setup --force {flags} && "
            f"nbgrader release_assignment 00_setup --force {flags}",
            cwd,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        for user in LEARNERS:
            home = os.path.expanduser(f"~{user}")
            r = _as(
                user, f"nbgrader fetch_assignment 00_setup {flags} && nbgrader submit 00_setup {flags}", home
            )
            assert r.returncode == 0, r.stderr[-2000:]
        out = tmp_path / "out"
        from grader.exchange import collect, write_feedback, write_manifest

        subs, _ = collect(exchange / "t101", out / "collected")
        assert sorted(s.student for s in subs if not s.status) == LEARNERS
        write_manifest(out, exchange, subs, None)
        for user in LEARNERS:  # the grader's feedback (grading itself is tested elsewhere)
            (out / "feedback" / user).mkdir(parents=True)
            (out / "feedback" / user / "00.md").write_text(f"# Lab 00 — {user}\n\nScore: **1 / 7**\n")
        written, skipped = write_feedback(out, course)
        assert len(written) == 2 and not skipped
        r = _as(INSTRUCTOR, f"nbgrader release_feedback 00_setup {flags}", cwd)
        assert r.returncode == 0, r.stderr[-2000:]
        for user, other in (LEARNERS, LEARNERS[::-1]):
            home = os.path.expanduser(f"~{user}")
            r = _as(user, f"nbgrader fetch_feedback 00_setup {flags}", home)
            assert r.returncode == 0, r.stderr[-2000:]
            pages = list(Path(home, "00_setup", "feedback").rglob("00_setup.html"))
            assert len(pages) == 1 and f"Lab 00 — {user}" in pages[0].read_text()
            assert _as(other, f"cat '{pages[0]}'", "/").returncode != 0  # not the other learner's
            assert _as(user, f"ls {course / 'source'}", "/").returncode != 0  # nor the answers
        print(f"hub up in {started:.1f} s; spawns: {[report['learners'][u]['spawn_s'] for u in LEARNERS]} s")
    finally:
        os.killpg(hub.pid, 15)
        hub.wait(timeout=30)
        shutil.rmtree(shared, ignore_errors=True)
        for user in LEARNERS:
            shutil.rmtree(Path(os.path.expanduser(f"~{user}"), "00_setup"), ignore_errors=True)
