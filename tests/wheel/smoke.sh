#!/usr/bin/env bash
# make test-wheel: builds every syncmgr wheel (scripts/build-wheels.sh: CPython
# 3.9-3.13, x86_64 and aarch64, each with the fast-path extension and the
# static daemon) into dist/, or takes them from DIST, and checks each:
#
# * every wheel: its name's tag is the one auditwheel finds it consistent
#   with (manylinux_2_17), its extension is for its CPython and architecture,
#   its daemon a static ELF for that architecture (tests/wheel/check_wheel.py);
# * every x86_64 wheel: installed into a fresh venv of its CPython with no Go
#   and no C compiler on PATH, the smoke runs with the fast path active: a
#   Lock op with no round trip, a Queue on its ring, a spawned child, the
#   `syncmgr` command's serve/status (tests/wheel/install_one.sh);
# * every aarch64 wheel whose CPython Debian ships for arm64 (3.9, 3.11,
#   3.13): under qemu-user, its daemon serves its own fast-path smoke run by
#   that arm64 CPython (tests/wheel/qemu_arm.sh);
# * the cp39 x86_64 wheel under Debian bullseye's glibc 2.31: the extension
#   loads, the package's daemon starts, the fast-path smoke passes
#   (tests/wheel/old_glibc.sh).
#
# The qemu and old-glibc checks run in the background while the x86_64
# wheels are installed and smoke-tested; their lines come last.
#
# A CPython 3.9-3.13 this machine lacks, a wheel missing from the build, or a
# failed check is a FAILED line. A qemu or old-glibc check whose tools or
# Debian packages cannot be had here is a "not run" note that says why
# (only those two). The last line is `wheel-smoke: N passed, M failed`; the
# exit status is 1 when M > 0.
#
#   tests/wheel/smoke.sh [DIST]
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
versions="3.9 3.10 3.11 3.12 3.13"
version=$(sed -nE 's/^version = "([^"]+)"/\1/p' pyclient/pyproject.toml)
work=$(mktemp -d /tmp/syncmgr-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
notes=()
ok() { echo "wheel-smoke: $1: ok${2:+: $2}"; passed=$((passed + 1)); }
bad() { echo "wheel-smoke: $1: FAILED: $2"; failed=$((failed + 1)); }
note() { echo "wheel-smoke: $1: not run: $2"; notes+=("$1: $2"); }
indent() { sed 's/^/    /'; }

. scripts/find-python.sh  # find_python 3.X

# The checks under qemu and under an older glibc spend most of their time
# fetching a Debian root and in emulation: they run in the background,
# beside the x86_64 installs, each into files of its own, and their results
# are printed after those, in the order they were started. Their tools are
# installed first, one apt-get at a time.
bg_labels=() bg_msgs=() bg_pids=()
background() {  # background LABEL MESSAGE COMMAND...
  local i=${#bg_labels[@]} p
  for p in "${root_pids[@]}"; do wait "$p"; done
  root_pids=()
  bg_labels+=("$1") bg_msgs+=("$2")
  shift 2
  ( start=$SECONDS; "$@" >"$work/bg-$i.out" 2>&1; echo "$? $((SECONDS - start))" >"$work/bg-$i.rc" ) &
  bg_pids+=("$!")
}
bash scripts/apt-ensure.sh qemu-aarch64-static qemu-user-static >/dev/null 2>&1 || true
bash scripts/apt-ensure.sh debootstrap debootstrap >/dev/null 2>&1 || true

if ! bash scripts/wheel-tools.sh; then
  bad "tools" "scripts/wheel-tools.sh could not install ziglang and auditwheel"
  echo "wheel-smoke: $passed passed, $failed failed"
  exit 1
fi
tools=$repo/build/wheel/tools

# Without Go (and without SYNCMGR_WHEEL_DAEMON) a wheel build must stop with
# an error that names Go.
mkdir -p "$work/nogo-src"
tar -C pyclient --exclude=build --exclude='*.egg-info' --exclude='*.so' --exclude=__pycache__ \
  --exclude='syncmgr/_bin' -cf - . | tar -C "$work/nogo-src" -xf -
if env -i HOME="$HOME" PATH=/usr/bin:/bin "$tools/bin/python" -m pip wheel -q --no-deps -w "$work/nogo" \
    "$work/nogo-src" >"$work/nogo.log" 2>&1; then
  bad "build without Go" "the wheel built with no Go on PATH"
elif ! grep -q "needs Go >= " "$work/nogo.log"; then
  bad "build without Go" "no clear error: $(tail -n 3 "$work/nogo.log" | tr '\n' ' ')"
else
  ok "build without Go" "refused with: $(grep -o 'building the syncmgr wheel compiles the daemon and needs Go[^:]*' "$work/nogo.log" | head -1)"
fi

# The Debian roots those checks run in are fetched while the wheels build
# (network, not CPU); each check waits for them first. A root that fails
# here is fetched again, and its failure reported, by its check.
root_pids=()
if command -v debootstrap >/dev/null; then
  for r in "arm64 bullseye 3.9" "arm64 bookworm 3.11" "arm64 trixie 3.13" "amd64 bullseye 3.9"; do
    read -r r_arch r_suite r_ver <<<"$r"
    bash scripts/debian-root.sh "$r_arch" "$r_suite" "$r_ver" "$repo/build/wheel/root-$r_arch-$r_suite" \
      >"$work/root-$r_arch-$r_suite.log" 2>&1 &
    root_pids+=("$!")
  done
fi

dist=${1:-}
if [ -z "$dist" ]; then
  dist=$repo/dist
  start=$SECONDS
  bash scripts/build-wheels.sh "$dist" 2>&1 | indent
  echo "wheel-smoke: build: $((SECONDS - start)) s"
fi

# The glibc check: the cp39 x86_64 wheel under an older glibc.
whl=$dist/syncmgr-$version-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
if [ -f "$whl" ]; then
  background "cp39 x86_64 under glibc 2.31" \
    "the extension loads and the package's daemon starts in Debian bullseye's CPython 3.9" \
    bash tests/wheel/old_glibc.sh "$whl" "$work"
fi

for arch in aarch64 x86_64; do  # aarch64 first: its qemu checks run in the background meanwhile
  for v in $versions; do
    xy=${v/./}
    label="cp$xy $arch"
    whl=$dist/syncmgr-$version-cp$xy-cp$xy-manylinux_2_17_$arch.manylinux2014_$arch.whl
    py=$(find_python "$v") || py=
    if [ ! -f "$whl" ]; then
      if [ -z "$py" ]; then
        bad "$label" "no CPython $v on this machine, so no wheel for it (install it: pyenv install $v)"
      else
        bad "$label" "no wheel $(basename "$whl") in $dist"
      fi
      continue
    fi
    if ! why=$("$tools/bin/python" tests/wheel/check_wheel.py --auditwheel "$tools/bin/auditwheel" \
        --arch "$arch" --python "$v" "$whl" 2>&1); then
      bad "$label" "$(basename "$whl"): $why"
      continue
    fi
    checked=$why
    if [ "$arch" = x86_64 ]; then
      if [ -z "$py" ]; then
        bad "$label" "no CPython $v on this machine to install $(basename "$whl") into (install it: pyenv install $v)"
        continue
      fi
      mkdir -p "$work/$xy"
      start=$SECONDS
      if bash tests/wheel/install_one.sh "$whl" "$py" "$work/$xy" >"$work/$xy.log" 2>&1; then
        indent <"$work/$xy.log"
        ok "$label" "$(basename "$whl"): $checked; installed into a fresh CPython $v venv with no Go or C compiler on PATH, smoke passed with the fast path ($((SECONDS - start)) s)"
      else
        indent <"$work/$xy.log"
        bad "$label" "$(basename "$whl"): the install or the smoke failed (above)"
      fi
    else
      ok "$label" "$(basename "$whl"): $checked"
      mkdir -p "$work/arm$xy"
      background "$label under qemu" "its daemon and its extension in Debian's arm64 CPython $v: fast path with no round trip" \
        bash tests/wheel/qemu_arm.sh "$whl" "$v" "$work/arm$xy"
    fi
  done
done

# The background checks' results, in the order they were started.
for i in "${!bg_labels[@]}"; do
  wait "${bg_pids[$i]}"
  read -r rc secs <"$work/bg-$i.rc" || { rc=1 secs=0; }
  case $rc in
    0) indent <"$work/bg-$i.out"; ok "${bg_labels[$i]}" "${bg_msgs[$i]} ($secs s)" ;;
    3) note "${bg_labels[$i]}" "$(tail -n 1 "$work/bg-$i.out")" ;;
    *) indent <"$work/bg-$i.out"; bad "${bg_labels[$i]}" "the smoke failed (above)" ;;
  esac
done

if [ ${#notes[@]} -gt 0 ]; then
  echo "wheel-smoke: not run, and why:"
  printf '    %s\n' "${notes[@]}"
fi
echo "wheel-smoke: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
