"""Per-learner cgroup v1 limits for JupyterHub's LocalProcessSpawner (memory, CPU, processes).

LocalProcessSpawner only exports `mem_limit`/`cpu_limit` as environment variables; nothing
enforces them. Where the cgroup v1 hierarchies are writable (root, no systemd as PID 1), each
learner's server gets its own group under the hub's own (`<hub's group>/llm-serving-hub/<user>`,
so a limit set above the hub still holds), and the server joins it in its child process before it
drops to the learner's uid: the kernels and course servers it starts are born inside.

Plain functions, no JupyterHub import: the spawner in jupyterhub_config.py calls them, and the
tests run them against a fake hierarchy.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000


@dataclass
class Limits:
    memory_bytes: int = 0  # 0: none
    cpus: float = 0.0  # 0: none (a CFS quota of cpus * period)
    pids: int = 0  # 0: none

    def __post_init__(self):
        if self.memory_bytes < 0 or self.cpus < 0 or self.pids < 0:
            raise ValueError(f"cgroup limits must be 0 (none) or positive: {self}")


def own_group(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> str:
    """The cgroup path of this process under a v1 controller ("/" when at the top)."""
    try:
        for line in Path(proc_cgroup).read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path or "/"
    except OSError:
        pass
    return "/"


def problem(root: Path = ROOT) -> str:
    """ "" when this process can create a cgroup under each controller, else why not."""
    for c in CONTROLLERS:
        base = root / c / own_group(c).lstrip("/")
        if not base.is_dir():
            return f"no cgroup v1 '{c}' hierarchy at {root / c} (cgroup v2 or none: limits are not enforced)"
        if not os.access(base, os.W_OK):
            return f"{base} is not writable (run the hub as root to enforce limits)"
    return ""


def _safe(user: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", user)[:64] or "_"


def prepare(user: str, limits: Limits, root: Path = ROOT, group: str = "llm-serving-hub") -> list[Path]:
    """Create the user's group under each controller and write its limits; returns the
    cgroup.procs files the server's child process writes its pid into."""
    procs = []
    for c in CONTROLLERS:
        d = root / c / own_group(c).lstrip("/") / group / _safe(user)
        d.mkdir(parents=True, exist_ok=True)
        if c == "memory" and limits.memory_bytes:
            (d / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        if c == "cpu" and limits.cpus:
            (d / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * CFS_PERIOD_US)))
        if c == "pids" and limits.pids:
            (d / "pids.max").write_text(str(limits.pids))
        procs.append(d / "cgroup.procs")
    return procs


def join(procs: list[Path], pid: int = 0) -> None:
    """Move a process (0: the caller) into the groups; called in the server's child process."""
    for p in procs:
        with open(p, "w") as f:
            f.write(str(pid or os.getpid()))


def remove(user: str, root: Path = ROOT, group: str = "llm-serving-hub") -> None:
    """Remove the user's groups once their processes are gone (a busy group stays)."""
    for c in CONTROLLERS:
        d = root / c / own_group(c).lstrip("/") / group / _safe(user)
        try:
            d.rmdir()
        except OSError:
            pass


def parse_bytes(text: str | int | None) -> int:
    """'4G', '512M', '1024K' or a number of bytes (JupyterHub's mem_limit forms) as bytes."""
    if text is None or text == "":
        return 0
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"not a memory size: {text!r} (write e.g. 4G or 512M)")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)
