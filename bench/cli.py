"""The command line: ``python -m bench [--smoke|--quick] ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Optional

import bench
from bench.common import _T0, HERE, REPO, BenchTimeout, log, run_cleanups
from bench.plots import make_plots
from bench.report import evaluate_targets, print_report, write_markdown
from bench.runner import run


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=bench.__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny run (< 60 s) for CI; writes no file")
    p.add_argument("--quick", action="store_true", help="shorter run; writes the report only with --out")
    p.add_argument("--clients", help="client counts for the throughput test, e.g. 1,4,16,64")
    p.add_argument("--duration", type=float, help="seconds per throughput case")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis columns")
    p.add_argument("--install-redis", action="store_true",
                   help="apt-get install redis-server (and pip install redis) if missing")
    p.add_argument("--out", help="Markdown report to write (default for a full run: docs/benchmarks.md; "
                                 "the PNGs go next to it)")
    p.add_argument("--no-docs", action="store_true", help="write no report, whatever the mode")
    p.add_argument("--json", help="also save every number to this JSON file")
    p.add_argument("--render", metavar="JSON", help="do not measure: rewrite the report from a --json file")
    p.add_argument("--wait-quiet", type=float, metavar="SECONDS",
                   help="first wait up to this long for the 1-minute load average to drop below 0.7")
    p.add_argument("--no-targets", action="store_true",
                   help="skip bench/targets.py (the same-host targets), which a full run starts after its own part")
    p.add_argument("--max-time", type=float, help="abort the run after this many seconds (default 1800, smoke 110)")
    args = p.parse_args(argv)
    if args.smoke and args.quick:
        p.error("--smoke and --quick exclude each other")
    if args.smoke and args.out:
        p.error("--smoke writes no report")

    if args.render:
        with open(args.render) as f:
            R = json.load(f, object_hook=_int_keys)
        R["targets"] = evaluate_targets(R)
        print_report(R)
        out = args.out or os.path.join(REPO, "docs", "benchmarks.md")
        plots = make_plots(R, os.path.dirname(os.path.abspath(out)), R.setdefault("notes", []))
        write_markdown(R, out, plots)
        log(f"wrote {out}")
        return 0

    def on_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGALRM:
            raise BenchTimeout(f"the run took longer than --max-time={max_time:g}s")
        raise KeyboardInterrupt

    max_time = args.max_time or (110 if args.smoke else 1800)
    # Ctrl-C stops the run and cleans up, even when a shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.alarm(int(max_time))
    # This part measures the socket path, which every client has (TCP, other
    # hosts, no C compiler); the fast path, on by default on the daemon's
    # host, is measured beside it by bench/targets.py (run_targets below).
    saved_fast = os.environ.get("SYNCMGR_FASTPATH")
    os.environ["SYNCMGR_FASTPATH"] = "0"
    try:
        R = run(args)
        R.setdefault("notes", []).append(
            "syncmgr columns in the sections above: the socket path (SYNCMGR_FASTPATH=0). The same-host fast "
            "path, on by default, is measured against the same baselines in the same-host targets section below.")
        signal.alarm(0)
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    except BenchTimeout as e:
        log(f"aborted: {e}; cleaning up")
        return 1
    except Exception:
        log("the benchmark failed:\n" + traceback.format_exc())
        return 1
    finally:
        signal.alarm(0)
        run_cleanups()
        if saved_fast is None:
            os.environ.pop("SYNCMGR_FASTPATH", None)
        else:
            os.environ["SYNCMGR_FASTPATH"] = saved_fast
    print_report(R)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(R, f, indent=1, default=str)
        log(f"saved {args.json}")
    out = args.out
    if out is None and not args.smoke and not args.quick:
        out = os.path.join(REPO, "docs", "benchmarks.md")
    if out and not args.no_docs:
        plots = make_plots(R, os.path.dirname(os.path.abspath(out)), R["notes"])
        write_markdown(R, out, plots)
        log(f"wrote {out}" + (f" and {', '.join(os.path.basename(x) for x in plots)}" if plots else ""))
    status = 0
    if not args.smoke and not args.quick and not args.no_targets:
        status = run_targets(out if out and not args.no_docs else None)
    log(f"done in {time.monotonic() - _T0:.0f} s")
    return status


def run_targets(out: Optional[str]) -> int:
    """Run bench/targets.py (the same-host targets, in a process of its own) after the main part, so that
    a full run shows everything; it rewrites only its own marked section of the report."""
    script = os.path.join(HERE, "targets.py")
    if not os.path.exists(script):
        return 0
    cmd = [sys.executable, script] + (["--out", out] if out else ["--no-docs"])
    log("targets (expected about 5 min; the whole make bench about 8-10 min): " + " ".join(cmd))
    return subprocess.call(cmd)


def _int_keys(d: dict[str, Any]) -> dict[Any, Any]:
    """JSON turns the client counts into strings; turn them back."""
    return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in d.items()}
