"""``make demo-compare``: every setup over the same seeds, interleaved, in fresh processes."""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
from typing import Any

import numpy as np

from .config import SETUPS
from .report import ShmWatch, load_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compare", action="store_true", help="run every setup over --repeats seeds, interleaved")
    p.add_argument("--repeats", type=int, default=5, help="with --compare: seeds --seed, --seed+1, ...")
    p.add_argument("--setups", default=",".join(SETUPS), help="with --compare: which setups")
    p.add_argument("--write-docs", action="store_true",
                   help="with --compare: rewrite the demo's section of docs/benchmarks.md")


def main(args: argparse.Namespace) -> int:
    print("compare: not built yet", file=sys.stderr)
    return 2


_ = (datetime, platform, subprocess, np, Any, ShmWatch, load_json)
