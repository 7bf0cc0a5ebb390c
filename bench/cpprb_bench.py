"""cpprb's multiprocessing replay buffers with syncmgr, SyncManager and plain
multiprocessing as ``ctx=``: the table of the cpprb target in the same-host targets.

For every cell (buffer class x cpprb backend x explorer processes x batch
size) each context runs in turn, the order rotating between rounds: the
explorers (forked processes) ``add`` batches for a fixed time while this
process, the learner, samples batches of the same size (and, for the
prioritized buffer, calls ``update_priorities`` on them). Transitions/s and
samples/s are the median over the rounds.

Each explorer makes one ``add`` before the clock starts, as any real job
does before its learner samples. Without it cpprb's own start-up race can
deadlock any ``ctx``: the learner polls ``get_stored_size()``, which counts
an ``add`` from the moment its index is claimed, before the explorer passed
``explorer_per_ready.wait()``. If the learner's first ``sample`` clears
``explorer_per_ready`` in that window, the explorer waits for the learner
and the learner for ``learner_per_ready``, which only a finished ``add`` has
ever set. The window is a few microseconds (longer in a forked child's first
call, and longer still on any socket path), so this table measured it as
"hung" rounds rather than throughput. Once one ``add`` has finished the
protocol cannot deadlock this way.

Every context is used with fork-started explorers, so SyncManager's proxies
reach their server with the inherited authkey (spawned or Ray processes
would need the authkey workaround cpprb documents). Called by
``bench/targets.py``; ``python bench/cpprb_bench.py [--smoke]`` runs this
table alone.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

BUFFERS = ("MPPrioritizedReplayBuffer", "MPReplayBuffer")
BACKENDS = ("sharedctypes", "SharedMemory")
EXPLORERS = (1, 4)
BATCHES = (1, 32)
BUFFER_SIZE = 1 << 14
HUNG_AFTER = 5.0  # seconds past the end of a measurement after which the learner counts as hung


def _batch(n: int, seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 4)), "act": rng.integers(0, 2, size=(n, 1)),
            "rew": rng.normal(size=(n, 1)), "next_obs": rng.normal(size=(n, 4)), "done": np.zeros((n, 1))}


def _explorer(rb: Any, batch: int, barrier: Any, seconds: float, seed: int, conn: Any, env: dict[str, str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.alarm(0)
    os.environ.update(env)
    code = 0
    try:
        data = _batch(batch, seed)
        # One add before the clock starts (see the module docstring).
        rb.add(**data)
        barrier.wait(timeout=60)
        deadline = time.monotonic() + seconds
        added = 0
        while time.monotonic() < deadline:
            rb.add(**data)
            added += batch
        conn.send(("ok", added))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        code = 1
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1200:]}"))
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(code)


class CellHung(Exception):
    """The learner did not get through sample/update_priorities in time."""


def _on_hung(signum: int, frame: Any) -> None:
    raise CellHung()


def run_cell(buffer: str, backend: str, ctx: Any, explorers: int, batch: int, seconds: float,
             env: dict[str, str]) -> dict[str, float]:
    """One measurement: explorers adding and the learner sampling for `seconds`.

    Raises CellHung when the learner is still blocked `seconds` + HUNG_AFTER
    seconds after the start (a watchdog thread interrupts it with SIGUSR1)."""
    import cpprb
    import numpy as np

    cls = getattr(cpprb, buffer)
    env_dict = {"obs": {"shape": 4}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": 4}, "done": {}}
    prioritized = buffer == "MPPrioritizedReplayBuffer"
    kwargs: dict[str, Any] = {"alpha": 0.6} if prioritized else {}
    rb = cls(BUFFER_SIZE, env_dict, ctx=ctx, backend=backend, **kwargs)
    fork = mp.get_context("fork")
    barrier = fork.Barrier(explorers + 1)
    procs, pipes = [], []
    watchdog: Optional[threading.Timer] = None
    old: Any = None
    try:
        for i in range(explorers):
            rd, wr = fork.Pipe(duplex=False)
            p = fork.Process(target=_explorer, args=(rb, batch, barrier, seconds, i, wr, env), daemon=True)
            p.start()
            wr.close()
            procs.append(p)
            pipes.append(rd)
        barrier.wait(timeout=60)
        main = threading.get_ident()
        watchdog = threading.Timer(seconds + HUNG_AFTER, signal.pthread_kill, (main, signal.SIGUSR1))
        watchdog.daemon = True
        old = signal.signal(signal.SIGUSR1, _on_hung)
        watchdog.start()
        rng = np.random.default_rng(0)
        prios = np.abs(rng.normal(size=batch)) + 1e-3
        t0 = time.monotonic()
        deadline = t0 + seconds
        samples = 0
        while time.monotonic() < deadline:
            if rb.get_stored_size() < batch:
                time.sleep(0.0005)
                continue
            if prioritized:
                s = rb.sample(batch, beta=0.4)
                rb.update_priorities(s["indexes"], prios)
            else:
                rb.sample(batch)
            samples += batch
        elapsed = time.monotonic() - t0
        watchdog.cancel()
        added = 0
        for rd in pipes:
            if not rd.poll(HUNG_AFTER):
                raise CellHung()  # an explorer still blocked in add
            msg = rd.recv()
            if msg[0] != "ok":
                raise RuntimeError(f"cpprb {buffer}: an explorer failed: {msg[1]}")
            added += msg[1]
        for p in procs:
            p.join(timeout=10)
        if added == 0 or samples == 0:
            raise RuntimeError(f"cpprb {buffer}: nothing was added or sampled ({added}, {samples})")
        return {"transitions_per_s": added / elapsed, "samples_per_s": samples / elapsed}
    finally:
        if watchdog is not None:
            watchdog.cancel()
            signal.signal(signal.SIGUSR1, old)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for rd in pipes:
            with contextlib.suppress(Exception):
                rd.close()
        del rb
        gc.collect()


def _drop_manager_connection(ctx: Any) -> None:
    """After an interrupted call, SyncManager's per-thread connection (shared by
    all proxies of one manager) still owes a reply: close it so that the next
    call opens a fresh one instead of reading the stale reply."""
    from multiprocessing.managers import BaseProxy, SyncManager

    if not isinstance(ctx, SyncManager):
        return
    entry = BaseProxy._address_to_local.get(ctx.address)  # type: ignore[attr-defined]
    tls = entry[0] if entry else None
    conn = getattr(tls, "connection", None)
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
        del tls.connection


def cells() -> list[tuple[str, str, int, int]]:
    return [(b, be, e, n) for b in BUFFERS for be in BACKENDS for e in EXPLORERS for n in BATCHES]


def run_table(contexts: dict[str, tuple[Callable[[], Any], dict[str, str]]], seconds: float, rounds: int,
              log: Callable[[str], None]) -> list[dict[str, Any]]:
    """contexts: label -> (a function that makes the ``ctx`` for one buffer, extra
    environment for the explorer processes). Returns one row per cell with
    each label's median transitions/s and samples/s."""
    labels = list(contexts)
    rows: list[dict[str, Any]] = []
    for ci, (buffer, backend, explorers, batch) in enumerate(cells()):
        got: dict[str, list[dict[str, float]]] = {lb: [] for lb in labels}
        hung = {lb: 0 for lb in labels}
        for r in range(rounds):
            k = (r + ci) % len(labels)
            for lb in labels[k:] + labels[:k]:
                make, env = contexts[lb]
                saved = {e: os.environ.get(e) for e in env}
                os.environ.update(env)
                try:
                    got[lb].append(run_cell(buffer, backend, make(), explorers, batch, seconds, env))
                except CellHung:
                    hung[lb] += 1
                    _drop_manager_connection(make())
                    log(f"cpprb {buffer} {backend} explorers={explorers} batch={batch} {lb}: the learner was "
                        f"still blocked {HUNG_AFTER:g} s after the end (counted as hung)")
                finally:
                    for e, v in saved.items():
                        if v is None:
                            os.environ.pop(e, None)
                        else:
                            os.environ[e] = v
        row: dict[str, Any] = {"buffer": buffer, "backend": backend, "explorers": explorers, "batch": batch}
        for lb in labels:
            # A hung round counts as zero: a buffer that deadlocks has no throughput.
            runs = got[lb] + [{"transitions_per_s": 0.0, "samples_per_s": 0.0}] * hung[lb]
            row[lb] = {m: statistics.median(x[m] for x in runs) for m in ("transitions_per_s", "samples_per_s")}
            row[lb]["hung"] = hung[lb]
        rows.append(row)
        log(f"cpprb {buffer} {backend} explorers={explorers} batch={batch}: " + ", ".join(
            f"{lb} {row[lb]['transitions_per_s']:,.0f} tr/s {row[lb]['samples_per_s']:,.0f} smp/s"
            + (f" ({hung[lb]} hung)" if hung[lb] else "") for lb in labels))
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    # The systems are set up by targets.py; this entry point runs only this table.
    import targets

    return targets.main(["--only", "cpprb", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
