"""The explorers and the evaluator: the code that runs beside the learner.

An explorer plays its environment with its own Ape-X epsilon
(``0.4 ** (1 + 7 i / (N - 1))``) and the newest published weights, turns its
steps into n-step transitions (bootstrapping with ``gamma ** k`` on a
time-limit cut, not at all on a terminal state), computes each transition's
initial priority from its own TD error (Ape-X) and adds them to the shared
buffer with ``add(priorities=...)``, once the rate limiter lets it. Each
finished episode goes to the learner through the stats Queue.

The evaluator waits for weights at least ``eval_every`` updates newer than
the last ones it judged, plays ``eval_episodes`` greedy episodes on seeds
derived from the run's seed and sends the result (with the version it
judged) to the learner through the evaluations Queue. It runs out of the
learner's loop, so the learner's throughput is the learner's alone.

``ExplorerActor`` and ``EvaluatorActor`` are the Ray actor classes;
``explore`` and ``evaluate_loop`` are the loops they (or forked processes) run.
"""

from __future__ import annotations

import base64
import collections
import multiprocessing as mp
import os
import time
from typing import Any, Optional

import numpy as np

from .config import Config
from .qnet import greedy_returns, q_forward


def install_authkey_workaround(encoded: str) -> None:
    """WORKAROUND (``SyncManager`` only; syncmgr needs none of this).

    A ``SyncManager`` proxy pickled by Ray arrives without the manager's
    authkey and would connect with this worker's own random key. cpprb's
    documentation (section "Ray") base64-encodes the learner's
    ``current_process().authkey`` and installs it in every worker with
    ``ray.worker.global_worker.run_function_on_all_workers``; that private
    function is gone from Ray 2.x, so each actor runs the same function first
    thing, before any proxy is unpickled there. It replaces the whole
    process's key, which is why cpprb's documentation warns about it.
    """
    mp.current_process().authkey = base64.b64decode(encoded)


class ExplorerCore:
    """One explorer's environment, epsilon, n-step window and current weights."""

    def __init__(self, rank: int, cfg: Config) -> None:
        import gymnasium as gym

        self.rank, self.cfg = rank, cfg
        self.eps = cfg.epsilons()[rank]
        self.env = gym.make(cfg.env)
        self.rng = np.random.default_rng([cfg.seed, 1000 + rank])
        self.obs, _ = self.env.reset(seed=cfg.seed * 1000 + rank)
        self.params: Optional[list[np.ndarray]] = None
        self.version = -1
        self.window: collections.deque = collections.deque()
        self.out: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next_obs", "discount")}
        self.gammas = cfg.gamma ** np.arange(cfg.nstep + 1)
        self.steps = self.episodes = self.added = 0
        self.ep_return, self.ep_len = 0.0, 0

    def _emit(self, next_obs: np.ndarray, terminated: bool) -> None:
        # The oldest step of the window, with the discounted sum of the window's rewards.
        o, a, _ = self.window[0]
        self.out["obs"].append(o)
        self.out["act"].append(a)
        self.out["rew"].append(sum(self.gammas[i] * r for i, (_, _, r) in enumerate(self.window)))
        self.out["next_obs"].append(next_obs)
        self.out["discount"].append(0.0 if terminated else self.gammas[len(self.window)])
        self.window.popleft()

    def chunk(self) -> tuple[Optional[dict[str, np.ndarray]], list[dict]]:
        """Take cfg.chunk env steps: (transitions with their 'priorities', or None; finished episodes)."""
        cfg, finished = self.cfg, []
        for _ in range(cfg.chunk):
            if self.params is None or self.rng.random() < self.eps:
                act = int(self.rng.integers(cfg.spec.n_actions))
            else:
                act = int(np.argmax(q_forward(self.params, self.obs[None].astype(np.float32))[0]))
            next_obs, rew, terminated, truncated, _ = self.env.step(act)
            self.steps += 1
            self.ep_return += float(rew)
            self.ep_len += 1
            self.window.append((self.obs, act, float(rew)))
            if terminated or truncated:
                while self.window:
                    self._emit(next_obs, bool(terminated))
                self.episodes += 1
                finished.append({"rank": self.rank, "return": self.ep_return, "length": self.ep_len,
                                 "explorer_steps": self.steps, "t": time.time()})
                self.ep_return, self.ep_len = 0.0, 0
                self.obs, _ = self.env.reset()
            else:
                if len(self.window) == cfg.nstep:
                    self._emit(next_obs, False)
                self.obs = next_obs
        if not self.out["obs"]:
            return None, finished
        batch = {k: np.asarray(v, np.float32 if k != "act" else np.int64) for k, v in self.out.items()}
        for v in self.out.values():
            v.clear()
        batch["priorities"] = self.priorities(batch)
        return batch, finished

    def priorities(self, b: dict[str, np.ndarray]) -> np.ndarray:
        """Ape-X initial priorities: |TD error| of each transition under this explorer's weights
        (max priority, cpprb's default, only before the first weights arrive)."""
        if self.params is None:
            return np.ones(len(b["act"]), np.float64)
        q = q_forward(self.params, np.concatenate([b["obs"], b["next_obs"]]))
        q_obs, q_next = q[:len(b["act"])], q[len(b["act"]):]
        target = b["rew"] + b["discount"] * q_next.max(axis=1)
        td = np.abs(target - q_obs[np.arange(len(b["act"])), b["act"]]).astype(np.float64) + 1e-6
        return np.where(np.isfinite(td), td, 1.0)  # a non-finite priority would poison the sum tree

    def close(self) -> None:
        self.env.close()


def explore(rank: int, cfg: Config, rb: Any, limiter: Any, weights: Any, stop: Any, stats_q: Any) -> dict:
    """An explorer's whole life: act, add when the limiter allows, until stop; returns its figures."""
    t_start = time.time()
    core = ExplorerCore(rank, cfg)
    pulls = add_calls = 0
    add_seconds = wait_seconds = 0.0
    try:
        while not stop.is_set():
            got = weights.read(core.version)  # one fast read of the version when nothing changed
            if got is not None:
                core.version, core.params, _ = got
                pulls += 1
            batch, finished = core.chunk()
            for ep in finished:
                stats_q.put(ep)
            if batch is None:
                continue
            n = len(batch["act"])
            t = time.perf_counter()
            while not limiter.insert(n, timeout=0.5):
                if limiter.is_stopped() or stop.is_set():
                    break
            wait_seconds += time.perf_counter() - t
            if limiter.is_stopped() or stop.is_set():
                break
            t = time.perf_counter()
            rb.add(**batch)
            add_seconds += time.perf_counter() - t
            add_calls += 1
            core.added += n
    finally:
        core.close()
    return {"rank": rank, "eps": core.eps, "steps": core.steps, "added": core.added, "episodes": core.episodes,
            "weight_pulls": pulls, "weight_retries": weights.retries, "add_calls": add_calls,
            "add_seconds": add_seconds, "limiter_wait_seconds": wait_seconds, "t_start": t_start}


def evaluate_loop(cfg: Config, weights: Any, stop: Any, evals_q: Any) -> dict:
    """Judge published weights every cfg.eval_every updates until stop; returns its figures."""
    k, last, last_updates, busy = 0, -1, -cfg.eval_every, 0.0
    while not stop.is_set():
        got = weights.read(last)
        if got is None or got[2]["updates"] < last_updates + cfg.eval_every:
            stop.wait(0.05)
            continue
        version, params, head = got
        last, last_updates = version, head["updates"]
        t = time.perf_counter()
        seeds = cfg.eval_seeds(k)
        returns = greedy_returns(params, cfg.env, seeds)
        busy += time.perf_counter() - t
        evals_q.put({"k": k, "version": version, "updates": head["updates"], "env_steps": head["env_steps"],
                     "mean_return": float(np.mean(returns)), "min_return": float(np.min(returns)),
                     "episodes": len(returns), "seeds": seeds, "t": time.time(), "eval_seconds": busy})
        k += 1
    return {"evaluations": k, "busy_seconds": busy, "pid": os.getpid()}


class ExplorerActor:
    """A Ray actor around ``explore``."""

    def __init__(self, rank: int, cfg: dict, authkey_b64: Optional[str] = None) -> None:
        if authkey_b64 is not None:
            install_authkey_workaround(authkey_b64)  # before run()'s arguments (the proxies) are unpickled
        self.rank, self.cfg = rank, Config(**cfg)

    def ready(self) -> float:
        import gymnasium  # noqa: F401  (imported here, so start-up time is counted as start-up)

        return time.time()

    def run(self, rb: Any, limiter: Any, weights: Any, stop: Any, stats_q: Any) -> dict:
        return explore(self.rank, self.cfg, rb, limiter, weights, stop, stats_q)


class EvaluatorActor:
    """A Ray actor around ``evaluate_loop``."""

    def __init__(self, cfg: dict, authkey_b64: Optional[str] = None) -> None:
        if authkey_b64 is not None:
            install_authkey_workaround(authkey_b64)
        self.cfg = Config(**cfg)

    def ready(self) -> float:
        import gymnasium  # noqa: F401

        return time.time()

    def run(self, weights: Any, stop: Any, evals_q: Any) -> dict:
        return evaluate_loop(self.cfg, weights, stop, evals_q)
