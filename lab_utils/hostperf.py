"""How fast this machine reads memory: the number a batch-1 decode bound is built on.

A decode step at batch 1 reads every weight once. Its speed limit is therefore the memory read
bandwidth of the device the weights sit in, divided by the bytes of the weights. Datasheet
figures (a GPU's HBM, a server's DDR channels) are peaks; this module measures what torch really
reads here, so lab 00 can build its bound on a figure from the same run.

    bw = measure_read_bandwidth()          # raw timings of every pass
    bw.bytes_per_s                         # best of the repeats, bytes per second
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class ReadBandwidth:
    """Timings of summing one large float32 tensor (each pass reads every byte once)."""

    nbytes: int  # bytes read per pass
    seconds: list[float]  # wall time of each timed pass
    device: str  # "cpu" or "cuda"
    threads: int  # torch intra-op threads during the passes

    def raw_samples(self) -> dict:
        return {
            "nbytes": self.nbytes,
            "seconds": list(self.seconds),
            "device": self.device,
            "threads": self.threads,
        }

    @property
    def bytes_per_s(self) -> float:
        """Read bandwidth of the fastest pass (bytes/s): the least disturbed by other work."""
        return bandwidth_from_samples(self.raw_samples())


def bandwidth_from_samples(samples: dict) -> float:
    """Bytes per second from raw samples: bytes read per pass over the fastest pass."""
    return float(samples["nbytes"]) / min(float(s) for s in samples["seconds"])


def measure_read_bandwidth(megabytes: int = 256, repeats: int = 7, device: str = "cpu") -> ReadBandwidth:
    """Measure memory read bandwidth with torch: time `tensor.sum()` over `megabytes` of float32.

    The tensor is several times larger than any CPU cache, so each pass streams from DRAM (or HBM
    on a GPU). One warm-up pass is not timed.
    """
    import torch

    if isinstance(megabytes, bool) or not isinstance(megabytes, int) or megabytes < 16:
        raise ValueError(
            f"megabytes must be a whole number >= 16 (bigger than the caches), got {megabytes!r}"
        )
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive whole number, got {repeats!r}")
    n = megabytes * (1 << 20) // 4
    x = torch.ones(n, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    x.sum()
    sync()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        sync()
        seconds.append(time.perf_counter() - t0)
    result = ReadBandwidth(
        nbytes=x.numel() * x.element_size(),
        seconds=seconds,
        device="cuda" if device.startswith("cuda") else "cpu",
        threads=torch.get_num_threads(),
    )
    del x
    return result


def _cpuinfo() -> tuple[str, set[str]]:
    """(CPU model name, instruction-set flags) of the first CPU in /proc/cpuinfo; ("?", set())
    where there is none."""
    model, flags = "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def has_bf16_instructions() -> bool:
    """True when the CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16): bf16 is then a fast dtype."""
    flags = _cpuinfo()[1]
    return "avx512_bf16" in flags or "amx_bf16" in flags


def machine_line() -> str:
    """One line naming this machine for a benchmark's output: CPU model, the vector and matrix
    instruction sets that decide the fast dtype (AVX2 only: float32; AVX-512 BF16 or AMX: bf16),
    and the CPUs this process may use."""
    import os
    import platform

    model, flags = _cpuinfo()
    if model == "?":
        model = platform.processor() or "?"
    isa = [
        name
        for name, flag in (
            ("AVX2", "avx2"),
            ("AVX-512", "avx512f"),
            ("AVX512-BF16", "avx512_bf16"),
            ("AMX-BF16", "amx_bf16"),
        )
        if flag in flags
    ]
    return (
        f"machine: {model}; {', '.join(isa) or 'no AVX2'}; {len(os.sched_getaffinity(0))} CPUs; "
        f"{platform.machine()}, python {platform.python_version()}"
    )


def tree_cpu_seconds(pid: int, ended: bool = False) -> float:
    """User + system CPU seconds used so far by process `pid` and its live children (a vLLM
    server's engine core is one); 0.0 when the process is gone. Benchmarks compare tokens per
    CPU second, which depends much less than wall time on who else runs on a shared machine.
    `ended`: add the children that have ended and were waited for (a start-up's subprocesses)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # a child that ended meanwhile
            continue
        total += t.user + t.system + ((t.children_user + t.children_system) if ended else 0.0)
    return total
