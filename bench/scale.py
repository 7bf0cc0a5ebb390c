"""Scale: the fast path under real process topologies.

N client processes (1, 8, 32, 64; 256 when the machine has 16 CPUs or more),
started by spawn and by fork, each looping for a fixed time on:

* ``own_lock``: a Lock of its own (acquire+release);
* ``shared_lock``: one Lock shared by all (acquire+release);
* ``semaphore4``: one Semaphore(4) shared by all (acquire+release);
* ``is_set``: one Event's ``is_set``;
* ``pingpong``: pairs of processes bouncing a pair of Events (set/wait/clear);
  one op is a round trip (N >= 2; an odd process out sits it out).

Aggregate ops/s (every process's ops over the wall-clock window from the
first one's start to the last one's end) and p50/p99 latency of one op
(sampled: one op in SAMPLE is timed alone) for three systems: syncmgr (the
fast path), syncmgr's socket path (``SYNCMGR_FASTPATH=0``) and
``multiprocessing``'s own primitives. Medians over interleaved rounds (the
order of the systems rotates). Needs Python, msgpack, the built extension and
a daemon binary only (no Ray, cpprb, numpy or matplotlib).

    python bench/scale.py            # full run; rewrites its section of docs/benchmarks.md
    python bench/scale.py --smoke    # a fraction of a second per cell; writes nothing
    python bench/scale.py --n 1,8 --methods fork --workloads shared_lock --seconds 0.5
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Iterator, Optional

import syncmgr

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "benchmarks.md")
BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"

FAST, SOCK, MPL = "syncmgr", "syncmgr socket", "multiprocessing"
SYSTEMS = (FAST, SOCK, MPL)
ENV = {FAST: {"SYNCMGR_FASTPATH": "1"}, SOCK: {"SYNCMGR_FASTPATH": "0"}, MPL: {}}
WORKLOADS = ("own_lock", "shared_lock", "semaphore4", "is_set", "pingpong")
TITLES = {"own_lock": "each process with its own Lock (acquire+release)",
          "shared_lock": "one shared Lock (acquire+release)",
          "semaphore4": "one shared Semaphore(4) (acquire+release)",
          "is_set": "one Event's is_set",
          "pingpong": "Event set/wait ping-pong between pairs of processes (round trips)"}
METHODS = ("spawn", "fork")
SAMPLE = 16  # one op in SAMPLE is timed on its own, for the latency percentiles

_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def default_ns() -> list[int]:
    ns = [1, 8, 32, 64]
    if (os.cpu_count() or 1) >= 16:
        ns.append(256)
    return ns


@contextlib.contextmanager
def env(extra: dict[str, str]) -> Iterator[None]:
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


# --------------------------------------------------------------------------
# the client processes


def _lock_loop(acq: Callable[[], Any], rel: Callable[[], Any], secs: float) -> tuple[int, int, int, list[int]]:
    pc = time.perf_counter_ns
    lat: list[int] = []
    n = 0
    start = pc()
    end = start + int(secs * 1e9)
    while True:
        for _ in range(SAMPLE - 1):
            acq()
            rel()
        t0 = pc()
        acq()
        rel()
        t1 = pc()
        lat.append(t1 - t0)
        n += SAMPLE
        if t1 >= end:
            return n, start, t1, lat


def _is_set_loop(f: Callable[[], Any], secs: float) -> tuple[int, int, int, list[int]]:
    pc = time.perf_counter_ns
    lat: list[int] = []
    n = 0
    start = pc()
    end = start + int(secs * 1e9)
    while True:
        for _ in range(SAMPLE - 1):
            f()
        t0 = pc()
        f()
        t1 = pc()
        lat.append(t1 - t0)
        n += SAMPLE
        if t1 >= end:
            return n, start, t1, lat


def _ping(ping: Any, pong: Any, secs: float) -> tuple[int, int, int, list[int]]:
    pc = time.perf_counter_ns
    lat: list[int] = []
    n = 0
    start = pc()
    end = start + int(secs * 1e9)
    t1 = start
    while t1 < end:
        t0 = pc()
        ping.set()
        if not pong.wait(30):
            raise TimeoutError("the pong never came")
        pong.clear()
        t1 = pc()
        lat.append(t1 - t0)
        n += 1
    return n, start, t1, lat


def _pong(ping: Any, pong: Any, secs: float) -> tuple[int, int, int, list[int]]:
    while ping.wait(max(1.0, secs)):  # the pinger stopped when no ping comes for that long
        ping.clear()
        pong.set()
    return 0, 0, 0, []


def _child(i: int, objs: dict[str, Any], workloads: list[str], barrier: Any, secs: float, conn: Any,
           extra: dict[str, str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(extra)
    out: dict[str, Any] = {}
    try:
        # One op on each object first: a forked child moves its inherited
        # handles to its own session at its first op, which no cell times.
        for lk in (objs["own"][i], objs["lock"], objs["sem"]):
            lk.acquire()
            lk.release()
        objs["event"].is_set()
        for ping, pong in objs["pairs"][i // 2:i // 2 + 1]:
            ping.is_set()
            pong.is_set()
        for w in workloads:
            barrier.wait(120)
            if w == "own_lock":
                lk = objs["own"][i]
                out[w] = _lock_loop(lk.acquire, lk.release, secs)
            elif w == "shared_lock":
                out[w] = _lock_loop(objs["lock"].acquire, objs["lock"].release, secs)
            elif w == "semaphore4":
                out[w] = _lock_loop(objs["sem"].acquire, objs["sem"].release, secs)
            elif w == "is_set":
                out[w] = _is_set_loop(objs["event"].is_set, secs)
            elif w == "pingpong":
                if i >= 2 * (len(objs["own"]) // 2):  # no partner (N odd): sits it out
                    out[w] = (0, 0, 0, [])
                else:
                    ping, pong = objs["pairs"][i // 2]
                    out[w] = (_ping if i % 2 == 0 else _pong)(ping, pong, secs)
        conn.send(out)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


# --------------------------------------------------------------------------
# one measurement: N processes of one start method on one system


def _objects(system: str, m: Any, ctx: Any, n: int) -> dict[str, Any]:
    src = ctx if system == MPL else m
    pairs = n // 2
    return {"own": [src.Lock() for _ in range(n)], "lock": src.Lock(), "sem": src.Semaphore(4),
            "event": src.Event(), "pairs": [(src.Event(), src.Event()) for _ in range(pairs)]}


def measure(system: str, method: str, n: int, m: Any, workloads: list[str], secs: float) -> dict[str, Any]:
    """Runs every workload once with n processes; returns per workload the
    aggregate ops/s and the sampled latencies (ns)."""
    ctx = mp.get_context(method)
    with env(ENV[system]):
        objs = _objects(system, m, ctx, n)
        barrier = ctx.Barrier(n)
        procs, pipes = [], []
        try:
            for i in range(n):
                rd, wr = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(i, objs, workloads, barrier, secs, wr, ENV[system]), daemon=True)
                p.start()
                wr.close()
                procs.append(p)
                pipes.append(rd)
            results = []
            limit = time.monotonic() + 120 + len(workloads) * (secs + 60)
            for rd in pipes:
                if not rd.poll(max(1.0, limit - time.monotonic())):
                    raise TimeoutError(f"{system} {method} N={n}: a client process never reported")
                results.append(rd.recv())
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)
            for rd in pipes:
                rd.close()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"{system} {method} N={n}: {errors[0]}")
    out: dict[str, Any] = {}
    for w in workloads:
        # Total ops over the wall-clock window from the first process's
        # start to the last one's end (perf_counter is CLOCK_MONOTONIC, one
        # clock for every process): a sum of per-process rates would count
        # windows that did not overlap as if they had.
        done = [r[w] for r in results if r[w][0] > 0]
        span = (max(d[2] for d in done) - min(d[1] for d in done)) / 1e9 if done else 0.0
        rate = sum(d[0] for d in done) / span if span > 0 else 0.0
        lat = [x for r in results for x in r[w][3]]
        out[w] = {"ops_s": rate, "lat": lat}
    return out


def pct(xs: list[int], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(q * len(s)))])


# --------------------------------------------------------------------------
# the run, the tables, the doc section


def run(args: argparse.Namespace) -> dict[str, Any]:
    ns = [int(x) for x in args.n.split(",")] if args.n else ([1, 4] if args.smoke else default_ns())
    methods = args.methods.split(",") if args.methods else list(METHODS)
    workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    systems = args.systems.split(",") if args.systems else list(SYSTEMS)
    for name, got, allowed in (("workloads", workloads, WORKLOADS), ("methods", methods, METHODS),
                               ("systems", systems, SYSTEMS)):
        if set(got) - set(allowed):
            raise SystemExit(f"unknown {name}: {sorted(set(got) - set(allowed))} (of {', '.join(allowed)})")
    secs = args.seconds or (0.1 if args.smoke else 1.0)
    rounds = args.rounds or (1 if args.smoke else 3)
    now = datetime.datetime.now(datetime.timezone.utc)
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    R: dict[str, Any] = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "nproc": os.cpu_count(), "load0": load0,
                         "ns": ns, "methods": methods, "workloads": workloads, "systems": systems,
                         "seconds": secs, "rounds": rounds, "cells": {}, "errors": []}
    m = syncmgr.Manager()
    m.start()
    try:
        with env(ENV[FAST]):
            from syncmgr import _fast  # type: ignore[attr-defined]

            probe = m.Lock()
            R["fast_state"] = "active" if _fast.active(probe) else f"inactive ({_fast.reasons})"
        log(f"fast path: {R['fast_state']}")
        for method in methods:
            for n in ns:
                for r in range(rounds):
                    k = r % len(systems)
                    for system in systems[k:] + systems[:k]:
                        log(f"{method} N={n} round {r + 1}/{rounds}: {system}")
                        try:
                            got = measure(system, method, n, m, workloads, secs)
                        except Exception as e:  # noqa: BLE001 - the other cells still run; reported
                            R["errors"].append(str(e))
                            log(f"failed: {e}\n{traceback.format_exc()}")
                            continue
                        for w, d in got.items():
                            if not d["lat"]:
                                continue  # nobody measured (ping-pong with one process)
                            cell = R["cells"].setdefault((w, method, n, system), {"ops_s": [], "lat": []})
                            cell["ops_s"].append(d["ops_s"])
                            cell["lat"] = d["lat"] if len(d["lat"]) > len(cell["lat"]) else cell["lat"]
    finally:
        m.shutdown()
    with open("/proc/loadavg") as f:
        R["load1"] = " ".join(f.read().split()[:3])
    return R


def fmt_rate(x: Optional[float]) -> str:
    if x is None:
        return "–"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k" if x >= 1e3 else f"{x:.0f}"


def fmt_ns(x: Optional[float]) -> str:
    if x is None:
        return "–"
    return f"{x / 1e6:.1f} ms" if x >= 1e6 else f"{x / 1e3:.1f} µs" if x >= 1e3 else f"{x:.0f} ns"


def tables(R: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    systems = R["systems"]
    for w in R["workloads"]:
        header = ["start", "N"]
        for s in systems:
            header += [f"{s} ops/s", "p50", "p99"]
        if FAST in systems and MPL in systems:
            header.append("syncmgr / mp")
        rows = []
        for method in R["methods"]:
            for n in R["ns"]:
                row = [method, str(n)]
                med = {}
                for s in systems:
                    c = R["cells"].get((w, method, n, s))
                    med[s] = statistics.median(c["ops_s"]) if c and c["ops_s"] else None
                    row += [fmt_rate(med[s]), fmt_ns(pct(c["lat"], 0.5) if c else None),
                            fmt_ns(pct(c["lat"], 0.99) if c else None)]
                if FAST in systems and MPL in systems:
                    a, b = med.get(FAST), med.get(MPL)
                    row.append(f"{a / b:.2f}x" if a and b else "–")
                rows.append(row)
        out.append((TITLES[w], header, rows))
    return out


def render(header: list[str], rows: list[list[str]], md: bool) -> str:
    if md:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*r) for r in rows])


def write_doc(R: dict[str, Any], path: str, command: str) -> None:
    L = [BEGIN, "", "## Scale: N client processes, spawn and fork", "",
         f"*Generated by `bench/scale.py` (only the part between the `scale` marker comments); rerun it rather "
         f"than editing.* Run on {R['date']}, {R['nproc']} CPUs, load average {R['load0']} at start and "
         f"{R['load1']} at end (/proc/loadavg); {R['seconds']:g} s per cell, median of {R['rounds']} interleaved "
         f"rounds; latency of one op, one op in {SAMPLE} timed alone; fast path {R['fast_state']}. With:", "",
         "```sh", command, "```", ""]
    for title, header, rows in tables(R):
        L += [f"### {title}", "", render(header, rows, md=True), ""]
    for e in R["errors"]:
        L += [f"**Failed:** {e}", ""]
    L.append(END)
    block = "\n".join(L)
    with open(path) as f:
        text = f.read()
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        a, b = text.index(BEGIN), text.index(END) + len(END)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="N=1,4, 0.1 s per cell, one round; writes no file")
    p.add_argument("--n", help="comma-separated process counts (default 1,8,32,64, and 256 with >= 16 CPUs)")
    p.add_argument("--methods", help=f"comma-separated start methods (of {','.join(METHODS)})")
    p.add_argument("--workloads", "--only", dest="workloads", help=f"comma-separated (of {','.join(WORKLOADS)})")
    p.add_argument("--systems", help=f"comma-separated (of {','.join(SYSTEMS)})")
    p.add_argument("--seconds", type=float, help="seconds per cell (default 1)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--out", help=f"Markdown file whose scale section to rewrite (default for a full run: {DOC})")
    p.add_argument("--no-docs", action="store_true", help="write no Markdown")
    args = p.parse_args(argv)
    try:
        R = run(args)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    for title, header, rows in tables(R):
        print(f"\n== {title}\n{render(header, rows, md=False)}")
    for e in R["errors"]:
        print(f"\nFAILED {e}")
    partial = bool(args.n or args.methods or args.workloads or args.systems or args.seconds or args.rounds)
    out = args.out or (None if args.smoke or partial else DOC)
    if out and not args.no_docs:
        cmd = ".venv/bin/python bench/scale.py" + "".join(" " + a for a in (sys.argv[1:] if argv is None else argv))
        write_doc(R, out, cmd + "    # or: make bench-scale")
        log(f"wrote the scale section of {out}")
    return 1 if R["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
