"""Build steps that put the syncmgr daemon into the wheel.

A wheel built from this directory carries the daemon as a static Go binary
at ``syncmgr/_bin/syncmgr`` (``CGO_ENABLED=0``: no libc, no shared
libraries), so it is tagged for a platform rather than ``any``:

* ``py3-none-manylinux_2_17_<arch>.manylinux2014_<arch>`` when the wheel
  holds no compiled Python extension (the binary runs on any Linux kernel of
  that architecture, whatever its libc);
* ``cpXY-cpXY-manylinux_<glibc>_<arch>`` when it does: an extension built
  here links against this machine's glibc, so the wheel claims no older one.

``SYNCMGR_WHEEL_ARCH=aarch64`` (or ``x86_64``) cross-compiles the daemon for
another architecture; a cross-built wheel carries no C extension (the client
falls back to its socket transport), since the host compiler cannot build one.

Editable installs (``pip install -e``) skip the Go build: the client then
finds the repository's ``bin/syncmgr`` (``make build``) or ``$SYNCMGR_BIN``.
Building a wheel needs Go (``$GO`` or ``go`` on PATH) and the repository's Go
source one directory up; without them the build stops with an error that
says so.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

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

# Python platform arch -> GOARCH.
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}
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
    go = os.environ.get("GO") or shutil.which("go")
    if not go or not os.access(go, os.X_OK):
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


def build_daemon(out: str) -> None:
    """Compile cmd/syncmgr into out as a static binary for target_arch()."""
    go, root, arch = _go(), _repo_root(), target_arch()
    out = os.path.abspath(out)
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


class build_py(_build_py):  # noqa: N801 - setuptools command names
    """build_py that also compiles the daemon into the package (not for editable installs)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        build_daemon(os.path.join(self.build_lib, "syncmgr", "_bin", "syncmgr"))


def _glibc_tag(arch: str) -> str:
    libc, _, ver = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    if libc != "glibc":
        raise SetupError("a wheel with a C extension can only be tagged on a glibc system")
    major, minor = ver.split(".")[:2]
    return f"manylinux_{major}_{minor}_{arch}"


class bdist_wheel(_bdist_wheel):  # noqa: N801
    """A platform wheel: py3-none-<platform> unless a C extension is inside."""

    def finalize_options(self) -> None:
        if cross_building() and self.distribution.ext_modules:
            print("syncmgr: cross-building: the wheel carries no C extension", flush=True)
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


cmdclass: dict[str, Any] = {"build_py": build_py, "bdist_wheel": bdist_wheel, "install": install}
