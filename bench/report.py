"""The report: number formats, the tables printed to stdout, the PASS/MISS target lines and the
docs/benchmarks.md writer.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import subprocess
import sys
import textwrap
from typing import Any, Callable, Optional

from bench.common import FLOOR, HERE, SYNCMANAGER, SYNCMGR
from bench.workloads import E2E_BATCH, E2E_SAMPLE, LAT_OPS, LAT_RTS, RT_TARGET_OPS, WORKLOADS

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


def write_markdown(R: dict[str, Any], path: str, plots: list[str]) -> None:
    info = R["machine"]
    cfg = R["cfg"]
    L: list[str] = []
    L.append("# Benchmarks: syncmgr, SyncManager and Redis, side by side")
    L.append("")
    L.append("*Generated by `python -m bench`; do not edit by hand — rerun it (the explanation of the numbers "
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
    if "load_end" in R:
        rows.append(["1-min load average at end", f"{R['load_end']:.2f}"])
    if "seconds" in R:
        rows.append(["run time (this part)", f"{R['seconds']:.0f} s"])
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
    L.append("`python -m bench --json FILE` saves every number of a run; `python -m bench --render FILE --out PATH` "
             "rewrites this page from such a file without measuring again.")
    L.append("")
    # Sections other tools write between "<!-- name:begin ... -->" and "<!-- name:end -->" markers
    # (make demo-compare, the same-host targets) are kept, in their order, after this run's part.
    for block in kept_sections(path):
        L.append(block)
        L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


_SECTION = re.compile(r"^<!-- ([\w-]+):begin\b.*?^<!-- \1:end -->$", re.M | re.S)


def kept_sections(path: str) -> list[str]:
    """The marker-delimited sections of the existing report at `path` (none if there is no file)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [m.group(0) for m in _SECTION.finditer(text)]
