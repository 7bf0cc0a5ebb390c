"""The ``syncmgr`` console command: runs the daemon binary shipped in the wheel.

``pip install syncmgr`` puts this wrapper on PATH; it replaces itself with
the binary (``syncmgr serve``, ``syncmgr status``, ...), so signals and exit
codes are the binary's own. Two commands are Python's, since they speak to
Ray: ``syncmgr ray-start`` and ``syncmgr ray-stop`` (a syncmgr cluster on a
running Ray cluster, see syncmgr.ray).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from ._daemon import find_binary
from .exceptions import SyncMgrError


def _ray_command(argv: list[str]) -> int:
    cmd = argv[0]
    p = argparse.ArgumentParser(
        prog=f"syncmgr {cmd}",
        description=("Start a syncmgr daemon on every node of a running Ray cluster, detached: it outlives this "
                     "command until `syncmgr ray-stop`; jobs reach it with syncmgr.ray.attach(NAME)."
                     if cmd == "ray-start" else
                     "Stop every daemon of a detached syncmgr cluster on Ray (`syncmgr ray-start`); nothing is "
                     "left on any node."))
    p.add_argument("--name", required=True, help="the syncmgr cluster's name")
    p.add_argument("--address", default="auto", help="the Ray cluster to join (default: auto, the running one)")
    args = p.parse_args(argv[1:])
    import ray  # noqa: PLC0415 - only these two commands need Ray

    from . import ray as sray  # noqa: PLC0415

    ray.init(address=args.address, configure_logging=False, log_to_driver=False)
    try:
        if cmd == "ray-start":
            c = sray.start(name=args.name, detached=True)
            for nid, info in sorted(c.nodes().items()):
                print(f"{nid}  {info['socket']}  {info['tcp']}")
            print(f"syncmgr cluster {args.name!r}: {len(c.nodes())} daemons; "
                  f"in a job: syncmgr.ray.attach({args.name!r}).local()")
        else:
            sray.attach(args.name).shutdown()
            print(f"syncmgr cluster {args.name!r}: stopped")
    except SyncMgrError as e:
        sys.stderr.write(f"syncmgr: {e}\n")
        return 1
    finally:
        ray.shutdown()
    return 0


def main(argv: Optional[list[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("ray-start", "ray-stop"):
        sys.exit(_ray_command(argv))
    try:
        binary = find_binary()
    except SyncMgrError as e:
        sys.stderr.write(f"syncmgr: {e}\n")
        sys.exit(1)
    os.execv(binary, [binary, *argv])


if __name__ == "__main__":
    main()
