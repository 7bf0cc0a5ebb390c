#!/usr/bin/env bash
# Installs one x86_64 syncmgr wheel into a fresh venv of its CPython, with
# no Go and no C compiler on PATH and no SYNCMGR_BIN, and runs the smoke
# there (tests/wheel/smoke.py: the packaged daemon, the packaged fast path
# with Lock ops and Queue items taking no round trip; then `syncmgr serve`
# started, used and stopped with SIGTERM).
#
#   tests/wheel/install_one.sh WHEEL PYTHON WORKDIR
#
# Exits non-zero, with the reason on stderr, at the first thing that fails.
set -euo pipefail
wheel=$1 py=$2 work=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
serve_pid=
trap 'if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; fi' EXIT

# A PATH of a few plain tools and nothing that compiles: no go, cc, gcc,
# clang, zig or ld can be found on it.
tools=$work/path
mkdir -p "$tools"
for t in sh bash env cat ls id uname sleep true false; do
  p=$(command -v "$t") && ln -sf "$p" "$tools/$t"
done
venv=$work/venv-$ver
rm -rf "$venv"
"$py" -m venv "$venv"
cleanpath=$venv/bin:$tools
for t in go cc gcc c99 clang zig ld tcc; do
  if p=$(PATH=$cleanpath command -v "$t"); then echo "install_one: $t is on the clean PATH ($p)" >&2; exit 1; fi
done
run() { env -i HOME="$HOME" PATH="$cleanpath" TMPDIR=/tmp LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"; }

# --only-binary: nothing may be compiled (msgpack comes as a wheel too).
run python -m pip install -q --only-binary :all: "$wheel"
(cd "$work" && run syncmgr version)
(cd "$work" && run python "$repo/tests/wheel/smoke.py")

# syncmgr serve from the console command, used by a client, stopped by SIGTERM.
key=$(run syncmgr keygen)
sock=$work/s-$ver.sock
env -i HOME="$HOME" PATH="$cleanpath" SYNCMGR_AUTHKEY="$key" \
  syncmgr serve --socket "$sock" --shm-dir none --log-format json >"$work/serve-$ver.log" 2>&1 &
serve_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$work/serve-$ver.log" >&2; echo "install_one: syncmgr serve did not start" >&2; exit 1; }
run SYNCMGR_AUTHKEY="$key" SYNCMGR_ADDRESS="$sock" python -c '
import syncmgr
m = syncmgr.connect()
e = m.Event(name="smoke")
e.set()
assert syncmgr.connect().Event(name="smoke").is_set()
print("smoke: syncmgr serve answers a connected client")'
status=$(run SYNCMGR_AUTHKEY="$key" syncmgr status --address "$sock")
echo "${status%%$'\n'*}"
kill -TERM "$serve_pid"
rc=0; wait "$serve_pid" || rc=$?
serve_pid=
if [ "$rc" -ne 0 ] || [ -e "$sock" ]; then
  cat "$work/serve-$ver.log" >&2
  echo "install_one: syncmgr serve stopped with $rc, socket left: $([ -e "$sock" ] && echo yes || echo no)" >&2
  exit 1
fi
echo "smoke: Python $ver: syncmgr serve stopped cleanly on SIGTERM"
