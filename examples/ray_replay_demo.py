"""Distributed prioritized replay on Ray, coordinated by syncmgr.

A learner (this process) owns a cpprb ``MPPrioritizedReplayBuffer`` whose
locks and events live in an embedded syncmgr daemon and whose data lives in
shared memory. Explorer actors on ``CartPole-v1`` add transitions in local
batches, check a stop Event on every step and pull policy weights from a
Queue each. The learner samples, trains a linear Q-function, updates the
priorities and pushes weights back. No authkey hack: the actors get the
daemon's address and key through ``runtime_env``.

    python examples/ray_replay_demo.py --explorers 4 --steps 20000
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from typing import Any

import numpy as np

import syncmgr

OBS_DIM, N_ACTIONS = 4, 2


def q_values(w: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Linear Q-function: obs (n, 4) -> (n, 2). w has shape (5, 2)."""
    return obs @ w[:OBS_DIM] + w[OBS_DIM]


def explorer_main(rank: int, rb: Any, stop: Any, weights_q: Any, steps: int, local_batch: int, seed: int) -> dict:
    """One explorer: act epsilon-greedily, add transitions in local batches."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed + rank)
    obs, _ = env.reset(seed=seed + rank)
    w = np.zeros((OBS_DIM + 1, N_ACTIONS))
    buf: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next_obs", "done")}
    added = episodes = weight_updates = 0
    for _ in range(steps):
        if stop.is_set():
            break
        try:
            w = weights_q.get_nowait()
            weight_updates += 1
        except queue.Empty:
            pass
        eps = 0.1
        act = int(rng.integers(N_ACTIONS)) if rng.random() < eps else int(np.argmax(q_values(w, obs[None])[0]))
        next_obs, rew, terminated, truncated, _ = env.step(act)
        for k, v in (("obs", obs), ("act", act), ("rew", rew), ("next_obs", next_obs), ("done", terminated)):
            buf[k].append(v)
        obs = next_obs
        if terminated or truncated:
            episodes += 1
            obs, _ = env.reset()
        if len(buf["obs"]) >= local_batch:
            rb.add(**{k: np.asarray(v) for k, v in buf.items()})
            added += len(buf["obs"])
            for v in buf.values():
                v.clear()
    if buf["obs"]:
        rb.add(**{k: np.asarray(v) for k, v in buf.items()})
        added += len(buf["obs"])
    return {"rank": rank, "added": added, "episodes": episodes, "weight_updates": weight_updates}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--explorers", type=int, default=4)
    p.add_argument("--steps", type=int, default=20000, help="environment steps per explorer")
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--local-batch", type=int, default=32, help="transitions an explorer adds at once")
    p.add_argument("--batch-size", type=int, default=64, help="learner sample size")
    p.add_argument("--max-seconds", type=float, default=120.0, help="stop the run after this long")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    args = p.parse_args(argv)

    import ray
    from cpprb import MPPrioritizedReplayBuffer

    env_dict = {"obs": {"shape": OBS_DIM}, "act": {"dtype": np.int64}, "rew": {},
                "next_obs": {"shape": OBS_DIM}, "done": {}}
    t0 = time.monotonic()
    ok = False
    with syncmgr.Manager() as m:
        rb = MPPrioritizedReplayBuffer(args.buffer_size, env_dict, alpha=0.6, ctx=m, backend="SharedMemory")
        stop = m.Event()
        weight_qs = [m.Queue(maxsize=1) for _ in range(args.explorers)]
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=True,
                 runtime_env=m.runtime_env(), configure_logging=False)
        try:
            explorer = ray.remote(num_cpus=args.num_cpus / (args.explorers + 1))(explorer_main)
            futures = [explorer.remote(i, rb, stop, weight_qs[i], args.steps, args.local_batch, args.seed)
                       for i in range(args.explorers)]
            stats = learn(args, rb, stop, weight_qs, futures, t0, ray)
            results = ray.get(futures, timeout=60)
            stats["stored"] = rb.get_stored_size()  # after the last add
            ok = True
        finally:
            stop.set()
            ray.shutdown()
    wall = time.monotonic() - t0
    if not ok:
        return 1
    added = sum(r["added"] for r in results)
    print()
    print("summary")
    print(f"  explorers            {args.explorers}")
    print(f"  transitions added    {added}  ({sum(r['episodes'] for r in results)} episodes)")
    print(f"  stored in buffer     {stats['stored']}")
    print(f"  samples drawn        {stats['samples']}  ({stats['batches']} batches of {args.batch_size})")
    print(f"  weight pushes taken  {sum(r['weight_updates'] for r in results)}")
    print(f"  add throughput       {added / stats['learn_seconds']:.0f} transitions/s")
    print(f"  sample throughput    {stats['samples'] / stats['learn_seconds']:.0f} samples/s")
    episodes = max(sum(r["episodes"] for r in results), 1)
    print(f"  mean episode length  {added / episodes:.1f} steps (CartPole-v1, epsilon-greedy explorers)")
    print(f"  wall time            {wall:.1f} s")
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("syncmgr-")] if os.path.isdir("/dev/shm") else []
    if stats["stored"] != min(added, args.buffer_size):
        expected = min(added, args.buffer_size)
        print(f"error: buffer holds {stats['stored']} transitions, expected {expected}", file=sys.stderr)
        return 1
    if leftovers:
        print(f"error: files left in /dev/shm: {leftovers}", file=sys.stderr)
        return 1
    print("demo finished OK")
    return 0


def learn(args: argparse.Namespace, rb: Any, stop: Any, weight_qs: list, futures: list, t0: float, ray: Any) -> dict:
    """Sample, train, update priorities and push weights until the explorers finish."""
    rng = np.random.default_rng(args.seed)
    w = rng.normal(scale=0.01, size=(OBS_DIM + 1, N_ACTIONS))
    gamma, lr = 0.99, 0.01
    samples = batches = 0
    start = last_print = time.monotonic()
    pending = list(futures)
    while pending:
        _, pending = ray.wait(pending, timeout=0)
        if time.monotonic() - t0 > args.max_seconds:
            print("\ntime budget reached; stopping explorers", file=sys.stderr)
            stop.set()
            break
        if rb.get_stored_size() < args.batch_size:
            time.sleep(0.01)
            continue
        s = rb.sample(args.batch_size, beta=0.4)
        obs, next_obs = s["obs"], s["next_obs"]
        act = s["act"].astype(np.int64).ravel()
        rew, done = s["rew"].ravel(), s["done"].ravel()
        q = q_values(w, obs)[np.arange(len(act)), act]
        target = rew + gamma * (1.0 - done) * q_values(w, next_obs).max(axis=1)
        td = target - q
        g = (s["weights"].ravel() * td)[:, None]
        x = np.hstack([obs, np.ones((len(obs), 1))])
        for a in range(N_ACTIONS):
            sel = act == a
            w[:, a] += lr * (x[sel] * g[sel]).mean(axis=0) if sel.any() else 0.0
        rb.update_priorities(s["indexes"], np.abs(td) + 1e-3)
        samples += len(act)
        batches += 1
        if batches % 20 == 0:
            for wq in weight_qs:
                try:
                    wq.put_nowait(w.copy())
                except queue.Full:
                    pass
        now = time.monotonic()
        if not args.quiet and now - last_print > 0.5:
            last_print = now
            el = now - start
            print(f"\r  stored {rb.get_stored_size():>7}  sampled {samples:>8}  "
                  f"{samples / el:>8.0f} samples/s  {el:5.1f}s", end="", flush=True)
    learn_seconds = max(time.monotonic() - start, 1e-9)
    return {"samples": samples, "batches": batches, "stored": rb.get_stored_size(), "learn_seconds": learn_seconds}


if __name__ == "__main__":
    sys.exit(main())
