"""The disk KV connector of vLLM v1 (`ExampleConnector`) as a tier below the engine's own cache.

A KV connector has two halves, both inside one vLLM engine:

- the **scheduler side** (`get_num_new_matched_tokens`, `update_state_after_alloc`,
  `build_connector_meta`) runs in the engine's scheduler: when a request arrives it asks the
  connector how many prompt tokens beyond the device prefix cache it can supply, so the scheduler
  allocates blocks for them and skips their prefill;
- the **worker side** (`start_load_kv`, `wait_for_layer_load`, `save_kv_layer`) runs beside the
  model: it copies those blocks in before the forward pass reads them, and saves new ones out.

`ExampleConnector` keeps each prompt's KV as one safetensors file per layer, in a folder named by
a hash of the prompt's token ids, under `shared_storage_path`. Two engines given the same folder
share it: one writes, the other loads. It is vLLM's reference connector, written for clarity, not
speed (LMCache, NIXL and the offloading connector are the fast ones, and all need a GPU here).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30


def disk_connector_config(store_dir: str | Path, role: str = "kv_both") -> dict:
    """vLLM's `--kv-transfer-config` for the disk connector writing and reading `store_dir`."""
    if role not in ("kv_both", "kv_producer", "kv_consumer"):
        raise ValueError(f"role is kv_both, kv_producer or kv_consumer, got {role!r}")
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(store_dir)},
    }


def new_store(prefix: str = "llm-serving-lab-kvstore-") -> Path:
    """A fresh private folder for a KV store (mode 700, under the temporary folder)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@dataclass(frozen=True)
class StoreUsage:
    """What a connector's store holds on disk."""

    # prompts stored (one folder each)
    prompts: int
    # files (one per layer and prompt)
    files: int
    # bytes of all files, headers included
    bytes: int


def store_usage(store_dir: str | Path) -> StoreUsage:
    """Count the prompts, files and bytes under a disk connector's folder."""
    prompts = files = size = 0
    root = Path(store_dir)
    if not root.is_dir():
        return StoreUsage(0, 0, 0)
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            prompts += 1
            for f in entry.iterdir():
                if f.is_file() and not f.is_symlink():
                    files += 1
                    size += f.stat().st_size
    return StoreUsage(prompts, files, size)


def ConnectorEngine(  # noqa: N802 - a factory that reads like the class it returns
    store_dir: str | Path,
    *,
    kv_cache_gib: float,
    max_model_len: int,
    role: str = "kv_both",
    extra_args: Sequence[str] = (),
    backend: str = "auto",
    core: int | None = None,
    owns_store: bool = False,
    **kwargs,
):
    """A `VLLMServer` on the course model whose engine uses the disk connector on `store_dir`.

    `core` (CPU mode) pins the engine to the `core`-th CPU this process may use (taskset, one OpenMP
    thread), so two engines on a 2-core machine do not fight over the same one, as lab 10's replicas.
    `owns_store=True` deletes the store (a folder `new_store` made) when this engine stops, even
    when the kernel that started it is killed; give it to the engine stopped last.
    """
    from ..servers.vllm import VLLMServer

    cfg = json.dumps(disk_connector_config(store_dir, role))
    srv = VLLMServer(
        kv_cache_gib=kv_cache_gib,
        max_model_len=max_model_len,
        extra_args=["--kv-transfer-config", cfg, *extra_args],
        backend=backend,
        **kwargs,
    )
    if core is not None and srv.mode == "cpu":
        cpus = sorted(os.sched_getaffinity(0))
        mine = str(cpus[int(core) % len(cpus)])
        if shutil.which("taskset"):
            srv.argv = ["taskset", "-c", mine, *srv.argv]
        srv.env = {**(srv.env or {}), "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": mine}
    srv.store_dir = Path(store_dir)
    if owns_store:
        # run by stop(), or by the reaper when the interpreter that started the engine dies
        srv.cleanup_command = [sys.executable, "-c", _REMOVE_STORE, str(store_dir)]
    return srv


_STORE_PREFIX = "llm-serving-lab-kvstore-"
_REMOVE_STORE = (
    "import os, shutil, sys; p = sys.argv[1]; "
    f"os.path.basename(p).startswith({_STORE_PREFIX!r}) and not os.path.islink(p) and shutil.rmtree(p, True)"
)


def remove_store(store_dir: str | Path) -> None:
    """Delete a store folder the course made (its prompts' files, then the folder)."""
    root = Path(store_dir)
    if (
        root.is_dir()
        and not root.is_symlink()
        and os.path.basename(root).startswith("llm-serving-lab-kvstore-")
    ):
        shutil.rmtree(root, ignore_errors=True)


def start_all(servers: Sequence, every_s: float | None = 10.0) -> list:
    """Start several servers at once (each waits for its own health check); stop all if one fails.

    Every `every_s` seconds it prints how many are ready (a start-up is never silent for long).
    """
    import threading
    import time

    errors: list[BaseException] = []

    def run(srv) -> None:
        try:
            srv.start()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in servers]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=every_s)
            if every_s and t.is_alive():
                ready = sum(not x.is_alive() for x in threads)
                print(
                    f"starting {len(threads)} engines: {ready}/{len(threads)} up, "
                    f"not ready yet after {time.monotonic() - t0:.0f} s",
                    flush=True,
                )
                break
    if errors:
        for srv in servers:
            srv.stop()
        raise errors[0]
    return list(servers)


__all__ = [
    "start_all",
    "disk_connector_config",
    "new_store",
    "StoreUsage",
    "store_usage",
    "ConnectorEngine",
    "remove_store",
]
