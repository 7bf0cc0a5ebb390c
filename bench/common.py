"""Shared bookkeeping of the benchmark: names of the systems, progress log, child processes and
clean-ups, percentiles, and CPU/RSS readings from /proc.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SYNCMGR = "syncmgr"
SYNCMANAGER = "SyncManager"
REDIS = "Redis"
FLOOR = "floor"

# --------------------------------------------------------------------------
# bookkeeping: progress, children, clean-up


_T0 = time.monotonic()
_CLEANUPS: list[tuple[str, Callable[[], None]]] = []
_CHILDREN: list[Any] = []  # mp.Process and subprocess.Popen objects


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def on_cleanup(what: str, fn: Callable[[], None]) -> None:
    _CLEANUPS.append((what, fn))


def track(child: Any) -> Any:
    _CHILDREN.append(child)
    return child


def stop_round(procs: list[Any], pipes: list[Any]) -> None:
    """End one measurement's child processes and close their result pipes:
    a child still running (the round failed) is killed."""
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for rd in pipes:
        try:
            rd.close()
        except Exception:  # noqa: BLE001 - clean-up goes on
            pass


def reap_children() -> None:
    """Stop every child process this run started that is still alive."""
    for c in list(_CHILDREN):
        try:
            if isinstance(c, subprocess.Popen):
                if c.poll() is None:
                    c.kill()
                    c.wait(timeout=5)
            else:
                if c.is_alive():
                    c.kill()
                c.join(timeout=5)
        except Exception:  # noqa: BLE001 - clean-up goes on
            pass
    _CHILDREN.clear()


def run_cleanups() -> None:
    reap_children()
    while _CLEANUPS:
        what, fn = _CLEANUPS.pop()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            log(f"clean-up of {what} failed: {e!r}")


class BenchTimeout(Exception):
    pass


def _child_signals() -> None:
    """In a benchmark child: no alarm, Ctrl-C is the parent's business (it kills us)."""
    signal.alarm(0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def fork_ctx() -> Any:
    return mp.get_context("fork")


# --------------------------------------------------------------------------
# statistics


def pct(sorted_xs: list[float], p: float) -> float:
    if not sorted_xs:
        return float("nan")
    k = max(0, min(len(sorted_xs) - 1, math.ceil(p / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[k]


def summary_us(samples_ns: list[int]) -> dict[str, Any]:
    xs = sorted(samples_ns)
    mean = (sum(xs) / len(xs) / 1e3) if xs else float("nan")
    return {"n": len(xs), "median": pct(xs, 50) / 1e3, "p99": pct(xs, 99) / 1e3, "mean": mean}


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    return (user + nice + system + irq + softirq) / hz, steal / hz


def loadavg() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
