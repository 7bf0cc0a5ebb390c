"""Queue targets: Queue throughput, syncmgr's ring against faster-fifo, multiprocessing.Queue and SyncManager.

One interleaved run (the order of the systems rotates from round to round;
medians over rounds; ratios printed) of:

* 8 B items, one producer process -> this process, single put/get;
* 8 B items, four producer processes -> this process;
* put_many/get_many of 64 items (faster-fifo's batch calls; syncmgr's
  put_many/get_many; multiprocessing.Queue and SyncManager have no batch
  call, so theirs is a loop of single puts and gets);
* 1 MiB numpy arrays, one producer -> this process;
* the same process putting and getting one 1 MiB array (latency; for the
  socket-path columns a fresh interpreter with ``SYNCMGR_FASTPATH=0``).

syncmgr runs as three columns: "syncmgr" (the same-host fast path: the
queue's ring), "syncmgr socket" (``SYNCMGR_FASTPATH=0`` clients of a queue
that has a ring) and "syncmgr socket, no ring" (a second daemon started with
``--fastpath-dir none``, whose queues keep their items in the daemon as
before rings existed: the socket path's baseline). faster-fifo is
optional (``pip install faster-fifo``); without it its columns are left out.

    python bench/queue_targets.py            # full run; rewrites its section of docs/benchmarks.md
    python bench/queue_targets.py --smoke    # a fraction of a second per workload; writes nothing
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from multiprocessing.managers import SyncManager
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import targets as T  # noqa: E402

import syncmgr  # noqa: E402
from syncmgr._daemon import PrivateDaemon  # noqa: E402

DOC = T.DOC
BEGIN, END = "<!-- queue-targets:begin -->", "<!-- queue-targets:end -->"
FF, MPQ, NORING = "faster-fifo", "multiprocessing.Queue", "syncmgr socket, no ring"
SYSTEMS = (FF, MPQ, T.FAST, T.SOCK, NORING, T.SYNCM)
_noring: list[Any] = []  # the manager of the daemon without rings, while run() runs
SMALL = b"12345678"


def _np_item() -> Any:
    import numpy as np
    return np.arange(1 << 17, dtype=np.float64)  # 1 MiB


def make_queue(s: str, m: Any, sm: SyncManager, big: bool) -> Any:
    if s == FF:
        import faster_fifo
        return faster_fifo.Queue(max_size_bytes=(64 if big else 1) << 20)
    if s == MPQ:
        return T.fork().Queue()
    if s == T.SYNCM:
        return sm.Queue()
    if s == NORING:
        return _noring[0].Queue()
    with T.env(T.env_of(s)):
        return m.Queue()


def _put_batch(q: Any, s: str, items: list[Any]) -> None:
    if s in (FF, T.FAST, T.SOCK, NORING):
        q.put_many(items, timeout=30)
    else:
        for x in items:
            q.put(x)


def _get_batch(q: Any, s: str, k: int) -> int:
    if s == FF:
        return len(q.get_many(timeout=30, max_messages_to_get=k))
    if s in (T.FAST, T.SOCK, NORING):
        return len(q.get_many(k, timeout=30))
    q.get(timeout=30)
    return 1


def _producer(q: Any, s: str, kind: str, n: int, go: Any, extra: dict[str, str]) -> None:
    T.child_setup(extra)
    code = 0
    try:
        item = _np_item() if kind == "big" else SMALL
        if not go.poll(60):
            raise RuntimeError("no go")
        go.recv()
        if kind == "batch":
            for _ in range(n // 64):
                _put_batch(q, s, [item] * 64)
        else:
            for _ in range(n):
                q.put(item, timeout=30)
        if hasattr(q, "join_thread"):  # multiprocessing.Queue: let its feeder thread flush
            q.close()
            q.join_thread()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    os._exit(code)


def throughput_once(s: str, kind: str, producers: int, m: Any, sm: SyncManager, n: int) -> float:
    """Items per second from producers processes to this one."""
    f = T.fork()
    q = make_queue(s, m, sm, kind == "big")
    per = n // producers
    if kind == "batch":
        per -= per % 64
    total = per * producers
    pipes = []
    ps = []
    for _ in range(producers):
        rd, wr = f.Pipe(duplex=False)
        pipes.append((rd, wr))
        env = T.NOFAST if s == NORING else T.env_of(s)
        p = T.track(f.Process(target=_producer, args=(q, s, kind, per, rd, env), daemon=True))
        p.start()
        ps.append(p)
    t = time.perf_counter_ns()
    for _, wr in pipes:
        wr.send("go")
    got = 0
    while got < total:
        if kind == "batch":
            got += _get_batch(q, s, 64)
        else:
            q.get(timeout=30)
            got += 1
    el = time.perf_counter_ns() - t
    for p in ps:
        p.join(timeout=30)
        if p.exitcode != 0:
            raise RuntimeError(f"queue {s} {kind}: a producer exited with {p.exitcode}")
    for rd, wr in pipes:
        rd.close()
        wr.close()
    with contextlib.suppress(Exception):
        q.close()
    return total / (el / 1e9)


_SAME_SOCKET = """
import os, sys, time
import numpy as np
import syncmgr
n = int(sys.argv[1])
q = syncmgr.connect().Queue()
a = np.arange(1 << 17, dtype=np.float64)
q.put(a)
q.get(timeout=30)
t = time.perf_counter_ns()
for _ in range(n):
    q.put(a)
    q.get(timeout=30)
print((time.perf_counter_ns() - t) / 1e9 / n)
"""


def _same_socket_once(env: dict[str, str], n: int) -> float:
    """same_process_once for a socket-path client: a fresh interpreter with
    SYNCMGR_FASTPATH=0 from its start (this process's client has the fast
    path on for the other columns, which a socket-only client would not)."""
    r = subprocess.run([sys.executable, "-c", _SAME_SOCKET, str(n)], env={**os.environ, **env, **T.NOFAST},
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"the socket client failed: {r.stderr[-2000:]}")
    return float(r.stdout.split()[-1])


def same_process_once(s: str, m: Any, sm: SyncManager, n: int) -> float:
    """Seconds per put+get of one 1 MiB array in this process."""
    if s == T.SOCK:
        return _same_socket_once(m.runtime_env()["env_vars"], n)
    if s == NORING:
        nd = _noring[1]
        return _same_socket_once({"SYNCMGR_ADDRESS": nd.address, "SYNCMGR_AUTHKEY": nd.key.hex()}, n)
    q = make_queue(s, m, sm, True)
    a = _np_item()
    q.put(a)
    q.get(timeout=30)
    t = time.perf_counter_ns()
    for _ in range(n):
        q.put(a)
        q.get(timeout=30)
    el = time.perf_counter_ns() - t
    with contextlib.suppress(Exception):
        q.close()
    return el / 1e9 / n


ROWS: dict[str, tuple[str, int, str]] = {
    # name: (kind, producers, what)
    "8 B, 1 -> 1": ("small", 1, "items/s"),
    "8 B, 4 -> 1": ("small", 4, "items/s"),
    "8 B, batches of 64": ("batch", 1, "items/s"),
    "1 MiB numpy, 1 -> 1": ("big", 1, "items/s"),
    "1 MiB numpy, same process put+get": ("same", 0, "s per put+get"),
}


def config(smoke: bool) -> dict[str, Any]:
    if smoke:
        return {"rounds": 1, "n": {"small": 600, "batch": 640, "big": 8, "same": 4}}
    return {"rounds": 9, "n": {"small": 100000, "batch": 200000, "big": 400, "same": 100}}


def run(smoke: bool, rounds: Optional[int] = None) -> dict[str, Any]:
    cfg = config(smoke)
    if rounds:
        cfg["rounds"] = rounds
    systems = list(SYSTEMS)
    note = ""
    try:
        import faster_fifo  # noqa: F401
    except ImportError as e:
        systems.remove(FF)
        note = f"faster-fifo not importable ({e}); `pip install faster-fifo` to add it"
    sm = SyncManager(ctx=T.fork())
    sm.start()
    m = syncmgr.Manager()
    m.start()
    nd = PrivateDaemon(args=("--fastpath-dir", "none")).start()
    _noring[:] = [syncmgr.connect(nd.address, nd.key), nd]
    R: dict[str, Any] = {"rows": {}, "note": note, "systems": systems, "rounds": cfg["rounds"],
                         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        with T.env(T.FASTON):
            R["fast_state"] = T.fast_state(m.Queue())
        for row, (kind, producers, _) in ROWS.items():
            got: dict[str, list[float]] = {s: [] for s in systems}
            for r in range(cfg["rounds"]):
                for s in T.rotated(systems, r):
                    slow = s in (T.SYNCM, T.SOCK, NORING) and not smoke
                    # A tenth of the items for the slow columns, except 1 MiB
                    # items (half: a tenth is a few dozen, too few to time).
                    n = cfg["n"][kind] // ({"same": 1, "big": 2}.get(kind, 10) if slow else 1)
                    if kind == "same":
                        if s == FF:
                            continue  # faster-fifo has no same-process put+get worth a row of its own
                        got[s].append(same_process_once(s, m, sm, n))
                    else:
                        got[s].append(throughput_once(s, kind, producers, m, sm, n))
                    T.reap()
            R["rows"][row] = {s: statistics.median(v) for s, v in got.items() if v}
            T.log(f"{row} done")
    finally:
        T.reap()
        m.shutdown()
        _noring.clear()
        nd.stop()
        sm.shutdown()
    return R


def ratio_cell(v: Optional[float], base: Optional[float], lower_is_better: bool) -> str:
    if not v or not base:
        return "–"
    return T.fmt_x(base / v if lower_is_better else v / base)


def report(R: dict[str, Any], md: bool) -> str:
    out = []
    for row, vals in R["rows"].items():
        lower = ROWS[row][2].startswith("s ")
        rows = []
        for s in R["systems"]:
            if s not in vals:
                continue
            v = vals[s]
            cell = T.fmt_ns(v * 1e9) if lower else T.fmt_rate(v)
            rows.append([s, cell, ratio_cell(vals.get(T.FAST), vals.get(s), lower) if s != T.FAST else "1.00x"])
        out.append(f"{row} ({ROWS[row][2]}; last column: syncmgr's ring vs that row's system)")
        out.append(T.table(["queue", ROWS[row][2], "syncmgr ring vs it"], rows, md))
    sock = [[row, ratio_cell(vals.get(T.SOCK), vals.get(NORING), ROWS[row][2].startswith("s "))]
            for row, vals in R["rows"].items() if T.SOCK in vals and NORING in vals]
    if sock:
        out.append("Socket-path clients of a queue that fast-path clients also use (its items in the ring), "
                   "against the socket path of a daemon without rings (above 1.00x: no slower)")
        out.append(T.table(["workload", "syncmgr socket vs syncmgr socket, no ring"], sock, md))
    if R["note"]:
        out.append(R["note"])
    return "\n\n".join(out)


def write_doc(R: dict[str, Any], path: str) -> None:
    body = "\n".join([BEGIN, "", "## Queue rings against faster-fifo, multiprocessing.Queue and SyncManager", "",
                      f"{R['date']}, {os.cpu_count()} CPUs; fast path: {R['fast_state']}; medians of "
                      f"{R['rounds']} interleaved rounds.", "",
                      report(R, True), "", END])
    T.write_section(path, BEGIN, END, body)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a fraction of a second per workload; writes no file")
    p.add_argument("--no-docs", action="store_true", help="write no Markdown")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 9; medians over them)")
    p.add_argument("--max-time", type=float, help="abort after this many seconds (default 1200, smoke 240)")
    args = p.parse_args(argv)
    max_time = args.max_time or (240 if args.smoke else 1200)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the run took longer than --max-time={max_time:g}s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(max_time))
    try:
        R = run(args.smoke, args.rounds)
    except Exception:
        T.log("the run failed:\n" + traceback.format_exc())
        return 1
    finally:
        signal.alarm(0)
        T.reap()
    print(report(R, False))
    if not args.smoke and not args.no_docs:
        write_doc(R, DOC)
        T.log(f"wrote the queue targets section of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
