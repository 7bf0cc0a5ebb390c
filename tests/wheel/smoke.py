"""Run inside a fresh venv where the syncmgr wheel is installed, with no Go
on PATH and no SYNCMGR_BIN: the packaged daemon must do everything, and the
packaged fast path (syncmgr._fastpath) must be the one in use: Lock ops with
no round trip to the daemon, a Queue's items on its ring.

``smoke.py --fast-only`` runs the fast-path part alone, against the daemon
SYNCMGR_ADDRESS and SYNCMGR_AUTHKEY name (the aarch64 wheel under qemu) or in
a Manager with the package's daemon (the x86_64 wheel under an older glibc):
for a wheel unpacked on PYTHONPATH rather than installed."""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import shutil
import sys
import sysconfig

import syncmgr
from syncmgr import _connection, _fast


def child(q: syncmgr.QueueProxy, lock: syncmgr.AcquirerProxy) -> None:
    # The proxies arrive pickled by address and name; the key comes from the
    # environment the Manager exported.
    with lock:
        q.put(("child", os.getpid()))


def check(cond: bool, what: str) -> None:
    if not cond:
        sys.exit(f"smoke: FAILED: {what}")


class RoundTrips:
    """Counts the requests this process sends to a daemon, on any of its
    connections (every socket-path op is one send_requests call)."""

    def __init__(self) -> None:
        self.n = 0
        orig = _connection.Connection.send_requests

        def counting(conn: _connection.Connection, frames: list) -> None:
            self.n += 1
            return orig(conn, frames)

        _connection.Connection.send_requests = counting  # type: ignore[method-assign]


def fast_path(m: syncmgr.Manager) -> str:
    """The fast path is the packaged extension's and carries Lock and Queue
    ops with no request to the daemon."""
    ext = _fast._ext
    check(ext is not None, "syncmgr._fastpath did not import: the wheel's fast path is missing")
    pkg = os.path.dirname(os.path.realpath(syncmgr.__file__))
    check(os.path.dirname(os.path.realpath(ext.__file__)) == pkg, f"the extension {ext.__file__} is not the package's")
    check(_fast.enabled_by_env(), "the fast path is turned off (SYNCMGR_FASTPATH=0?)")
    trips = RoundTrips()
    n = trips.n
    lock, q = m.Lock(), m.Queue()
    check(trips.n > n, "the round-trip counter saw no request for two new objects")
    check(_fast.active(lock), f"the Lock is not on the fast path: {_fast.reasons}")
    check(_fast.active(q) and q.__dict__["_fast"].ring is not None,
          f"the Queue is not on its ring: {_fast.reasons}")
    check(lock.acquire(timeout=5), "lock.acquire")  # a first op may send the proxy's notes
    lock.release()
    q.put(0)
    check(q.get(timeout=5) == 0, "queue round trip")
    n = trips.n
    for _ in range(100):
        check(lock.acquire(timeout=5), "lock.acquire")
        lock.release()
    lock_trips = trips.n - n
    n = trips.n
    for i in range(100):
        q.put({"i": i})
        check(q.get(timeout=5) == {"i": i}, "queue item")
    queue_trips = trips.n - n
    check(lock_trips == 0, f"100 Lock acquire/release pairs sent {lock_trips} requests to the daemon")
    check(queue_trips == 0, f"100 Queue put/get pairs sent {queue_trips} requests to the daemon")
    return (f"fast path {os.path.basename(ext.__file__)}: 100 Lock acquire/release and 100 Queue "
            "put/get on its ring, 0 round trips")


def fast_only() -> None:
    """The fast path alone: against $SYNCMGR_ADDRESS's daemon when set, else
    in a Manager that starts the package's own daemon."""
    where = f"Python {sys.version.split()[0]} {platform.machine()}, {os.confstr('CS_GNU_LIBC_VERSION')}"
    if os.environ.get("SYNCMGR_ADDRESS"):
        print(f"smoke: {where}: {fast_path(syncmgr.connect())}")
        return
    binary = syncmgr.find_binary()
    pkg = os.path.dirname(os.path.realpath(syncmgr.__file__))
    check(os.path.realpath(binary).startswith(pkg), f"daemon {binary} is not the package's")
    with syncmgr.Manager() as m:
        print(f"smoke: {where}: the package's daemon started; {fast_path(m)}")


def main() -> None:
    check("SYNCMGR_BIN" not in os.environ, "SYNCMGR_BIN must not be set")
    for tool in ("go", "cc", "gcc", "clang", "zig"):
        check(shutil.which(tool) is None, f"{tool} must not be on PATH")
    binary = syncmgr.find_binary()
    site = sysconfig.get_paths()["platlib"]
    packaged = os.path.realpath(binary).startswith(os.path.realpath(site))
    check(packaged, f"daemon {binary} is not the packaged one under {site}")
    pkg = os.path.realpath(syncmgr.__file__)
    check(pkg.startswith(os.path.realpath(site)), f"syncmgr imported from {pkg}, not the installed wheel under {site}")
    with syncmgr.Manager() as m:
        fast = fast_path(m)
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
    print(f"smoke: Python {sys.version.split()[0]}: {fast}")


if __name__ == "__main__":
    fast_only() if sys.argv[1:] == ["--fast-only"] else main()
