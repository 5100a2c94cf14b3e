"""The server base, with a real small HTTP server process."""

from __future__ import annotations

import socket
import sys
import time
import urllib.request

import pytest

from lab_utils.servers import ServerProcess, ServerStartError, free_port, running_servers
from lab_utils.servers.base import port_in_use


def http_server(**kw) -> ServerProcess:
    return ServerProcess(
        "http",
        [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"],
        health_path="/",
        startup_timeout=30,
        **kw,
    )


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_context_manager_starts_binds_loopback_and_stops():
    with http_server() as srv:
        assert srv.is_running and srv.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(srv.url + "/", timeout=5) as resp:
            assert resp.status == 200
        pid = srv.pid
        assert srv in running_servers()
    assert not srv.is_running and not _alive(pid)
    assert not port_in_use(srv.port)
    assert srv not in running_servers()


def test_start_failure_raises_with_log_tail():
    srv = ServerProcess(
        "broken",
        [sys.executable, "-c", "import sys; print('boom: bad flag --nope'); sys.exit(3)"],
        health_path="/",
        startup_timeout=20,
    )
    with pytest.raises(ServerStartError) as info:
        srv.start()
    assert "exited with code 3" in str(info.value)
    assert "boom: bad flag --nope" in info.value.log_tail
    assert not srv.is_running


def test_health_timeout_kills_the_process():
    srv = ServerProcess(
        "silent",
        [sys.executable, "-c", "import time; print('waiting'); time.sleep(60)"],
        health_path="/",
        startup_timeout=1.5,
    )
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="not healthy after"):
        srv.start()
    assert time.monotonic() - t0 < 20
    assert not _alive(srv.pid)


def test_port_in_use_is_reported_clearly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerStartError, match="already in use"):
            http_server(port=port).start()


def test_stop_kills_a_process_that_ignores_sigterm_and_its_children():
    code = (
        "import signal, subprocess, sys, time, http.server, socketserver\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print('child', child.pid, flush=True)\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    srv = ServerProcess(
        "stubborn", [sys.executable, "-c", code, "{port}"], health_path="/", startup_timeout=30
    )
    srv.start()
    child = int(srv.log_text().split("child ")[1].split()[0])
    t0 = time.monotonic()
    srv.stop(timeout=1)
    assert time.monotonic() - t0 < 15
    assert not _alive(srv.pid) and not _alive(child)


def test_stop_all_at_exit_leaves_nothing(tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(
        "import sys\n"
        "from lab_utils.servers import ServerProcess\n"
        "s = ServerProcess('http', [sys.executable, '-m', 'http.server', '{port}', '--bind', '{host}'], health_path='/')\n"
        "s.start()\n"
        "print(s.pid, flush=True)\n"  # exits without stopping: atexit must do it
    )
    import subprocess

    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
        env={
            **__import__("os").environ,
            "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parent.parent),
        },
    )
    pid = int(out.stdout.strip().splitlines()[-1])
    time.sleep(0.5)
    assert not _alive(pid)


def test_bad_arguments():
    with pytest.raises(ValueError, match="startup_timeout"):
        ServerProcess("x", ["true"], startup_timeout=0)
    assert 1024 < free_port() < 65536


def test_a_killed_kernel_leaves_no_server_running(tmp_path):
    """SIGKILL runs no atexit: the reaper started with the server stops it, then runs its cleanup."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    marker = tmp_path / "cleaned"
    script = tmp_path / "kernel.py"
    import json

    cleanup = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('done')"]
    script.write_text(
        "import sys, time\n"
        "from lab_utils.servers import ServerProcess\n"
        "s = ServerProcess('http', [sys.executable, '-m', 'http.server', '{port}', '--bind', '{host}'],\n"
        f"                  health_path='/', cleanup_command={json.dumps(cleanup)})\n"
        "s.start()\n"
        "print(s.pid, s.reaper.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    kernel = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    try:
        server_pid, reaper_pid = map(int, kernel.stdout.readline().split())
        assert _alive(server_pid) and _alive(reaper_pid)
        kernel.send_signal(signal.SIGKILL)  # the kernel dies without running anything
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (_alive(server_pid) or _alive(reaper_pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), "the server outlived its kernel"
        assert not _alive(reaper_pid)
        assert marker.read_text() == "done"  # e.g. `docker rm -f NAME` for a container
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()


def test_stop_also_stops_the_reaper_and_runs_the_cleanup_once(tmp_path):
    marker = tmp_path / "count"
    srv = ServerProcess(
        "http",
        [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"],
        health_path="/",
        startup_timeout=30,
        cleanup_command=[sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"],
    )
    srv.start()
    reaper = srv.reaper.pid
    assert _alive(reaper)
    srv.stop()
    srv.stop()
    assert not _alive(reaper) and srv.reaper is None
    assert marker.read_text() == "x"


def test_logs_go_to_a_private_folder(monkeypatch):
    import os
    import stat
    import tempfile

    from lab_utils.servers.base import LOG_DIR_PREFIX

    monkeypatch.setenv("LAB_TEST_SECRET", "inherited")
    srv = ServerProcess(
        "envcheck",
        [
            sys.executable,
            "-c",
            "import os, time; print('SECRET=' + os.environ.get('LAB_TEST_SECRET', '-'), "
            "flush=True); time.sleep(30)",
        ],
        health_check=lambda s: "SECRET=" in s.log_text(),
        startup_timeout=30,
    )
    srv.unset_env.add("LAB_TEST_SECRET")
    folder = srv.log_path.parent
    assert folder.name.startswith(LOG_DIR_PREFIX) and str(folder.parent) == tempfile.gettempdir()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    with srv:
        assert stat.S_IMODE(os.stat(srv.log_path).st_mode) == 0o600
        assert "SECRET=-" in srv.log_text()  # the variable was removed from its environment
