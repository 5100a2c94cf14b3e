#!/usr/bin/env bash
# Install the Debian package behind a system tool the course uses, once, as root with apt.
#   scripts/apt_tool.sh COMMAND PACKAGE "what happens without it"
# Never fails the build: without root or apt it says what to install and what is skipped.
cmd=$1 pkg=$2 without=$3
command -v "$cmd" >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get install -y -q "$pkg" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$pkg" >/dev/null 2>&1; } ||
    echo "note: $pkg not installed; $without"
else
  echo "note: $cmd not found (apt-get install $pkg); $without"
fi
exit 0
