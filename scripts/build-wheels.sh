#!/usr/bin/env bash
# Builds syncmgr's wheels: one per CPython 3.9-3.13 and per architecture
# (x86_64, aarch64), each with the fast-path extension (syncmgr._fastpath)
# and the static daemon inside, tagged cpXY-cpXY-manylinux_2_17_<arch>
# (manylinux2014), and checks each with auditwheel.
#
#   scripts/build-wheels.sh [DIST]        (default: dist)
#
# The extension is compiled by Zig's C compiler (PyPI's ziglang) for glibc
# 2.17, against each CPython's own headers (for aarch64, with pyconfig.h
# set to its aarch64 values: docs/decisions.md, "Wheels for every CPython
# and both architectures"). The daemon is compiled once per architecture
# (Go, CGO_ENABLED=0) and put into each of that architecture's wheels.
#
# Needs Go ($GO or go on PATH), the CPythons (pyenv's, or python3.X on
# PATH) and PyPI. Tools go into build/wheel/tools (scripts/wheel-tools.sh).
#
# Environment: WHEEL_VERSIONS="3.11 3.12" and WHEEL_ARCHS="x86_64" narrow
# the set. One line per wheel; a missing CPython, a failed build or a
# failed check is a FAILED line and the exit status is 1, after the others
# have been built.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dist=${1:-dist}
mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
versions=${WHEEL_VERSIONS:-3.9 3.10 3.11 3.12 3.13}
archs=${WHEEL_ARCHS:-x86_64 aarch64}
glibc=2.17
work=$repo/build/wheel
tools=$work/tools
export PIP_DISABLE_PIP_VERSION_CHECK=1
version=$(sed -nE 's/^version = "([^"]+)"/\1/p' pyclient/pyproject.toml)
failed=0
fail() { echo "wheel: FAILED: $*"; failed=$((failed + 1)); }

. scripts/find-python.sh  # find_python 3.X

bash scripts/wheel-tools.sh || { echo "wheel: FAILED: the build tools could not be installed"; exit 1; }
echo "wheel: tools: zig $("$tools/bin/python" -m ziglang version), auditwheel $("$tools/bin/auditwheel" --version | awk 'NR == 1 {print $2}')"

# The old wheels of this version go: dist/ then holds exactly this build's.
rm -f "$dist"/syncmgr-"$version"-*.whl

# A clean copy of the client's source to build from (the checkout's
# pyclient/ may hold an editable install's extension and build/ dir).
src=$work/src
rm -rf "$src"
mkdir -p "$src"
tar -C pyclient --exclude=build --exclude='*.egg-info' --exclude='*.so' --exclude=__pycache__ \
  --exclude='syncmgr/_bin' -cf - . | tar -C "$src" -xf -

for arch in $archs; do
  case "$arch" in x86_64|aarch64) ;; *) fail "architecture $arch: expected x86_64 or aarch64"; continue ;; esac
  # The daemon, once for all of this architecture's wheels.
  daemon=$work/daemon-$arch/syncmgr
  if ! SYNCMGR_WHEEL_ARCH=$arch "$tools/bin/python" pyclient/_daemon_build.py daemon "$daemon" >"$work/daemon-$arch.log" 2>&1; then
    cat "$work/daemon-$arch.log"
    fail "$arch: the daemon did not build"
    continue
  fi
  # The C compiler: Zig's, for this architecture and glibc 2.17.
  cc=$work/zig/cc-$arch
  mkdir -p "$work/zig"
  printf '#!/bin/sh\nexec "%s" -m ziglang cc -target %s-linux-gnu.%s "$@"\n' "$tools/bin/python" "$arch" "$glibc" >"$cc"
  chmod +x "$cc"
  for v in $versions; do
    label="cp${v/./} $arch"
    py=$(find_python "$v") || { fail "$label: no CPython $v on this machine (looked for pyenv's versions/$v.*/bin/python$v and python$v on PATH)"; continue; }
    inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    cflags="-DNDEBUG -fwrapv"
    if [ "$arch" = aarch64 ] && [ "$(uname -m)" != aarch64 ]; then
      # This CPython's headers with pyconfig.h as aarch64's: the only
      # differences Debian's amd64 and arm64 builds of 3.11 show (x87/x64
      # inline asm, wchar_t's signedness, the support tier); none of them
      # touches an object layout or an API the extension uses.
      over=$work/include-aarch64/python$v
      rm -rf "$over"; mkdir -p "$over"; cp -R "$inc"/. "$over"/
      sed -i -E \
        -e 's|^#define (HAVE_GCC_ASM_FOR_X64\|HAVE_GCC_ASM_FOR_X87) 1$|/* #undef \1 */|' \
        -e 's|^/\* #undef HAVE_USABLE_WCHAR_T \*/$|#define HAVE_USABLE_WCHAR_T 1|' \
        -e 's|^#define PY_SUPPORT_TIER 1$|#define PY_SUPPORT_TIER 2|' "$over/pyconfig.h"
      cflags="-I$over $cflags"
    fi
    out=$work/out-$arch-$v
    rm -rf "$out" "$src/build" "$src"/*.egg-info
    if ! env CC="$cc" LDSHARED="$cc -shared -s" CFLAGS="$cflags" LDFLAGS= \
        SYNCMGR_WHEEL_ARCH="$arch" SYNCMGR_WHEEL_GLIBC="$glibc" SYNCMGR_WHEEL_DAEMON="$daemon" \
        SYNCMGR_WHEEL_REQUIRE_EXT=1 "$py" -m pip wheel -q --no-deps -w "$out" "$src" >"$out.log" 2>&1; then
      tail -30 "$out.log"
      fail "$label: pip wheel failed (log: $out.log)"
      continue
    fi
    whl=$(ls "$out"/syncmgr-*.whl)
    # The checks: auditwheel's tag is the one the name claims; the
    # extension is this CPython's, for this architecture; the daemon is a
    # static ELF for this architecture.
    if ! why=$("$tools/bin/python" "$repo/tests/wheel/check_wheel.py" --auditwheel "$tools/bin/auditwheel" \
        --arch "$arch" --python "$v" --glibc "$glibc" "$whl" 2>&1); then
      echo "$why"
      fail "$label: $(basename "$whl") failed its checks"
      continue
    fi
    mv "$whl" "$dist/"
    echo "wheel: $(basename "$whl") ($(du -k "$dist/$(basename "$whl")" | cut -f1) KiB): $why"
  done
done
rm -rf "$src/build" "$src"/*.egg-info
n=$(ls "$dist"/syncmgr-"$version"-*.whl 2>/dev/null | wc -l)
echo "wheel: $n wheels in $dist, $failed failed"
[ "$failed" -eq 0 ]
