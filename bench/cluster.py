"""syncmgr.ray on simulated Ray nodes: co-located learners, remote ingestion, start and shutdown.

Nodes are ``ray.cluster_utils.Cluster`` nodes on this machine (each its own
raylet and object store). Three parts, each in one run:

* **start and shutdown**: ``syncmgr.ray.start()`` on 3 nodes until every
  daemon answers; ``shutdown()`` then leaves how many daemon processes and
  /dev/shm files (a segment was made on every node first);
* **co-located learners** on 2 nodes, in interleaved rounds: each node's
  learner runs ``sample(64)`` + ``update_priorities`` on its own node's
  shard, as (a) cpprb's ``MPPrioritizedReplayBuffer`` with
  ``ctx=cluster.local()``, (b) RLlib's pattern: a Ray actor holding cpprb's
  ``PrioritizedReplayBuffer`` of the same size, sampled by
  ``ray.get(actor.sample.remote(64))`` from a learner actor on the same node
  (priorities sent with ``.remote()``), and (c) the same
  ``MPPrioritizedReplayBuffer`` on plain ``multiprocessing`` in one process,
  the floor for this buffer; plus cpprb's single-process
  ``PrioritizedReplayBuffer`` for reference. Every row times two learners
  at once (one per node, or two processes for the rows without Ray), so
  each row carries the same load;
* **remote ingestion over TCP+TLS on loopback**: 4 producers on one node
  put into a Queue whose consumer is on the other node, on its fast path:
  ``put_many`` of 64 x 8-byte items, and 1 MiB numpy arrays. Each producer
  connects (its key from the cluster, its TLS handshake) before the clock
  starts, and a run is long enough (about a second) that the Ray calls
  starting it and its first cold pages are a small part of it.

    python bench/cluster.py            # rewrites its section of docs/benchmarks.md
    python bench/cluster.py --smoke    # a few steps of each; writes nothing
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import statistics
import sys
import time
from typing import Any, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import targets as T  # noqa: E402

DOC = T.DOC
BEGIN, END = "<!-- ray-cluster:begin -->", "<!-- ray-cluster:end -->"
ENV = {"obs": {"shape": 4, "dtype": np.float32}, "act": {"dtype": np.int64}, "rew": {"dtype": np.float32},
       "next_obs": {"shape": 4, "dtype": np.float32}, "done": {"dtype": np.float32}}
NODE = {"num_cpus": 4, "object_store_memory": 100 << 20}


def _fill(rb: Any, n: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(n // 1000):
        rb.add(obs=rng.random((1000, 4), np.float32), act=rng.integers(0, 2, 1000), rew=rng.random(1000, np.float32),
               next_obs=rng.random((1000, 4), np.float32), done=np.zeros(1000, np.float32))


def _steps(rb: Any, k: int) -> float:
    """Seconds per sample(64) + update_priorities, over k steps."""
    t0 = time.perf_counter()
    for _ in range(k):
        s = rb.sample(64, beta=0.4)
        rb.update_priorities(s["indexes"], np.abs(s["rew"].ravel()) + 1e-3)
    return (time.perf_counter() - t0) / k


class ShardLearner:
    """(a): an MP buffer on this node's daemon, sampled here."""

    def __init__(self, cluster: Any, size: int) -> None:
        from cpprb import MPPrioritizedReplayBuffer

        self.rb = MPPrioritizedReplayBuffer(size, ENV, ctx=cluster.local())
        _fill(self.rb, size)

    def steps(self, k: int) -> float:
        return _steps(self.rb, k)


class ReplayActor:
    """(b): RLlib's replay actor."""

    def __init__(self, size: int) -> None:
        from cpprb import PrioritizedReplayBuffer

        self.rb = PrioritizedReplayBuffer(size, ENV)
        _fill(self.rb, size)

    def sample(self, n: int) -> dict:
        return self.rb.sample(n, beta=0.4)

    def update_priorities(self, idx: Any, prios: Any) -> None:
        self.rb.update_priorities(idx, prios)


class ActorLearner:
    """(b): the learner beside it, on the same node."""

    def __init__(self, replay: Any) -> None:
        self.replay = replay

    def steps(self, k: int) -> float:
        import ray

        t0 = time.perf_counter()
        for _ in range(k):
            s = ray.get(self.replay.sample.remote(64))
            self.replay.update_priorities.remote(s["indexes"], np.abs(s["rew"].ravel()) + 1e-3)
        return (time.perf_counter() - t0) / k


class Consumer:
    """The ingestion Queue's consumer, on its node's fast path."""

    def __init__(self, cluster: Any, name: str) -> None:
        from syncmgr import _fast

        self.q = cluster.local().Queue(name=name)
        self.fast = _fast.active(self.q)

    def queue(self) -> Any:
        return self.q

    def is_fast(self) -> bool:
        return bool(self.fast)

    def drain(self, n_items: int, big: bool) -> tuple[float, int]:
        """Get until n_items have come; (the wall-clock time then, bytes)."""
        got, nbytes = 0, 0
        while got < n_items:
            batch = self.q.get_many(4096, timeout=60)
            got += len(batch)
            if big:
                nbytes += sum(int(a.nbytes) for a in batch)
        return time.time(), nbytes


class Producer:
    def warm(self, q: Any) -> int:
        """Connect (the key from the cluster's actor, the TLS handshake)
        before the clock starts: the rate measured is the ingestion's."""
        return int(q.qsize())

    def run(self, q: Any, n_batches: int, big: bool) -> int:
        if big:
            a = np.ones(1 << 18, np.float32)  # 1 MiB
            for _ in range(n_batches):
                q.put(a)
            return n_batches
        items = [b"12345678"] * 64
        for _ in range(n_batches):
            q.put_many(items)
        return 64 * n_batches


def _local_worker(kind: str, size: int, conn: Any) -> None:
    """A process that holds one buffer (plain multiprocessing's MP buffer,
    or cpprb's single-process one) and times steps on request."""
    from cpprb import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer

    rb = MPPrioritizedReplayBuffer(size, ENV) if kind == "mp" else PrioritizedReplayBuffer(size, ENV)
    _fill(rb, size)
    conn.send("ready")
    while True:
        k = conn.recv()
        if k is None:
            return
        conn.send(_steps(rb, k))


class LocalPair:
    """Two such processes, timed at once: the same load as two nodes' learners."""

    def __init__(self, kind: str, size: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        for _ in range(2):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_local_worker, args=(kind, size, b), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)
        for c in self.conns:
            assert c.recv() == "ready"

    def steps(self, k: int) -> float:
        for c in self.conns:
            c.send(k)
        return statistics.mean(c.recv() for c in self.conns)

    def close(self) -> None:
        for c, p in zip(self.conns, self.procs):
            c.send(None)
            p.join(10)


def _pin(ray: Any, cls: Any, node: str, **opts: Any) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(cls).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                                   **opts)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            os.kill(p, 0)
            out.append(p)
        except ProcessLookupError:
            pass
    return out


def run(smoke: bool) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    import syncmgr.ray as sray

    # 2**14 is the buffer of the project's other cpprb benchmarks (bench/cpprb_bench.py).
    sizes = [1 << 12] if smoke else [1 << 14, 100_000]
    rounds, k = (2, 20) if smoke else (7, 400)
    R: dict[str, Any] = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "rounds": rounds, "k": k,
                         "sizes": sizes, "loadavg_start": T.machine()["loadavg"]}
    rc = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    extra = [rc.add_node(**NODE) for _ in range(2)]
    rc.wait_for_nodes()
    ray.init(address=rc.address, configure_logging=False, log_to_driver=False)
    try:
        # --- start and shutdown on 3 nodes ---------------------------------------
        shm0 = set(glob.glob("/dev/shm/*"))
        t0 = time.monotonic()
        c = sray.start(name="bench-start")
        nodes = c.nodes()
        for nid in nodes:
            c.on(nid).status()
        R["start_s"] = time.monotonic() - t0
        R["start_nodes"] = len(nodes)
        for nid in nodes:
            c.on(nid).SharedMemory(create=True, size=4096)
        pids = [n["pid"] for n in nodes.values()]
        t0 = time.monotonic()
        c.shutdown()
        deadline = time.monotonic() + 30
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        R["shutdown_s"] = time.monotonic() - t0
        R["left_procs"] = len(_alive(pids))
        R["left_shm"] = len(set(glob.glob("/dev/shm/*")) - shm0)
        rc.remove_node(extra[-1])
        rc.wait_for_nodes()
        time.sleep(1)

        # --- co-located learners on 2 nodes ----------------------------------------
        cluster = sray.start(name="bench")
        two = sorted(cluster.nodes())
        R["learners"] = {}
        for size in sizes:
            shard = [_pin(ray, ShardLearner, n).remote(cluster, size) for n in two]
            replay = [_pin(ray, ReplayActor, n).remote(size) for n in two]
            learners = [_pin(ray, ActorLearner, n).remote(r) for n, r in zip(two, replay)]
            ray.get([a.steps.remote(5) for a in shard + learners])
            mp_pair, sp_pair = LocalPair("mp", size), LocalPair("single", size)  # no Ray, no syncmgr
            rows: dict[str, list[float]] = {"syncmgr": [], "actor": [], "mp": [], "single": []}
            for _ in range(rounds):
                rows["syncmgr"].append(statistics.mean(ray.get([a.steps.remote(k) for a in shard])))
                rows["actor"].append(statistics.mean(ray.get([a.steps.remote(k) for a in learners])))
                rows["mp"].append(mp_pair.steps(k))
                rows["single"].append(sp_pair.steps(k))
            mp_pair.close()
            sp_pair.close()
            R["learners"][size] = {name: statistics.median(v) for name, v in rows.items()}
            for a in shard + learners + replay:
                ray.kill(a)

        # --- remote ingestion: 4 producers on node B, the consumer on node A -------------
        a_node, b_node = two
        for big in (False, True):
            name = f"ingest-{'big' if big else 'small'}"
            cons = _pin(ray, Consumer, a_node).remote(cluster, name)
            q = ray.get(cons.queue.remote())
            n_batches = (20 if big else 200) if smoke else (300 if big else 4000)
            prods = [_pin(ray, Producer, b_node).remote() for _ in range(4)]
            n_items = 4 * n_batches * (1 if big else 64)
            ray.get([p.warm.remote(q) for p in prods])
            trials = []
            for _ in range(1 if smoke else 3):
                done = cons.drain.remote(n_items, big)
                time.sleep(0.5)  # the consumer waits in get_many before the first put
                t_start = time.time()  # the same clock as the consumer's: one machine
                sent = ray.get([p.run.remote(q, n_batches, big) for p in prods])
                t_end, nbytes = ray.get(done)
                assert sum(sent) == n_items
                trials.append({"items": n_items, "seconds": t_end - t_start, "bytes": nbytes})
            mid = sorted(trials, key=lambda x: x["seconds"])[len(trials) // 2]
            R["ingest_big" if big else "ingest_small"] = {**mid, "trials": len(trials),
                                                          "fast": ray.get(cons.is_fast.remote())}
            for p in prods + [cons]:
                ray.kill(p)
        cluster.shutdown()
    finally:
        ray.shutdown()
        rc.shutdown()
    R["loadavg_end"] = T.machine()["loadavg"]
    return R


def report(R: dict[str, Any], md: bool) -> str:
    b = (lambda s: f"**{s}**") if md else (lambda s: s)
    out = []
    out.append(T.table(["check", "measured", "target", ""], [
        [f"start() on {R['start_nodes']} simulated nodes, every daemon answering", f"{R['start_s']:.2f} s", "<= 10 s",
         b("PASS" if R["start_s"] <= 10 else "MISS")],
        ["shutdown(): daemon processes left", str(R["left_procs"]), "0", b("PASS" if R["left_procs"] == 0 else "MISS")],
        ["shutdown(): /dev/shm files left", str(R["left_shm"]), "0", b("PASS" if R["left_shm"] == 0 else "MISS")],
    ], md))
    out.append("")
    def verdict(vs_actor: float, floor: float) -> str:
        # Where the buffer itself (plain multiprocessing, one process) is
        # within 5x of the actor pattern, no lock server can reach 5x.
        if vs_actor >= 5:
            return b("PASS")
        return b("MISS") + (f" (plain multiprocessing, the floor, is {floor:.1f}x)" if floor < 5 else "")

    rows = []
    for size, L in R["learners"].items():
        vs_actor = L["actor"] / L["syncmgr"]
        vs_mp = L["syncmgr"] / L["mp"]
        rows += [
            [f"syncmgr: MPPrioritizedReplayBuffer({size:,}), ctx=cluster.local(), each node its own shard",
             T.fmt_ns(L["syncmgr"] * 1e9), "", "", ""],
            ["RLlib's pattern: replay actor + learner actor on the same node", T.fmt_ns(L["actor"] * 1e9),
             f"{vs_actor:.1f}x slower than syncmgr", ">= 5x", verdict(vs_actor, L["actor"] / L["mp"])],
            ["MPPrioritizedReplayBuffer on plain multiprocessing, one process", T.fmt_ns(L["mp"] * 1e9),
             f"syncmgr takes {vs_mp:.2f}x its time", "<= 1.2x", b("PASS" if vs_mp <= 1.2 else "MISS")],
            ["(reference) cpprb PrioritizedReplayBuffer, one process, no locks", T.fmt_ns(L["single"] * 1e9),
             f"the MP buffer costs {L['mp'] / L['single']:.1f}x it", "", ""],
        ]
    out.append(T.table(["learner step: sample(64) + update_priorities", "per step", "ratio", "target", ""], rows,
                       md))
    out.append("")
    s, g = R["ingest_small"], R["ingest_big"]
    small = s["items"] / s["seconds"]
    big = g["bytes"] / g["seconds"] / (1 << 30)
    out.append(T.table(["remote ingestion, 4 producers over TCP+TLS -> fast-path consumer", "measured", "target", ""], [
        ["put_many of 64 x 8 B items", f"{small:,.0f} items/s", ">= 1,000,000 items/s",
         b("PASS" if small >= 1e6 else "MISS")],
        ["1 MiB numpy arrays", f"{big:.2f} GiB/s", ">= 1 GiB/s", b("PASS" if big >= 1 else "MISS")],
    ], md))
    return "\n".join(out)


def write_doc(R: dict[str, Any], path: str) -> None:
    body = "\n".join([
        BEGIN, "", "## syncmgr.ray: per-node daemons on simulated Ray nodes", "",
        f"*Generated by `bench/cluster.py` (`make bench-cluster`); rerun it rather than editing.* {R['date']}, "
        f"{os.cpu_count()} CPUs, load average {R['loadavg_start']} at start and {R['loadavg_end']} at end. Nodes "
        f"are `ray.cluster_utils.Cluster` nodes on this machine. Learner rows: medians of {R['rounds']} "
        f"interleaved rounds of {R['k']} steps by 2 learners at once (one per node; two processes for the rows "
        f"without Ray), shards of {' and '.join(f'{n:,}' for n in R['sizes'])} transitions. "
        "A remote producer's `put_many` of 64 items is one request over TCP+TLS; a 1 MiB array is one `put`; each "
        "producer has connected before the clock starts; each ingestion row is the median of "
        f"{R['ingest_small'].get('trials', 1)} runs, each of {R['ingest_small']['items']:,} items or "
        f"{R['ingest_big']['bytes'] / (1 << 30):.2f} GiB of arrays.", "",
        report(R, True), "", END])
    T.write_section(path, BEGIN, END, body)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few steps of each; writes no file")
    p.add_argument("--no-docs", action="store_true", help="write no Markdown")
    args = p.parse_args(argv)
    R = run(args.smoke)
    print(report(R, False))
    if not args.smoke and not args.no_docs:
        write_doc(R, DOC)
        T.log(f"wrote the ray-cluster section of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
