#!/usr/bin/env bash
# Unpacks a minimal Debian root with one CPython in it, for running a wheel
# under another glibc or another architecture without a container:
#
#   scripts/debian-root.sh ARCH SUITE PYVER DIR
#   e.g. scripts/debian-root.sh arm64 bookworm 3.11 build/wheel/root-arm64-bookworm
#
# debootstrap --foreign downloads the suite's base packages with
# python3.X-minimal, libpython3.X-stdlib and python3-msgpack, and every
# package is then unpacked with dpkg-deb -x: nothing is configured and
# nothing runs inside the root, so it works for a foreign architecture
# without binfmt_misc. Run its Python as
#   qemu-aarch64-static -L DIR DIR/usr/bin/python3.X          (arm64)
#   DIR/lib64/ld-linux-x86-64.so.2 --library-path ... DIR/usr/bin/python3.X (amd64)
# A DIR that was made before with the same arguments is kept.
# Needs debootstrap (apt-get install debootstrap) and Debian's mirror.
set -euo pipefail
arch=$1 suite=$2 pyver=$3 dir=$4
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
want="$arch $suite $pyver $mirror"
if [ -x "$dir/usr/bin/python$pyver" ] && [ "$(cat "$dir/.made" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debian-root: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
log=$dir.log
if ! debootstrap --foreign --arch="$arch" --variant=minbase \
    --include="python$pyver-minimal,libpython$pyver-stdlib,python3-msgpack" \
    "$suite" "$dir" "$mirror" >"$log" 2>&1; then
  tail -5 "$log" >&2
  echo "debian-root: debootstrap of $suite ($arch) from $mirror failed (log: $log)" >&2
  exit 1
fi
for deb in "$dir"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$dir"; done
rm -f "$dir"/var/cache/apt/archives/*.deb
[ -x "$dir/usr/bin/python$pyver" ] || { echo "debian-root: no python$pyver in $suite ($arch)" >&2; exit 1; }
echo "$want" >"$dir/.made"
