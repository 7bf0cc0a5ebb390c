#!/usr/bin/env bash
# Builds the syncmgr wheel, checks its tag and its static daemon, installs it
# into fresh venvs (one per Python found) with no Go on PATH and no
# SYNCMGR_BIN, and runs a smoke test: `syncmgr version`, a Manager with a
# Lock, Queue, Value and SharedMemory, and `syncmgr serve` started, used and
# stopped with SIGTERM.
#
#   tests/wheel/smoke.sh [WHEEL]      (default: build one with $PYTHON -m pip wheel)
#   SMOKE_PYTHONS="/path/python3.12 ..." to choose the interpreters.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
python=${PYTHON:-python3}
work=$(mktemp -d /tmp/syncmgr-wheel.XXXXXX)
serve_pid=
cleanup() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

wheel=${1:-}
if [ -z "$wheel" ]; then
  # Without Go the build must stop with an error that names Go.
  if env -i HOME="$HOME" PATH=/usr/bin:/bin "$python" -m pip wheel -q --no-deps -w "$work/nogo" ./pyclient >"$work/nogo.log" 2>&1; then
    echo "smoke: the wheel built without Go on PATH" >&2; exit 1
  fi
  grep -q "needs Go >= " "$work/nogo.log" || { cat "$work/nogo.log"; echo "smoke: no clear error without Go" >&2; exit 1; }
  echo "build without Go: refused with: $(grep -o 'building the syncmgr wheel compiles the daemon and needs Go[^:]*' "$work/nogo.log" | head -1)"
  rm -rf pyclient/build
  "$python" -m pip wheel -q --no-deps -w "$work/dist" ./pyclient
  wheel=$(ls "$work"/dist/syncmgr-*.whl)
fi
name=$(basename "$wheel")
echo "wheel: $name ($(du -k "$wheel" | cut -f1) KiB)"
arch=$(uname -m)
case "$name" in
  *-py3-none-manylinux_2_17_"$arch".manylinux2014_"$arch".whl|*-cp3*-manylinux_2_*_"$arch".whl) ;;
  *) echo "wheel tag is not a manylinux tag for $arch: $name" >&2; exit 1 ;;
esac
# The daemon inside must be static (no ELF interpreter, no dynamic section):
# that is what makes the manylinux tag honest.
"$python" - "$wheel" <<'PY'
import struct, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
info = z.getinfo("syncmgr/_bin/syncmgr")
assert (info.external_attr >> 16) & 0o111, "daemon is not executable in the wheel"
elf = z.read(info)
assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1, "not a 64-bit little-endian ELF"
phoff, = struct.unpack_from("<Q", elf, 0x20)
phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
types = [struct.unpack_from("<I", elf, phoff + i * phentsize)[0] for i in range(phnum)]
assert 3 not in types and 2 not in types, f"daemon is dynamically linked (program headers {types})"
print(f"daemon: static ELF, {len(elf) // 1024} KiB, executable")
PY

# auditwheel (PyPI's checker for manylinux tags) must agree: the glibc it
# says the wheel needs is no newer than the one the tag claims.
if "$python" -m venv "$work/aw" && "$work/aw/bin/python" -m pip install -q --disable-pip-version-check auditwheel; then
  show=$("$work/aw/bin/auditwheel" show "$wheel" 2>&1) || { echo "$show"; exit 1; }
  echo "auditwheel: $(echo "$show" | tr '\n' ' ' | sed -E 's/.*(is consistent with the following platform tag: "[^"]*").*/\1/')"
  "$python" - "$name" "$show" <<'PY'
import re, sys
ours = tuple(map(int, re.search(r"manylinux_(\d+)_(\d+)_", sys.argv[1]).groups()))
m = re.search(r'consistent\s+with\s+the\s+following\s+platform\s+tag:\s+"manylinux_(\d+)_(\d+)_', sys.argv[2])  # auditwheel wraps long lines
assert m, sys.argv[2]
need = tuple(map(int, m.groups()))
assert need <= ours, f"auditwheel says glibc {need} is needed, the tag claims {ours}"
PY
else
  echo "auditwheel: not run (it could not be installed)"
fi

# Interpreters: $SMOKE_PYTHONS, else $PYTHON plus every pyenv 3.9-3.13 found.
if [ -n "${SMOKE_PYTHONS:-}" ]; then
  read -r -a pythons <<<"$SMOKE_PYTHONS"
else
  pythons=("$python")
  seen=" $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') "
  root=$(pyenv root 2>/dev/null || true)
  for v in 3.9 3.10 3.11 3.12 3.13; do
    for p in "$root"/versions/"$v".*/bin/python"$v"; do
      if [ -x "$p" ] && [[ "$seen" != *" $v "* ]]; then pythons+=("$p"); seen="$seen$v "; fi
      break
    done
  done
fi

# A PATH with no Go on it (and nothing from the caller's venv).
cleanpath=/usr/bin:/bin
for d in /usr/bin /bin; do
  if [ -x "$d/go" ]; then echo "smoke: $d/go exists; cannot make a PATH without Go" >&2; exit 1; fi
done

# A wheel with a C extension inside is for one CPython (cpXY): test it there.
only=
case "$name" in *-cp3*) only=$(echo "$name" | sed -E 's/.*-cp3([0-9]+)-cp3.*/3.\1/') ;; esac
ok=0
for py in "${pythons[@]}"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ -n "$only" ] && [ "$ver" != "$only" ]; then
    echo "smoke: Python $ver: not run (the wheel is for CPython $only only)"
    continue
  fi
  venv="$work/venv-$ver"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
  run() { env -i HOME="$HOME" PATH="$venv/bin:$cleanpath" TMPDIR=/tmp LANG=C.UTF-8 "$@"; }
  (cd "$work" && run syncmgr version)
  (cd "$work" && run python "$repo/tests/wheel/smoke.py")

  # syncmgr serve from the console command, used by a client, stopped by SIGTERM.
  key=$(run syncmgr keygen)
  sock="$work/s-$ver.sock"
  env -i HOME="$HOME" PATH="$venv/bin:$cleanpath" SYNCMGR_AUTHKEY="$key" \
    syncmgr serve --socket "$sock" --shm-dir none --log-format json >"$work/serve-$ver.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || { cat "$work/serve-$ver.log"; echo "smoke: syncmgr serve did not start" >&2; exit 1; }
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
    cat "$work/serve-$ver.log"; echo "smoke: syncmgr serve stopped with $rc, socket left: $([ -e "$sock" ] && echo yes || echo no)" >&2; exit 1
  fi
  echo "smoke: Python $ver: syncmgr serve stopped cleanly on SIGTERM"
  ok=$((ok + 1))
done
# The cross-compiled aarch64 wheel: tag, static ELF for aarch64, and (where
# qemu-user-static is installed) its daemon serving this machine's client.
if [ -z "${1:-}" ]; then
  rm -rf pyclient/build
  SYNCMGR_WHEEL_ARCH=aarch64 "$python" -m pip wheel -q --no-deps -w "$work/dist-arm" ./pyclient
  rm -rf pyclient/build
  arm=$(ls "$work"/dist-arm/syncmgr-*.whl)
  case "$(basename "$arm")" in
    *-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl) ;;
    *) echo "aarch64 wheel has the wrong tag: $(basename "$arm")" >&2; exit 1 ;;
  esac
  "$python" - "$arm" "$work/syncmgr-aarch64" <<'PY'
import os, struct, sys, zipfile
elf = zipfile.ZipFile(sys.argv[1]).read("syncmgr/_bin/syncmgr")
machine, = struct.unpack_from("<H", elf, 0x12)
phoff, = struct.unpack_from("<Q", elf, 0x20)
phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
types = [struct.unpack_from("<I", elf, phoff + i * phentsize)[0] for i in range(phnum)]
assert machine == 183, f"e_machine {machine}, want 183 (aarch64)"
assert 3 not in types and 2 not in types, "aarch64 daemon is dynamically linked"
open(sys.argv[2], "wb").write(elf)
os.chmod(sys.argv[2], 0o755)
print(f"aarch64 wheel: {os.path.basename(sys.argv[1])}, static aarch64 ELF")
PY
  if command -v qemu-aarch64-static >/dev/null; then
    qemu-aarch64-static "$work/syncmgr-aarch64" version
    key=$(run syncmgr keygen)
    sock="$work/arm.sock"
    env -i PATH="$cleanpath" SYNCMGR_AUTHKEY="$key" qemu-aarch64-static "$work/syncmgr-aarch64" serve \
      --socket "$sock" --shm-dir none >"$work/serve-arm.log" 2>&1 &
    serve_pid=$!
    for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
    run SYNCMGR_AUTHKEY="$key" SYNCMGR_ADDRESS="$sock" python -c '
import syncmgr
m = syncmgr.connect()
q = m.Queue()
q.put([1, "two"])
assert q.get(timeout=30) == [1, "two"]
print("smoke: the aarch64 daemon (under qemu) serves an x86_64 client")'
    kill -TERM "$serve_pid"; rc=0; wait "$serve_pid" || rc=$?; serve_pid=
    [ "$rc" -eq 0 ] || { cat "$work/serve-arm.log"; echo "smoke: aarch64 daemon exited $rc" >&2; exit 1; }
    ok=$((ok + 1))
  else
    echo "aarch64: not run (qemu-aarch64-static is not installed; apt-get install qemu-user-static)"
  fi
fi
echo "wheel-smoke: $ok passed, 0 failed"
