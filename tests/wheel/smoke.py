"""Run inside a fresh venv where the syncmgr wheel is installed, with no Go
on PATH and no SYNCMGR_BIN: the packaged daemon must do everything."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import sysconfig

import syncmgr


def child(q: syncmgr.QueueProxy, lock: syncmgr.AcquirerProxy) -> None:
    # The proxies arrive pickled by address and name; the key comes from the
    # environment the Manager exported.
    with lock:
        q.put(("child", os.getpid()))


def check(cond: bool, what: str) -> None:
    if not cond:
        sys.exit(f"smoke: FAILED: {what}")


def main() -> None:
    check("SYNCMGR_BIN" not in os.environ, "SYNCMGR_BIN must not be set")
    check(shutil.which("go") is None, "go must not be on PATH")
    binary = syncmgr.find_binary()
    site = sysconfig.get_paths()["platlib"]
    packaged = os.path.realpath(binary).startswith(os.path.realpath(site))
    check(packaged, f"daemon {binary} is not the packaged one under {site}")
    with syncmgr.Manager() as m:
        lock, q, v = m.Lock(), m.Queue(), m.Value("i", 0)
        check(lock.acquire(timeout=5), "lock.acquire")
        lock.release()
        v.add(41)
        v.add(1)
        check(v.get() == 42, f"value is {v.get()}")
        q.put({"n": 1})
        check(q.get(timeout=5) == {"n": 1}, "queue round trip")
        seg = m.SharedMemory(create=True, size=4096)
        seg.buf[:5] = b"hello"
        other = m.SharedMemory(seg.name)
        check(bytes(other.buf[:5]) == b"hello", "shared memory contents")
        other.close()
        seg.close()
        seg.unlink()
        p = mp.get_context("spawn").Process(target=child, args=(q, lock))
        p.start()
        got = q.get(timeout=60)
        p.join(60)
        check(got == ("child", p.pid) and p.exitcode == 0, f"child process: {got!r}, exit {p.exitcode}")
    print(f"smoke: Python {sys.version.split()[0]}: Manager with Lock, Queue, Value, SharedMemory "
          f"and a spawned child: ok ({binary})")


if __name__ == "__main__":
    main()
