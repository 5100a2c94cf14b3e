"""Start and stop the real `tritonserver` on a model repository folder.

CPU mode runs the tritonserver 2.51 binary that ships inside the `nvidia-pytriton` wheel, from the
Triton server environment `.venv-triton` (built by `make triton-env`; separate from the course
.venv because pytriton pins numpy<2). The wheel carries the binary, its shared libraries and the
python backend, but not in the layout `--backend-directory` expects, so `prepare_install` copies
the python backend and the stub for this Python version into `<venv>/triton-backends/python/`
once.

    with TritonServer("/tmp/repo", model_control="explicit") as srv:
        srv.load_model("mlp")
        httpx.get(srv.url + "/v2/models/mlp/stats")

Three ports, all picked free and bound to 127.0.0.1: HTTP (`srv.port`, `srv.url`), gRPC
(`srv.grpc_port`, `srv.grpc_url`) and metrics (`srv.metrics_port`, `srv.metrics_url`).

GPU lab machine: the launcher does not start NGC containers. Use `docker/triton-compose.yml`
(`docker compose -f docker/triton-compose.yml up`), then point clients at its ports; inside such a
container `/opt/tritonserver` is found and used by this launcher too.

Why the python backend stub sees `.venv-triton`'s packages: the stub embeds Python and locates its
prefix by looking for `python3` on PATH, so the launcher puts `<venv>/bin` first on PATH (what
pytriton itself does), and LD_LIBRARY_PATH gets the wheel's libraries plus the Python LIBDIR
holding libpython3.11.so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..runtime import triton_env_python
from .base import HOST, ServerProcess, free_port

NGC_ROOT = Path("/opt/tritonserver")
MODEL_CONTROL_MODES = ("none", "explicit", "poll")

_PROBE = r"""
import importlib.util, json, sys, sysconfig, pathlib
spec = importlib.util.find_spec("pytriton")
pkg = pathlib.Path(spec.origin).parent if spec else None
print(json.dumps({"pkg": str(pkg) if pkg else None,
                  "libdir": sysconfig.get_config_var("LIBDIR"),
                  "version": "%d.%d" % sys.version_info[:2]}))
"""


@dataclass(frozen=True)
class TritonInstall:
    """Where a usable tritonserver lives and what it needs in its environment."""

    binary: Path  # the tritonserver executable
    backends: Path  # passed as --backend-directory
    lib_dirs: tuple[Path, ...]  # prepended to LD_LIBRARY_PATH
    bin_dir: Path | None = None  # prepended to PATH so the python stub finds the right Python

    def env(self) -> dict[str, str]:
        """Environment additions the server process needs."""
        env: dict[str, str] = {}
        libs = [str(p) for p in self.lib_dirs]
        if os.environ.get("LD_LIBRARY_PATH"):
            libs.append(os.environ["LD_LIBRARY_PATH"])
        if libs:
            env["LD_LIBRARY_PATH"] = ":".join(libs)
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            env["VIRTUAL_ENV"] = str(self.bin_dir.parent)
        return env


def prepare_install(python: str | Path | None = None) -> TritonInstall:
    """Find tritonserver (.venv-triton's pytriton wheel, else an NGC /opt/tritonserver) and lay out its backends."""
    python = Path(python) if python else triton_env_python()
    if python is None:
        if (NGC_ROOT / "bin" / "tritonserver").exists():
            return TritonInstall(NGC_ROOT / "bin" / "tritonserver", NGC_ROOT / "backends", ())
        raise FileNotFoundError(
            "no Triton server environment: run `make triton-env` (or `bash scripts/triton_env.sh`) "
            "to build .venv-triton, or set TRITON_VENV to an environment with nvidia-pytriton"
        )
    out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{python} could not describe itself: {out.stderr.strip()[-500:]}")
    info = json.loads(out.stdout)
    if not info["pkg"]:
        raise FileNotFoundError(f"{python} has no nvidia-pytriton; rerun `bash scripts/triton_env.sh`")
    pkg = Path(info["pkg"])
    server = pkg / "tritonserver"
    stub = server / "python_backend_stubs" / info["version"] / "triton_python_backend_stub"
    if not stub.exists():
        raise FileNotFoundError(f"nvidia-pytriton has no python backend stub for Python {info['version']}")
    venv = python.parent.parent
    backends = venv / "triton-backends"
    files = [
        server / "backends" / "python" / "libtriton_python.so",
        server / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ]
    try:
        _copy_once(files, backends / "python")
    except OSError:  # a read-only environment (the grader's sandbox): lay the backends out privately
        import tempfile

        backends = Path(tempfile.gettempdir()) / f"triton-backends-{os.getuid()}"
        _copy_once(files, backends / "python")
    return TritonInstall(
        server / "bin" / "tritonserver",
        backends,
        (pkg.parent / "nvidia_pytriton.libs", Path(info["libdir"])),
        python.parent,
    )


def _copy_once(files: list[Path], dest: Path) -> None:
    """Copy files into dest unless an identical-size copy is there; atomic per file."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in files:
        target = dest / src.name
        if target.exists() and target.stat().st_size == src.stat().st_size:
            continue
        tmp = dest / f".{src.name}.{os.getpid()}.tmp"
        shutil.copy2(src, tmp)
        os.replace(tmp, target)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until no process is left in the group; True when it is empty."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.05)
    return False


def _three_ports(*given: int | None) -> tuple[int, int, int]:
    """The given ports, the missing ones picked free; all three distinct."""
    chosen = [p for p in given if p]
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"HTTP, gRPC and metrics ports must differ, got {given}")
    out: list[int] = []
    for p in given:
        if not p:
            p = free_port()
            while p in chosen or p in out:  # the OS may hand the same free port out twice
                p = free_port()
        out.append(p)
    return out[0], out[1], out[2]


class TritonServer(ServerProcess):
    """tritonserver on one model repository, HTTP/gRPC/metrics on free 127.0.0.1 ports."""

    def __init__(
        self,
        model_repository: str | Path,
        *,
        model_control: str = "none",
        load_models: list[str] | None = None,
        python: str | Path | None = None,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        log_verbose: int = 0,
        extra_args: list[str] | None = None,
        startup_timeout: float = 180.0,
        name: str = "tritonserver",
        log_path: str | Path | None = None,
    ):
        repo = Path(model_repository).resolve()
        if not repo.is_dir():
            raise FileNotFoundError(f"model repository {repo} does not exist; write it first")
        if model_control not in MODEL_CONTROL_MODES:
            raise ValueError(f"model_control must be one of {MODEL_CONTROL_MODES}, got {model_control!r}")
        if load_models and model_control != "explicit":
            raise ValueError(
                "load_models only applies with model_control='explicit' "
                "(in 'none' mode Triton loads every model in the repository)"
            )
        self.install = prepare_install(python)
        self.model_repository = repo
        self.model_control = model_control
        http_port, self.grpc_port, self.metrics_port = _three_ports(http_port, grpc_port, metrics_port)
        argv = [
            str(self.install.binary),
            "--model-repository",
            str(repo),
            "--backend-directory",
            str(self.install.backends),
            "--http-address",
            HOST,
            "--http-port",
            "{port}",
            "--grpc-address",
            HOST,
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-address",
            HOST,
            "--metrics-port",
            str(self.metrics_port),
            "--allow-gpu-metrics",
            "false",
            "--model-control-mode",
            model_control,
            # a graceful stop waits this long for open connections and in-flight requests
            # (default 30 s); a client that keeps its connection open holds it that long
            "--exit-timeout-secs",
            "5",
            "--log-verbose",
            str(int(log_verbose)),
        ]
        for model in load_models or []:
            argv += ["--load-model", model]
        argv += list(extra_args or [])
        super().__init__(
            name,
            argv,
            port=http_port,
            health_path="/v2/health/ready",
            env=self.install.env(),
            log_path=log_path,
            startup_timeout=startup_timeout,
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the server and its python-backend stubs; remove the shared memory they leave behind."""
        regions = self._shm_regions()
        if self.is_running:
            # SIGTERM to tritonserver alone, not its process group: the server unloads its models
            # and ends the python stubs itself. Stubs that get the signal directly die first and
            # leave the server waiting out --exit-timeout-secs. The base then cleans the group up.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        code = super().stop(timeout)
        if self.proc is not None:
            _wait_group_gone(self.proc.pid, 5.0)  # SIGKILLed stubs take a moment to disappear
        for path in regions:  # an exit that times out skips the unload that would free them
            path.unlink(missing_ok=True)
        return code

    def _shm_regions(self) -> set[Path]:
        """The python backend's /dev/shm regions this server has mapped (read from /proc)."""
        if not self.is_running:
            return set()
        try:
            maps = Path(f"/proc/{self.pid}/maps").read_text()
        except OSError:
            return set()
        return {
            Path(line.split(None, 5)[5])
            for line in maps.splitlines()
            if "/dev/shm/triton_python_backend_shm_region" in line and len(line.split(None, 5)) == 6
        }

    # -- addresses ---------------------------------------------------------------------------
    @property
    def grpc_url(self) -> str:
        """host:port for tritonclient.grpc (no scheme)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """host:port for tritonclient.http (no scheme)."""
        return f"{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint, http://127.0.0.1:<metrics_port>/metrics."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    # -- the HTTP API, with nothing but the standard library ---------------------------------
    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 300) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            raise RuntimeError(
                f"{method} {path} -> HTTP {err.code}: {detail}\n"
                f"--- last lines of the server log ---\n{self.log_tail(15)}"
            ) from None
        return json.loads(raw) if raw else {}

    def load_model(self, model: str, config: str | dict | None = None) -> None:
        """Load (or reload) a model; `config` overrides its config.pbtxt (explicit mode only)."""
        body = None
        if config is not None:
            from ..triton.config import config_to_dict

            cfg = config_to_dict(config) if isinstance(config, str) else config
            body = {"parameters": {"config": json.dumps(cfg)}}
        self._request("POST", f"/v2/repository/models/{model}/load", body)

    def unload_model(self, model: str) -> None:
        """Unload a model (explicit mode only)."""
        self._request("POST", f"/v2/repository/models/{model}/unload")

    def repository_index(self) -> list[dict]:
        """Every model in the repository with its state (READY, UNAVAILABLE, ...)."""
        return self._request("POST", "/v2/repository/index")

    def model_ready(self, model: str, version: str | int = "") -> bool:
        """True when the model (a version of it, if given) answers ready."""
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version != "" else "") + "/ready"
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def model_config(self, model: str) -> dict:
        """The configuration Triton is actually using (after auto-complete), as a dict."""
        return self._request("GET", f"/v2/models/{model}/config")

    def statistics(self, model: str = "") -> dict:
        """The statistics extension: per-model inference/execution counts and timings."""
        return self._request("GET", f"/v2/models/{model}/stats" if model else "/v2/models/stats")

    def metrics_text(self) -> str:
        """The Prometheus text from the metrics port."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
            return resp.read().decode()
