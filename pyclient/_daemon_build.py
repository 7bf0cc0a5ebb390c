"""Build steps that put the syncmgr daemon into the wheel.

A wheel built from this directory carries the daemon as a static Go binary
at ``syncmgr/_bin/syncmgr`` (``CGO_ENABLED=0``: no libc, no shared
libraries), so it is tagged for a platform rather than ``any``:

* ``py3-none-manylinux_2_17_<arch>.manylinux2014_<arch>`` when the wheel
  holds no compiled Python extension (the binary runs on any Linux kernel of
  that architecture, whatever its libc);
* ``cpXY-cpXY-manylinux_<glibc>_<arch>`` when it holds ``syncmgr._fastpath``.
  The glibc in the tag is the one the extension was compiled against: this
  machine's, unless ``SYNCMGR_WHEEL_GLIBC`` (e.g. ``2.17``) says that ``$CC``
  targets an older one (``scripts/build-wheels.sh`` sets both, with Zig's C
  compiler; its ``auditwheel show`` checks the claim). A 2.17 wheel also
  carries the ``manylinux2014`` alias.

Environment of a wheel build:

* ``SYNCMGR_WHEEL_ARCH=aarch64`` (or ``x86_64``) builds for another
  architecture. The daemon is cross-compiled by Go; the C extension goes in
  only when ``$CC`` is set (a cross compiler for that architecture, which
  the builder vouches for) and otherwise is left out with a message.
* ``SYNCMGR_WHEEL_DAEMON=PATH`` puts a daemon built beforehand (``python
  _daemon_build.py daemon OUT``) into the wheel instead of running Go again:
  it must be a static ELF for the target architecture.
* ``SYNCMGR_WHEEL_REQUIRE_EXT=1`` makes a failed extension build fail the
  wheel (setup.py) instead of leaving the extension out.

Editable installs (``pip install -e``) skip the Go build: the client then
finds the repository's ``bin/syncmgr`` (``make build``) or ``$SYNCMGR_BIN``.
Building a wheel needs Go (``$GO`` or ``go`` on PATH) and the repository's Go
source one directory up, or ``SYNCMGR_WHEEL_DAEMON``; without them the build
stops with an error that says so.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import struct
import subprocess
import sys
from typing import Any

from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.install import install as _install
from setuptools.errors import SetupError

try:  # setuptools >= 70.1 carries bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # pragma: no cover - older setuptools with the wheel package
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel  # type: ignore[no-redef]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODULE = "github.com/syncmgr/syncmgr"

# Python platform arch -> GOARCH, and -> the ELF header's e_machine.
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


def host_arch() -> str:
    m = platform.machine().lower()
    return _ALIASES.get(m, m)


def target_arch() -> str:
    """The architecture the wheel is for: $SYNCMGR_WHEEL_ARCH or this machine's."""
    want = os.environ.get("SYNCMGR_WHEEL_ARCH", "").strip().lower()
    if not want:
        return host_arch()
    arch = _ALIASES.get(want)
    if arch is None:
        raise SetupError(f"SYNCMGR_WHEEL_ARCH={want!r}: expected one of x86_64, aarch64")
    return arch


def cross_building() -> bool:
    return target_arch() != host_arch()


def _go() -> str:
    go = shutil.which(os.environ.get("GO") or "go")
    if not go:
        raise SetupError(
            "building the syncmgr wheel compiles the daemon and needs Go >= 1.26: "
            "put `go` on PATH or point $GO at it (https://go.dev/dl/). "
            "For a development install without the daemon inside, use `pip install -e`."
        )
    return go


def _repo_root() -> str:
    gomod = os.path.join(REPO, "go.mod")
    try:
        with open(gomod, encoding="utf-8") as f:
            first = f.readline().split()
    except OSError:
        first = []
    if first[:2] != ["module", MODULE]:
        raise SetupError(
            f"building the syncmgr wheel needs the daemon's Go source ({MODULE}) in {REPO}; "
            "build from a checkout of the syncmgr repository"
        )
    return REPO


def check_static_elf(path: str, arch: str) -> None:
    """Raise SetupError unless path is a static 64-bit little-endian ELF
    executable for arch (no ELF interpreter, no dynamic section)."""
    try:
        with open(path, "rb") as f:
            elf = f.read(1 << 16)
    except OSError as e:
        raise SetupError(f"syncmgr daemon {path}: {e}") from e
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise SetupError(f"syncmgr daemon {path}: not a 64-bit little-endian ELF")
    (machine,) = struct.unpack_from("<H", elf, 0x12)
    if machine != ELF_MACHINE.get(arch):
        raise SetupError(f"syncmgr daemon {path}: ELF machine {machine}, not {arch}")
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    types = [struct.unpack_from("<I", elf, phoff + i * phentsize)[0] for i in range(phnum)]
    if 2 in types or 3 in types:  # PT_DYNAMIC, PT_INTERP
        raise SetupError(f"syncmgr daemon {path}: dynamically linked; the wheel needs a static one")


def build_daemon(out: str) -> None:
    """Put a static daemon for target_arch() at out: $SYNCMGR_WHEEL_DAEMON
    if set (checked), else compile cmd/syncmgr."""
    arch = target_arch()
    out = os.path.abspath(out)
    prebuilt = os.environ.get("SYNCMGR_WHEEL_DAEMON", "").strip()
    if prebuilt:
        check_static_elf(prebuilt, arch)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copyfile(prebuilt, out)
        os.chmod(out, 0o755)
        print(f"syncmgr: daemon from SYNCMGR_WHEEL_DAEMON={prebuilt} ({arch})", flush=True)
        return
    go, root = _go(), _repo_root()
    if sys.platform.startswith("linux") and arch not in GOARCH:
        raise SetupError(f"no Go target for architecture {arch!r}")
    env = dict(os.environ, CGO_ENABLED="0")
    if sys.platform.startswith("linux"):
        env.update(GOOS="linux", GOARCH=GOARCH[arch])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [go, "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, "./cmd/syncmgr"]
    print(f"syncmgr: {' '.join(cmd)} (GOARCH={env.get('GOARCH', 'host')}, CGO_ENABLED=0)", flush=True)
    try:
        subprocess.run(cmd, cwd=root, env=env, check=True)
    except subprocess.CalledProcessError as e:
        raise SetupError(f"go build of the syncmgr daemon failed (exit {e.returncode})") from e
    os.chmod(out, 0o755)
    if sys.platform.startswith("linux"):
        check_static_elf(out, arch)


class build_py(_build_py):  # noqa: N801 - setuptools command names
    """build_py that also compiles the daemon into the package (not for editable installs)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        build_daemon(os.path.join(self.build_lib, "syncmgr", "_bin", "syncmgr"))


class build_ext(_build_ext):  # noqa: N801
    """build_ext that names a cross-built extension for its target
    (``.cpython-311-aarch64-linux-gnu.so``), not for the machine building it.
    $SETUPTOOLS_EXT_SUFFIX, when set, still wins."""

    def get_ext_filename(self, fullname: str) -> str:
        name = super().get_ext_filename(fullname)
        if cross_building() and not os.environ.get("SETUPTOOLS_EXT_SUFFIX"):
            name = name.replace(f"-{host_arch()}-linux-gnu.", f"-{target_arch()}-linux-gnu.")
        return name


def wheel_glibc() -> tuple[int, int]:
    """The glibc the extension is built against: $SYNCMGR_WHEEL_GLIBC (the
    one $CC targets) or this machine's."""
    want = os.environ.get("SYNCMGR_WHEEL_GLIBC", "").strip()
    if want:
        m = re.fullmatch(r"2\.(\d+)", want)
        if not m:
            raise SetupError(f"SYNCMGR_WHEEL_GLIBC={want!r}: expected a glibc version such as 2.17")
        if not os.environ.get("CC"):
            raise SetupError("SYNCMGR_WHEEL_GLIBC names the glibc $CC targets, but $CC is not set")
        return 2, int(m.group(1))
    libc, _, ver = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    if libc != "glibc":
        raise SetupError("a wheel with a C extension can only be tagged on a glibc system")
    major, minor = ver.split(".")[:2]
    return int(major), int(minor)


def _glibc_tag(arch: str) -> str:
    major, minor = wheel_glibc()
    tag = f"manylinux_{major}_{minor}_{arch}"
    if (major, minor) == (2, 17):
        tag += f".manylinux2014_{arch}"  # the PEP 599 name, for pip < 20.3
    return tag


class bdist_wheel(_bdist_wheel):  # noqa: N801
    """A platform wheel: py3-none-<platform> unless a C extension is inside."""

    def finalize_options(self) -> None:
        if cross_building() and self.distribution.ext_modules and not os.environ.get("CC"):
            print(f"syncmgr: cross-building for {target_arch()} without $CC: "
                  "the wheel carries no C extension (no fast path)", flush=True)
            self.distribution.ext_modules = []
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        arch = target_arch()
        with_ext = self.distribution.has_ext_modules()
        if not sys.platform.startswith("linux"):
            impl, abi, plat = super().get_tag()
            return (impl, abi, plat) if with_ext else ("py3", "none", plat)
        if with_ext:
            impl, abi, _ = super().get_tag()
            return impl, abi, _glibc_tag(arch)
        return "py3", "none", f"manylinux_2_17_{arch}.manylinux2014_{arch}"


class install(_install):  # noqa: N801
    """Install into platlib: the package holds a platform binary, so it sits at
    the wheel's root rather than under .data/purelib."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.install_lib = self.install_platlib


cmdclass: dict[str, Any] = {"build_py": build_py, "build_ext": build_ext, "bdist_wheel": bdist_wheel,
                            "install": install}


if __name__ == "__main__":
    # python _daemon_build.py daemon OUT: the daemon alone, for
    # $SYNCMGR_WHEEL_ARCH, to hand to several wheel builds as SYNCMGR_WHEEL_DAEMON.
    if len(sys.argv) != 3 or sys.argv[1] != "daemon":
        sys.exit("usage: python _daemon_build.py daemon OUT")
    try:
        build_daemon(sys.argv[2])
    except SetupError as e:
        sys.exit(f"syncmgr: {e}")
