#!/usr/bin/env bash
# A JupyterHub for a class on one machine, with nbgrader's exchange. Run as root (real unix users).
#
#   docker/hub/hub.sh install             the hub's venv from Debian's python3.11 (jupyterhub, jupyterlab,
#                                         nbgrader; docker/hub/requirements.txt) + configurable-http-proxy (npm)
#   docker/hub/hub.sh course              the exchange and the instructor's course folder (source/ mode 700)
#   docker/hub/hub.sh users NAME...       learners as unix users, homes mode 700 (`useradd -m` makes 755)
#   docker/hub/hub.sh release NN          hand out lab NN (labs/NN_*.ipynb) through nbgrader's exchange
#   docker/hub/hub.sh start               the hub on 127.0.0.1:$HUB_PORT (foreground)
#
# Settings (environment): HUB_VENV [/opt/llm-serving-hub/venv], HUB_STATE [/srv/llm-serving-hub],
# HUB_EXCHANGE [/srv/nbgrader/exchange], HUB_COURSE [llm-serving], HUB_ADMINS [instructor],
# HUB_USERS, HUB_PORT [8000], HUB_AUTH [pam|shared]; see jupyterhub_config.py.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export HUB_VENV=${HUB_VENV:-/opt/llm-serving-hub/venv}
export HUB_STATE=${HUB_STATE:-/srv/llm-serving-hub}
export HUB_EXCHANGE=${HUB_EXCHANGE:-/srv/nbgrader/exchange}
export HUB_COURSE=${HUB_COURSE:-llm-serving}
export HUB_ADMINS=${HUB_ADMINS:-instructor}
SYSTEM_PYTHON=${HUB_PYTHON:-/usr/bin/python3.11}
CHP_VERSION=5.3.0
INSTRUCTOR=${HUB_ADMINS%% *}

need_root() { [ "$(id -u)" = 0 ] || { echo "error: run as root: the hub starts servers as real unix users" >&2; exit 1; }; }

install() {
  need_root
  if [ ! -x "$SYSTEM_PYTHON" ]; then
    echo "error: $SYSTEM_PYTHON not found: apt-get install python3.11 python3.11-venv (a Python under a" >&2
    echo "       private home such as pyenv's cannot be run by learners)" >&2
    exit 1
  fi
  case "$(readlink -f "$SYSTEM_PYTHON")" in
    /root/* | /home/*) echo "error: $SYSTEM_PYTHON lives in a private home; learners cannot run it" >&2; exit 1 ;;
  esac
  "$SYSTEM_PYTHON" -c 'import ensurepip' 2>/dev/null || bash "$REPO/scripts/apt_tool.sh" none python3.11-venv "no venv"
  command -v npm >/dev/null || bash "$REPO/scripts/apt_tool.sh" npm npm "no configurable-http-proxy"
  local t0=$SECONDS
  [ -x "$HUB_VENV/bin/python" ] || "$SYSTEM_PYTHON" -m venv "$HUB_VENV"
  "$HUB_VENV/bin/pip" install -q --upgrade pip
  "$HUB_VENV/bin/pip" install -q -r "$HERE/requirements.txt"
  "$HUB_VENV/bin/pip" check
  # as in the course environment (scripts/install_course_env.sh): jsonschema would build an RFC 3987
  # parser at every import (1.7 s of CPU in each nbgrader command and single-user server)
  "$HUB_VENV/bin/pip" uninstall -y -q rfc3987-syntax 2>/dev/null || true
  echo "python packages: $((SECONDS - t0)) s"
  t0=$SECONDS
  npm install --silent --prefix "$HUB_VENV/lib/chp" "configurable-http-proxy@$CHP_VERSION" >/dev/null
  ln -sf "$HUB_VENV/lib/chp/node_modules/.bin/configurable-http-proxy" "$HUB_VENV/bin/configurable-http-proxy"
  echo "configurable-http-proxy $CHP_VERSION: $((SECONDS - t0)) s"
  mkdir -p "$HUB_VENV/etc/jupyter"
  sed -e "s|@COURSE@|$HUB_COURSE|" -e "s|@EXCHANGE@|$HUB_EXCHANGE|" "$HERE/nbgrader_config.py" \
    >"$HUB_VENV/etc/jupyter/nbgrader_config.py"
  chmod -R a+rX "$HUB_VENV"
  "$HUB_VENV/bin/jupyterhub" --version
}

course() {
  need_root
  mkdir -p "$HUB_EXCHANGE"
  chmod 777 "$HUB_EXCHANGE"  # nbgrader's exchange root: every user writes into it
  id "$INSTRUCTOR" >/dev/null 2>&1 || useradd -m -s /bin/bash "$INSTRUCTOR"
  local home
  home=$(getent passwd "$INSTRUCTOR" | cut -d: -f6)
  chmod 700 "$home"
  mkdir -p "$home/$HUB_COURSE/source" "$home/.jupyter"
  printf 'c = get_config()  # noqa: F821\nc.CourseDirectory.root = "%s"\n' "$home/$HUB_COURSE" \
    >"$home/.jupyter/nbgrader_config.py"
  chown -R "$INSTRUCTOR:" "$home/$HUB_COURSE" "$home/.jupyter"
  chmod 700 "$home/$HUB_COURSE/source"  # the answers; learners could read it otherwise
  echo "course $HUB_COURSE: $home/$HUB_COURSE (source/ 700), exchange $HUB_EXCHANGE"
}

users() {
  need_root
  [ $# -gt 0 ] || { echo "usage: hub.sh users NAME... (or a file: hub.sh users \$(cat names.txt))" >&2; exit 2; }
  for name in "$@"; do
    if ! [[ "$name" =~ ^[a-z_][a-z0-9_-]{0,31}$ ]]; then
      echo "error: '$name' is not a unix user name (lower case letters, digits, _ and -)" >&2
      exit 2
    fi
    id "$name" >/dev/null 2>&1 || useradd -m -s /bin/bash "$name"
    chmod 700 "$(getent passwd "$name" | cut -d: -f6)"
  done
  echo "learners: $*"
}

release() {
  need_root
  local lab=${1:?usage: hub.sh release NN}
  local nb
  nb=$(ls "$REPO"/labs/"$lab"_*.ipynb 2>/dev/null | head -1)
  [ -n "$nb" ] || { echo "error: no labs/${lab}_*.ipynb" >&2; exit 2; }
  local name home
  name=$(basename "$nb" .ipynb)
  home=$(getent passwd "$INSTRUCTOR" | cut -d: -f6)
  mkdir -p "$home/$HUB_COURSE/source/$name"
  cp "$nb" "$home/$HUB_COURSE/source/$name/"
  chown -R "$INSTRUCTOR:" "$home/$HUB_COURSE/source"
  (cd "$home/$HUB_COURSE" && runuser -u "$INSTRUCTOR" -- env PATH="$HUB_VENV/bin:$PATH" HOME="$home" \
    sh -c "nbgrader generate_assignment '$name' --force && nbgrader release_assignment '$name' --force")
}

start() {
  need_root
  [ -x "$HUB_VENV/bin/jupyterhub" ] || { echo "error: no hub in $HUB_VENV: run hub.sh install first" >&2; exit 1; }
  mkdir -p "$HUB_STATE"
  chmod 700 "$HUB_STATE"
  cd "$HUB_STATE"
  exec "$HUB_VENV/bin/jupyterhub" -f "$HERE/jupyterhub_config.py"
}

cmd=${1:-}
shift || true
case "$cmd" in
  install | course | users | release | start) "$cmd" "$@" ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
