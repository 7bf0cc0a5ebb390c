"""The work every system does: the single-client latency operations, the fresh-process unpickle
script, the throughput workloads (what one client process does in a loop) and the end-to-end cpprb
explorer.
"""

from __future__ import annotations

import array
import contextlib
import os
import pickle
import queue
import socket
import struct
import time
import traceback
from typing import Any, Callable, Optional

from bench.common import REDIS, SYNCMANAGER, SYNCMGR, _child_signals
from bench.systems import SyncmgrDaemon, _frame, raw_syncmgr_connect

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
    ("q8x64", "Queue batch of 64 x 8 B: put_many + get_many (SyncManager: 64 puts + 64 gets; Redis: RPUSH + LPOP 64)",
     2, 8),
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

    batch_q = m.Queue(name="bench-queue-q8x64")
    batch = [make_item(8)] * 64

    def q8x64() -> None:
        batch_q.put_many(batch)
        got = batch_q.get_many(64, timeout=30)
        while len(got) < 64:
            got += batch_q.get_many(64 - len(got), timeout=30)

    return {
        "q8x64": q8x64,
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

    batch_q = sm.Queue()
    keep.append(batch_q)
    batch = [make_item(8)] * 64

    def q8x64() -> None:  # SyncManager has no batch call
        for x in batch:
            batch_q.put(x)
        for _ in batch:
            batch_q.get(timeout=30)

    return {
        "q8x64": q8x64,
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

    batch = [pickle.dumps(make_item(8), protocol=5)] * 64

    def q8x64() -> None:
        r.rpush("bench-queue-q8x64", *batch)
        got = r.lpop("bench-queue-q8x64", 64)
        assert len(got) == 64
        for b in got:
            pickle.loads(b)

    return {
        "q8x64": q8x64,
        "rtt": r.ping,
        "lock": lambda: (lk.acquire(), lk.release()),
        "ev_is_set": lambda: r.get("bench-event") == b"1",
        "ev_set": lambda: r.set("bench-event", 1),
        "val_get": lambda: int(r.get("bench-value")),
        "val_set": lambda: r.set("bench-value", 1),
        "add": lambda: r.incr("bench-value"),
        "q8": qop("q8"), "q64k": qop("q64k"), "q1m": qop("q1m"),
    }


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
        # One add before the clock starts, as in bench/cpprb_bench.py: a
        # learner that samples before any add has finished can deadlock
        # with cpprb's own protocol (docs/benchmarks.md), on any ctx.
        rb.add(**batch)
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
