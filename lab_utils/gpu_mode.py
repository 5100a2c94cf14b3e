"""Checks that GPU mode can work, run from a machine without a GPU (`make gpu-check`, tests).

Two questions a CPU machine can answer about the GPU mode:

1. Do the GPU requirements resolve? `resolve_requirements()` asks the package registry, for Linux
   x86-64 and Python 3.11, what `requirements/course-gpu.txt` would install, without downloading
   a single CUDA wheel (uv reads each wheel's metadata with HTTP range requests).
2. Is every lab's GPU branch reachable? `gpu_branch_outcomes()` runs each lab's parameters cell and
   setup cell, with `BACKEND = "gpu"` and CUDA hidden, and reports what the setup cell raised: the
   lab's own `resolve_backend` error is the right answer; silence (the lab would go on pretending
   to have a GPU) or a traceback from inside a library is not.

Nothing heavy is imported at module level: scripts/gpu_check.py imports this with any Python.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# The target the GPU requirements are resolved for: a GPU lab machine (Linux x86-64, glibc 2.28+).
TARGET_PYTHON = "3.11"
TARGET_PLATFORM = "x86_64-manylinux_2_28"

# What an unreachable or failing registry looks like in uv's or pip's output (then a test skips,
# instead of failing for a reason that has nothing to do with the requirements).
_NETWORK_ERRORS = re.compile(
    r"dns error|failed to lookup address|Name or service not known|Temporary failure in name resolution"
    r"|Network is unreachable|Connection refused|connection reset|error sending request"
    r"|operation timed out|timed out|Max retries exceeded|NewConnectionError|Could not fetch URL"
    r"|Failed to fetch|tls handshake|certificate verify failed|HTTP status server error",
    re.IGNORECASE,
)

# The message `lab_utils.runtime.resolve_backend` raises for BACKEND="gpu" without CUDA.
GPU_REFUSAL = "BACKEND='gpu' but torch sees no CUDA device"


@dataclass
class Resolution:
    """What a requirements file resolves to on the target (name -> version), or why it did not."""

    ok: bool
    tool: str
    pins: dict[str, str] = field(default_factory=dict)
    error: str = ""
    unreachable: bool = False  # the registry could not be reached: says nothing about the file
    seconds: float = 0.0


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _uv() -> str | None:
    """The uv executable next to this Python (the course environment installs it), or on PATH."""
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else shutil.which("uv")


def _pip_env() -> dict:
    # This workplace's pip config and PIP_FIND_LINKS offer a local CPU-only torch build
    # (2.13.0+cpu satisfies ==2.13.0); the GPU resolution must see the registry alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def resolve_requirements(requirements: Path, timeout: float = 90) -> Resolution:
    """Resolve a requirements file for a Linux x86-64 GPU machine with Python 3.11, downloading no wheel.

    Uses uv (`uv pip compile --python-platform ...`), which resolves for the target platform and
    reads metadata with range requests; without uv, falls back to pip's dry run with fast-deps
    (resolves for this interpreter and platform, and is several times slower).
    """
    t0 = time.monotonic()
    uv = _uv()
    with tempfile.TemporaryDirectory(prefix="gpu-resolve-") as tmp:
        if uv:
            out = Path(tmp) / "resolved.txt"
            cmd = [
                uv,
                "pip",
                "compile",
                "--quiet",
                "--no-header",
                "--no-annotate",
                "--python-version",
                TARGET_PYTHON,
                "--python-platform",
                TARGET_PLATFORM,
                str(requirements),
                "-o",
                str(out),
            ]
            tool = "uv pip compile"
        else:
            out = Path(tmp) / "report.json"
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--use-feature=fast-deps",
                "--report",
                str(out),
                "-r",
                str(requirements),
            ]
            tool = "pip install --dry-run"
        env = _pip_env()
        env.setdefault("UV_HTTP_TIMEOUT", "30")
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return Resolution(
                False,
                tool,
                error=f"{tool} did not finish in {timeout:.0f} s",
                unreachable=True,
                seconds=time.monotonic() - t0,
            )
        seconds = time.monotonic() - t0
        text = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            unreachable = (
                bool(_NETWORK_ERRORS.search(text))
                and "No solution found" not in text
                and "ResolutionImpossible" not in text
            )
            return Resolution(False, tool, error=text[-4000:], unreachable=unreachable, seconds=seconds)
        pins: dict[str, str] = {}
        if uv:
            for line in out.read_text().splitlines():
                m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line.strip())
                if m:
                    pins[_canonical(m.group(1))] = m.group(2)
        else:
            report = json.loads(out.read_text())
            for item in report.get("install", []):
                meta = item.get("metadata", {})
                pins[_canonical(meta.get("name", ""))] = meta.get("version", "")
        return Resolution(True, tool, pins=pins, seconds=seconds)


def requirement_pins(requirements: Path) -> dict[str, str]:
    """The exact pins (`name==version`) a requirements file states itself."""
    pins = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
        if m:
            pins[_canonical(m.group(1))] = m.group(2)
    return pins


# --- the labs' GPU branch --------------------------------------------------------------------------


def lab_notebooks(folder: Path) -> list[Path]:
    """Every lab notebook in a folder (`NN_name.ipynb`), in order; new labs are found automatically."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def setup_cells(nb) -> tuple[str, str]:
    """(parameters cell source, setup cell source) of a lab notebook.

    The setup cell is the first code cell after the parameters cell that calls `resolve_backend(`:
    every lab decides its mode there (docs/AUTHORING.md). Raises ValueError naming what is missing.
    """
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = [i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])]
    if not params:
        raise ValueError("no code cell is tagged 'parameters'")
    first = params[0]
    for c in code[first + 1 :]:
        if "resolve_backend(" in c.source:
            return code[first].source, c.source
    raise ValueError(
        "no cell after the parameters cell calls resolve_backend(BACKEND): "
        "the lab never decides between CPU and GPU mode"
    )


@dataclass
class BranchOutcome:
    """What a lab's setup cell did with BACKEND='gpu' on a machine without CUDA."""

    lab: str
    ok: bool
    detail: str


def _describe_error(outputs) -> tuple[str, str, str] | None:
    for out in outputs:
        if out.get("output_type") == "error":
            tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.get("traceback", [])))
            return out.get("ename", ""), out.get("evalue", ""), tb
    return None


def gpu_branch_outcomes(
    notebooks: list[Path], timeout: float = 120, cwd: Path | None = None, kernel_name: str = "python3"
) -> dict[str, BranchOutcome]:
    """Run each lab's parameters + setup cell with BACKEND='gpu' and CUDA hidden; judge what it raised.

    All labs share one kernel (torch is imported once), with `%reset -f` between labs. The kernel
    sees CUDA_VISIBLE_DEVICES="", so this holds on a GPU machine too.
    """
    import nbformat
    from nbclient import NotebookClient

    combined = nbformat.v4.new_notebook()
    slots: dict[str, int | None] = {}
    problems: dict[str, str] = {}
    for path in notebooks:
        lab = path.stem
        try:
            params, setup = setup_cells(nbformat.read(str(path), as_version=4))
        except Exception as exc:  # noqa: BLE001 - reported per lab
            problems[lab] = str(exc)
            continue
        combined.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        combined.cells.append(nbformat.v4.new_code_cell(params))
        combined.cells.append(nbformat.v4.new_code_cell('BACKEND = "gpu"  # forced by the GPU-mode check'))
        combined.cells.append(nbformat.v4.new_code_cell(setup))
        slots[lab] = len(combined.cells) - 1
    if slots:
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the kernel inherits it: no CUDA, even on a GPU box
        os.environ.setdefault("MPLBACKEND", "Agg")
        try:
            client = NotebookClient(
                combined,
                timeout=timeout,
                kernel_name=kernel_name,
                allow_errors=True,
                interrupt_on_timeout=True,
                resources={"metadata": {"path": str(cwd or notebooks[0].parent)}},
            )
            client.execute()
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
    outcomes: dict[str, BranchOutcome] = {}
    for path in notebooks:
        lab = path.stem
        if lab in problems:
            outcomes[lab] = BranchOutcome(lab, False, problems[lab])
            continue
        err = _describe_error(combined.cells[slots[lab]].get("outputs", []))
        if err is None:
            outcomes[lab] = BranchOutcome(
                lab,
                False,
                "the setup cell ran without an error: with "
                "BACKEND='gpu' and no CUDA the lab would go on as if it had a GPU",
            )
            continue
        ename, evalue, tb = err
        if ename == "ValueError" and GPU_REFUSAL in evalue and "resolve_backend" in tb:
            outcomes[lab] = BranchOutcome(lab, True, f"{ename}: {evalue}")
        else:
            last = [ln for ln in tb.splitlines() if ln.strip()][-6:]
            outcomes[lab] = BranchOutcome(
                lab, False, f"{ename}: {evalue} (not the lab's own resolve_backend error)\n" + "\n".join(last)
            )
    return outcomes
