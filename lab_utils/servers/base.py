"""One base for every server process the course starts.

    with ServerProcess("demo", [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"],
                       health_path="/") as srv:
        httpx.get(srv.url)

- picks a free port on 127.0.0.1 unless given one ("{port}" and "{host}" in argv are filled in);
- starts the process in its own process group, with stdout and stderr captured in a log file in a
  private folder (`tempfile.mkdtemp`, mode 700) unless given a log path;
- waits for an HTTP health URL (or a callable) to answer, with a timeout;
- on failure raises ServerStartError carrying the last lines of the log;
- stops with SIGTERM to the whole group, then SIGKILL; as a context manager, and at interpreter
  exit for anything still running;
- and when the interpreter that started it dies without stopping it (a kernel killed with
  SIGKILL runs no atexit), a small reaper process started with the server notices that its
  parent is gone and stops the server's group (then runs the server's `cleanup_command`, e.g.
  `docker rm -f NAME` for a container).

Secrets (API keys) go to servers through `env`, never through argv, which `ps` shows to everyone.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

HOST = "127.0.0.1"

_RUNNING: dict[int, ServerProcess] = {}
_LOCK = threading.Lock()
_LOG_DIR: Path | None = None

# Prefix of the private log folders (one per interpreter); `python -m lab_utils.setup` finds old ones.
LOG_DIR_PREFIX = "llm-serving-lab-logs-"


def log_dir() -> Path:
    """This interpreter's private log folder (made once with mkdtemp: mode 700, unpredictable name)."""
    global _LOG_DIR
    with _LOCK:
        if _LOG_DIR is None or not _LOG_DIR.is_dir():
            _LOG_DIR = Path(tempfile.mkdtemp(prefix=LOG_DIR_PREFIX))
        return _LOG_DIR


# The reaper: `python -c _REAPER PARENT_PID PGID CLEANUP_JSON`. It waits while its parent (the
# interpreter that started the server) lives and the server's group exists; if the parent goes
# first, it stops the group (SIGTERM, then SIGKILL) and runs the cleanup command.
_REAPER = r"""
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is for the kernel
parent, pgid, cleanup = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
def alive():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
while os.getppid() == parent:
    if not alive():
        sys.exit(0)
    time.sleep(0.2)
for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        break
    end = time.monotonic() + 10
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
if cleanup:
    try:
        subprocess.run(cleanup, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)
    except Exception:
        pass
"""


class ServerStartError(RuntimeError):
    """A server did not become healthy; the message ends with the tail of its log."""

    def __init__(self, message: str, log_tail: str = ""):
        self.log_tail = log_tail
        super().__init__(
            f"{message}\n--- last lines of the server log ---\n{log_tail}" if log_tail else message
        )


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a text file ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64_000))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class OpenAIAddresses:
    """What an OpenAI-style server's clients need: `base_url`, `model_name`, `api_key`.

    Mixed into servers that set `url`, `model`, `served_model_name` and `_api_key` (None: no key).
    """

    url: str
    model: str
    served_model_name: str | None
    _api_key: str | None

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url: the server URL plus /v1."""
        return self.url + "/v1"

    @property
    def model_name(self) -> str:
        """The model name requests must send (what /v1/models lists)."""
        return self.served_model_name or self.model

    @property
    def api_key(self) -> str:
        """The key clients should send: the server's own, or a placeholder when it needs none."""
        return self._api_key or "EMPTY"


class ServerProcess:
    """A server subprocess with a port, a log, a health check, and a guaranteed stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int | None = None,
        host: str = HOST,
        health_path: str | None = "/health",
        health_check: Callable[[ServerProcess], bool] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        log_path: str | Path | None = None,
        startup_timeout: float = 120.0,
        cleanup_command: Sequence[str] | None = None,
    ):
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be positive seconds, got {startup_timeout}")
        self.name = name
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.argv = [str(a).replace("{port}", str(self.port)).replace("{host}", host) for a in argv]
        self.health_path = health_path
        self.health_check = health_check
        self.env = env
        # names removed from the inherited environment (e.g. an API key the learner has exported)
        self.unset_env: set[str] = set()
        self.cwd = str(cwd) if cwd else None
        if log_path is None:
            log_path = log_dir() / f"{name}-{self.port}.log"
        self.log_path = Path(log_path)
        # run after the process is stopped, by stop() or by the reaper (e.g. `docker rm -f NAME`)
        self.cleanup_command = [str(a) for a in cleanup_command] if cleanup_command else None
        self.reaper: subprocess.Popen | None = None
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    # -- addresses ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8123."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of this server's log."""
        return tail(self.log_path, lines)

    def log_text(self) -> str:
        """The whole log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- lifecycle ---------------------------------------------------------------------------
    def healthy(self) -> bool:
        """One health probe: the callable if given, else GET health_path answering 2xx."""
        if self.health_check is not None:
            try:
                return bool(self.health_check(self))
            except Exception:
                return False
        if self.health_path is None:
            return port_in_use(self.port, self.host)
        try:
            with urllib.request.urlopen(self.url + self.health_path, timeout=2) as resp:
                return 200 <= resp.status < 300
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self) -> ServerProcess:
        """Start the process and wait until it is healthy; raise ServerStartError otherwise."""
        if self.is_running:
            return self
        if port_in_use(self.port, self.host):
            raise ServerStartError(
                f"{self.name}: port {self.port} on {self.host} is already in use; "
                "pass port=None to pick a free one, or stop what listens there"
            )
        env = dict(os.environ)
        for key in self.unset_env:
            env.pop(key, None)
        if self.env:
            env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # owner-only, and never through a symlink someone planted at that path
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        log = os.fdopen(fd, "wb")
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            log.close()
            raise ServerStartError(f"{self.name}: could not run {self.argv[0]!r}: {exc}") from exc
        log.close()  # the child holds its own copy of the descriptor
        with _LOCK:
            _RUNNING[self.proc.pid] = self
        self._start_reaper()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_reaper(self) -> None:
        """A watcher that stops this server if this interpreter dies without stopping it."""
        import sys

        try:
            self.reaper = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _REAPER,
                    str(os.getpid()),
                    str(self.proc.pid),
                    json.dumps(self.cleanup_command or []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:  # no reaper: atexit still stops the server on a normal exit
            self.reaper = None

    def _stop_reaper(self) -> None:
        reaper, self.reaper = self.reaper, None
        if reaper is not None and reaper.poll() is None:
            reaper.kill()
        if reaper is not None:
            try:
                reaper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _wait_healthy(self) -> None:
        deadline = self.started_at + self.startup_timeout
        delay = 0.1
        said = self.started_at  # a start-up longer than 15 s says so every 15 s (no silent minute)
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.name} exited with code {code} before it became healthy "
                    f"(command: {' '.join(self.argv)})",
                    self.log_tail(),
                )
            if self.healthy():
                self.ready_after_s = time.monotonic() - self.started_at
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.name} was not healthy after {self.startup_timeout:.0f} s "
                    f"(health: {self.url}{self.health_path or ''}); raise startup_timeout if the "
                    "machine is just slow",
                    self.log_tail(),
                )
            now = time.monotonic()
            if now - said >= 15:
                said = now
                print(
                    f"{self.name}: not ready yet after {now - self.started_at:.0f} s "
                    f"(gives up after {self.startup_timeout:.0f} s)",
                    flush=True,
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the whole process group: SIGTERM, wait up to `timeout` s, then SIGKILL.

        Returns the exit code (None if it was never started). Safe to call twice.
        """
        proc = self.proc
        if proc is None:
            return None
        self._stop_reaper()  # from here on this interpreter does the stopping
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # children that outlived the group leader still die with the group; wait until they are gone
        _signal_group(proc.pid, signal.SIGKILL)
        _wait_group_gone(proc.pid, timeout=5.0)
        with _LOCK:
            first_stop = _RUNNING.pop(proc.pid, None) is not None
        if self.cleanup_command and first_stop:
            try:
                subprocess.run(
                    self.cleanup_command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=60,
                )
            except (OSError, subprocess.SubprocessError):
                pass
        return proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<{type(self).__name__} {self.name} {self.url} {state}>"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if _only_zombies(pgid):
            return
        time.sleep(0.05)


def _only_zombies(pgid: int) -> bool:
    try:
        import psutil
    except ImportError:
        return False
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return True


def running_servers() -> list[ServerProcess]:
    """Servers this interpreter started and has not stopped."""
    with _LOCK:
        return [s for s in _RUNNING.values() if s.is_running]


def stop_all() -> None:
    """Stop every server this interpreter started (also runs at exit)."""
    with _LOCK:
        servers = list(_RUNNING.values())
    for srv in servers:
        try:
            srv.stop(timeout=5)
        except Exception:
            pass


atexit.register(stop_all)
