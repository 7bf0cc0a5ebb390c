"""Microbenchmarks of syncmgr._fastpath alone (no daemon): checks that the
extension reaches the figures the fast path is designed around. Not the
project's benchmark (that is `make bench`); a quick check after a change to
pyclient/csrc/.

    .venv/bin/python scripts/fastpath-micro.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import struct
import tempfile
import time

from syncmgr import _fastpath as fp

SLOTS, SIZE = 8, 8 * 64
LOCK, E1, E2 = 64, 128, 192


def segment(path: str) -> fp.Segment:
    fd = os.open(path, os.O_RDWR)
    try:
        return fp.Segment(fd, SIZE)
    finally:
        os.close(fd)


def uncontended(s: fp.Segment, n: int) -> float:
    acq, rel = s.lock_acquire, s.lock_release
    t0 = time.perf_counter_ns()
    for _ in range(n):
        acq(LOCK, 1, 1, -1.0)
        rel(LOCK)
    return (time.perf_counter_ns() - t0) / n


def mp_lock(n: int) -> float:
    lk = mp.Lock()
    acq, rel = lk.acquire, lk.release
    t0 = time.perf_counter_ns()
    for _ in range(n):
        acq()
        rel()
    return (time.perf_counter_ns() - t0) / n


def ponger(path: str, n: int) -> None:
    s = segment(path)
    for _ in range(n):
        s.event_wait(E1, -1.0)
        s.event_clear(E1)
        s.event_set(E2)


def pingpong(path: str, s: fp.Segment, n: int) -> float:
    p = mp.get_context("fork").Process(target=ponger, args=(path, n))
    p.start()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        s.event_set(E1)
        s.event_wait(E2, -1.0)
        s.event_clear(E2)
    dt = (time.perf_counter_ns() - t0) / n
    p.join()
    return dt


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "seg")
        with open(path, "wb") as f:
            f.write(struct.pack("<QIII", 0x5752474D434E5953, 1, 64, SLOTS).ljust(SIZE, b"\0"))
        os.chmod(path, 0o600)
        s = segment(path)
        un = statistics.median(uncontended(s, 200_000) for _ in range(5))
        ml = statistics.median(mp_lock(200_000) for _ in range(5))
        pp = statistics.median(pingpong(path, s, 5_000) for _ in range(3))
    print(f"uncontended Lock acquire+release, _fastpath:     {un:8.1f} ns")
    print(f"uncontended acquire+release, multiprocessing.Lock: {ml:6.1f} ns")
    print(f"cross-process hand-off round trip (two Events):  {pp / 1000:8.2f} us")


if __name__ == "__main__":
    main()
