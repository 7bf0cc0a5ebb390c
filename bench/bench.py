#!/usr/bin/env python3
"""syncmgr against CPython's SyncManager (and Redis), side by side, in one run.

    .venv/bin/python bench/bench.py                 # full run (~6-9 min on 2 cores), rewrites docs/benchmarks.md
    .venv/bin/python bench/bench.py --smoke         # < 60 s, changes no file; exit status 0 if everything ran
    .venv/bin/python bench/bench.py --quick --out /tmp/b.md
    make bench BENCH_ARGS="--install-redis"         # with Redis columns (apt-get installs redis-server)

Everything runs on this machine, in this run, on the same work:

* syncmgr: the Go daemon (``$SYNCMGR_BIN``, else ``bin/syncmgr``) on a private
  Unix socket, driven through the Python client ``syncmgr``;
* SyncManager: ``multiprocessing.managers.SyncManager`` on a Unix socket, same
  Python interpreter;
* Redis (optional): ``redis-server`` on a Unix socket, driven by redis-py;
* the floor: a raw round trip over a Unix socket to a tiny echo process.

Results go to stdout as tables with ratios and PASS/MISS lines for the targets
(a miss never fails the run). A full or ``--quick`` run with ``--out`` also
writes a Markdown report with PNG plots (matplotlib). ``bench/analysis.md``,
when present, is copied into the report as the explanation of the numbers.

Only the standard library is imported at module level: the SyncManager server
is started with the ``spawn`` method and re-imports this file, and it should
not carry numpy or matplotlib in its footprint.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import datetime
import gc
import hashlib
import hmac
import json
import math
import multiprocessing as mp
import os
import pickle
import platform
import queue
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from typing import Any, Callable, Optional

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


# --------------------------------------------------------------------------
# the systems


def find_syncmgr_bin() -> str:
    env = os.environ.get("SYNCMGR_BIN")
    if env and os.access(env, os.X_OK):
        return env
    cand = os.path.join(REPO, "bin", "syncmgr")
    if os.access(cand, os.X_OK):
        return cand
    found = shutil.which("syncmgr")
    if found:
        return found
    raise SystemExit("bench: no syncmgr daemon binary: run `make build` or set SYNCMGR_BIN")


class SyncmgrDaemon:
    """A syncmgr daemon on a private socket, started (and stopped) by the benchmark."""

    def __init__(self, binary: str, label: str = "main") -> None:
        self.dir = tempfile.mkdtemp(prefix="smbench-", dir="/tmp")
        self.address = os.path.join(self.dir, "syncmgr.sock")
        self.key = os.urandom(32)
        env = dict(os.environ, SYNCMGR_AUTHKEY=self.key.hex())
        env.pop("SYNCMGR_AUTHKEY_FILE", None)
        self.log_path = os.path.join(self.dir, "daemon.log")
        with open(self.log_path, "wb") as logf:
            self.proc = track(subprocess.Popen(
                [binary, "serve", "--socket", self.address, "--log-level", "warn", "--shm-dir", "none",
                 "--exit-with-parent", str(os.getpid())],
                env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True))
        on_cleanup(f"syncmgr daemon ({label})", self.stop)
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"syncmgr daemon exited at start: {self.log_tail()}")
            if os.path.exists(self.address):
                try:
                    raw_syncmgr_connect(self.address, self.key).close()
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"syncmgr daemon did not start in 15 s: {self.log_tail()}")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k
    return bytes(buf)


def raw_syncmgr_connect(address: str, key: bytes) -> socket.socket:
    """An authenticated connection made from docs/protocol.md alone (no client library)."""
    import msgpack

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(address)
        n = struct.unpack(">I", _read_exact(s, 4))[0]
        hello = msgpack.unpackb(_read_exact(s, n), raw=False)
        ns, nc = hello["nonce"], os.urandom(32)
        auth = {"t": "auth", "version": 1, "nonce": nc, "pid": os.getpid(), "label": "bench",
                "mac": hmac.new(key, b"syncmgr/1 client" + ns + nc, hashlib.sha256).digest()}
        s.sendall(_frame(msgpack.packb(auth, use_bin_type=True)))
        n = struct.unpack(">I", _read_exact(s, 4))[0]
        welcome = msgpack.unpackb(_read_exact(s, n), raw=False)
        if welcome.get("t") != "welcome":
            raise ConnectionError(f"handshake refused: {welcome}")
    except BaseException:
        s.close()
        raise
    s.settimeout(None)
    return s


def start_syncmanager(label: str) -> Any:
    """A SyncManager on a Unix socket. Its server process is started with
    spawn so that it does not inherit this process's memory (numpy, cpprb,
    redis-py): its footprint is the manager's own."""
    from multiprocessing.managers import SyncManager

    d = tempfile.mkdtemp(prefix="smgrbench-", dir="/tmp")
    sm = SyncManager(address=os.path.join(d, "sock"), authkey=os.urandom(32), ctx=mp.get_context("spawn"))
    sm.start()
    track(sm._process)

    def stop() -> None:
        with contextlib.suppress(Exception):
            sm.shutdown()
        shutil.rmtree(d, ignore_errors=True)

    on_cleanup(f"SyncManager ({label})", stop)
    sm.bench_stop = stop  # type: ignore[attr-defined]
    return sm


class RedisServer:
    def __init__(self, label: str = "main") -> None:
        self.dir = tempfile.mkdtemp(prefix="redisbench-", dir="/tmp")
        self.address = os.path.join(self.dir, "redis.sock")
        self.log_path = os.path.join(self.dir, "redis.log")
        with open(self.log_path, "wb") as logf:
            self.proc = track(subprocess.Popen(
                ["redis-server", "--port", "0", "--unixsocket", self.address, "--unixsocketperm", "700",
                 "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
                 "--maxclients", "4096", "--loglevel", "warning"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True))
        on_cleanup(f"redis-server ({label})", self.stop)
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start")
            if os.path.exists(self.address):
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.settimeout(2)
                    s.connect(self.address)
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        s.close()
                        break
                    s.close()
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start in 15 s")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self) -> Any:
        import redis

        return redis.Redis(unix_socket_path=self.address, socket_timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_available(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether Redis columns can be measured; installs with --install-redis."""
    if args.no_redis:
        return False, "Redis skipped (--no-redis)"
    have_server = shutil.which("redis-server") is not None
    try:
        import redis  # noqa: F401

        have_py = True
    except ImportError:
        have_py = False
    if args.install_redis and not have_server:
        log("--install-redis: apt-get install -y redis-server")
        ok = _run_quiet(["apt-get", "install", "-y", "-q", "redis-server"], 600)
        if not ok:
            log("apt-get install failed; running apt-get update first, then again")
            _run_quiet(["apt-get", "update", "-q"], 600)
            _run_quiet(["apt-get", "install", "-y", "-q", "redis-server"], 600)
        have_server = shutil.which("redis-server") is not None
        if have_server:
            # The Debian package starts a system service; this benchmark runs its own.
            _run_quiet(["service", "redis-server", "stop"], 60)
    if args.install_redis and not have_py:
        log(f"--install-redis: {sys.executable} -m pip install redis (the `bench` extra of pyclient lists it)")
        _run_quiet([sys.executable, "-m", "pip", "install", "-q", "redis>=4"], 600)
        try:
            import importlib

            importlib.invalidate_caches()
            import redis  # noqa: F401,F811

            have_py = True
        except ImportError:
            have_py = False
    if not have_server:
        return False, "Redis skipped: no redis-server on PATH (run with --install-redis to apt-get install it)"
    if not have_py:
        return False, "Redis skipped: redis-py is not installed (pip install redis, or --install-redis)"
    return True, ""


def _run_quiet(cmd: list[str], timeout: float) -> bool:
    try:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"{' '.join(cmd)}: {e}")
        return False
    if r.returncode != 0:
        log(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return r.returncode == 0


# --------------------------------------------------------------------------
# the floor: an echo process, no protocol

ECHO_SERVER = r"""
import socket, struct, sys, threading
def serve(c):
    hdr = c.recv(4, socket.MSG_WAITALL)
    if len(hdr) < 4:
        return
    (n,) = struct.unpack(">I", hdr)   # message size for this connection
    buf = bytearray(n); view = memoryview(buf)
    while True:
        got = 0
        while got < n:
            k = c.recv_into(view[got:])
            if k == 0:
                return
            got += k
        c.sendall(view)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


class EchoFloor:
    """Ping-pong of fixed-size messages with an echo process: the physical floor."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="echobench-", dir="/tmp")
        self.address = os.path.join(self.dir, "echo.sock")
        self.proc = track(subprocess.Popen([sys.executable, "-c", ECHO_SERVER, self.address],
                                           stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
        on_cleanup("echo server", self.stop)
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not ready.startswith(b"ready"):
            raise RuntimeError("echo server did not start")
        self.pid = self.proc.pid
        self._socks: dict[int, socket.socket] = {}

    def pinger(self, size: int) -> Callable[[], None]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.address)
        s.sendall(struct.pack(">I", size))
        self._socks[size] = s
        msg = b"\x01" * size
        buf = bytearray(size)
        view = memoryview(buf)

        def ping() -> None:
            s.sendall(msg)
            got = 0
            while got < size:
                got += s.recv_into(view[got:])

        return ping

    def stop(self) -> None:
        for s in self._socks.values():
            with contextlib.suppress(OSError):
                s.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------
# single-client latency

# (key, label, round trips for syncmgr and the floor ratio, floor size)
LAT_OPS = [
    ("rtt", "round trip, 8 B (floor: echo; syncmgr: ping; Redis: PING)", 1, 8),
    ("raw_ping", "syncmgr ping without the client library (raw socket + msgpack)", 1, 8),
    ("lock", "Lock acquire + release", 2, 8),
    ("ev_is_set", "Event is_set", 1, 8),
    ("ev_set", "Event set", 1, 8),
    ("val_get", "Value get", 1, 8),
    ("val_set", "Value set", 1, 8),
    ("add", "atomic add (syncmgr add, SyncManager lock+get+set, Redis INCR)", 1, 8),
    ("lgs", "lock + get + set + release (the same on both)", 4, 8),
    ("q8", "Queue put + get, 8 B bytes", 2, 8),
    ("q64k", "Queue put + get, 64 KiB numpy array", 2, 65536),
    ("q1m", "Queue put + get, 1 MiB numpy array", 2, 1 << 20),
    ("create_named", "create named object + proxy (SyncManager: Lock())", 1, 8),
    ("create_anon", "create anonymous Lock + proxy", 1, 8),
    ("unpickle", "fresh process: unpickle proxy + first call", 0, 8),
]
LAT_LABEL = {k: lbl for k, lbl, _, _ in LAT_OPS}
LAT_RTS = {k: n for k, _, n, _ in LAT_OPS}
LAT_FLOOR_SIZE = {k: s for k, _, _, s in LAT_OPS}
# Ops whose target is "no slower than SyncManager, within 1.5x the floor per round trip".
RT_TARGET_OPS = ["lock", "ev_is_set", "ev_set", "val_get", "val_set", "add", "q8"]


def make_item(size: int) -> Any:
    if size <= 8:
        return b"\x07" * size
    try:
        import numpy as np

        return np.full(size, 7, dtype=np.uint8)
    except ImportError:
        return b"\x07" * size


class Counter:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.i = 0

    def __call__(self) -> str:
        self.i += 1
        return f"{self.prefix}{self.i}"


def syncmgr_latency_ops(m: Any, daemon: SyncmgrDaemon, keep: list) -> dict[str, Callable[[], Any]]:
    import msgpack

    lock = m.Lock(name="bench-lock")
    ev = m.Event(name="bench-event")
    val = m.Value("i", 0, name="bench-value")
    qs = {k: m.Queue(name=f"bench-queue-{k}") for k in ("q8", "q64k", "q1m")}
    items = {"q8": make_item(8), "q64k": make_item(65536), "q1m": make_item(1 << 20)}
    names = Counter(f"bench-create-{os.getpid()}-")
    client = m._c()  # the process's client: a bare ping, for the floor comparison

    raw = raw_syncmgr_connect(daemon.address, daemon.key)
    keep.append(raw)
    req = _frame(msgpack.packb([1, "ping", {}], use_bin_type=True))
    rbuf = bytearray(4096)
    rview = memoryview(rbuf)

    def raw_ping() -> None:
        raw.sendall(req)
        got = 0
        while True:
            got += raw.recv_into(rview[got:])
            if got >= 4 and got >= 4 + struct.unpack_from(">I", rbuf, 0)[0]:
                return

    def lgs() -> None:
        lock.acquire()
        val.set(val.get() + 1)
        lock.release()

    def qop(k: str) -> Callable[[], None]:
        q, item = qs[k], items[k]

        def f() -> None:
            q.put(item)
            q.get(timeout=30)

        return f

    return {
        "rtt": lambda: client.call("ping", {}),
        "raw_ping": raw_ping,
        "lock": lambda: (lock.acquire(), lock.release()),
        "ev_is_set": ev.is_set,
        "ev_set": ev.set,
        "val_get": val.get,
        "val_set": lambda: val.set(1),
        "add": lambda: val.add(1),
        "lgs": lgs,
        "q8": qop("q8"), "q64k": qop("q64k"), "q1m": qop("q1m"),
        "create_named": lambda: keep.append(m.Lock(name=names())),
        "create_anon": lambda: keep.append(m.Lock()),
    }


def syncmanager_latency_ops(sm: Any, keep: list) -> dict[str, Callable[[], Any]]:
    lock = sm.Lock()
    ev = sm.Event()
    val = sm.Value("i", 0)
    qs = {k: sm.Queue() for k in ("q8", "q64k", "q1m")}
    items = {"q8": make_item(8), "q64k": make_item(65536), "q1m": make_item(1 << 20)}
    keep.extend([lock, ev, val, *qs.values()])

    def lgs() -> None:
        lock.acquire()
        val.set(val.get() + 1)
        lock.release()

    def qop(k: str) -> Callable[[], None]:
        q, item = qs[k], items[k]

        def f() -> None:
            q.put(item)
            q.get(timeout=30)

        return f

    return {
        "lock": lambda: (lock.acquire(), lock.release()),
        "ev_is_set": ev.is_set,
        "ev_set": ev.set,
        "val_get": val.get,
        "val_set": lambda: val.set(1),
        "add": lgs,
        "lgs": lgs,
        "q8": qop("q8"), "q64k": qop("q64k"), "q1m": qop("q1m"),
        "create_named": lambda: keep.append(sm.Lock()),
        "create_anon": lambda: keep.append(sm.Lock()),
    }


def redis_latency_ops(r: Any) -> dict[str, Callable[[], Any]]:
    lk = r.lock("bench-lock", sleep=0.001)
    r.set("bench-event", 0)
    r.set("bench-value", 0)
    items = {"q8": make_item(8), "q64k": make_item(65536), "q1m": make_item(1 << 20)}

    def qop(k: str) -> Callable[[], None]:
        item, key = items[k], f"bench-queue-{k}"

        def f() -> None:
            r.lpush(key, pickle.dumps(item, protocol=5))
            pickle.loads(r.brpop(key, timeout=30)[1])

        return f

    return {
        "rtt": r.ping,
        "lock": lambda: (lk.acquire(), lk.release()),
        "ev_is_set": lambda: r.get("bench-event") == b"1",
        "ev_set": lambda: r.set("bench-event", 1),
        "val_get": lambda: int(r.get("bench-value")),
        "val_set": lambda: r.set("bench-value", 1),
        "add": lambda: r.incr("bench-value"),
        "q8": qop("q8"), "q64k": qop("q64k"), "q1m": qop("q1m"),
    }


def time_calls(fn: Callable[[], Any], n: int, out: list[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(n):
        t = clock()
        fn()
        out.append(clock() - t)


def run_latency(systems: dict[str, dict[str, Callable[[], Any]]], cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each op, each system: rounds of samples, systems interleaved (rotating
    order), so that drift of the machine falls on everyone alike."""
    results: dict[str, dict[str, Any]] = {s: {} for s in systems}
    pooled: dict[int, list[int]] = {}
    rounds = cfg["rounds"]
    for key, _label, _, _ in LAT_OPS:
        if key == "unpickle":
            continue
        have = [s for s in systems if key in systems[s]]
        if not [s for s in have if s != FLOOR]:
            continue
        n = cfg["iters"].get(key, cfg["iters"]["default"])
        per_round = max(1, n // rounds)
        samples: dict[str, list[int]] = {s: [] for s in have}
        for s in have:  # warm-up
            time_calls(systems[s][key], max(1, per_round // 4), [])
        for r in range(rounds):
            order = have[r % len(have):] + have[:r % len(have)]
            for s in order:
                gc.collect()
                time_calls(systems[s][key], per_round, samples[s])
        parts = []
        for s in have:
            results[s][key] = summary_us(samples[s])
            parts.append(f"{s} {results[s][key]['median']:.1f}")
        if FLOOR in samples:
            pooled.setdefault(LAT_FLOOR_SIZE[key], []).extend(samples[FLOOR])
        log(f"latency {key:13s} " + "  ".join(parts) + " (median us)")
    if FLOOR in results:
        for size, xs in pooled.items():
            results[FLOOR][f"echo{size}"] = summary_us(xs)
    return results


UNPICKLE_CHILD = {
    SYNCMGR: r"""
import os, pickle, sys, time
import syncmgr
data = bytes.fromhex(sys.argv[1])
t0 = time.perf_counter()
p = pickle.loads(data)
p.is_set()
t1 = time.perf_counter()
print(t1 - t0)
""",
    SYNCMANAGER: r"""
import os, pickle, sys, time
import multiprocessing, multiprocessing.managers
multiprocessing.current_process().authkey = bytes.fromhex(os.environ["BENCH_SYNCMANAGER_AUTHKEY"])
data = bytes.fromhex(sys.argv[1])
t0 = time.perf_counter()
p = pickle.loads(data)
p.is_set()
t1 = time.perf_counter()
print(t1 - t0)
""",
    REDIS: r"""
import os, pickle, sys, time
import redis
data = bytes.fromhex(sys.argv[1])
t0 = time.perf_counter()
path, key = pickle.loads(data)
r = redis.Redis(unix_socket_path=path)
r.get(key)
t1 = time.perf_counter()
print(t1 - t0)
""",
}


def run_unpickle(pickles: dict[str, tuple[bytes, dict[str, str]]], samples: int) -> dict[str, dict[str, Any]]:
    """A fresh `python -c` per sample; the child times unpickle + first call itself."""
    out: dict[str, list[int]] = {s: [] for s in pickles}
    for _ in range(samples):
        for s, (data, extra_env) in pickles.items():
            env = dict(os.environ, **extra_env)
            p = track(subprocess.Popen([sys.executable, "-c", UNPICKLE_CHILD[s], data.hex()], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL))
            try:
                so, se = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
                raise RuntimeError(f"unpickle child for {s} did not finish in 60 s") from None
            if p.returncode != 0:
                raise RuntimeError(f"unpickle child for {s} failed: {se.decode(errors='replace')[-1500:]}")
            out[s].append(int(float(so.decode().strip().splitlines()[-1]) * 1e9))
    res = {}
    for s, xs in out.items():
        res[s] = summary_us(xs)
        res[s]["samples_us"] = [x / 1e3 for x in xs]
    log("latency unpickle      " + "  ".join(f"{s} {res[s]['median']:.0f}" for s in res) + " (median us)")
    return res


# --------------------------------------------------------------------------
# multi-client throughput

WORKLOADS = [
    ("indep_locks", "independent locks (acquire + release of its own lock)"),
    ("one_lock", "one contended lock (acquire + release)"),
    ("queue", "producers/consumers on one queue (8 B items)"),
]
WORKLOAD_LABEL = dict(WORKLOADS)


def _tp_prepare(spec: dict[str, Any], idx: int) -> tuple[Callable[[], bool], Optional[Callable[[], bool]]]:
    """In the child: connect and return the op(s). An op returns True when it
    did its work (a queue put/get that timed out returns False). For the queue
    with two or more clients, even clients produce and odd ones consume; the
    op that counts is a get (an item delivered), the other is None."""
    system, wl, n, run = spec["system"], spec["workload"], spec["clients"], spec["run"]
    role = "both" if n == 1 else ("put" if idx % 2 == 0 else "get")
    item = b"\x07" * 8
    if system == SYNCMGR:
        import syncmgr

        m = syncmgr.connect(spec["address"], bytes.fromhex(spec["key"]))
        if wl in ("indep_locks", "one_lock"):
            lk = m.Lock(name=f"tp{run}-{idx}" if wl == "indep_locks" else f"tp{run}-shared")

            def op() -> bool:
                lk.acquire()
                lk.release()
                return True

            return op, None
        q = m.Queue(maxsize=1000, name=f"tp{run}-queue")
    elif system == SYNCMANAGER:
        from multiprocessing.managers import AcquirerProxy, AutoProxy

        key = bytes.fromhex(spec["key"])
        if wl in ("indep_locks", "one_lock"):
            tok = spec["tokens"][idx if wl == "indep_locks" else 0]
            lk = AcquirerProxy(tok, "pickle", authkey=key, incref=False)

            def op() -> bool:
                lk.acquire()
                lk.release()
                return True

            return op, None
        tok, exposed = spec["tokens"][0]
        q = AutoProxy(tok, "pickle", authkey=key, exposed=exposed, incref=False)
    else:
        import redis

        r = redis.Redis(unix_socket_path=spec["address"], socket_timeout=30)
        if wl in ("indep_locks", "one_lock"):
            lk = r.lock(f"tp{run}-{idx}" if wl == "indep_locks" else f"tp{run}-shared", sleep=0.001)

            def op() -> bool:
                lk.acquire(blocking_timeout=30)
                lk.release()
                return True

            return op, None
        qkey = f"tp{run}-queue"

        def rput() -> bool:
            r.lpush(qkey, item)
            return True

        def rget() -> bool:
            return r.brpop(qkey, timeout=0.2) is not None

        if role == "both":
            return (lambda: rput() and rget()), None
        return (rget, None) if role == "get" else (lambda: False, rput)

    def put() -> bool:
        try:
            q.put(item, timeout=0.2)
            return True
        except queue.Full:
            return False

    def get() -> bool:
        try:
            q.get(timeout=0.2)
            return True
        except queue.Empty:
            return False

    if role == "both":
        return (lambda: put() and get()), None
    return (get, None) if role == "get" else (lambda: False, put)


def _tp_child(spec: dict[str, Any], idx: int, barrier: Any, conn: Any) -> None:
    _child_signals()
    code = 0
    try:
        op, side = _tp_prepare(spec, idx)
        barrier.wait(timeout=120)
        clock = time.perf_counter_ns
        lat = array.array("d")
        ops = 0
        cpu0 = time.process_time()
        t_start = time.monotonic()
        deadline = clock() + int(spec["duration"] * 1e9)
        if side is not None:  # a producer: its puts are not counted as ops, but their latency is
            while True:
                t = clock()
                if t >= deadline:
                    break
                if side():
                    lat.append((clock() - t) / 1e3)
        else:
            while True:
                t = clock()
                if t >= deadline:
                    break
                if op():
                    lat.append((clock() - t) / 1e3)
                    ops += 1
        t_end = time.monotonic()
        conn.send(("ok", ops, t_start, t_end, lat.tobytes(), time.process_time() - cpu0))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        code = 1
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"))
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(code)  # no finalizers: SyncManager proxies would open a connection each to decref


_RUN_IDS = iter(range(1, 1 << 30))


def run_throughput_case(system: str, env: dict[str, Any], workload: str, n: int, duration: float) -> dict[str, Any]:
    run = next(_RUN_IDS)
    spec: dict[str, Any] = {"system": system, "workload": workload, "clients": n, "run": run, "duration": duration}
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    if system == SYNCMGR:
        spec.update(address=env["daemon"].address, key=env["daemon"].key.hex())
        server_pid = env["daemon"].pid
        m = env["m"]
        if workload == "queue":
            m.Queue(maxsize=1000, name=f"tp{run}-queue")

        def cleanup() -> None:
            names = [f"tp{run}-{i}" for i in range(n)] + [f"tp{run}-shared", f"tp{run}-queue"]
            for nm in names:
                with contextlib.suppress(Exception):
                    m.delete(nm)
    elif system == SYNCMANAGER:
        sm = env["sm"]
        server_pid = sm._process.pid
        spec["key"] = bytes(sm._authkey).hex()
        if workload == "indep_locks":
            spec["tokens"] = [sm._create("Lock")[0] for _ in range(n)]
        elif workload == "one_lock":
            spec["tokens"] = [sm._create("Lock")[0]]
        else:
            spec["tokens"] = [sm._create("Queue", 1000)]
        tokens = spec["tokens"]

        def cleanup() -> None:
            from multiprocessing.connection import Client
            from multiprocessing.managers import dispatch

            for t in tokens:
                tok = t[0] if isinstance(t, tuple) else t
                with contextlib.suppress(Exception):
                    c = Client(tok.address, authkey=sm._authkey)
                    try:
                        dispatch(c, None, "decref", (tok.id,))
                    finally:
                        c.close()
    else:
        spec["address"] = env["redis"].address
        server_pid = env["redis"].pid
        r = env["r"]

        def cleanup() -> None:
            keys = r.keys(f"tp{run}-*")
            if keys:
                r.delete(*keys)

    ctx = fork_ctx()
    barrier = ctx.Barrier(n + 1)
    procs, pipes = [], []
    gc.collect()
    try:
        for i in range(n):
            rd, wr = ctx.Pipe(duplex=False)
            p = track(ctx.Process(target=_tp_child, args=(spec, i, barrier, wr), daemon=True))
            p.start()
            wr.close()
            procs.append(p)
            pipes.append(rd)
        try:
            barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            errs = _collect_errors(pipes)
            raise RuntimeError(f"{system} {workload} x{n}: clients did not get ready in time {errs}") from None
        srv0, (busy0, steal0), me0 = proc_cpu_s(server_pid), machine_cpu_s(), time.process_time()
        ops, starts, ends, lat, client_cpu = 0, [], [], array.array("d"), 0.0
        errors = []
        for rd in pipes:
            if not rd.poll(duration + 60):
                errors.append("a client did not report in time")
                continue
            msg = rd.recv()
            if msg[0] != "ok":
                errors.append(msg[1])
                continue
            _, o, t0, t1, lb, ccpu = msg
            client_cpu += ccpu
            ops += o
            starts.append(t0)
            ends.append(t1)
            lat.frombytes(lb)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        srv1, (busy1, steal1), me1 = proc_cpu_s(server_pid), machine_cpu_s(), time.process_time()
        if errors:
            raise RuntimeError(f"{system} {workload} x{n}: {errors[0]}")
        span = max(ends) - min(starts)
        xs = sorted(lat)
        server_cpu = srv1 - srv0
        # CPU used on the machine meanwhile by anything else (other users, kernel threads, children's
        # exit): a check that the figures are this benchmark's alone.
        other = max(0.0, (busy1 - busy0) - server_cpu - client_cpu - (me1 - me0))
        per = 1e6 / ops if ops else float("nan")
        return {"ops": ops, "seconds": span, "ops_per_s": ops / span if span > 0 else 0.0,
                "p50_us": pct(xs, 50), "p99_us": pct(xs, 99), "calls": len(xs),
                "client_cpu_us_per_op": client_cpu * per, "server_cpu_us_per_op": server_cpu * per,
                "server_cpu_s": server_cpu, "client_cpu_s": client_cpu, "other_cpu_s": other,
                "steal_s": steal1 - steal0, "machine_busy_s": busy1 - busy0}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for rd in pipes:
            with contextlib.suppress(Exception):
                rd.close()
        cleanup()


def _collect_errors(pipes: list[Any]) -> list[str]:
    errs = []
    for rd in pipes:
        with contextlib.suppress(Exception):
            if rd.poll(0.5):
                msg = rd.recv()
                if msg[0] == "error":
                    errs.append(msg[1])
    return errs[:1]


def run_throughput(envs: dict[str, dict[str, Any]], clients: list[int], duration: float) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for wl, _ in WORKLOADS:
        res[wl] = {}
        for n in clients:
            res[wl][n] = {}
            for s, env in envs.items():
                res[wl][n][s] = run_throughput_case(s, env, wl, n, duration)
            log(f"throughput {wl:11s} x{n:<3d} " + "  ".join(
                f"{s} {res[wl][n][s]['ops_per_s']:.0f}/s p99 {res[wl][n][s]['p99_us']:.0f}us" for s in envs))
    return res


# --------------------------------------------------------------------------
# end to end: cpprb MPPrioritizedReplayBuffer

E2E_BATCH = 32       # transitions an explorer adds at once
E2E_SAMPLE = 64      # learner batch


def _e2e_explorer(rb: Any, barrier: Any, duration: float, seed: int, conn: Any) -> None:
    _child_signals()
    code = 0
    try:
        import numpy as np

        rng = np.random.default_rng(seed)
        batch = {"obs": rng.normal(size=(E2E_BATCH, 4)), "act": rng.integers(0, 2, size=(E2E_BATCH, 1)),
                 "rew": rng.normal(size=(E2E_BATCH, 1)), "next_obs": rng.normal(size=(E2E_BATCH, 4)),
                 "done": np.zeros((E2E_BATCH, 1))}
        barrier.wait(timeout=120)
        deadline = time.monotonic() + duration
        added = 0
        while time.monotonic() < deadline:
            rb.add(**batch)
            added += E2E_BATCH
        conn.send(("ok", added))
    except BaseException as e:  # noqa: BLE001
        code = 1
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"))
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(code)


def run_e2e_one(label: str, mgr: Any, duration: float, explorers: int) -> dict[str, Any]:
    import numpy as np
    from cpprb import MPPrioritizedReplayBuffer

    env_dict = {"obs": {"shape": 4}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": 4}, "done": {}}
    rb = MPPrioritizedReplayBuffer(1 << 17, env_dict, alpha=0.6, ctx=mgr, backend="SharedMemory")
    ctx = fork_ctx()
    barrier = ctx.Barrier(explorers + 1)
    procs, pipes = [], []
    try:
        for i in range(explorers):
            rd, wr = ctx.Pipe(duplex=False)
            p = track(ctx.Process(target=_e2e_explorer, args=(rb, barrier, duration, i, wr), daemon=True))
            p.start()
            wr.close()
            procs.append(p)
            pipes.append(rd)
        barrier.wait(timeout=120)
        rng = np.random.default_rng(0)
        t0 = time.monotonic()
        deadline = t0 + duration
        samples = batches = 0
        while time.monotonic() < deadline:
            if rb.get_stored_size() < E2E_SAMPLE:
                time.sleep(0.001)
                continue
            s = rb.sample(E2E_SAMPLE, beta=0.4)
            rb.update_priorities(s["indexes"], np.abs(rng.normal(size=E2E_SAMPLE)) + 1e-3)
            samples += E2E_SAMPLE
            batches += 1
        learn_s = time.monotonic() - t0
        added = 0
        for rd in pipes:
            if not rd.poll(duration + 60):
                raise RuntimeError(f"cpprb {label}: an explorer did not report in time")
            msg = rd.recv()
            if msg[0] != "ok":
                raise RuntimeError(f"cpprb {label}: explorer failed: {msg[1]}")
            added += msg[1]
        for p in procs:
            p.join(timeout=10)
        stored = rb.get_stored_size()
        return {"transitions": added, "samples": samples, "seconds": learn_s,
                "transitions_per_s": added / learn_s, "samples_per_s": samples / learn_s, "stored": stored}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for rd in pipes:
            with contextlib.suppress(Exception):
                rd.close()
        del rb
        gc.collect()


def run_e2e(m: Any, duration: float, explorers: int) -> dict[str, Any]:
    try:
        import cpprb  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        return {"skipped": f"cpprb or numpy not installed ({e})"}
    res: dict[str, Any] = {}
    res[SYNCMGR] = run_e2e_one(SYNCMGR, m, duration, explorers)
    log(f"cpprb syncmgr: {res[SYNCMGR]['transitions_per_s']:.0f} transitions/s, "
        f"{res[SYNCMGR]['samples_per_s']:.0f} samples/s")
    smgr = mp.Manager()  # what cpprb's docs use: a fork-started SyncManager on a Unix socket
    on_cleanup("multiprocessing.Manager() for cpprb", smgr.shutdown)
    try:
        res[SYNCMANAGER] = run_e2e_one(SYNCMANAGER, smgr, duration, explorers)
    finally:
        smgr.shutdown()
    log(f"cpprb SyncManager: {res[SYNCMANAGER]['transitions_per_s']:.0f} transitions/s, "
        f"{res[SYNCMANAGER]['samples_per_s']:.0f} samples/s")
    return res


# --------------------------------------------------------------------------
# daemon footprint


def _conn_holder(system: str, address: str, key_hex: str, count: int, conn: Any) -> None:
    """Open `count` idle authenticated connections, report, hold them until told."""
    _child_signals()
    socks: list[Any] = []
    code = 0
    try:
        key = bytes.fromhex(key_hex) if key_hex else b""
        for _ in range(count):
            if system == SYNCMGR:
                socks.append(raw_syncmgr_connect(address, key))
            elif system == SYNCMANAGER:
                from multiprocessing.connection import Client
                from multiprocessing.managers import dispatch

                c = Client(address, authkey=key)
                dispatch(c, None, "accept_connection", ("bench-idle",))  # a serving thread, like a proxy's
                socks.append(c)
            else:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(10)
                s.connect(address)
                s.sendall(b"PING\r\n")
                if not s.recv(16).startswith(b"+PONG"):
                    raise RuntimeError("redis did not answer PING")
                socks.append(s)
        conn.send("ready")
        conn.poll(300)  # hold until the parent has measured (bounded)
    except BaseException as e:  # noqa: BLE001
        code = 1
        with contextlib.suppress(Exception):
            conn.send(f"error {type(e).__name__}: {e}")
    finally:
        for s in socks:
            with contextlib.suppress(Exception):
                s.close()
        os._exit(code)


def rss_with_connections(system: str, pid: int, address: str, key_hex: str, total: int, procs_n: int) -> int:
    ctx = fork_ctx()
    procs, pipes = [], []
    try:
        per = [total // procs_n + (1 if i < total % procs_n else 0) for i in range(procs_n)]
        for cnt in per:
            a, b = ctx.Pipe()
            p = track(ctx.Process(target=_conn_holder, args=(system, address, key_hex, cnt, b), daemon=True))
            p.start()
            procs.append(p)
            pipes.append(a)
        for a in pipes:
            if not a.poll(120):
                raise RuntimeError(f"{system}: connection holders not ready in 120 s")
            msg = a.recv()
            if msg != "ready":
                raise RuntimeError(f"{system}: connection holder: {msg}")
        time.sleep(0.5)
        return rss_kb(pid)
    finally:
        for a in pipes:
            with contextlib.suppress(Exception):
                a.send("close")
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def footprint(binary: str, n_objects: int, n_conns: int, with_redis: bool) -> dict[str, Any]:
    """Fresh servers: idle RSS, RSS with n_objects objects, RSS with n_conns idle clients."""
    import syncmgr

    res: dict[str, Any] = {"objects": n_objects, "conns": n_conns}
    conn_procs = 4

    # syncmgr
    d = SyncmgrDaemon(binary, "footprint objects")
    m = syncmgr.connect(d.address, d.key)
    m._c().call("ping", {})
    time.sleep(0.5)
    idle = rss_kb(d.pid)
    t = time.monotonic()
    for i in range(n_objects):
        m.Value("i", 0, name=f"fp-{i}")
    create_s = time.monotonic() - t
    time.sleep(0.5)
    objs = rss_kb(d.pid)
    m._c().close()
    d.stop()
    d2 = SyncmgrDaemon(binary, "footprint connections")
    idle2 = rss_kb(d2.pid)
    conns = rss_with_connections(SYNCMGR, d2.pid, d2.address, d2.key.hex(), n_conns, conn_procs)
    d2.stop()
    res[SYNCMGR] = {"idle_kb": idle, "objects_kb": objs, "conns_kb": conns, "idle2_kb": idle2,
                    "create_s": create_s}
    log(f"footprint syncmgr: idle {idle} kB, {n_objects} Values {objs} kB, {n_conns} conns {conns} kB")

    # SyncManager: 'create' over a fresh connection each (what SyncManager._create does), 4 threads
    sm = start_syncmanager("footprint objects")
    pid = sm._process.pid
    time.sleep(0.5)
    idle = rss_kb(pid)
    t = time.monotonic()
    errors: list[BaseException] = []

    def creator(k: int) -> None:
        try:
            for _ in range(k):
                sm._create("Value", "i", 0)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=creator, args=(n_objects // 4 + (1 if i < n_objects % 4 else 0),))
               for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    if errors:
        raise RuntimeError(f"SyncManager object creation failed: {errors[0]!r}")
    create_s = time.monotonic() - t
    time.sleep(0.5)
    objs = rss_kb(pid)
    sm.bench_stop()
    sm2 = start_syncmanager("footprint connections")
    pid2 = sm2._process.pid
    time.sleep(0.5)
    idle2 = rss_kb(pid2)
    conns = rss_with_connections(SYNCMANAGER, pid2, sm2.address, bytes(sm2._authkey).hex(), n_conns, conn_procs)
    sm2.bench_stop()
    res[SYNCMANAGER] = {"idle_kb": idle, "objects_kb": objs, "conns_kb": conns, "idle2_kb": idle2,
                        "create_s": create_s}
    log(f"footprint SyncManager: idle {idle} kB, {n_objects} Values {objs} kB, {n_conns} conns {conns} kB")

    if with_redis:
        rs = RedisServer("footprint")
        r = rs.client()
        r.ping()
        time.sleep(0.3)
        idle = rss_kb(rs.pid)
        t = time.monotonic()
        pipe = r.pipeline(transaction=False)
        for i in range(n_objects):
            pipe.set(f"fp-{i}", 0)
            if i % 10000 == 9999:
                pipe.execute()
        pipe.execute()
        create_s = time.monotonic() - t
        time.sleep(0.3)
        objs = rss_kb(rs.pid)
        r.flushall()
        r.close()
        rs.stop()
        rs2 = RedisServer("footprint connections")
        idle2 = rss_kb(rs2.pid)
        conns = rss_with_connections(REDIS, rs2.pid, rs2.address, "", n_conns, conn_procs)
        rs2.stop()
        res[REDIS] = {"idle_kb": idle, "objects_kb": objs, "conns_kb": conns, "idle2_kb": idle2,
                      "create_s": create_s}
        log(f"footprint Redis: idle {idle} kB, {n_objects} keys {objs} kB, {n_conns} conns {conns} kB")
    for s in (SYNCMGR, SYNCMANAGER, REDIS):
        if s in res and n_objects:
            res[s]["bytes_per_object"] = (res[s]["objects_kb"] - res[s]["idle_kb"]) * 1024 / n_objects
        if s in res and n_conns:
            res[s]["bytes_per_conn"] = (res[s]["conns_kb"] - res[s]["idle2_kb"]) * 1024 / n_conns
    return res


# --------------------------------------------------------------------------
# machine description


def machine_info(binary: str, redis_ok: bool) -> dict[str, str]:
    info: dict[str, str] = {}
    cpu = "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    info["cpu"] = cpu
    info["cores"] = str(os.cpu_count())
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            info["memory"] = f"{kb / 1024 / 1024:.1f} GiB"
    info["kernel"] = f"{platform.system()} {platform.release()}"
    info["python"] = f"{platform.python_implementation()} {platform.python_version()}"
    go = "unknown"
    for cmd in (["go", "version", binary], ["/usr/local/go/bin/go", "version", binary]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                go = r.stdout.strip().split(":", 1)[-1].strip() + " (daemon build)"
                break
    info["go"] = go
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        info["syncmgr"] = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=10).stdout.strip()
    vers = []
    for mod in ("syncmgr", "msgpack", "numpy", "cpprb", "redis", "matplotlib"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            vers.append(f"{mod} {version(mod)}")
    info["packages"] = ", ".join(vers)
    if redis_ok:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
            info["redis"] = out.strip()
    virt = []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            if " hypervisor" in f.read():
                virt.append("virtual machine (cpuinfo flag `hypervisor`)")
    with contextlib.suppress(Exception):
        out = subprocess.run(["systemd-detect-virt", "--container"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if out and out != "none":
            virt.append(f"container: {out}")
    if virt:
        info["virtualization"] = ", ".join(virt)
    return info


# --------------------------------------------------------------------------
# report


def fmt_us(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}"


def fmt_rate(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}"


def fmt_ratio(x: Optional[float]) -> str:
    if x is None or math.isnan(x) or math.isinf(x):
        return "—"
    return f"{x:.2f}x"


def md_table(header: list[str], rows: list[list[str]], align: Optional[str] = None) -> str:
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header))]
    out.append("  ".join("-" * w for w in widths))
    for r in rows:
        out.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
    return "\n".join(out)


def latency_rows(R: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    systems = R["systems"]
    lat = R["latency"]
    floor = lat.get(FLOOR, {})
    header = ["operation", "RTs"]
    for s in [FLOOR] + systems:
        header += [f"{s} med", f"{s} p99"]
    header += ["syncmgr / SyncManager", "syncmgr / floor"]
    rows = []
    for key, label, rts, fsize in LAT_OPS:
        if not any(key in lat.get(s, {}) for s in systems):
            continue
        row = [label, str(rts) if rts else "—"]
        fl = floor.get(key) or floor.get(f"echo{fsize}")
        if rts and fl:
            fmed, fp99 = fl["median"] * rts, fl["p99"] * rts
        else:
            fmed = fp99 = None
        row += [fmt_us(fmed), fmt_us(fp99)]
        for s in systems:
            v = lat.get(s, {}).get(key)
            row += [fmt_us(v["median"]) if v else "—", fmt_us(v["p99"]) if v else "—"]
        a = lat.get(SYNCMGR, {}).get(key)
        b = lat.get(SYNCMANAGER, {}).get(key)
        row.append(fmt_ratio(a["median"] / b["median"]) if a and b else "—")
        row.append(fmt_ratio(a["median"] / fmed) if a and fmed else "—")
        rows.append(row)
    return header, rows


def throughput_rows(R: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    systems = R["systems"]
    header = ["workload", "clients"]
    for s in systems:
        header += [f"{s} ops/s", f"{s} p99 us"]
    header += ["syncmgr / SyncManager"]
    rows = []
    for wl, label in WORKLOADS:
        for n, cell in R["throughput"].get(wl, {}).items():
            row = [label, str(n)]
            for s in systems:
                v = cell.get(s)
                row += [fmt_rate(v["ops_per_s"]) if v else "—", fmt_us(v["p99_us"]) if v else "—"]
            a, b = cell.get(SYNCMGR), cell.get(SYNCMANAGER)
            row.append(fmt_ratio(a["ops_per_s"] / b["ops_per_s"]) if a and b and b["ops_per_s"] else "—")
            rows.append(row)
    return header, rows


def cpu_rows(R: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Where the CPU went in the throughput cases: client and server CPU per op."""
    systems = R["systems"]
    header = ["workload", "clients"]
    for s in systems:
        header += [f"{s} client", f"{s} server"]
    header += ["other CPU"]
    rows = []
    for wl, _label in WORKLOADS:
        for n, cell in R["throughput"].get(wl, {}).items():
            row = [wl, str(n)]
            other = total = 0.0
            for s in systems:
                v = cell.get(s)
                if v and "client_cpu_us_per_op" in v:
                    row += [fmt_us(v["client_cpu_us_per_op"]), fmt_us(v["server_cpu_us_per_op"])]
                    other += v["other_cpu_s"]
                    total += v["machine_busy_s"]
                else:
                    row += ["—", "—"]
            row.append(f"{100 * other / total:.0f}%" if total else "—")
            rows.append(row)
    return header, rows


def e2e_rows(R: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    e = R.get("e2e", {})
    header = ["cpprb MPPrioritizedReplayBuffer", SYNCMGR, SYNCMANAGER, "syncmgr / SyncManager"]
    rows = []
    if SYNCMGR in e and SYNCMANAGER in e:
        for k, lbl in (("transitions_per_s", f"transitions added /s ({R['cfg']['e2e_explorers']} explorers)"),
                       ("samples_per_s", "transitions sampled /s (learner)")):
            a, b = e[SYNCMGR][k], e[SYNCMANAGER][k]
            rows.append([lbl, fmt_rate(a), fmt_rate(b), fmt_ratio(a / b if b else float("nan"))])
    return header, rows


def footprint_rows(R: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    f = R.get("footprint", {})
    systems = [s for s in R["systems"] if s in f]
    header = ["daemon RSS (VmRSS)"] + systems + ["syncmgr / SyncManager"]
    rows = []
    if not systems:
        return header, rows

    def mb(kb: float) -> str:
        return f"{kb / 1024:.1f} MB"

    def add(label: str, key: str, fmt: Callable[[float], str]) -> None:
        vals = [f[s].get(key) for s in systems]
        a, b = f.get(SYNCMGR, {}).get(key), f.get(SYNCMANAGER, {}).get(key)
        rows.append([label] + [fmt(v) if v is not None else "—" for v in vals]
                    + [fmt_ratio(a / b) if a is not None and b else "—"])

    add("idle (one client connected)", "idle_kb", mb)
    if f.get("objects"):
        add(f"with {f['objects']:,} named objects (Values; Redis: keys)", "objects_kb", mb)
        add("bytes per idle object", "bytes_per_object", lambda v: f"{v:,.0f} B")
    if f.get("conns"):
        add(f"with {f['conns']} idle connected clients", "conns_kb", mb)
        add("bytes per idle connection", "bytes_per_conn", lambda v: f"{v:,.0f} B")
    if f.get("objects"):
        add(f"time to create {f['objects']:,} objects", "create_s", lambda v: f"{v:.1f} s")
    return header, rows


def evaluate_targets(R: dict[str, Any]) -> list[dict[str, str]]:
    lat = R["latency"]
    T: list[dict[str, str]] = []

    def add(name: str, status: str, detail: str) -> None:
        T.append({"target": name, "status": status, "detail": detail})

    S, M = lat.get(SYNCMGR, {}), lat.get(SYNCMANAGER, {})
    F = lat.get(FLOOR, {})
    floor8 = F.get("echo8", {}).get("median")

    slow, details = [], []
    for k in RT_TARGET_OPS:
        if k in S and k in M:
            r = S[k]["median"] / M[k]["median"]
            details.append(f"{k} {r:.2f}x")
            if r > 1.0:
                slow.append(k)
    if details:
        add("every single-round-trip op no slower than SyncManager (median)",
            "PASS" if not slow else "MISS",
            ("slower: " + ", ".join(slow) + "; " if slow else "") + "syncmgr/SyncManager: " + ", ".join(details))
    far, details = [], []
    if floor8:
        for k in RT_TARGET_OPS:
            if k in S:
                r = S[k]["median"] / ((F.get(k) or F["echo8"])["median"] * LAT_RTS[k])
                details.append(f"{k} {r:.2f}x")
                if r > 1.5:
                    far.append(k)
        add("every single-round-trip op within 1.5x the raw socket floor (per round trip, median)",
            "PASS" if not far else "MISS",
            (f"over: {', '.join(far)}; " if far else "") + f"floor (all 8 B rows) {floor8:.1f} us; "
            + ", ".join(details))

    for key, name in (("create_named", "proxy creation >= 5x faster than SyncManager"),
                      ("create_anon", "anonymous proxy creation >= 5x faster than SyncManager"),
                      ("unpickle", "first call after unpickling in a fresh process >= 5x faster than SyncManager")):
        if key in S and key in M:
            sp = M[key]["median"] / S[key]["median"]
            add(name, "PASS" if sp >= 5 else "MISS",
                f"{sp:.1f}x ({fmt_us(S[key]['median'])} us vs {fmt_us(M[key]['median'])} us)")
    if "add" in S and "add" in M:
        sp = M["add"]["median"] / S["add"]["median"]
        add("atomic add >= 1.8x faster than SyncManager's lock+get+set", "PASS" if sp >= 1.8 else "MISS",
            f"{sp:.2f}x ({fmt_us(S['add']['median'])} us vs {fmt_us(M['add']['median'])} us)")
    tp = R.get("throughput", {})
    for wl, _label in WORKLOADS:
        cell = tp.get(wl, {}).get(64) or tp.get(wl, {}).get("64")
        if cell and SYNCMGR in cell and SYNCMANAGER in cell:
            sp = cell[SYNCMGR]["ops_per_s"] / max(cell[SYNCMANAGER]["ops_per_s"], 1e-9)
            add(f"64-client aggregate throughput >= 3x SyncManager: {wl}", "PASS" if sp >= 3 else "MISS",
                f"{sp:.2f}x ({cell[SYNCMGR]['ops_per_s']:,.0f} vs {cell[SYNCMANAGER]['ops_per_s']:,.0f} ops/s)")
        else:
            add(f"64-client aggregate throughput >= 3x SyncManager: {wl}", "SKIP", "64 clients not run")
    if "q1m" in S and "q1m" in M:
        sp = M["q1m"]["median"] / S["q1m"]["median"]
        add("1 MiB queue round trip >= 1.5x faster than SyncManager", "PASS" if sp >= 1.5 else "MISS",
            f"{sp:.2f}x ({fmt_us(S['q1m']['median'])} us vs {fmt_us(M['q1m']['median'])} us)")
    fp = R.get("footprint", {}).get(SYNCMGR)
    if fp:
        add("daemon RSS < 30 MB idle", "PASS" if fp["idle_kb"] < 30 * 1024 else "MISS",
            f"{fp['idle_kb'] / 1024:.1f} MB")
        n_obj = R["footprint"].get("objects", 0)
        if "bytes_per_object" in fp and n_obj >= 10000:
            bpo = fp["bytes_per_object"]
            add("daemon < 1 KB per idle object", "PASS" if bpo < 1024 else "MISS",
                f"{bpo:,.0f} B per object ({n_obj:,} named Values)")
        elif "bytes_per_object" in fp:
            add("daemon < 1 KB per idle object", "SKIP",
                f"{n_obj:,} objects are too few to see past the heap's growth steps "
                f"({fp['bytes_per_object']:,.0f} B each)")
        else:
            add("daemon < 1 KB per idle object", "SKIP", "objects not created in this mode")
    return T


def print_report(R: dict[str, Any]) -> None:
    out = sys.stdout
    print(file=out)
    print("== single-client latency (microseconds; RTs = round trips; floor = echo of the same size x RTs)", file=out)
    h, rows = latency_rows(R)
    print(text_table(h, rows), file=out)
    if R.get("throughput"):
        print(file=out)
        print(f"== multi-client throughput ({R['cfg']['duration']:g} s per case; "
              "ops/s aggregate over all clients)", file=out)
        h, rows = throughput_rows(R)
        print(text_table(h, rows), file=out)
        print(file=out)
        print("== CPU per op in the throughput cases (microseconds of CPU; client = all client processes; "
              "other = CPU used meanwhile by anything else on the machine)", file=out)
        h, rows = cpu_rows(R)
        print(text_table(h, rows), file=out)
    if R.get("e2e") and "skipped" not in R["e2e"]:
        print(file=out)
        print("== end to end: cpprb MPPrioritizedReplayBuffer, backend=SharedMemory, "
              f"{R['cfg']['e2e_duration']:g} s", file=out)
        h, rows = e2e_rows(R)
        print(text_table(h, rows), file=out)
    if R.get("footprint"):
        print(file=out)
        print("== daemon footprint", file=out)
        h, rows = footprint_rows(R)
        print(text_table(h, rows), file=out)
    for note in R.get("notes", []):
        print(f"note: {note}", file=out)
    print(file=out)
    print("== targets", file=out)
    for t in R["targets"]:
        print(f"{t['status']:4s}  {t['target']}: {t['detail']}", file=out)
    out.flush()


def make_plots(R: dict[str, Any], out_dir: str, notes: list[str]) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        log("matplotlib is not installed in this venv: installing it now "
            f"({sys.executable} -m pip install matplotlib) for the plots; "
            "`pip install -e 'pyclient[bench]'` installs it for good")
        ok = _run_quiet([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], 600)
        try:
            import importlib

            importlib.invalidate_caches()
            import matplotlib  # noqa: F811
        except ImportError:
            notes.append("plots skipped: matplotlib is not installed and could not be installed"
                         + ("" if ok else " (pip failed)"))
            return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {FLOOR: "#888888", SYNCMGR: "#1f77b4", SYNCMANAGER: "#d62728", REDIS: "#2ca02c"}
    files = []
    lat = R["latency"]
    systems = R["systems"]
    keys = [k for k, _, _, _ in LAT_OPS if k not in ("raw_ping",) and any(k in lat.get(s, {}) for s in systems)]
    labels = {"rtt": "round trip 8 B", "lock": "Lock acq+rel", "ev_is_set": "Event is_set", "ev_set": "Event set",
              "val_get": "Value get", "val_set": "Value set", "add": "atomic add", "lgs": "lock+get+set",
              "q8": "Queue 8 B", "q64k": "Queue 64 KiB", "q1m": "Queue 1 MiB", "create_named": "create named",
              "create_anon": "create anon", "unpickle": "unpickle+call\n(fresh process)"}
    series = [FLOOR] + systems
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(keys) + 1.8))
    h = 0.8 / len(series)
    for j, s in enumerate(series):
        ys, xs, errs = [], [], []
        for i, k in enumerate(keys):
            if s == FLOOR:
                rts = LAT_RTS[k]
                fl = lat.get(FLOOR, {}).get(k) or lat.get(FLOOR, {}).get(f"echo{LAT_FLOOR_SIZE[k]}")
                if not fl or not rts:
                    continue
                v = {"median": fl["median"] * rts, "p99": fl["p99"] * rts}
            else:
                v = lat.get(s, {}).get(k)
                if not v:
                    continue
            ys.append(i + (j - (len(series) - 1) / 2) * h)
            xs.append(v["median"])
            errs.append(max(v["p99"] - v["median"], 0))
        if xs:
            ax.barh(ys, xs, height=h, color=colors.get(s), label=s + (" (echo x RTs)" if s == FLOOR else ""),
                    xerr=[[0] * len(errs), errs], error_kw={"elinewidth": 0.6, "capsize": 1.5, "alpha": 0.6})
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([labels.get(k, k) for k in keys])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("latency, microseconds (bar: median, whisker: p99; log scale)")
    ax.set_title("Single-client latency per operation")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    p = os.path.join(out_dir, "bench-latency.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)

    tp = R.get("throughput", {})
    if tp:
        fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(13, 4.2))
        for ax, (wl, label) in zip(axes, WORKLOADS):
            cells = tp.get(wl, {})
            ns = sorted(int(n) for n in cells)
            for s in systems:
                xs = [n for n in ns if s in cells.get(n, cells.get(str(n), {}))]
                ys = [cells.get(n, cells.get(str(n)))[s]["ops_per_s"] for n in xs]
                if xs:
                    ax.plot(xs, ys, marker="o", color=colors.get(s), label=s)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns)
            ax.set_xticklabels([str(n) for n in ns])
            ax.set_yscale("log")
            ax.set_xlabel("client processes")
            ax.set_title(textwrap.fill(label, 40), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("aggregate ops/s (log)")
        axes[0].legend(fontsize=8)
        fig.suptitle("Multi-client throughput vs client count")
        fig.tight_layout()
        p = os.path.join(out_dir, "bench-throughput.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p)
    return files


def write_markdown(R: dict[str, Any], path: str, plots: list[str]) -> None:
    info = R["machine"]
    cfg = R["cfg"]
    L: list[str] = []
    L.append("# Benchmarks: syncmgr, SyncManager and Redis, side by side")
    L.append("")
    L.append("*Generated by `bench/bench.py`; do not edit by hand — rerun it (the explanation of the numbers "
             "comes from `bench/analysis.md`).*")
    L.append("")
    L.append(f"Run on {R['date']} with:")
    L.append("")
    L.append("```sh")
    L.append(R["command"])
    L.append("```")
    L.append("")
    L.append("## Machine")
    L.append("")
    rows = [["CPU", info.get("cpu", "?")], ["cores", info.get("cores", "?")], ["memory", info.get("memory", "?")],
            ["kernel", info.get("kernel", "?")], ["Python", info.get("python", "?")], ["Go", info.get("go", "?")],
            ["daemon", info.get("syncmgr", "?")], ["packages", info.get("packages", "?")]]
    if "redis" in info:
        rows.append(["Redis", info["redis"]])
    if "virtualization" in info:
        rows.append(["virtualization", info["virtualization"]])
    if "load_start" in R:
        rows.append(["1-min load average at start", f"{R['load_start']:.2f}"])
    L.append(md_table(["", ""], rows, "ll"))
    L.append("")
    L.append("## Targets")
    L.append("")
    L.append("Checked on every run (a miss is reported, never fatal):")
    L.append("")
    L.append(md_table(["target", "result", "numbers"],
                      [[t["target"], f"**{t['status']}**", t["detail"]] for t in R["targets"]], "lll"))
    L.append("")
    L.append("## Single-client latency")
    L.append("")
    L.append(f"Microseconds, one client process, {cfg['rounds']} interleaved rounds per operation "
             f"({cfg['iters']['default']} samples for small ops). *RTs* is the number of round trips the operation "
             "takes with syncmgr; the floor columns are an echo round trip of the row's payload size, measured in "
             "the same rounds as the systems, times RTs, and *syncmgr / floor* divides by it. Ratios below 1 mean "
             "syncmgr is faster.")
    L.append("")
    h, rows = latency_rows(R)
    L.append(md_table(h, rows, "lc" + "r" * (len(h) - 2)))
    L.append("")
    if any(p.endswith("bench-latency.png") for p in plots):
        L.append("![latency per operation per system](bench-latency.png)")
        L.append("")
    if R.get("throughput"):
        L.append("## Multi-client throughput")
        L.append("")
        L.append(f"Client processes forked, each with its own connection, released together by a barrier, "
                 f"{cfg['duration']:g} s per case. ops/s is the aggregate over all clients (a lock op is acquire + "
                 "release; a queue op is one item delivered, with half the clients producing and half consuming, "
                 "one client doing both). p99 is over every call of every client. "
                 "Ratios above 1 mean syncmgr is faster.")
        L.append("")
        h, rows = throughput_rows(R)
        L.append(md_table(h, rows, "lc" + "r" * (len(h) - 2)))
        L.append("")
        if any(p.endswith("bench-throughput.png") for p in plots):
            L.append("![throughput vs client count](bench-throughput.png)")
            L.append("")
        L.append("Where the CPU went, in microseconds of CPU per op (client: summed over all client processes, "
                 "from `time.process_time()`; server: the daemon's or server's utime + stime from `/proc`; "
                 f"the machine has {R['machine'].get('cores', '?')} cores). *Other CPU* is the share of the "
                 "machine's busy time during the cases that was neither the clients, the server nor the benchmark "
                 "(kernel threads, process exits, anything else running): a check that the numbers are the "
                 "benchmark's own.")
        L.append("")
        h, rows = cpu_rows(R)
        L.append(md_table(h, rows, "lc" + "r" * (len(h) - 2)))
        L.append("")
    if R.get("e2e") and "skipped" not in R["e2e"]:
        L.append("## End to end: cpprb prioritized replay")
        L.append("")
        L.append(f"`MPPrioritizedReplayBuffer(2**17, ..., alpha=0.6, ctx=..., backend=\"SharedMemory\")`; "
                 f"{cfg['e2e_explorers']} forked explorer processes add batches of {E2E_BATCH} transitions, "
                 f"the learner (the benchmark process) samples {E2E_SAMPLE} and updates their priorities, for "
                 f"{cfg['e2e_duration']:g} s. `ctx=multiprocessing.Manager()` against `ctx=` a syncmgr manager; the "
                 "transition data is in shared memory in both cases, so the difference is the coordination "
                 "(cpprb's locks, events and counters).")
        L.append("")
        h, rows = e2e_rows(R)
        L.append(md_table(h, rows))
        L.append("")
    if R.get("footprint"):
        L.append("## Daemon footprint")
        L.append("")
        L.append("VmRSS of the server process from `/proc/<pid>/status`, on fresh servers: right after start with "
                 "one client; after creating the objects (syncmgr: named `Value('i')` through the client; "
                 "SyncManager: `Value('i', 0)` through `SyncManager._create`, a connection each as the manager itself "
                 "does, from 4 threads; Redis: `SET` of small keys); and with idle authenticated connections held "
                 "by 4 processes (SyncManager: each one `accept_connection`ed, i.e. with its serving thread, as a "
                 "proxy's connection is).")
        L.append("")
        h, rows = footprint_rows(R)
        L.append(md_table(h, rows))
        L.append("")
    L.append("## Method")
    L.append("")
    L.append(textwrap.dedent("""\
        * **Same work, same run, same machine.** Every system is started by the benchmark on a private
          Unix socket. syncmgr is driven through its Python client (`syncmgr.connect`); SyncManager is
          `multiprocessing.managers.SyncManager(address="/tmp/.../sock", authkey=...)` (family `AF_UNIX`),
          its server started with the `spawn` method so that it does not carry the benchmark's memory;
          Redis is `redis-server --port 0 --unixsocket ...` driven by redis-py.
        * **The floor** is a raw round trip to a tiny echo process over a Unix socket, with no protocol:
          the client sends N bytes, the echo process reads them and writes them back (N = 8 B, 64 KiB and
          1 MiB). Both ends are Python (`sendall` / `recv_into`), as the client is in every other row. It
          is measured inside every latency row, in the same rounds as the systems. It is a floor for a
          server that blocks in `recv`, not a hard lower bound: how fast a sleeping process wakes up
          depends on what else the CPUs are doing, and another server can land below it.
        * **Latency**: each operation runs in rounds, the systems interleaved with a rotating order, so that
          drift of the machine (frequency, noisy neighbours) falls on all of them alike; `gc.collect()`
          before each round; medians and p99 over all samples. Queue items are pickled by every system
          (redis-py gets the pickle as the value); 64 KiB and 1 MiB items are numpy `uint8` arrays.
          *Atomic add*: syncmgr `Value.add(1)` (one request, done by the daemon), SyncManager
          `lock.acquire(); v.set(v.get() + 1); lock.release()`, Redis `INCR`. *Create*: syncmgr
          `m.Lock(name=...)` with a new name each time (or `m.Lock()`), SyncManager `m.Lock()`; the proxies
          are kept alive during timing, so SyncManager's decref connection is not counted.
          *Unpickle*: a fresh `python -c` per sample imports its client library, then times
          `pickle.loads(proxy) + proxy.is_set()` itself (SyncManager: after the usual
          `current_process().authkey = ...`; Redis: unpickle an address and a key, connect, `GET`).
        * **Redis mapping**: Lock = redis-py `Lock` (`SET NX PX` + a Lua release; blocking acquire polls every
          1 ms), Event = a key read with `GET` / written with `SET`, Value = `GET`/`SET`/`INCR`,
          Queue = `LPUSH`/`BRPOP` (unbounded; syncmgr and SyncManager queues have maxsize 1000 in the
          throughput test). Redis has no objects to create or proxies to pickle.
        * **Throughput**: fresh objects per case; SyncManager children build their proxies from tokens
          (`incref=False`) so that start-up does not pay an incref per inherited proxy; children exit with
          `os._exit` (no decref storm). Every wait in the benchmark is bounded, and every server and child is
          stopped on exit, error or Ctrl-C.
        """))
    for note in R.get("notes", []):
        L.append(f"* Note: {note}")
    L.append("")
    analysis = os.path.join(HERE, "analysis.md")
    if os.path.exists(analysis):
        with open(analysis) as f:
            L.append(f.read().rstrip())
        L.append("")
    L.append("## Raw results")
    L.append("")
    L.append("`bench.py --json FILE` saves every number of a run; `bench.py --render FILE --out PATH` "
             "rewrites this page from such a file without measuring again.")
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


# --------------------------------------------------------------------------
# main


def config(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        cfg = {"mode": "smoke", "rounds": 2, "iters": {"default": 200, "q64k": 100, "q1m": 20, "create_named": 100,
                                                       "create_anon": 100, "lgs": 100},
               "unpickle_samples": 2, "clients": [1, 4], "duration": 0.4, "e2e_duration": 2.0, "e2e_explorers": 4,
               "objects": 1000, "conns": 32}
    elif args.quick:
        cfg = {"mode": "quick", "rounds": 5, "iters": {"default": 1500, "q64k": 600, "q1m": 90, "create_named": 400,
                                                       "create_anon": 400, "lgs": 600},
               "unpickle_samples": 4, "clients": [1, 4, 16, 64], "duration": 1.5, "e2e_duration": 5.0,
               "e2e_explorers": 4, "objects": 20000, "conns": 256}
    else:
        cfg = {"mode": "full", "rounds": 10, "iters": {"default": 5000, "q64k": 2000, "q1m": 300, "create_named": 1000,
                                                      "create_anon": 1000, "lgs": 2000},
               "unpickle_samples": 10, "clients": [1, 4, 16, 64], "duration": 3.0, "e2e_duration": 10.0,
               "e2e_explorers": 4, "objects": 100000, "conns": 256}
    if args.clients:
        cfg["clients"] = [int(x) for x in args.clients.split(",") if x.strip()]
    if args.duration:
        cfg["duration"] = args.duration
    if args.smoke:
        cfg["clients"] = [n for n in cfg["clients"] if n < 64]
    return cfg


def run(args: argparse.Namespace) -> dict[str, Any]:
    binary = find_syncmgr_bin()
    os.environ["SYNCMGR_BIN"] = binary
    cfg = config(args)
    notes: list[str] = []
    redis_ok, why = redis_available(args)
    if not redis_ok:
        notes.append(why)
        log(why)
    import syncmgr

    R: dict[str, Any] = {"cfg": cfg, "notes": notes,
                         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         "command": command_line(args), "machine": machine_info(binary, redis_ok)}
    systems = [SYNCMGR, SYNCMANAGER] + ([REDIS] if redis_ok else [])
    R["systems"] = systems
    log(f"mode {cfg['mode']}; systems {', '.join(systems)}; daemon {binary}")
    if args.wait_quiet:
        deadline = time.monotonic() + args.wait_quiet
        while loadavg() > 0.7 and time.monotonic() < deadline:
            log(f"waiting for a quiet machine (load average {loadavg():.2f})")
            time.sleep(15)
    R["load_start"] = loadavg()
    if R["load_start"] > 1.0:
        notes.append(f"the machine was busy when the run started (1-minute load average {R['load_start']:.2f}): "
                     "expect noisy numbers")

    daemon = SyncmgrDaemon(binary)
    os.environ["SYNCMGR_ADDRESS"] = daemon.address
    os.environ["SYNCMGR_AUTHKEY"] = daemon.key.hex()
    m = syncmgr.connect(daemon.address, daemon.key)
    sm = start_syncmanager("main")
    rs = RedisServer() if redis_ok else None
    r = rs.client() if rs else None

    # --- floor and single-client latency
    echo = EchoFloor()
    keep: list[Any] = []
    pingers = {n: echo.pinger(n) for n in (8, 65536, 1 << 20)}
    ops: dict[str, dict[str, Callable[[], Any]]] = {
        # The floor takes part in every row: one echo of the row's payload size, in the same rounds.
        FLOOR: {k: pingers[size] for k, _, rts, size in LAT_OPS if rts},
        SYNCMGR: syncmgr_latency_ops(m, daemon, keep),
        SYNCMANAGER: syncmanager_latency_ops(sm, keep),
    }
    if r is not None:
        ops[REDIS] = redis_latency_ops(r)
    lat = run_latency({s: ops[s] for s in [FLOOR] + systems}, cfg)
    R["latency"] = lat
    echo.stop()

    # --- unpickle + first call in a fresh process
    ev_s = m.Event()
    ev_m = sm.Event()
    keep += [ev_s, ev_m]
    pickles: dict[str, tuple[bytes, dict[str, str]]] = {
        SYNCMGR: (pickle.dumps(ev_s), {}),
        SYNCMANAGER: (pickle.dumps(ev_m), {"BENCH_SYNCMANAGER_AUTHKEY": bytes(sm._authkey).hex()}),
    }
    if r is not None:
        r.set("bench-event", 0)
        pickles[REDIS] = (pickle.dumps((rs.address, "bench-event")), {})
    unp = run_unpickle(pickles, cfg["unpickle_samples"])
    for s, v in unp.items():
        lat[s]["unpickle"] = v
    keep.clear()
    gc.collect()

    # --- throughput
    envs: dict[str, dict[str, Any]] = {SYNCMGR: {"daemon": daemon, "m": m}, SYNCMANAGER: {"sm": sm}}
    if rs is not None:
        envs[REDIS] = {"redis": rs, "r": r}
    R["throughput"] = run_throughput(envs, cfg["clients"], cfg["duration"])

    # --- end to end
    R["e2e"] = run_e2e(m, cfg["e2e_duration"], cfg["e2e_explorers"])
    if "skipped" in R["e2e"]:
        notes.append(f"end-to-end skipped: {R['e2e']['skipped']}")

    # --- footprint (fresh servers)
    sm.bench_stop()
    if r is not None:
        r.close()
    if rs is not None:
        rs.stop()
    R["footprint"] = footprint(binary, cfg["objects"], cfg["conns"], redis_ok)
    if args.smoke:
        notes.append(f"smoke mode: {cfg['objects']} objects and {cfg['conns']} connections only; no 64 clients")
    R["load_end"] = loadavg()
    tp_other = [v.get("other_cpu_s", 0) / max(v.get("machine_busy_s", 0), 1e-9)
                for cells in R["throughput"].values() for cell in cells.values() for v in cell.values()]
    if tp_other and max(tp_other) > 0.15:
        notes.append(f"during some throughput cases up to {100 * max(tp_other):.0f}% of the machine's busy CPU was "
                     "used by processes other than the benchmark's (see *other CPU*)")
    R["targets"] = evaluate_targets(R)
    return R


def command_line(args: argparse.Namespace) -> str:
    """The command as run, less the output-only --json option."""
    parts, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--json":
            skip = True
            continue
        if a.startswith("--json="):
            continue
        parts.append(a)
    argv = " ".join(parts)
    exe = os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO) else sys.executable
    cmd = f"{exe} bench/bench.py {argv}".strip()
    return cmd + "    # or: make bench" + (f" BENCH_ARGS='{argv}'" if argv else "")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    try:
        R = run(args)
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
    log(f"done in {time.monotonic() - _T0:.0f} s")
    return 0


def _int_keys(d: dict[str, Any]) -> dict[Any, Any]:
    """JSON turns the client counts into strings; turn them back."""
    return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in d.items()}


if __name__ == "__main__":
    sys.exit(main())
