"""CPU seconds that two start-up costs add, measured against their removal in the same run.

    .venv/bin/python bench/import_cpu.py [--rounds 2] [--imports 5] [--no-server]

1. `rfc3987-syntax`: when it is installed, `import jsonschema` builds an Earley parser of RFC 3987
   (jupyter-events asks for the package through jsonschema[format-nongpl]). nbformat, papermill, ray
   and so each of vLLM's processes import jsonschema. scripts/install_course_env.sh removes the
   package; here a downloaded copy on PYTHONPATH puts it back for the baseline arm.
2. vLLM's model-info cache: without VLLM_CACHE_ROOT/modelinfos, each engine start inspects the
   model's class in a subprocess of its own. A graded run's home is new each time, so the grader
   hands it the instructor's cache (grader/sandbox.vllm_model_info_dir).

Part 1 times `python -c "import nbformat"` with and without the package, alternated (`--imports`
each). Part 2 starts the course's vLLM server (lab 05's flags) in three arms, alternated `--rounds`
times: both costs, the package removed, both removed. It sums the CPU time of the server's process tree
until /health answers, then stops it. Each arm prints its median and spread, and its ratio to the
first. The CPU model is printed, because the machines differ.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab_utils.hostperf import _cpuinfo, tree_cpu_seconds  # noqa: E402

PACKAGE = "rfc3987-syntax==1.1.0"


def package_dir(scratch: Path) -> Path:
    """A folder to put on PYTHONPATH that holds rfc3987_syntax (downloaded from the package index)."""
    wheels, site = scratch / "wheels", scratch / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), PACKAGE], check=True
    )
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    return site


def child_cpu(cmd: list[str], env: dict) -> float:
    before = os.times()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def summary(name: str, values: list[float], base: float | None) -> str:
    med = statistics.median(values)
    ratio = f"  {med / base:.2f}x the first arm" if base else ""
    return f"{name:44s} median {med:6.2f} s CPU  (min {min(values):.2f}, max {max(values):.2f}, n={len(values)}){ratio}"


def server_arm(site: Path | None, info: Path | None, scratch: Path) -> tuple[float, float]:
    from lab_utils.servers.vllm import VLLMServer

    cache = Path(tempfile.mkdtemp(prefix="vllm-cache-", dir=scratch))
    if info is not None:
        shutil.copytree(info, cache / "modelinfos")
    srv = VLLMServer(
        kv_cache_gib=0.25,
        max_model_len=1024,
        extra_args=["--max-num-seqs", "8", "--max-num-batched-tokens", "256"],
    )
    srv.env["VLLM_CACHE_ROOT"] = str(cache)
    if site is not None:
        srv.env["PYTHONPATH"] = str(site)
    try:
        srv.start()
        return tree_cpu_seconds(srv.pid, ended=True), srv.ready_after_s
    finally:
        srv.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the three server arms")
    parser.add_argument("--imports", type=int, default=5, help="alternations of the import arms")
    parser.add_argument("--no-server", action="store_true", help="the import arms only")
    args = parser.parse_args()
    print(
        f"CPU: {_cpuinfo()[0] or platform.processor() or 'unknown'}, {os.cpu_count()} cores; python {platform.python_version()}"
    )
    from importlib.util import find_spec

    if find_spec("rfc3987_syntax") is not None:
        print("rfc3987_syntax is installed in this environment: run scripts/install_course_env.sh first")
        return 1
    with tempfile.TemporaryDirectory(prefix="import-cpu-") as tmp:
        scratch = Path(tmp)
        site = package_dir(scratch)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        cmd = [sys.executable, "-c", "import nbformat"]
        arms: dict[str, list[float]] = {
            "import nbformat, rfc3987-syntax installed": [],
            "import nbformat, removed": [],
        }
        for _ in range(args.imports):
            arms["import nbformat, rfc3987-syntax installed"].append(
                child_cpu(cmd, {**env, "PYTHONPATH": str(site)})
            )
            arms["import nbformat, removed"].append(child_cpu(cmd, env))
        base = None
        for name, values in arms.items():
            print(summary(name, values, base))
            base = base or statistics.median(values)
        if args.no_server:
            return 0
        from grader.sandbox import vllm_model_info_dir

        info = vllm_model_info_dir()
        if info is None:
            print("no vLLM model-info cache yet (start any vLLM server once): the server arms need it")
            return 1
        plans = {
            "vLLM start, both costs (a graded run before)": (site, None),
            "vLLM start, rfc3987-syntax removed": (None, None),
            "vLLM start, removed + model info (now)": (None, Path(info)),
        }
        cpu: dict[str, list[float]] = {k: [] for k in plans}
        ready: dict[str, list[float]] = {k: [] for k in plans}
        for r in range(args.rounds):
            for name, (s, i) in plans.items():
                t0 = time.perf_counter()
                c, w = server_arm(s, i, scratch)
                cpu[name].append(c)
                ready[name].append(w)
                print(
                    f"  round {r + 1}/{args.rounds} {name}: {c:.1f} s CPU, ready after {w:.1f} s "
                    f"({time.perf_counter() - t0:.0f} s with the stop)",
                    flush=True,
                )
        base = None
        for name in plans:
            print(summary(name, cpu[name], base) + f"; ready median {statistics.median(ready[name]):.1f} s")
            base = base or statistics.median(cpu[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
