#!/usr/bin/env bash
# Makes sure a command from one of Debian's packages is installed:
#
#   scripts/apt-ensure.sh COMMAND PACKAGE
#
# Installs PACKAGE with apt-get (running apt-get update first when the
# install fails on stale lists) where it is missing. Exits 1 with one line
# that says why when that cannot be done (not root, no apt-get, the mirror
# unreachable), so callers can report the check they skip.
set -uo pipefail
cmd=$1 pkg=$2
command -v "$cmd" >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "$cmd is not installed and cannot be installed here (needs root and apt-get: apt-get install $pkg)"
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q "$pkg" >/tmp/apt-ensure-"$pkg".log 2>&1; then
  apt-get update -q >>/tmp/apt-ensure-"$pkg".log 2>&1
  if ! apt-get install -y -q "$pkg" >>/tmp/apt-ensure-"$pkg".log 2>&1; then
    echo "apt-get install $pkg failed: $(tail -n 1 /tmp/apt-ensure-"$pkg".log)"
    exit 1
  fi
fi
command -v "$cmd" >/dev/null || { echo "$pkg installed but $cmd is not on PATH"; exit 1; }
