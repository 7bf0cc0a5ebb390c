"""The interleaved runner: rounds in which every system runs the same operation in turn, the
throughput cases, end-to-end and footprint, and ``run`` which does them all in one run.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import datetime
import gc
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from bench.common import (
    _T0,
    FLOOR,
    REDIS,
    REPO,
    SYNCMANAGER,
    SYNCMGR,
    fork_ctx,
    loadavg,
    log,
    machine_cpu_s,
    on_cleanup,
    pct,
    proc_cpu_s,
    rss_kb,
    stop_round,
    summary_us,
    track,
)
from bench.report import evaluate_targets, machine_info
from bench.systems import EchoFloor, RedisServer, SyncmgrDaemon, find_syncmgr_bin, redis_available, start_syncmanager
from bench.workloads import (
    E2E_SAMPLE,
    LAT_FLOOR_SIZE,
    LAT_OPS,
    UNPICKLE_CHILD,
    WORKLOADS,
    _conn_holder,
    _e2e_explorer,
    _tp_child,
    redis_latency_ops,
    syncmanager_latency_ops,
    syncmgr_latency_ops,
)


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
        stop_round(procs, pipes)
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
        stop_round(procs, pipes)
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


# Wall time of each mode on the reference machine (2 cores), the same-host targets not included.
EXPECTED = {"smoke": "about 20 s", "quick": "about 1-2 min", "full": "about 3-5 min"}


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
    log(f"expected run time on 2 idle cores: {EXPECTED[cfg['mode']]} (more on a loaded machine; "
        f"--max-time {args.max_time or (110 if args.smoke else 1800):g} s bounds it)")
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
    R["seconds"] = time.monotonic() - _T0
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
    cmd = f"{exe} -m bench {argv}".strip()
    return cmd + "    # or: make bench" + (f" BENCH_ARGS='{argv}'" if argv else "")
