"""Same-host targets: syncmgr's same-host ops against SyncManager and plain multiprocessing.

One interleaved run (the order of the systems rotates from round to round;
medians over rounds; ratios printed) of:

* micro ops in one process: uncontended Lock and Semaphore acquire+release, Event.is_set,
  Value.get, Event.set, Value.set, Value.add (SyncManager has no add: its
  column is ``with lock: v.value += 1``);
* a cross-process hand-off: two processes ping-ponging a pair of Events;
* a killed holder: SIGKILL a process holding a Lock while another process
  waits in ``acquire``; time from the kill to the waiter owning the lock;
* cpprb's multiprocessing replay buffers (``bench/cpprb_bench.py``);
* Queue put/get of small items between two processes, with faster-fifo's
  shared-memory ring beside the others when it is installed.

syncmgr runs as two columns: "syncmgr" (the default: the same-host fast path
when this build has it) and "syncmgr socket" (``SYNCMGR_FASTPATH=0`` while
its objects are made and in its child processes).

    python bench/targets.py            # full run; rewrites its section of docs/benchmarks.md
    python bench/targets.py --smoke    # a fraction of a second per workload; writes nothing
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import itertools
import json
import multiprocessing as mp
import operator
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from multiprocessing.managers import SyncManager
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cpprb_bench  # noqa: E402

import syncmgr  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "benchmarks.md")
BEGIN, END = "<!-- targets:begin -->", "<!-- targets:end -->"

FAST, SOCK, SYNCM, MPL = "syncmgr", "syncmgr socket", "SyncManager", "multiprocessing"
SYSTEMS = (FAST, SOCK, SYNCM, MPL)
NOFAST = {"SYNCMGR_FASTPATH": "0"}
# The Python client takes the fast path by default; the benchmark says so explicitly.
FASTON = {"SYNCMGR_FASTPATH": "1"}

_T0 = time.monotonic()
_CHILDREN: list[Any] = []


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def track(p: Any) -> Any:
    _CHILDREN.append(p)
    return p


def reap() -> None:
    for p in _CHILDREN:
        with contextlib.suppress(Exception):
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    _CHILDREN.clear()


@contextlib.contextmanager
def env(extra: dict[str, str]):  # type: ignore[no-untyped-def]
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def env_of(system: str) -> dict[str, str]:
    return NOFAST if system == SOCK else (FASTON if system == FAST else {})


def fork() -> Any:
    return mp.get_context("fork")


def child_setup(extra: dict[str, str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.alarm(0)
    os.environ.update(extra)


def rotated(seq: tuple[str, ...] | list[str], r: int) -> list[str]:
    k = r % len(seq)
    return list(seq[k:]) + list(seq[:k])


def fast_state(proxy: Any) -> str:
    """Whether proxy's ops take the fast path, and if not why."""
    try:
        from syncmgr import _fast  # type: ignore[attr-defined]
    except ImportError:
        return "not in this build (socket path)"
    if _fast.active(proxy):
        return "active"
    reason = getattr(_fast, "reasons", {}).get(proxy._client.address, "")
    if _fast.enabled_by_env():
        return "inactive" + (f" ({reason})" if reason else "")
    return "off (SYNCMGR_FASTPATH=0 or no extension)"


# --------------------------------------------------------------------------
# micro ops: one process, uncontended


def _pair(f: Callable[[], Any], g: Callable[[], Any]) -> Callable[[int], float]:
    def run(n: int) -> float:
        t = time.perf_counter_ns()
        for _ in itertools.repeat(None, n):
            f()
            g()
        return (time.perf_counter_ns() - t) / n
    return run


def _one(f: Callable[[], Any]) -> Callable[[int], float]:
    def run(n: int) -> float:
        t = time.perf_counter_ns()
        for _ in itertools.repeat(None, n):
            f()
        return (time.perf_counter_ns() - t) / n
    return run


def _arg(f: Callable[[Any], Any], a: Any) -> Callable[[int], float]:
    def run(n: int) -> float:
        t = time.perf_counter_ns()
        for _ in itertools.repeat(None, n):
            f(a)
        return (time.perf_counter_ns() - t) / n
    return run


MICRO = ("lock", "semaphore", "is_set", "value_get", "event_set", "value_set", "value_add")
MICRO_TITLE = {
    "lock": "Lock acquire + release",
    "semaphore": "Semaphore acquire + release",
    "is_set": "Event.is_set",
    "value_get": "Value.get",
    "event_set": "Event.set",
    "value_set": "Value.set",
    "value_add": "Value.add (SyncManager, multiprocessing: `with lock: v.value += 1`)",
}


def micro_ops(system: str, m: Any, sm: SyncManager, keep: list[Any]) -> dict[str, Callable[[int], float]]:
    if system in (FAST, SOCK):
        with env(env_of(system)):
            lk, sem, ev, v = m.Lock(), m.Semaphore(2), m.Event(), m.Value("i", 0)
        keep += [lk, sem, ev, v]
        return {"lock": _pair(lk.acquire, lk.release), "semaphore": _pair(sem.acquire, sem.release),
                "is_set": _one(ev.is_set), "value_get": _one(v.get),
                "event_set": _one(ev.set), "value_set": _arg(v.set, 1), "value_add": _arg(v.add, 1)}
    if system == SYNCM:
        lk, sem, ev, v, vl = sm.Lock(), sm.Semaphore(2), sm.Event(), sm.Value("i", 0), sm.Lock()
        keep += [lk, sem, ev, v, vl]

        def sm_add() -> None:
            with vl:
                v.value += 1
        return {"lock": _pair(lk.acquire, lk.release), "semaphore": _pair(sem.acquire, sem.release),
                "is_set": _one(ev.is_set), "value_get": _one(v.get),
                "event_set": _one(ev.set), "value_set": _arg(v.set, 1), "value_add": _one(sm_add)}
    plk, psem, pev, pv = mp.Lock(), mp.Semaphore(2), mp.Event(), mp.Value("i", 0)
    keep += [plk, psem, pev, pv]
    vlock = pv.get_lock()

    def mp_add() -> None:
        with vlock:
            pv.value += 1
    return {"lock": _pair(plk.acquire, plk.release), "semaphore": _pair(psem.acquire, psem.release),
            "is_set": _one(pev.is_set),
            "value_get": _arg(operator.attrgetter("value"), pv), "event_set": _one(pev.set),
            "value_set": _arg(functools.partial(setattr, pv, "value"), 1), "value_add": _one(mp_add)}


def run_micro(m: Any, sm: SyncManager, rounds: int, batch_s: float, keep: list[Any]) -> dict[str, dict[str, float]]:
    ops = {s: micro_ops(s, m, sm, keep) for s in SYSTEMS}
    sizes: dict[tuple[str, str], int] = {}
    for s in SYSTEMS:  # calibrate: a batch lasts about batch_s
        for op in MICRO:
            n = 4
            while True:
                per = ops[s][op](n)
                if per * n >= batch_s * 1e9 or n >= 1 << 22:
                    break
                n = min(n * 4, max(n + 1, int(batch_s * 1e9 / max(per, 1.0))))
            sizes[(s, op)] = n
    got: dict[str, dict[str, list[float]]] = {op: {s: [] for s in SYSTEMS} for op in MICRO}
    for r in range(rounds):
        for op in MICRO:
            for s in rotated(SYSTEMS, r):
                got[op][s].append(ops[s][op](sizes[(s, op)]))
    loop = _one(int)  # the loop and a trivial C call, the floor of the table
    floor = statistics.median(loop(1 << 16) for _ in range(5))
    res = {op: {s: statistics.median(got[op][s]) for s in SYSTEMS} for op in MICRO}
    res["_floor"] = {"ns": floor}
    return res


# --------------------------------------------------------------------------
# cross-process hand-off: ping-pong on a pair of Events


def _ponger(ping: Any, pong: Any, stop: Any, extra: dict[str, str]) -> None:
    child_setup(extra)
    code = 0
    try:
        while ping.wait(60):
            ping.clear()
            if stop.value:
                break
            pong.set()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    os._exit(code)


def run_handoff(m: Any, sm: SyncManager, rounds: int, n: int, keep: list[Any]) -> dict[str, float]:
    f = fork()
    pairs: dict[str, tuple[Any, Any, Any, Any]] = {}
    for s in SYSTEMS:
        with env(env_of(s)):
            if s in (FAST, SOCK):
                ping, pong = m.Event(), m.Event()
            elif s == SYNCM:
                ping, pong = sm.Event(), sm.Event()
            else:
                ping, pong = f.Event(), f.Event()
        stop = f.RawValue("i", 0)
        p = track(f.Process(target=_ponger, args=(ping, pong, stop, env_of(s)), daemon=True))
        p.start()
        keep += [ping, pong]
        pairs[s] = (ping, pong, stop, p)

    def trips(s: str, k: int) -> float:
        ping, pong, _, p = pairs[s]
        t = time.perf_counter_ns()
        for _ in range(k):
            ping.set()
            if not pong.wait(30):
                raise RuntimeError(f"hand-off {s}: no answer in 30 s (child alive: {p.is_alive()})")
            pong.clear()
        return (time.perf_counter_ns() - t) / (2 * k)  # two hand-offs per round trip

    got: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    for s in SYSTEMS:
        trips(s, max(10, n // 10))  # warm-up: children attach, pages fault in
    for r in range(rounds):
        for s in rotated(SYSTEMS, r):
            got[s].append(trips(s, n))
    for s, (ping, _, stop, p) in pairs.items():
        stop.value = 1
        ping.set()
        p.join(timeout=10)
        if p.exitcode != 0:
            raise RuntimeError(f"hand-off {s}: the child exited with {p.exitcode}")
    return {s: statistics.median(got[s]) for s in SYSTEMS}


# --------------------------------------------------------------------------
# killed holder -> next waiter


def _holder(lk: Any, conn: Any, extra: dict[str, str]) -> None:
    child_setup(extra)
    lk.acquire()
    conn.send("held")
    time.sleep(120)
    os._exit(0)


def _waiter(lk: Any, conn: Any, timeout: float, extra: dict[str, str]) -> None:
    child_setup(extra)
    code = 0
    try:
        conn.send("waiting")
        ok = lk.acquire(timeout=timeout)
        t = time.monotonic_ns()  # CLOCK_MONOTONIC: one clock for all processes
        conn.send((ok, t))
        if ok:
            lk.release()
    except BaseException as e:  # noqa: BLE001
        code = 1
        with contextlib.suppress(Exception):
            conn.send((None, repr(e)))
    os._exit(code)


def killed_holder_once(lk: Any, extra: dict[str, str], timeout: float) -> Optional[float]:
    """ms from SIGKILL of the holder to the waiter owning lk; None if it never did."""
    f = fork()
    hr, hw = f.Pipe(duplex=False)
    wr, ww = f.Pipe(duplex=False)
    h = track(f.Process(target=_holder, args=(lk, hw, extra), daemon=True))
    h.start()
    if not hr.poll(30) or hr.recv() != "held":
        raise RuntimeError("killed holder: the holder did not take the lock")
    w = track(f.Process(target=_waiter, args=(lk, ww, timeout, extra), daemon=True))
    w.start()
    if not wr.poll(30) or wr.recv() != "waiting":
        raise RuntimeError("killed holder: the waiter did not start")
    time.sleep(0.2)  # let it block in acquire
    t0 = time.monotonic_ns()
    os.kill(h.pid, signal.SIGKILL)
    if not wr.poll(timeout + 30):
        raise RuntimeError("killed holder: the waiter did not report")
    ok, t1 = wr.recv()
    h.join(timeout=10)
    w.join(timeout=10)
    for c in (hr, hw, wr, ww):
        c.close()
    if ok is None:
        raise RuntimeError(f"killed holder: the waiter failed: {t1}")
    return (t1 - t0) / 1e6 if ok else None


def run_killed(m: Any, sm: SyncManager, trials: int, give_up_s: float) -> dict[str, Any]:
    res: dict[str, Any] = {}
    samples: dict[str, list[float]] = {FAST: [], SOCK: []}
    for r in range(trials):
        for s in rotated((FAST, SOCK), r):
            with env(env_of(s)):
                lk = m.Lock()
            ms = killed_holder_once(lk, env_of(s), 10.0)
            if ms is None:
                raise RuntimeError(f"killed holder ({s}): the waiter never got the lock")
            samples[s].append(ms)
            del lk
    for s in (FAST, SOCK):
        res[s] = {"median_ms": statistics.median(samples[s]), "max_ms": max(samples[s]), "n": len(samples[s])}
    # The others never release a dead holder's lock: shown with a short wait.
    for s, lk in ((SYNCM, sm.Lock()), (MPL, fork().Lock())):
        ms = killed_holder_once(lk, {}, give_up_s)
        res[s] = {"median_ms": ms, "gave_up_s": give_up_s, "n": 1}
    return res


# --------------------------------------------------------------------------
# Queue put/get, small items, producer process -> this process

QUEUE_SYSTEMS = ("faster-fifo", "faster-fifo get_many", MPL, FAST, SYNCM)


def _producer(q: Any, n: int, go: Any, extra: dict[str, str]) -> None:
    child_setup(extra)
    code = 0
    try:
        item = b"12345678"
        if not go.poll(60):
            raise RuntimeError("no go")
        go.recv()
        for _ in range(n):
            q.put(item)
        if hasattr(q, "join_thread"):  # multiprocessing.Queue: let its feeder thread flush
            q.close()
            q.join_thread()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    os._exit(code)


def queue_once(s: str, m: Any, sm: SyncManager, n: int) -> float:
    f = fork()
    many = False
    if s.startswith("faster-fifo"):
        import faster_fifo

        q: Any = faster_fifo.Queue(max_size_bytes=1 << 20)
        many = s.endswith("get_many")
    elif s == MPL:
        q = f.Queue()
    elif s == FAST:
        q = m.Queue()
    else:
        q = sm.Queue()
    rd, wr = f.Pipe(duplex=False)
    p = track(f.Process(target=_producer, args=(q, n, rd, {}), daemon=True))
    p.start()
    t = time.perf_counter_ns()
    wr.send("go")
    got = 0
    if many:
        while got < n:
            got += len(q.get_many(timeout=30, max_messages_to_get=1000))
    else:
        get = q.get
        while got < n:
            get(timeout=30)
            got += 1
    el = time.perf_counter_ns() - t
    p.join(timeout=30)
    if p.exitcode != 0:
        raise RuntimeError(f"queue {s}: the producer exited with {p.exitcode}")
    rd.close()
    wr.close()
    with contextlib.suppress(Exception):
        q.close()
    return n / (el / 1e9)


def run_queue(m: Any, sm: SyncManager, rounds: int, n_fast: int, n_slow: int) -> dict[str, Any]:
    systems = list(QUEUE_SYSTEMS)
    try:
        import faster_fifo  # noqa: F401
    except ImportError as e:
        systems = [s for s in systems if not s.startswith("faster-fifo")]
        note = f"faster-fifo not importable ({e}); `pip install faster-fifo` to add it"
    else:
        note = ""
    got: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(rounds):
        for s in rotated(systems, r):
            got[s].append(queue_once(s, m, sm, n_slow if s == SYNCM else n_fast))
    return {"items_per_s": {s: statistics.median(v) for s, v in got.items()}, "note": note}


# --------------------------------------------------------------------------
# targets


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def evaluate(R: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []

    def add(name: str, ok: bool, numbers: str) -> None:
        out.append({"target": name, "result": "PASS" if ok else "MISS", "numbers": numbers})

    mi = R.get("micro")
    if mi:
        def speedup(op: str, col: str) -> float:
            return mi[op][SYNCM] / mi[op][col]
        # The Lock targets, and the same bar for Semaphores.
        for op, kind in (("lock", "Lock"), ("semaphore", "Semaphore")):
            if op not in mi:
                continue
            x = speedup(op, FAST)
            add(f"{kind} acquire+release >= 100x SyncManager", x >= 100,
                f"{x:.1f}x ({fmt_ns(mi[op][FAST])} vs {fmt_ns(mi[op][SYNCM])}; "
                f"socket column {speedup(op, SOCK):.2f}x)")
            vs_mp = mi[op][FAST] / mi[op][MPL]
            add(f"{kind} acquire+release within 3x of multiprocessing.{kind}", vs_mp <= 3,
                f"{vs_mp:.2f}x its time ({fmt_ns(mi[op][FAST])} vs {fmt_ns(mi[op][MPL])}; "
                f"socket column {mi[op][SOCK] / mi[op][MPL]:.0f}x)")
        for op, need in (("is_set", 100), ("value_get", 100), ("event_set", 50), ("value_set", 50), ("value_add", 50)):
            x = speedup(op, FAST)
            add(f"{MICRO_TITLE[op].split(' (')[0]} >= {need}x SyncManager", x >= need,
                f"{x:.1f}x ({fmt_ns(mi[op][FAST])} vs {fmt_ns(mi[op][SYNCM])}; socket column {speedup(op, SOCK):.2f}x)")
    ho = R.get("handoff")
    if ho:
        add("cross-process hand-off <= 5 us (median)", ho[FAST] <= 5000,
            f"{ho[FAST] / 1000:.2f} us (socket {ho[SOCK] / 1000:.1f}, SyncManager {ho[SYNCM] / 1000:.1f}, "
            f"multiprocessing {ho[MPL] / 1000:.1f})")
    kh = R.get("killed")
    if kh:
        add("killed holder -> next waiter < 10 ms (median)", kh[FAST]["median_ms"] < 10,
            f"{kh[FAST]['median_ms']:.2f} ms, max {kh[FAST]['max_ms']:.2f}, n={kh[FAST]['n']} "
            f"(socket {kh[SOCK]['median_ms']:.2f} ms)")
    cp = R.get("cpprb")
    if cp:
        for against, need in ((SYNCM, 5.0), (MPL, 0.5)):
            worst: Optional[tuple[float, str]] = None
            passed = total = 0
            for row in cp:
                for metric in ("transitions_per_s", "samples_per_s"):
                    # a hung (0/s) denominator: no ratio, counted as a miss
                    x = ratio(row[FAST][metric], row[against][metric]) or 0.0
                    total += 1
                    passed += x >= need
                    where = f"{row['buffer']} {row['backend']} e={row['explorers']} b={row['batch']} {metric[:-6]}"
                    if worst is None or x < worst[0]:
                        worst = (x, where)
            assert worst is not None
            add(f"cpprb >= {need:g}x {against} (every cell, transitions/s and samples/s)", passed == total,
                f"{passed}/{total} cells; lowest {worst[0]:.2f}x ({worst[1]})")
    return out


# --------------------------------------------------------------------------
# formatting


def fmt_ns(ns: Optional[float]) -> str:
    if ns is None:
        return "—"
    if ns < 1000:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1000:.1f} µs"
    return f"{ns / 1e6:.2f} ms"


def fmt_x(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:.0f}x" if x >= 100 else (f"{x:.1f}x" if x >= 10 else f"{x:.2f}x")


def fmt_rate(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:,.0f}"


def cpprb_cell(d: dict[str, Any], metric: str) -> str:
    hung = d.get("hung", 0)
    return fmt_rate(d[metric]) + (f" ({hung} hung)" if hung else "")


def table(header: list[str], rows: list[list[str]], md: bool) -> str:
    if md:
        rule = " | ".join("---" if i == 0 else "---:" for i in range(len(header)))
        L = ["| " + " | ".join(header) + " |", "| " + rule + " |"]
        L += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(L)
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    L = ["  ".join(h.ljust(w[i]) for i, h in enumerate(header))]
    L += ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(L)


def sections(R: dict[str, Any], md: bool) -> list[tuple[str, str, str]]:
    """(title, note, table) for each part of the run."""
    out: list[tuple[str, str, str]] = []
    t = R.get("targets")
    if t:
        out.append(("Targets", "Checked on every run; a miss is reported, never fatal. "
                    "The targets apply to the default column (\"syncmgr\").",
                    table(["target", "result", "numbers"],
                          [[x["target"], f"**{x['result']}**" if md else x["result"], x["numbers"]] for x in t], md)))
    mi = R.get("micro")
    if mi:
        rows = []
        for op in MICRO:
            d = mi[op]
            rows.append([MICRO_TITLE[op], fmt_ns(d[FAST]), fmt_ns(d[SOCK]), fmt_ns(d[SYNCM]), fmt_ns(d[MPL]),
                         fmt_x(ratio(d[SYNCM], d[FAST])), fmt_x(ratio(d[SYNCM], d[SOCK])),
                         fmt_x(ratio(d[FAST], d[MPL]))])
        out.append(("Uncontended ops, one process",
                    f"Time per op, median of {R['cfg']['rounds']} interleaved rounds (each round a batch of calls "
                    f"per system). *speed-up* = SyncManager's time / syncmgr's; *vs mp* = syncmgr's time / "
                    f"multiprocessing's (lower is better). The Python loop and one trivial C call cost "
                    f"{fmt_ns(mi['_floor']['ns'])} per iteration in every column. Fast path: "
                    f"{R['fast_state'][FAST]}; socket column: {R['fast_state'][SOCK]}.",
                    table(["op", FAST, SOCK, SYNCM, MPL, "speed-up (syncmgr)", "speed-up (socket)", "syncmgr vs mp"],
                          rows, md)))
    ho = R.get("handoff")
    if ho:
        out.append(("Cross-process hand-off",
                    "Two processes ping-pong a pair of Events (set / wait / clear); time per hand-off "
                    f"(half a round trip), median of {R['cfg']['rounds']} rounds of {R['cfg']['handoff_n']} "
                    "round trips.",
                    table(["", FAST, SOCK, SYNCM, MPL],
                          [["µs per hand-off"] + [f"{ho[s] / 1000:.2f}" for s in SYSTEMS]], md)))
    kh = R.get("killed")
    if kh:
        cells = []
        for s in SYSTEMS:
            d = kh[s]
            if d["median_ms"] is None:
                cells.append(f"never (gave up after {d['gave_up_s']:g} s)")
            else:
                extra = f" (max {d['max_ms']:.2f}, n={d['n']})" if "max_ms" in d else ""
                cells.append(f"{d['median_ms']:.2f}{extra}")
        out.append(("Killed holder → next waiter",
                    "A process holding a Lock is SIGKILLed while another process blocks in acquire; "
                    "ms from the kill to the waiter owning the lock (CLOCK_MONOTONIC in both processes).",
                    table(["", *SYSTEMS], [["ms", *cells]], md)))
    cp = R.get("cpprb")
    if cp:
        rows = []
        for row in cp:
            for metric, name in (("transitions_per_s", "transitions/s"), ("samples_per_s", "samples/s")):
                rows.append([row["buffer"].replace("ReplayBuffer", "RB"), row["backend"], str(row["explorers"]),
                             str(row["batch"]), name] + [cpprb_cell(row[s], metric) for s in SYSTEMS] +
                            [fmt_x(ratio(row[FAST][metric], row[SYNCM][metric])),
                             fmt_x(ratio(row[FAST][metric], row[MPL][metric])),
                             fmt_x(ratio(row[SOCK][metric], row[SYNCM][metric]))])
        out.append(("cpprb multiprocessing replay buffers",
                    f"`ctx=` each system; explorers are forked processes calling `add` with batches of *batch* "
                    f"transitions while this process samples batches of the same size (and calls "
                    f"`update_priorities` for MPPrioritizedRB); {R['cfg']['cpprb_seconds']:g} s per measurement, "
                    f"median of {R['cfg']['cpprb_rounds']} interleaved rounds; buffer of {cpprb_bench.BUFFER_SIZE} "
                    "transitions. The multiprocessing column is `ctx=multiprocessing.get_context()`. "
                    "Fork-started explorers inherit SyncManager's authkey (spawned or Ray workers would need "
                    "cpprb's authkey workaround). *hung*: rounds in which the learner (or an explorer) was still "
                    f"blocked {cpprb_bench.HUNG_AFTER:g} s after the end of the measurement; such a round counts "
                    "as 0/s.",
                    table(["buffer", "backend", "explorers", "batch", "metric", *SYSTEMS,
                           "syncmgr / SyncManager", "syncmgr / mp", "socket / SyncManager"], rows, md)))
    qu = R.get("queue")
    if qu:
        ips = qu["items_per_s"]
        base = ips.get(SYNCM)
        rows = [[s if s != FAST else "syncmgr (the queue's shared ring)", fmt_rate(v),
                 fmt_x(ratio(v, base))] for s, v in ips.items()]
        note = ("One producer process puts 8-byte items, this process gets them; items/s, median of "
                f"{R['cfg']['rounds_queue']} interleaved rounds. *get_many* takes up to 1000 items per call.")
        if qu.get("note"):
            note += " " + qu["note"] + "."
        out.append(("Queue put/get, small items", note, table(["queue", "items/s", "vs SyncManager"], rows, md)))
    return out


def print_report(R: dict[str, Any]) -> None:
    for title, note, tab in sections(R, md=False):
        print(f"\n== {title}\n{note}\n\n{tab}")
    for e in R.get("errors", []):
        print(f"\nFAILED {e}")
    print()


def machine() -> dict[str, str]:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {"nproc": str(os.cpu_count()), "loadavg": load}


def write_doc(R: dict[str, Any], path: str) -> None:
    L = [BEGIN, "", "## Same host: syncmgr against SyncManager and multiprocessing", "",
         f"*Generated by `bench/targets.py` (only the part between the `targets` marker comments); rerun it "
         f"rather than editing.* Run on {R['date']}, {R['machine']['nproc']} CPUs, load average "
         f"{R['machine']['loadavg_start']} at start and {R['machine']['loadavg_end']} at end "
         f"(/proc/loadavg), {R['seconds']:.0f} s, with:", "", "```sh", R["command"], "```", ""]
    for title, note, tab in sections(R, md=True):
        L += [f"### {title}", "", note, "", tab, ""]
    for e in R.get("errors", []):
        L += [f"**Failed:** {e}", ""]
    L.append(END)
    write_section(path, BEGIN, END, "\n".join(L))


def write_section(path: str, begin: str, end: str, block: str) -> None:
    """Replace the part of path from begin to end (markers included, block
    must start with begin and end with end) with block, or append block."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    if begin in text and end in text and text.index(begin) < text.index(end):
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------


PARTS = ("micro", "handoff", "killed", "cpprb", "queue")


def config(smoke: bool) -> dict[str, Any]:
    if smoke:
        return {"rounds": 3, "batch_s": 0.002, "handoff_n": 100, "killed_trials": 1, "give_up_s": 0.3,
                "cpprb_seconds": 0.15, "cpprb_rounds": 1, "rounds_queue": 1, "queue_fast": 5000, "queue_slow": 300}
    return {"rounds": 15, "batch_s": 0.01, "handoff_n": 2000, "killed_trials": 5, "give_up_s": 1.0,
            "cpprb_seconds": 1.5, "cpprb_rounds": 2, "rounds_queue": 5, "queue_fast": 100000, "queue_slow": 5000}


def run(args: argparse.Namespace, only: set[str]) -> dict[str, Any]:
    cfg = config(args.smoke)
    if args.cpprb_seconds:
        cfg["cpprb_seconds"] = args.cpprb_seconds
    now = datetime.datetime.now(datetime.timezone.utc)
    R: dict[str, Any] = {"cfg": cfg, "date": now.strftime("%Y-%m-%d %H:%M UTC")}
    load0 = machine()["loadavg"]
    sm = SyncManager(ctx=mp.get_context("spawn"))  # a lean server process; fork children inherit the authkey
    sm.start()
    m = syncmgr.Manager()
    m.start()
    keep: list[Any] = []
    try:
        probe = {}
        for s in (FAST, SOCK):
            with env(env_of(s)):
                lk = m.Lock()
                probe[s] = fast_state(lk)
            keep.append(lk)
        R["fast_state"] = probe
        log(f"fast path: {probe[FAST]}; socket column: {probe[SOCK]}")
        contexts: dict[str, tuple[Callable[[], Any], dict[str, str]]] = {
            FAST: (lambda: m, dict(FASTON)), SOCK: (lambda: m, dict(NOFAST)),
            SYNCM: (lambda: sm, {}), MPL: (lambda: mp.get_context(), {})}
        parts: dict[str, Callable[[], Any]] = {
            "micro": lambda: run_micro(m, sm, cfg["rounds"], cfg["batch_s"], keep),
            "handoff": lambda: run_handoff(m, sm, cfg["rounds"], cfg["handoff_n"], keep),
            "killed": lambda: run_killed(m, sm, cfg["killed_trials"], cfg["give_up_s"]),
            "cpprb": lambda: cpprb_bench.run_table(contexts, cfg["cpprb_seconds"], cfg["cpprb_rounds"], log),
            "queue": lambda: run_queue(m, sm, cfg["rounds_queue"], cfg["queue_fast"], cfg["queue_slow"]),
        }
        for part in PARTS:
            if part not in only:
                continue
            try:
                R[part] = parts[part]()
            except (KeyboardInterrupt, TimeoutError):
                raise
            except Exception as e:  # noqa: BLE001 - the other parts still run; the failure is reported
                R.setdefault("errors", []).append(f"{part}: {type(e).__name__}: {e}")
                log(f"{part} failed:\n{traceback.format_exc()}")
            else:
                log(f"{part} done")
            reap()
    finally:
        keep.clear()
        gc.collect()
        reap()
        m.shutdown()
        sm.shutdown()
    R["machine"] = {"nproc": str(os.cpu_count()), "loadavg_start": load0, "loadavg_end": machine()["loadavg"]}
    R["targets"] = evaluate(R)
    return R


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a fraction of a second per workload; writes no file")
    p.add_argument("--only", help=f"comma-separated parts to run (of {','.join(PARTS)})")
    p.add_argument("--cpprb-seconds", type=float, help="seconds per cpprb measurement")
    p.add_argument("--out", help=f"Markdown file whose targets section to rewrite (default for a full run: {DOC})")
    p.add_argument("--no-docs", action="store_true", help="write no Markdown")
    p.add_argument("--json", help="also save every number to this JSON file")
    p.add_argument("--max-time", type=float, help="abort after this many seconds (default 1200, smoke 240)")
    args = p.parse_args(argv)
    only = set(PARTS) if not args.only else set(args.only.split(","))
    if only - set(PARTS):
        p.error(f"unknown parts: {', '.join(sorted(only - set(PARTS)))}")
    max_time = args.max_time or (240 if args.smoke else 1200)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the run took longer than --max-time={max_time:g}s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.alarm(int(max_time))
    try:
        R = run(args, only)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception:
        log("the run failed:\n" + traceback.format_exc())
        return 1
    finally:
        signal.alarm(0)
        reap()
    R["seconds"] = time.monotonic() - _T0
    status = 1 if R.get("errors") else 0
    cmd = ".venv/bin/python bench/targets.py" + ("" if argv is None else "") + \
        ("".join(" " + a for a in (sys.argv[1:] if argv is None else argv)))
    R["command"] = cmd + "    # or: make bench-targets"
    print_report(R)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(R, f, indent=1, default=str)
    out = args.out or (None if args.smoke or args.only else DOC)
    if out and not args.no_docs:
        write_doc(R, out)
        log(f"wrote the targets section of {out}")
    log(f"done in {R['seconds']:.0f} s" + (f"; {len(R['errors'])} part(s) failed" if status else ""))
    return status


if __name__ == "__main__":
    threading.current_thread().name = "targets"
    sys.exit(main())
