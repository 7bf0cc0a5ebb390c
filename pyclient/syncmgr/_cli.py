"""The ``syncmgr`` console command: runs the daemon binary shipped in the wheel.

``pip install syncmgr`` puts this wrapper on PATH; it replaces itself with
the binary (``syncmgr serve``, ``syncmgr status``, ...), so signals and exit
codes are the binary's own.
"""

from __future__ import annotations

import os
import sys

from ._daemon import find_binary
from .exceptions import SyncMgrError


def main() -> None:
    try:
        binary = find_binary()
    except SyncMgrError as e:
        sys.stderr.write(f"syncmgr: {e}\n")
        sys.exit(1)
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
