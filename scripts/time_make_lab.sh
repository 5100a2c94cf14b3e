#!/usr/bin/env bash
# How long `make lab` takes from a fresh clone until JupyterLab answers on its port (issue 50, the
# README's set-up table). One run, timed as a learner would see it:
#
#   scripts/time_make_lab.sh [REPO]     # REPO: what to clone (default: this checkout)
#
# The clone gets its own .venv and its own course cache (COURSE_CACHE, so the course model is built
# again) in a temporary folder; pip's own settings (index, find-links, cache) are the machine's, as
# they would be for a learner. When JupyterLab answers, the script prints the times, stops
# JupyterLab and the background builder `make lab` started, and deletes the folder (KEEP=1 keeps it).
set -euo pipefail
SRC=${1:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}
PORT=${LAB_PORT:-18888}
WORK=$(mktemp -d /tmp/time-make-lab-XXXXXX)
LOG="$WORK/make-lab.log"
cleanup() {
  if [ -n "${MAKE_PID:-}" ] && kill -0 "$MAKE_PID" 2>/dev/null; then
    kill -TERM -- "-$MAKE_PID" 2>/dev/null || true  # make, JupyterLab and the EXIT trap's builder stop
    for _ in $(seq 30); do kill -0 "$MAKE_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$MAKE_PID" 2>/dev/null || true
  fi
  if [ -x "$WORK/repo/.venv/bin/python" ]; then
    (cd "$WORK/repo" && COURSE_CACHE="$WORK/cache" .venv/bin/python -m lab_utils.background stop) >/dev/null 2>&1 || true
  fi
  if [ "${KEEP:-0}" != 1 ]; then rm -rf "$WORK"; else echo "kept $WORK"; fi
}
trap cleanup EXIT

echo "machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; $(date -u +%FT%TZ)"
git clone -q "$SRC" "$WORK/repo"
cd "$WORK/repo"
T0=$(date +%s.%N)
COURSE_CACHE="$WORK/cache" setsid make lab LAB_PORT="$PORT" >"$LOG" 2>&1 &
MAKE_PID=$!
seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$T0" "$(date +%s.%N)"; }
VENV_S="" MODEL_S=""
while true; do
  if ! kill -0 "$MAKE_PID" 2>/dev/null; then
    echo "make lab ended before JupyterLab answered; its log:" >&2
    tail -30 "$LOG" >&2
    exit 1
  fi
  [ -z "$VENV_S" ] && ls .venv/.installed-cpu >/dev/null 2>&1 && VENV_S=$(seconds)
  [ -z "$MODEL_S" ] && ls "$WORK"/cache/models/*/.course-model.json >/dev/null 2>&1 && MODEL_S=$(seconds)
  if curl -fs -o /dev/null "http://127.0.0.1:$PORT/api"; then break; fi
  sleep 1
done
echo "from the clone: .venv ready ${VENV_S:-?} s, course model ready ${MODEL_S:-?} s, JupyterLab answering $(seconds) s"
