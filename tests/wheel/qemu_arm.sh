#!/usr/bin/env bash
# Runs one aarch64 syncmgr wheel under qemu-user on this x86_64 machine:
# its static daemon (`syncmgr serve`, under qemu-aarch64-static) and, with
# a Debian arm64 CPython of the wheel's version unpacked beside it
# (scripts/debian-root.sh; no binfmt_misc, no chroot), the fast-path smoke
# (tests/wheel/smoke.py --fast-only): Lock ops and Queue items with no round
# trip, through the wheel's aarch64 extension, against that daemon.
#
#   tests/wheel/qemu_arm.sh WHEEL PYVER WORKDIR
#
# Exit 0: passed; 1: failed; 3: not run, with the reason on stdout (no
# Debian suite reachable here has that CPython for arm64, or qemu-user or
# debootstrap could not be installed, or Debian's mirror did not answer).
set -euo pipefail
wheel=$1 ver=$2 work=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
case "$ver" in
  3.9) suite=bullseye ;;
  3.11) suite=bookworm ;;
  3.13) suite=trixie ;;
  *) echo "no Debian suite here ships CPython $ver for arm64 (bullseye has 3.9, bookworm 3.11, trixie 3.13)"; exit 3 ;;
esac
why=$(bash "$repo/scripts/apt-ensure.sh" qemu-aarch64-static qemu-user-static) || { echo "$why"; exit 3; }
why=$(bash "$repo/scripts/apt-ensure.sh" debootstrap debootstrap) || { echo "$why"; exit 3; }
root=$repo/build/wheel/root-arm64-$suite
why=$(bash "$repo/scripts/debian-root.sh" arm64 "$suite" "$ver" "$root" 2>&1) || { echo "$why" | tail -n 1; exit 3; }

pkg=$work/arm-$ver
rm -rf "$pkg"; mkdir -p "$pkg"
python3 -m zipfile -e "$wheel" "$pkg"
chmod +x "$pkg/syncmgr/_bin/syncmgr"
qemu-aarch64-static "$pkg/syncmgr/_bin/syncmgr" version
key=$(qemu-aarch64-static "$pkg/syncmgr/_bin/syncmgr" keygen)
sock=$work/arm-$ver.sock
env -i PATH=/usr/bin:/bin SYNCMGR_AUTHKEY="$key" qemu-aarch64-static "$pkg/syncmgr/_bin/syncmgr" serve \
  --socket "$sock" >"$work/serve-arm-$ver.log" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$work/serve-arm-$ver.log"; echo "the aarch64 daemon did not start under qemu"; exit 1; }
env -i PATH=/usr/bin:/bin LANG=C.UTF-8 PYTHONPATH="$pkg" SYNCMGR_ADDRESS="$sock" SYNCMGR_AUTHKEY="$key" \
  qemu-aarch64-static -L "$root" "$root/usr/bin/python$ver" "$repo/tests/wheel/smoke.py" --fast-only
kill -TERM "$serve_pid"
rc=0; wait "$serve_pid" || rc=$?
trap - EXIT
[ "$rc" -eq 0 ] || { cat "$work/serve-arm-$ver.log"; echo "the aarch64 daemon exited $rc on SIGTERM"; exit 1; }
echo "smoke: the aarch64 daemon under qemu served the aarch64 client and stopped cleanly on SIGTERM"
