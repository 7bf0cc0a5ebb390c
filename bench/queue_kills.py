"""Queue kill loops: processes SIGKILLed at every labelled step of a Queue op on the ring, counted.

Each kill forks a victim that uses one queue on the same-host fast path and
dies by the extension's test hook (``_fastpath._set_queue_kill_step``) at one
labelled step of an op; this process then gets what the queue holds and
checks it against what the victim's ops had done:

* put (single ``put`` and ``put_many``): 1 latch taken, 2 record written,
  3 committed (killed before ``put`` returned);
* get (single ``get`` and ``get_many``): 11 latch taken, 12 copied out,
  13 committed (the item went with the dead consumer: the one loss allowed);
* 21: a blocked ``get`` killed as it leaves its sleep, after an item came;
* JoinableQueue: a consumer that got one item (and owes its ``task_done``)
  killed at a step of put, get or ``task_done`` (31 latch taken, 32
  committed, 33 debt lowered): ``join`` must neither hang nor return while
  an item is unfinished, and one ``task_done`` too many must raise (the
  counts are exact).

Every item has its own id. Counted per step: duplicates (an id got twice),
lost items (a put that returned, never got, beyond the one a consumer killed
after its commit had taken), uncommitted puts seen (a put killed before its
commit whose item showed up), committed puts missing (killed after the
commit, item absent), and the time from the victim's death (reaped) to the
next item this process got: "wedged" counts waits past 10 s.

    python bench/queue_kills.py              # >= 1000 kills; rewrites its section of docs/benchmarks.md
    python bench/queue_kills.py --smoke      # one kill per step; writes nothing
"""

from __future__ import annotations

import argparse
import collections
import datetime
import math
import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import time
import traceback
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import targets as T  # noqa: E402

import syncmgr  # noqa: E402
from syncmgr import _fast  # noqa: E402

DOC = T.DOC
BEGIN, END = "<!-- queue-kills:begin -->", "<!-- queue-kills:end -->"
CTX = mp.get_context("fork")
WEDGED_S = 10.0

# (label, kind, step, batch)
VARIANTS: list[tuple[str, str, int, bool]] = (
    [(f"put step {s}{' (put_many)' if b else ''}", "put", s, b) for s in (1, 2, 3) for b in (False, True)]
    + [(f"get step {s}{' (get_many)' if b else ''}", "get", s, b) for s in (11, 12, 13) for b in (False, True)]
    + [("get leaving its sleep (21)", "sleep", 21, False)]
    + [(f"JoinableQueue, {op} step {s}", "jq", s, False)
       for op, steps in (("put", (1, 2, 3)), ("get", (11, 12, 13)), ("task_done", (31, 32, 33))) for s in steps]
)


def _victim(q: Any, kind: str, step: int, batch: bool, ids: list[int]) -> None:
    from syncmgr import _fastpath
    try:
        if kind == "put":
            q.put(ids[0])
            q.put(ids[1])
            _fastpath._set_queue_kill_step(step)
            if batch:
                q.put_many([ids[2]])
            else:
                q.put(ids[2])
        elif kind == "get":
            _fastpath._set_queue_kill_step(step)
            if batch:
                q.get_many(1, timeout=30)
            else:
                q.get(timeout=30)
        elif kind == "jq":
            q.get(timeout=30)  # owed: got, not marked done
            _fastpath._set_queue_kill_step(step)
            if step < 10:
                q.put(ids[2])
            elif step < 30:
                q.get(timeout=30)
            else:
                q.task_done()
        else:
            _fastpath._set_queue_kill_step(step)
            q.get(timeout=60)
    except BaseException:  # noqa: BLE001 - the parent sees the exit code
        traceback.print_exc()
    os._exit(3)  # the hook should have killed us


def _waiters(m: Any, name: str) -> int:
    for o in m.status()["objects"]:
        if o["name"] == name:
            return int(o["waiters"])
    return 0


def _drain(q: Any) -> tuple[list[int], float]:
    t0 = time.monotonic()
    got: list[int] = list(q.get_many(1000, timeout=WEDGED_S * 3))
    waited = time.monotonic() - t0
    while True:
        try:
            got.append(q.get_nowait())
        except queue.Empty:
            return got, waited


def _finish(c: dict[str, Any], seen: collections.Counter[int], recovery: list[float], m: Any,
            name: str) -> dict[str, Any]:
    """The counts that every variant ends with."""
    c["duplicates"] = sum(n - 1 for n in seen.values() if n > 1)
    c["recovery p50 ms"] = statistics.median(recovery) * 1e3 if recovery else math.nan
    c["recovery max ms"] = max(recovery) * 1e3 if recovery else math.nan
    c["waiters left"] = _waiters(m, name)
    return c


def one_variant(m: Any, label: str, kind: str, step: int, batch: bool, kills: int, base: int) -> dict[str, Any]:
    name = f"kills-{kind}-{step}-{int(batch)}-{base}"
    q = m.Queue(name=name)
    if not _fast.active(q):
        raise RuntimeError(f"the queue is not on the fast path: {_fast.reasons}")
    seen: collections.Counter[int] = collections.Counter()
    c = {"kills": 0, "duplicates": 0, "lost": 0, "uncommitted seen": 0, "committed missing": 0, "wedged": 0,
         "bad exit": 0}
    recovery: list[float] = []
    for k in range(kills):
        ids = [base + 10 * k + j for j in range(3)]
        returned: set[int] = set()
        allowed: set[int] = set()
        if kind == "get":
            q.put(ids[0])
            q.put(ids[1])
            returned = {ids[0], ids[1]}
            if step == 13:
                allowed = {ids[0]}  # the dead consumer had committed its get
        p = CTX.Process(target=_victim, args=(q, kind, step, batch, ids))
        p.start()
        if kind == "sleep":
            deadline = time.monotonic() + 30
            while _waiters(m, name) < 1 and time.monotonic() < deadline:
                time.sleep(0.002)
            q.put(ids[0])
            returned = {ids[0]}
        p.join(60)
        if p.exitcode != -signal.SIGKILL:
            c["bad exit"] += 1
        c["kills"] += 1
        if kind == "put":
            returned = {ids[0], ids[1]}
        got, waited = _drain(q)
        recovery.append(waited)
        if waited > WEDGED_S:
            c["wedged"] += 1
        seen.update(got)
        gs = set(got)
        c["lost"] += len(returned - gs - allowed)
        if kind == "put" and step in (1, 2) and ids[2] in gs:
            c["uncommitted seen"] += 1
        if kind == "put" and step == 3 and ids[2] not in gs:
            c["committed missing"] += 1
    return _finish(c, seen, recovery, m, name)


def one_joinable(m: Any, label: str, step: int, kills: int, base: int) -> dict[str, Any]:
    name = f"kills-jq-{step}-{base}"
    q = m.JoinableQueue(name=name)
    if not _fast.active(q):
        raise RuntimeError(f"the JoinableQueue is not on the fast path: {_fast.reasons}")
    seen: collections.Counter[int] = collections.Counter()
    c = {"kills": 0, "duplicates": 0, "lost": 0, "uncommitted seen": 0, "committed missing": 0, "wedged": 0,
         "bad exit": 0, "join hung": 0, "join early": 0, "counts off": 0}
    recovery: list[float] = []
    for k in range(kills):
        ids = [base + 10 * k + j for j in range(3)]
        q.put(ids[0])
        q.put(ids[1])
        p = CTX.Process(target=_victim, args=(q, "jq", step, False, ids))
        p.start()
        p.join(60)
        c["kills"] += 1
        if p.exitcode != -signal.SIGKILL:
            c["bad exit"] += 1
        taken = {ids[0], ids[1]} if step == 13 else {ids[0]}  # delivered to the consumer before it died
        want = [ids[1], ids[2]] if step == 3 else [] if step == 13 else [ids[1]]
        t0 = time.monotonic()
        got: list[int] = []
        for _ in want:
            try:
                x = q.get(timeout=WEDGED_S * 3)
            except queue.Empty:
                c["wedged"] += 1
                break
            if not got:
                recovery.append(time.monotonic() - t0)
            got.append(x)
            if q.join(timeout=0.01):
                c["join early"] += 1  # x is not done yet
            q.task_done()
        if not want:
            recovery.append(time.monotonic() - t0)
        if not q.join(timeout=WEDGED_S):
            c["join hung"] += 1
        try:
            q.task_done()
            c["counts off"] += 1  # one too many was accepted
        except ValueError:
            pass
        while True:
            try:
                got.append(q.get_nowait())
            except queue.Empty:
                break
        seen.update(got)
        gs = set(got)
        c["lost"] += len({ids[0], ids[1]} - gs - taken)
        if step in (1, 2) and ids[2] in gs:
            c["uncommitted seen"] += 1
        if step == 3 and ids[2] not in gs:
            c["committed missing"] += 1
    return _finish(c, seen, recovery, m, name)


def run(kills_total: int, smoke: bool) -> dict[str, Any]:
    per = 1 if smoke else math.ceil(kills_total / len(VARIANTS))
    R: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         "per": per, "rows": {}, "loadavg_start": T.machine()["loadavg"]}
    with T.env(T.FASTON):
        m = syncmgr.Manager()
        m.start()
        try:
            for i, (label, kind, step, batch) in enumerate(VARIANTS):
                base = (i + 1) * 10_000_000
                if kind == "jq":
                    R["rows"][label] = one_joinable(m, label, step, per, base)
                else:
                    R["rows"][label] = one_variant(m, label, kind, step, batch, per, base)
                T.log(f"{label}: {R['rows'][label]}")
        finally:
            T.reap()
            m.shutdown()
    R["loadavg_end"] = T.machine()["loadavg"]
    return R


COLS = ("kills", "duplicates", "lost", "uncommitted seen", "committed missing", "wedged", "join hung", "join early",
        "counts off", "bad exit", "waiters left", "recovery p50 ms", "recovery max ms")


def report(R: dict[str, Any], md: bool) -> str:
    rows = []
    tot: collections.Counter[str] = collections.Counter()
    for label, c in R["rows"].items():
        rows.append([label] + [f"{c[k]:.1f}" if k.endswith("ms") else str(c.get(k, "–")) for k in COLS])
        tot.update({k: c.get(k, 0) for k in COLS if not k.endswith("ms")})
    rows.append(["**all**" if md else "all"] + [str(tot[k]) if not k.endswith("ms") else "" for k in COLS])
    return T.table(["step", *COLS], rows, md)


def violations(R: dict[str, Any]) -> int:
    # Every counted column but the kills themselves is a violation.
    return sum(c.get(k, 0) for c in R["rows"].values() for k in COLS if k != "kills" and not k.endswith("ms"))


def write_doc(R: dict[str, Any], path: str) -> None:
    body = "\n".join([
        BEGIN, "", "## Queue kill loops", "",
        f"*Generated by `bench/queue_kills.py` (`make bench-queue-kills`); rerun it rather than editing.* "
        f"{R['date']}, {os.cpu_count()} CPUs, load average {R['loadavg_start']} at start and "
        f"{R['loadavg_end']} at end; {R['per']} kills per step. Recovery: from the victim's death (reaped) to "
        f"the next items this process got, which includes the daemon noticing the session's end.", "",
        report(R, True), "", END])
    T.write_section(path, BEGIN, END, body)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=1000, help="kills in all, spread over the steps (default 1000)")
    p.add_argument("--smoke", action="store_true", help="one kill per step; writes no file")
    p.add_argument("--no-docs", action="store_true", help="write no Markdown")
    args = p.parse_args(argv)
    if _fast._ext is None:
        print("the fast path's extension is not built: nothing to kill", file=sys.stderr)
        return 1
    try:
        R = run(args.kills, args.smoke)
    except Exception:
        T.log("the run failed:\n" + traceback.format_exc())
        return 1
    print(report(R, False))
    bad = violations(R)
    print(f"{sum(c['kills'] for c in R['rows'].values())} kills, {bad} violations")
    if not args.smoke and not args.no_docs:
        write_doc(R, DOC)
        T.log(f"wrote the queue kill loops section of {DOC}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
