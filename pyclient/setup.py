"""Build step for the optional C extension syncmgr._fastpath.

Everything else about the package is declared in pyproject.toml. The
extension is optional: without a C compiler (or off Linux) the install
succeeds without it and the client uses the socket path for every object.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "syncmgr._fastpath",
            sources=["syncmgr/_fastpath.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)
