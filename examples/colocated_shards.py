"""Co-located replay shards on a Ray cluster, with a syncmgr daemon on every node.

The layout RLlib builds for its learner shards with ``create_colocated_actors``
(create actors, check their host, kill the extras, retry), here placed
directly, with no actor call per sample:

* every shard node holds one cpprb ``MPPrioritizedReplayBuffer`` made with
  ``ctx=cluster.local()`` (its memory in the node's shared memory, its locks
  on the node's fast path), its explorers and its learner, all pinned to the
  node; explorers ``add`` and the learner ``sample``s and
  ``update_priorities`` in shared memory;
* a stop Event and a weights-version Value live on the driver's node and are
  used from every node (over TCP+TLS from the others);
* each shard has an ingestion Queue: explorers on a node without a shard
  (and one explorer per shard node, for the next shard) put batches of
  transitions into it from another node over TCP+TLS, and the learner moves
  them into its buffer.

Each shard learns CartPole-v1 with its own DQN (numpy, examples/apex/qnet.py).

    python examples/colocated_shards.py --local-nodes 2            # simulated nodes (ray.cluster_utils)
    python examples/colocated_shards.py --address auto             # a real cluster
    python examples/colocated_shards.py --local-nodes 2 --short    # a few seconds: checks the layout runs

Exits 0 when every shard's greedy policy reached --target (or, with --short,
when every path carried data), and nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import apex  # noqa: E402
import ray  # noqa: E402
from apex.qnet import QNetwork, greedy_returns, q_forward  # noqa: E402
from apex.weights import WeightsBroadcast  # noqa: E402

import syncmgr.ray as sray  # noqa: E402

ENV_ID, OBS, ACTS = "CartPole-v1", 4, 2
HIDDEN = 64
ENV_DICT = {"obs": {"shape": OBS, "dtype": np.float32}, "act": {"dtype": np.int64}, "rew": {"dtype": np.float32},
            "next_obs": {"shape": OBS, "dtype": np.float32}, "done": {"dtype": np.float32}}
BATCH, GAMMA = 64, 0.99


def pinned(cls: Any, node: str, **opts: Any) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(cls).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                                   **opts)


class Learner:
    """One shard: its replay buffer (made here, on its node), its weights and its DQN."""

    def __init__(self, cluster: sray.Cluster, index: int, size: int, seed: int) -> None:
        from cpprb import MPPrioritizedReplayBuffer

        self.index = index
        m = cluster.local()
        self.rb = MPPrioritizedReplayBuffer(size, ENV_DICT, ctx=m, alpha=0.6)
        self.net = QNetwork([OBS, HIDDEN, HIDDEN, ACTS], np.random.default_rng(seed), lr=5e-4)
        self.target = self.net.copy_params()
        shapes = [p.shape for p in self.net.params]
        self.weights = WeightsBroadcast(m.SharedMemory(create=True, size=WeightsBroadcast.size_for(shapes)),
                                        m.Value("q", 0), shapes)
        self.weights.publish(self.net.params, 0, 0)
        self.ingest = m.Queue(name=f"shards-ingest-{index}")
        self.updates = 0
        self.ingested = 0

    def handles(self) -> tuple[Any, Any, Any]:
        """What explorers need: the buffer, the weights (both for this node's
        explorers) and the ingestion Queue (for any node's)."""
        return self.rb, self.weights, self.ingest

    def current_weights(self) -> list[np.ndarray]:
        return self.net.copy_params()

    def _drain(self) -> None:
        import queue

        try:
            batches = self.ingest.get_many(64, block=False)
        except queue.Empty:
            return
        for batch in batches:
            self.rb.add(**batch)
            self.ingested += len(batch["rew"])

    def run(self, stop: Any, version: Any, target: float, budget: float, short_updates: int) -> dict[str, Any]:
        t0 = time.monotonic()
        best, evals, step_times = -1.0, [], []
        while not stop.is_set() and time.monotonic() - t0 < budget:
            self._drain()
            if self.rb.get_stored_size() < 4 * BATCH:
                time.sleep(0.01)
                continue
            ts = time.perf_counter()
            s = self.rb.sample(BATCH, beta=0.4)
            q_next = q_forward(self.target, s["next_obs"])
            a_next = np.argmax(q_forward(self.net.params, s["next_obs"]), axis=1)
            y = s["rew"].ravel() + GAMMA * (1.0 - s["done"].ravel()) * q_next[np.arange(BATCH), a_next]
            _, td, grads = self.net.loss_and_grads(s["obs"], s["act"].ravel().astype(np.int64), y.astype(np.float32),
                                                   s["weights"].astype(np.float32))
            self.net.apply(grads)
            self.rb.update_priorities(s["indexes"], np.abs(td) + 1e-3)
            step_times.append(time.perf_counter() - ts)
            self.updates += 1
            if self.updates % 250 == 0:
                self.target = self.net.copy_params()
            if self.updates % 50 == 0:
                self.weights.publish(self.net.params, self.updates, 0)
                version.add(1)  # the global version, on the driver's node
            if short_updates and self.updates >= short_updates and (self.ingested or time.monotonic() - t0 > 60):
                break
            if not short_updates and self.updates % 1000 == 0:
                mean = float(np.mean(greedy_returns(self.net.params, ENV_ID, list(range(10)))))
                evals.append((self.updates, mean))
                best = max(best, mean)
                if mean >= target:
                    break
        return {"shard": self.index, "updates": self.updates, "stored": self.rb.get_stored_size(),
                "ingested": self.ingested, "best": best, "evals": evals,
                "step_us": 1e6 * float(np.median(step_times)) if step_times else None}


class Explorer:
    """Acts epsilon-greedily and adds transitions: straight into its node's
    shard, or as batches into another node's ingestion Queue."""

    def __init__(self, seed: int) -> None:
        import gymnasium as gym

        self.env = gym.make(ENV_ID)
        self.rng = np.random.default_rng(seed)
        self.seed = seed

    def run(self, stop: Any, rb: Any, weights: Any, ingest: Any, learner: Any) -> dict[str, Any]:
        params: Optional[list[np.ndarray]] = None
        last, steps, sent = -1, 0, 0
        obs, _ = self.env.reset(seed=self.seed)
        buf: dict[str, list[Any]] = {k: [] for k in ENV_DICT}
        while not stop.is_set():
            if weights is not None:
                got = weights.read(last, timeout=1.0)
                if got is not None:
                    last, params, _ = got
            elif params is None or steps % 2000 == 0:
                params = ray.get(learner.current_weights.remote())  # a node without a shard: an actor call now and then
            eps = max(0.05, 1.0 - steps / 20000)
            if params is None or self.rng.random() < eps:
                act = int(self.rng.integers(ACTS))
            else:
                act = int(np.argmax(q_forward(params, obs[None].astype(np.float32))[0]))
            nxt, r, term, trunc, _ = self.env.step(act)
            for k, v in (("obs", obs), ("act", act), ("rew", r), ("next_obs", nxt), ("done", float(term))):
                buf[k].append(v)
            obs = nxt
            if term or trunc:
                obs, _ = self.env.reset()
            steps += 1
            if len(buf["rew"]) == 32:
                batch = {k: np.asarray(v, dtype=ENV_DICT[k]["dtype"]) for k, v in buf.items()}
                if rb is not None:
                    rb.add(**batch)
                else:
                    ingest.put(batch)
                sent += 32
                buf = {k: [] for k in ENV_DICT}
        return {"steps": steps, "sent": sent, "remote": rb is None}


DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md")
BEGIN, END = "<!-- colocated-shards:begin -->", "<!-- colocated-shards:end -->"


def write_docs(figures: dict[str, Any], args: argparse.Namespace, ok: bool) -> None:
    """Replace this example's section of docs/benchmarks.md with this run's figures."""
    import datetime

    where = f"{args.local_nodes} simulated nodes" if args.local_nodes else f"the Ray cluster at {args.address}"
    lines = [BEGIN, "", "## Co-located replay shards (examples/colocated_shards.py)", "",
             f"*Written by `make demo-shards WRITE_DOCS=1`; rerun it rather than editing.* "
             f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, {where}, {args.explorers} explorer(s) "
             f"per node plus one per shard node feeding the next shard over TCP+TLS; target: every shard's greedy "
             f"mean return over 10 episodes >= {args.target:g}. {'Reached' if ok else 'Not reached'} in "
             f"{figures['seconds']} s; the global weights version (a Value on the driver's node) ended at "
             f"{figures['weights_version']}.", "",
             "| shard | updates | learner step (median, with the DQN's numpy work) | stored (capacity) | "
             "transitions added from the ingestion Queue (TCP+TLS) | greedy returns at 1k, 2k, ... updates |",
             "|---|---:|---:|---:|---:|---|"]
    for r in figures["shards"]:
        evals = ", ".join(f"{m:.0f}" for _, m in r["evals"])
        lines.append(f"| {r['shard']} | {r['updates']:,} | {r['step_us']:.0f} µs | {r['stored']:,} | "
                     f"{r['ingested']:,} | {evals} |")
    lines += ["", END]
    block = "\n".join(lines)
    with open(DOCS, encoding="utf-8") as f:
        text = f.read()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(DOCS + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(DOCS + ".tmp", DOCS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local-nodes", type=int, default=0, help="simulate N nodes on this machine (ray.cluster_utils)")
    ap.add_argument("--address", default=None, help="join a running Ray cluster (e.g. auto)")
    ap.add_argument("--shards", type=int, default=0, help="nodes that hold a shard (default: all)")
    ap.add_argument("--explorers", type=int, default=1, help="explorers per node")
    ap.add_argument("--size", type=int, default=50_000, help="each shard's capacity")
    ap.add_argument("--target", type=float, default=195.0, help="greedy mean return every shard must reach")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds of learning at most")
    ap.add_argument("--short", action="store_true", help="a few hundred updates: checks that every path runs")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--write-docs", action="store_true", help="write the figures into docs/benchmarks.md")
    args = ap.parse_args()

    local = None
    if args.local_nodes:
        from ray.cluster_utils import Cluster

        local = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20,
                                                               "include_dashboard": False})
        for _ in range(args.local_nodes - 1):
            local.add_node(num_cpus=2, object_store_memory=80 << 20)
        local.wait_for_nodes()
        ray.init(address=local.address, configure_logging=False, log_to_driver=False)
    else:
        ray.init(address=args.address, configure_logging=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(apex)
    cluster = sray.start()
    t0 = time.monotonic()
    try:
        nodes = sorted(cluster.nodes())
        shard_nodes = nodes[:args.shards or len(nodes)]
        m = cluster.local()
        stop, version = m.Event(name="shards-stop"), m.Value("q", 0, name="shards-weights-version")
        # Two threads per learner: run() and the weights that explorers on other nodes ask for.
        learners = [pinned(Learner, n, max_concurrency=2).remote(cluster, i, args.size, i)
                    for i, n in enumerate(shard_nodes)]
        handles = ray.get([lr.handles.remote() for lr in learners])
        runs, explorers = [], []
        for j, node in enumerate(nodes):
            for k in range(args.explorers):
                ex = pinned(Explorer, node).remote(1000 * j + k)
                explorers.append(ex)
                if node in shard_nodes:
                    i = shard_nodes.index(node)
                    rb, w, _ = handles[i]
                    runs.append(ex.run.remote(stop, rb, w, None, learners[i]))
                else:
                    i = j % len(shard_nodes)
                    runs.append(ex.run.remote(stop, None, None, handles[i][2], learners[i]))
            if node in shard_nodes and len(shard_nodes) > 1:
                # One more explorer per shard node, feeding the next shard over TCP+TLS.
                i = (shard_nodes.index(node) + 1) % len(shard_nodes)
                ex = pinned(Explorer, node).remote(1000 * j + 999)
                explorers.append(ex)
                runs.append(ex.run.remote(stop, None, None, handles[i][2], learners[i]))
        results = ray.get([lr.run.remote(stop, version, args.target, args.budget, 300 if args.short else 0)
                           for lr in learners])
        stop.set()
        ex_results = ray.get(runs, timeout=120)
        figures = {"nodes": len(nodes), "shards": results, "explorers": ex_results,
                   "weights_version": version.value, "seconds": round(time.monotonic() - t0, 1)}
        print(json.dumps({k: v for k, v in figures.items() if k != "explorers"}, default=float))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, default=float, indent=1)
        if args.short:
            ok = (all(r["updates"] >= 300 for r in results) and figures["weights_version"] >= len(results)
                  and any(e["remote"] and e["sent"] > 0 for e in ex_results)
                  and sum(r["ingested"] for r in results) > 0)
        else:
            ok = all(r["best"] >= args.target for r in results)
        print("colocated shards:", "OK" if ok else "FAILED")
        if args.write_docs and not args.short:
            write_docs(figures, args, ok)
        return 0 if ok else 1
    finally:
        cluster.shutdown()
        ray.shutdown()
        if local is not None:
            local.shutdown()


if __name__ == "__main__":
    sys.exit(main())
