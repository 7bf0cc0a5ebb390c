"""setuptools entry: metadata lives in pyproject.toml; the daemon build and
the wheel's platform tag live in _daemon_build.py. The optional C extension
syncmgr._fastpath (the same-host fast path) is built here: without a C
compiler (or off Linux) the install succeeds without it and the client uses
the socket path for every object. SYNCMGR_WHEEL_REQUIRE_EXT=1 (what
scripts/build-wheels.sh sets) makes a failed extension build fail the wheel
instead."""

import glob
import os
import sys

from setuptools import Extension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _daemon_build import cmdclass  # noqa: E402

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "syncmgr._fastpath",
            # One file per family of objects; fastpath.h is what they share.
            sources=sorted(glob.glob("csrc/fp_*.c")),
            depends=sorted(glob.glob("csrc/*.h")),
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
            # The test build (scripts/setup-venv.sh) compiles the ring's kill-step
            # hook in; wheels and plain installs do not.
            define_macros=[("SYNCMGR_TEST_HOOKS", "1")] if os.environ.get("SYNCMGR_TEST_HOOKS") == "1" else [],
            optional=os.environ.get("SYNCMGR_WHEEL_REQUIRE_EXT") != "1",
        )
    )

setup(cmdclass=cmdclass, ext_modules=ext_modules)
