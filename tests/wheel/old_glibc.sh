#!/usr/bin/env bash
# Runs one x86_64 syncmgr wheel under a glibc older than this machine's:
# Debian bullseye's (2.31, the oldest suite Debian's mirror still serves),
# unpacked with its CPython 3.9 (scripts/debian-root.sh) and run through
# that root's own dynamic loader, so the process's libc is bullseye's. The
# wheel's cp39 extension must load there and the fast-path smoke pass with
# a Manager that starts the wheel's daemon (tests/wheel/smoke.py --fast-only).
#
#   tests/wheel/old_glibc.sh WHEEL(cp39, x86_64) WORKDIR
#
# Exit 0: passed; 1: failed; 3: not run, with the reason on stdout.
set -euo pipefail
wheel=$1 work=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
suite=bullseye ver=3.9
why=$(bash "$repo/scripts/apt-ensure.sh" debootstrap debootstrap) || { echo "$why"; exit 3; }
root=$repo/build/wheel/root-amd64-$suite
why=$(bash "$repo/scripts/debian-root.sh" amd64 "$suite" "$ver" "$root" 2>&1) || { echo "$why" | tail -n 1; exit 3; }
pkg=$work/old-glibc
rm -rf "$pkg"; mkdir -p "$pkg"
python3 -m zipfile -e "$wheel" "$pkg"
chmod +x "$pkg/syncmgr/_bin/syncmgr"
libs=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu
out=$(env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOME="$HOME" PYTHONHOME="$root/usr" \
  PYTHONPATH="$pkg:$root/usr/lib/python3/dist-packages" \
  "$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$libs" "$root/usr/bin/python$ver" \
  "$repo/tests/wheel/smoke.py" --fast-only)
echo "$out"
case "$out" in
  *"glibc 2.31"*) ;;
  *) echo "the smoke did not run under bullseye's glibc 2.31"; exit 1 ;;
esac
