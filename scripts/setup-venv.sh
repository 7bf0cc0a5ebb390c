#!/usr/bin/env bash
# Creates the project's virtual environment and installs the Python client
# (editable) with everything the tests and the demo need.
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
  echo "setup-venv: need Python >= 3.9 as \$PYTHON (have: $("$python" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" || {
    echo "setup-venv: '$python -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
    exit 1
  }
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# SYNCMGR_TEST_HOOKS: the extension with its test hooks (the queue ring's
# kill steps, which the kill loops use); wheels are built without them.
SYNCMGR_TEST_HOOKS=1 "$venv/bin/python" -m pip install -q -e "./pyclient[test,ray]"
