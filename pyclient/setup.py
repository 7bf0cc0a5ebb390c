"""setuptools entry: metadata lives in pyproject.toml; the daemon build and
the wheel's platform tag live in _daemon_build.py."""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _daemon_build import cmdclass  # noqa: E402

setup(cmdclass=cmdclass)
