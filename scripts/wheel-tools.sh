#!/usr/bin/env bash
# Makes build/wheel/tools, the venv with the wheel build's own tools: Zig's
# C compiler (PyPI's ziglang), auditwheel, and setuptools for
# pyclient/_daemon_build.py. Pinned, so that a rebuild is the same build;
# kept while the pins are unchanged. Prints nothing on success.
#
#   scripts/wheel-tools.sh            ($PYTHON, default python3, makes the venv)
set -euo pipefail
cd "$(dirname "$0")/.."
tools=build/wheel/tools
reqs="ziglang==0.17.1 auditwheel==6.8.2 setuptools==84.2.1"
[ "$(cat "$tools/.reqs" 2>/dev/null)" = "$reqs" ] && exit 0
rm -rf "$tools"
mkdir -p build/wheel
"${PYTHON:-python3}" -m venv "$tools"
# shellcheck disable=SC2086
"$tools/bin/python" -m pip install -q --disable-pip-version-check $reqs || {
  echo "wheel-tools: could not install $reqs into $tools (PyPI unreachable?)" >&2
  exit 1
}
echo "$reqs" >"$tools/.reqs"
