"""Ape-X style distributed prioritized-replay DQN on Ray, coordinated by syncmgr.

Explorer actors play CartPole-v1 with their own epsilon (Ape-X's
``0.4 ** (1 + 7 i / (N - 1))``), compute n-step returns locally and add them
to one cpprb ``MPPrioritizedReplayBuffer``. The learner (this process) samples
with importance-sampling weights, trains a small numpy MLP Q-network (double
DQN, a target network, Huber loss, Adam with gradient clipping), writes the
new |TD| priorities back, pushes weights to each explorer through its own
Queue and evaluates the greedy policy until it solves the task. A Semaphore of
"step credits" paces the explorers so that every transition is replayed about
``--replay-ratio`` times: on a small machine the learner, not the explorers,
is the bottleneck. A stop Event ends the explorers.

With ``--ctx syncmgr`` (the default) the buffer uses cpprb's default
``sharedctypes`` backend with ``ctx=`` an embedded syncmgr daemon, so every
byte of replay memory is a segment in the daemon's registry, and all locks,
events, queues and counters are syncmgr objects. ``--ctx multiprocessing``
runs the same job on CPython's ``SyncManager`` with the authkey workaround
from cpprb's documentation (see ``install_authkey_workaround``).

    python examples/ray_replay_demo.py                 # learn, summarise, plot
    python examples/ray_replay_demo.py --ctx multiprocessing
    python examples/ray_replay_demo.py --compare       # both, ratios, docs/benchmarks.md

The exit status is 0 only if the greedy policy reached the target return and
the run left nothing behind in /dev/shm.
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import numpy as np

OBS_DIM, N_ACTIONS = 4, 2
ENV_ID = "CartPole-v1"
RANDOM_RETURN = 22.0  # mean return of a uniformly random policy on CartPole-v1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_BEGIN = "<!-- demo-compare:begin (written by `make demo-compare`; edit examples/ray_replay_demo.py) -->"
BENCH_END = "<!-- demo-compare:end -->"
COMPARE_MIN_UPDATES = 4000  # --compare: every run learns at least this long, so throughput is not start-up noise


@dataclasses.dataclass
class Config:
    """Every knob of a run; the defaults solve CartPole-v1 on 2 cores."""

    ctx: str = "syncmgr"
    seed: int = 0
    explorers: int = 2
    # Q-network and optimiser
    hidden: int = 64
    lr: float = 1e-3
    grad_clip: float = 10.0
    gamma: float = 0.99
    nstep: int = 3
    target_every: int = 200
    # replay
    buffer_size: int = 50_000
    batch_size: int = 64
    alpha: float = 0.6
    beta0: float = 0.4
    beta_updates: int = 10_000
    replay_ratio: float = 8.0
    warmup: int = 1_000
    chunk: int = 32
    # explorers
    eps_base: float = 0.4
    eps_exp: float = 7.0
    sync_every: int = 50
    # evaluation and stopping
    eval_every: int = 250
    eval_episodes: int = 10
    target_return: float = 195.0
    max_seconds: float = 300.0
    max_updates: int = 40_000
    min_updates: int = 0  # keep learning after solving until this many updates (steadier throughput figures)
    max_env_steps: int = 400_000
    num_cpus: int = 2

    def epsilons(self) -> list[float]:
        """Ape-X's per-explorer epsilons: explorer 0 explores most, the last least."""
        n = self.explorers
        if n == 1:
            return [self.eps_base]
        return [self.eps_base ** (1 + self.eps_exp * i / (n - 1)) for i in range(n)]


# --- the Q-network ------------------------------------------------------------------------


def q_forward(params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """Q-values of a ReLU MLP: params = [W1, b1, W2, b2, ..., Wk, bk], x (n, obs) -> (n, actions)."""
    h = x
    last = len(params) - 2
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i < last:
            h = np.maximum(h, 0.0)
    return h


class QNetwork:
    """A small MLP Q-network with a weighted Huber loss, its gradient and Adam."""

    def __init__(self, sizes: list[int], rng: np.random.Generator, lr: float = 1e-3,
                 grad_clip: float = 10.0) -> None:
        self.params: list[np.ndarray] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            scale = math.sqrt(2.0 / fan_in) if i < len(sizes) - 2 else math.sqrt(1.0 / fan_in)
            self.params.append((rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32))
            self.params.append(np.zeros(fan_out, np.float32))
        self.lr, self.grad_clip = lr, grad_clip
        self.b1, self.b2, self.eps = 0.9, 0.999, 1e-8
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.t = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return q_forward(self.params, x)

    def copy_params(self) -> list[np.ndarray]:
        return [p.copy() for p in self.params]

    def loss_and_grads(self, obs: np.ndarray, act: np.ndarray, target: np.ndarray,
                       weights: np.ndarray) -> tuple[float, np.ndarray, list[np.ndarray]]:
        """Loss mean(w * huber(Q(obs, act) - target)), the TD errors and d loss / d params."""
        acts = [obs]
        h = obs
        last = len(self.params) - 2
        for i in range(0, len(self.params), 2):
            h = h @ self.params[i] + self.params[i + 1]
            if i < last:
                h = np.maximum(h, 0.0)
                acts.append(h)
        rows = np.arange(len(act))
        td = h[rows, act] - target
        abs_td = np.abs(td)
        huber = np.where(abs_td <= 1.0, 0.5 * td * td, abs_td - 0.5)
        loss = float(np.mean(weights * huber))
        dq = np.zeros_like(h)
        dq[rows, act] = weights * np.clip(td, -1.0, 1.0) / len(act)
        grads: list[np.ndarray] = [np.empty(0)] * len(self.params)
        g = dq
        for i in range(len(self.params) - 2, -1, -2):
            a_in = acts[i // 2]
            grads[i] = a_in.T @ g
            grads[i + 1] = g.sum(axis=0)
            if i > 0:
                g = (g @ self.params[i].T) * (a_in > 0)
        return loss, td, grads

    def apply(self, grads: list[np.ndarray]) -> float:
        """One Adam step on grads clipped to a global norm of grad_clip; returns the norm before clipping."""
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        scale = min(1.0, self.grad_clip / (norm + 1e-6))
        self.t += 1
        lr_t = self.lr * math.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g = g * scale
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= (lr_t * m / (np.sqrt(v) + self.eps)).astype(p.dtype)
        return norm


# --- explorers -----------------------------------------------------------------------------


def install_authkey_workaround(encoded: str) -> None:
    """WORKAROUND (multiprocessing only; syncmgr needs none of this).

    A ``SyncManager`` proxy pickled by Ray arrives without the manager's
    authkey and would connect with this worker's own random key. cpprb's
    documentation (section "Ray") base64-encodes the learner's
    ``current_process().authkey`` and installs it in every worker with
    ``ray.worker.global_worker.run_function_on_all_workers``; that private
    function is gone from Ray 2.x, so the demo runs the same function at the
    start of each explorer, before any proxy is unpickled there. It replaces
    the whole process's key, which is why cpprb's documentation warns about it.
    """
    mp.current_process().authkey = base64.b64decode(encoded)


class Explorer:
    """One Ape-X explorer: epsilon-greedy CartPole with the newest weights it has."""

    def __init__(self, rank: int, cfg: dict, authkey_b64: Optional[str] = None) -> None:
        if authkey_b64 is not None:
            install_authkey_workaround(authkey_b64)  # before run()'s arguments (the proxies) are unpickled
        self.t_init = time.time()
        self.rank = rank
        self.cfg = Config(**cfg)
        self.eps = self.cfg.epsilons()[rank]

    def run(self, rb: Any, stop: Any, weights_q: Any, credits: Any, added_value: Any) -> dict:
        t_run = time.time()  # the arguments (proxies, the buffer) are unpickled and attached by now
        t_first_add = 0.0
        import gymnasium as gym

        cfg = self.cfg
        env = gym.make(ENV_ID)
        rng = np.random.default_rng(cfg.seed * 1000 + self.rank)
        obs, _ = env.reset(seed=cfg.seed * 1000 + self.rank)
        params: Optional[list[np.ndarray]] = None
        window: collections.deque = collections.deque()
        out: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next_obs", "discount")}
        gammas = cfg.gamma ** np.arange(cfg.nstep + 1)
        steps = added = episodes = pulls = add_calls = 0
        add_seconds = 0.0
        ep_return, returns = 0.0, collections.deque(maxlen=20)

        def emit(next_obs: np.ndarray, terminated: bool) -> None:
            # The oldest step of the window, with the discounted sum of the window's rewards.
            o, a, _ = window[0]
            out["obs"].append(o)
            out["act"].append(a)
            out["rew"].append(sum(gammas[i] * r for i, (_, _, r) in enumerate(window)))
            out["next_obs"].append(next_obs)
            out["discount"].append(0.0 if terminated else gammas[len(window)])
            window.popleft()

        while not stop.is_set():
            if not credits.acquire(timeout=0.2):
                continue
            try:
                params = weights_q.get_nowait()
                pulls += 1
            except queue.Empty:
                pass
            for _ in range(cfg.chunk):
                if params is None or rng.random() < self.eps:  # no weights yet: act randomly
                    act = int(rng.integers(N_ACTIONS))
                else:
                    act = int(np.argmax(q_forward(params, obs[None].astype(np.float32))[0]))
                next_obs, rew, terminated, truncated, _ = env.step(act)
                steps += 1
                ep_return += float(rew)
                window.append((obs, act, float(rew)))
                if terminated or truncated:
                    while window:
                        emit(next_obs, bool(terminated))
                    episodes += 1
                    returns.append(ep_return)
                    ep_return = 0.0
                    obs, _ = env.reset()
                else:
                    if len(window) == cfg.nstep:
                        emit(next_obs, False)
                    obs = next_obs
            if out["obs"]:
                t = time.perf_counter()
                rb.add(**{k: np.asarray(v) for k, v in out.items()})
                add_seconds += time.perf_counter() - t
                add_calls += 1
                if not t_first_add:
                    t_first_add = time.time()
                added += len(out["obs"])
                for v in out.values():
                    v.clear()
                added_value.value = added  # this explorer is the only writer
        env.close()
        return {"rank": self.rank, "eps": self.eps, "steps": steps, "added": added, "episodes": episodes,
                "weight_pulls": pulls, "add_calls": add_calls, "add_seconds": add_seconds,
                "mean_train_return": float(np.mean(returns)) if returns else 0.0,
                "t_init": self.t_init, "t_run": t_run, "t_first_add": t_first_add}


# --- evaluation, /dev/shm accounting, progress ---------------------------------------------


def evaluate(params: list[np.ndarray], episodes: int, seed: int) -> float:
    """Mean return of the greedy policy over `episodes` episodes, run side by side."""
    import gymnasium as gym

    envs = [gym.make(ENV_ID) for _ in range(episodes)]
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
    live = np.ones(episodes, bool)
    total = np.zeros(episodes)
    while live.any():
        acts = np.argmax(q_forward(params, obs), axis=1)
        for i in np.flatnonzero(live):
            o, r, term, trunc, _ = envs[i].step(int(acts[i]))
            total[i] += r
            obs[i] = o
            if term or trunc:
                live[i] = False
    for e in envs:
        e.close()
    return float(total.mean())


SHM_DIR = "/dev/shm"


class ShmWatch:
    """What this run put in /dev/shm: a snapshot before and after, and the names
    this process and its descendants (the daemon, Ray, the explorers) had mapped
    or open while it ran, so that a file another program made meanwhile is not
    blamed on the run (and one the run made is, whatever its prefix)."""

    def __init__(self) -> None:
        self.before = self.listing()
        self.touched: set[str] = set()

    @staticmethod
    def listing() -> set[str]:
        return set(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else set()

    def poll(self) -> None:
        import psutil  # a dependency of Ray

        me = psutil.Process()
        try:
            procs = [me, *me.children(recursive=True)]
        except psutil.Error:
            procs = [me]
        prefix = SHM_DIR + "/"
        for p in procs:
            pid = p.pid
            try:
                with open(f"/proc/{pid}/maps") as f:
                    for line in f:
                        i = line.find(prefix)
                        if i >= 0:
                            self.touched.add(line[i + len(prefix):].rstrip("\n").removesuffix(" (deleted)"))
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if target.startswith(prefix):
                        self.touched.add(target[len(prefix):].removesuffix(" (deleted)"))
            except OSError:
                continue  # exited meanwhile, or not ours to read

    def left(self, extra_names: set[str], prefixes: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
        """(files the run left behind, new files it never touched): a new file
        is the run's if its processes touched it, it is named in extra_names
        or it starts with one of prefixes (its own daemon's file prefix)."""
        new = self.listing() - self.before
        ours = sorted(n for n in new if n in self.touched or n in extra_names or (prefixes and n.startswith(prefixes)))
        return ours, sorted(new - set(ours))


class Progress:
    """On a terminal, a tqdm bar of the best greedy return against the target;
    otherwise (CI logs) a plain line every few seconds."""

    def __init__(self, target: float, every: float = 2.0, enabled: bool = True) -> None:
        self.enabled, self.every, self.last = enabled, every, 0.0
        self.bar: Any = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            try:
                sized = os.get_terminal_size(sys.stdout.fileno()).columns > 0
            except OSError:
                sized = False
            self.bar = tqdm(total=int(target), desc="best greedy return", leave=True, file=sys.stdout,
                            dynamic_ncols=sized, ncols=None if sized else 120,  # a pty without a size: 120
                            bar_format="{desc}: {n:.0f}/{total_fmt} |{bar}| {elapsed}{postfix}")

    def update(self, best: float, info: dict[str, str], force: bool = False) -> None:
        if self.bar is not None:
            self.bar.n = max(0.0, min(best, float(self.bar.total)))
            self.bar.set_postfix(info, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if self.enabled and (force or now - self.last >= self.every):
            self.last = now
            print("  " + "  ".join(f"{k} {v}" for k, v in info.items()), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- the learner -----------------------------------------------------------------------------


def make_context(kind: str) -> tuple[Any, dict, Optional[str], str]:
    """(manager, cpprb buffer kwargs, authkey for the workaround or None, label)."""
    if kind == "syncmgr":
        import syncmgr

        m = syncmgr.Manager()
        m.start()
        # cpprb's default backend ("sharedctypes") takes every array from ctx,
        # i.e. from the daemon's shared-memory registry.
        return m, {"ctx": m}, None, "syncmgr (embedded daemon, cpprb default sharedctypes backend)"
    if kind == "multiprocessing":
        m = mp.get_context().Manager()
        # cpprb's documented Ray set-up: SyncManager for locks and events, the
        # SharedMemory backend for data (sharedctypes memory cannot be pickled
        # into Ray workers), and the authkey workaround for the proxies.
        key = base64.b64encode(bytes(mp.current_process().authkey)).decode()
        return m, {"ctx": m, "backend": "SharedMemory"}, key, \
            "multiprocessing.SyncManager (cpprb SharedMemory backend, authkey workaround)"
    raise ValueError(f"unknown --ctx {kind!r}: syncmgr or multiprocessing")


def mapped_shm() -> set[str]:
    """The /dev/shm files this process has mapped (not counting unlinked ones, e.g. Ray's object store)."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            i = line.find(SHM_DIR + "/")
            if i >= 0 and not line.rstrip("\n").endswith(" (deleted)"):
                names.add(line[i + len(SHM_DIR) + 1:].rstrip("\n"))
    return names


def run(cfg: Config, *, progress: bool = True) -> dict:
    """One training run; returns its figures. Starts a local Ray cluster unless one is up."""
    import ray
    from cpprb import MPPrioritizedReplayBuffer

    t_wall0 = time.monotonic()
    watch = ShmWatch()
    if __name__ != "__main__":  # imported (e.g. by the tests): ship this module's code to the workers
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    m, rb_kwargs, authkey_b64, label = make_context(cfg.ctx)
    own_ray = not ray.is_initialized()
    if own_ray:
        try:
            # The manager is up first, so Ray's processes inherit the SYNCMGR_ADDRESS and
            # SYNCMGR_AUTHKEY it exported (or, with another daemon's already set, find the key
            # file beside this daemon's socket): no runtime_env needed on one host. A
            # runtime_env would cost Ray 1.5-2.5 s of worker set-up per explorer here.
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, configure_logging=False,
                     log_to_driver=True, object_store_memory=100 << 20)
        except BaseException:
            m.shutdown()
            raise
    registry: set[str] = set()
    prefixes: tuple[str, ...] = ()
    res: dict[str, Any] = {"ctx": cfg.ctx, "label": label, "config": dataclasses.asdict(cfg)}
    try:
        env_dict = {"obs": {"shape": OBS_DIM, "dtype": np.float32}, "act": {"dtype": np.int64},
                    "rew": {"dtype": np.float32}, "next_obs": {"shape": OBS_DIM, "dtype": np.float32},
                    "discount": {"dtype": np.float32}}
        before_buffer = mapped_shm()
        rb = MPPrioritizedReplayBuffer(cfg.buffer_size, env_dict, alpha=cfg.alpha, **rb_kwargs)
        # The buffer's memory: the /dev/shm files it made this process map, and
        # how many of them the daemon's registry holds (its shm_list request,
        # what `syncmgr status` shows).
        replay = mapped_shm() - before_buffer
        if cfg.ctx == "syncmgr":
            registry = {os.path.basename(s["path"]) for s in m._c().call("shm_list", {})["segments"]}
        res["replay_files"] = len(replay)
        res["replay_bytes"] = sum(os.stat(os.path.join(SHM_DIR, n)).st_size for n in replay
                                  if os.path.exists(os.path.join(SHM_DIR, n)))
        res["replay_in_registry"] = len(replay & registry)
        # The daemon names its files with a prefix of its own: any new file with it is this run's.
        common = os.path.commonprefix(sorted(registry)) if len(registry) > 1 else ""
        prefixes = (common[:common.rfind("-") + 1],) if common.count("-") >= 2 else ()
        stop = m.Event()
        credits = m.Semaphore(0)
        weight_qs = [m.Queue(maxsize=1) for _ in range(cfg.explorers)]
        added_values = [m.Value("q", 0) for _ in range(cfg.explorers)]
        opts: dict[str, Any] = {"num_cpus": min(1.0, cfg.num_cpus / (cfg.explorers + 1))}
        if cfg.ctx == "syncmgr" and not own_ray:
            opts["runtime_env"] = m.runtime_env()  # a cluster that was up before the manager: per actor
        actor_cls = ray.remote(Explorer).options(**opts)
        actors = [actor_cls.remote(i, dataclasses.asdict(cfg), authkey_b64) for i in range(cfg.explorers)]
        futures = [a.run.remote(rb, stop, weight_qs[i], credits, added_values[i]) for i, a in enumerate(actors)]
        res["t_launch"] = time.time()
        res["ray_start_seconds"] = time.monotonic() - t_wall0
        try:
            res.update(learn(cfg, rb, stop, credits, weight_qs, added_values, futures, watch, progress, ray))
        finally:
            stop.set()
            for _ in range(cfg.explorers):
                credits.release()  # no explorer stays parked on the semaphore
        explorers = ray.get(futures, timeout=120)
        res["explorers"] = explorers
        res["stored"] = rb.get_stored_size()
        watch.poll()
        if cfg.ctx == "syncmgr":
            registry |= {os.path.basename(s["path"]) for s in m._c().call("shm_list", {})["segments"]}
        for a in actors:
            ray.kill(a)
    finally:
        m.shutdown()
        if own_ray:
            ray.shutdown()
    res["wall_seconds"] = time.monotonic() - t_wall0
    left, foreign = watch.left(registry, prefixes)
    res["shm_prefixes"] = list(prefixes)
    res["shm_left"], res["shm_foreign"] = left, foreign
    res["shm_pending_atexit"] = []
    if cfg.ctx == "multiprocessing":
        # cpprb's SharedMemory backend unlinks its segments from an atexit hook
        # of this process: they are still there now and go when it exits.
        res["shm_pending_atexit"] = [n for n in left if n.startswith("psm_")]
    return res


def learn(cfg: Config, rb: Any, stop: Any, credits: Any, weight_qs: list, added_values: list,
          futures: list, watch: ShmWatch, progress: bool, ray: Any) -> dict:
    """Sample, train, update priorities, push weights and evaluate until solved or out of budget."""
    rng = np.random.default_rng(cfg.seed)
    sizes = [OBS_DIM, cfg.hidden, cfg.hidden, N_ACTIONS]
    net = QNetwork(sizes, rng, lr=cfg.lr, grad_clip=cfg.grad_clip)
    target = net.copy_params()
    for _ in range(math.ceil(cfg.warmup / cfg.chunk)):
        credits.release()
    credit_per_update = cfg.batch_size / cfg.replay_ratio
    credit = 0.0
    updates = samples = evals = pushes = 0
    t_sample = t_prio = t_train = 0.0
    curve: list[dict] = []
    series: list[dict] = []
    best = -math.inf
    solved_at: Optional[dict] = None
    reason = ""
    bar = Progress(cfg.target_return, enabled=progress)
    t0 = time.monotonic()
    last_tick = last_poll = t0
    last_added = last_samples = last_updates = 0
    added = 0
    t_first: Optional[float] = None  # the first update, after the warm-up

    def show(now: float, force: bool = False) -> None:
        bar.update(best if curve else 0.0,
                   {"t": f"{now - t0:.0f}s", "env steps": str(added), "updates": str(updates),
                    "last eval": f"{curve[-1]['return']:.0f}" if curve else "-",
                    "best": f"{best:.0f}" if curve else "-",
                    "updates/s": f"{updates / (now - t_first):.0f}" if t_first is not None and now > t_first
                    else "-"}, force)

    try:
        while True:
            now = time.monotonic()
            done, _ = ray.wait(futures, timeout=0)
            if done:
                ray.get(done)  # an explorer that ended early raises its error here
                reason = "an explorer stopped"
                break
            if now - last_tick >= 0.5 or updates == 0:
                added = sum(v.value for v in added_values)
                if now > last_tick:
                    series.append(rates(now - t0, now - last_tick, added - last_added, samples - last_samples,
                                        updates - last_updates))
                last_tick, last_added, last_samples, last_updates = now, added, samples, updates
                show(now)
                if now - last_poll >= 5.0:
                    watch.poll()
                    last_poll = now
            if now - t0 > cfg.max_seconds:
                reason = f"time budget ({cfg.max_seconds:.0f} s) reached"
                break
            if updates >= cfg.max_updates:
                reason = f"update budget ({cfg.max_updates}) reached"
                break
            if added >= cfg.max_env_steps:
                reason = f"environment-step budget ({cfg.max_env_steps}) reached"
                break
            if rb.get_stored_size() < cfg.warmup:
                time.sleep(0.02)
                added = sum(v.value for v in added_values)
                continue
            if t_first is None:
                t_first = time.monotonic()
            beta = cfg.beta0 + (1.0 - cfg.beta0) * min(1.0, updates / cfg.beta_updates)
            t = time.perf_counter()
            s = rb.sample(cfg.batch_size, beta)
            t_sample += time.perf_counter() - t
            t = time.perf_counter()
            act = s["act"].ravel().astype(np.int64)
            next_q_online = net(s["next_obs"])
            next_q_target = q_forward(target, s["next_obs"])
            best_next = next_q_target[np.arange(len(act)), np.argmax(next_q_online, axis=1)]
            y = s["rew"].ravel() + s["discount"].ravel() * best_next
            _, td, grads = net.loss_and_grads(s["obs"], act, y.astype(np.float32),
                                              s["weights"].ravel().astype(np.float32))
            net.apply(grads)
            t_train += time.perf_counter() - t
            t = time.perf_counter()
            rb.update_priorities(s["indexes"], np.abs(td).astype(np.float64))
            t_prio += time.perf_counter() - t
            updates += 1
            samples += len(act)
            credit += credit_per_update
            while credit >= cfg.chunk:
                credits.release()
                credit -= cfg.chunk
            if updates % cfg.target_every == 0:
                target = net.copy_params()
            if updates % cfg.sync_every == 0:
                push_weights(weight_qs, net.copy_params())
                pushes += 1
            if updates % cfg.eval_every == 0:
                ret = evaluate(net.params, cfg.eval_episodes, seed=10_000 + 100 * evals)
                evals += 1
                el = time.monotonic() - t0
                added = sum(v.value for v in added_values)
                curve.append({"t": el, "t_train": time.monotonic() - (t_first or t0), "updates": updates,
                              "env_steps": added, "return": ret})
                best = max(best, ret)
                first_solve = solved_at is None and ret >= cfg.target_return
                show(time.monotonic(), force=bar.bar is not None or first_solve)
                if first_solve:
                    solved_at = curve[-1]
                    reason = f"solved: greedy return {ret:.1f} >= {cfg.target_return:.0f}"
                if solved_at is not None and updates >= cfg.min_updates:
                    if updates > solved_at["updates"]:
                        reason += f"; kept on to {updates} updates (--min-updates) to measure throughput"
                    break
    finally:
        bar.close()
        stop.set()
    now = time.monotonic()
    learn_seconds = max(now - t0, 1e-9)
    train_seconds = max(now - (t_first if t_first is not None else now), 1e-9)
    added = sum(v.value for v in added_values)
    if now > last_tick:
        series.append(rates(now - t0, now - last_tick, added - last_added, samples - last_samples,
                            updates - last_updates))
    return {"reason": reason, "solved": solved_at is not None, "solved_at": solved_at, "curve": curve,
            "series": series, "best_return": best if curve else None, "updates": updates,
            "samples": samples, "learn_seconds": learn_seconds, "updating_seconds": train_seconds,
            "added_live": added, "weight_pushes": pushes,
            "sample_seconds": t_sample, "priority_seconds": t_prio, "train_seconds": t_train}


def rates(t: float, dt: float, added: int, samples: int, updates: int) -> dict:
    return {"t": t, "added_per_s": added / dt, "samples_per_s": samples / dt, "updates_per_s": updates / dt}


def push_weights(weight_qs: list, params: list[np.ndarray]) -> None:
    """Leave the newest weights in each explorer's one-slot queue, replacing stale ones."""
    for wq in weight_qs:
        try:
            wq.put_nowait(params)
        except queue.Full:
            try:
                wq.get_nowait()
            except queue.Empty:
                pass
            try:
                wq.put_nowait(params)
            except queue.Full:
                pass  # the explorer will take the next push


# --- reporting ---------------------------------------------------------------------------------


def milestones(curve: list[dict], levels: tuple[float, ...] = (50, 100, 150, 195)) -> list[tuple[float, dict]]:
    out = []
    for lv in levels:
        hit = next((c for c in curve if c["return"] >= lv), None)
        if hit is not None:
            out.append((lv, hit))
    return out


def summarize(res: dict) -> list[str]:
    cfg = res["config"]
    ex = res["explorers"]
    added = sum(e["added"] for e in ex)
    steps = sum(e["steps"] for e in ex)
    ls, us = res["learn_seconds"], res["updating_seconds"]
    add_calls = max(sum(e["add_calls"] for e in ex), 1)
    add_s = sum(e["add_seconds"] for e in ex)
    upd = max(res["updates"], 1)
    lines = ["", f"summary ({res['label']})",
             f"  outcome               {res['reason']}"]
    if res["solved_at"]:
        s = res["solved_at"]
        lines.append(f"  time to solve         {s['t_train']:.1f} s from the first update, {s['t']:.1f} s from "
                     f"launching the explorers  ({s['env_steps']} env steps, {s['updates']} updates)")
    lines.append(f"  best greedy return    {res['best_return'] if res['best_return'] is not None else '-'}"
                 f"  (mean of {cfg['eval_episodes']} episodes; random policy ~{RANDOM_RETURN:.0f})")
    lines.append("  return milestones     " + ("  ".join(
        f">={lv:.0f}: {c['t']:.0f}s/{c['env_steps']} steps" for lv, c in milestones(res["curve"])) or "none"))
    lines.append(f"  evaluations           {len(res['curve'])}: "
                 + " ".join(f"{c['return']:.0f}" for c in res["curve"]))
    lines += [
        f"  explorers             {len(ex)}, epsilon " + " / ".join(f"{e['eps']:.4f}" for e in ex)
        + ", mean return of their last 20 episodes " + " / ".join(f"{e['mean_train_return']:.0f}" for e in ex),
        f"  env steps             {steps}  ({sum(e['episodes'] for e in ex)} episodes)",
        f"  transitions added     {added}  ({cfg['nstep']}-step returns; stored {res['stored']})",
        f"  samples drawn         {res['samples']}  ({res['updates']} batches of {cfg['batch_size']})",
        f"  weight pushes taken   {sum(e['weight_pulls'] for e in ex)}",
        f"  replay memory         {res['replay_files']} files in /dev/shm, {res['replay_bytes'] / 2**20:.1f} MiB; "
        + (f"{res['replay_in_registry']} of them segments in syncmgr's registry" if res["ctx"] == "syncmgr" else
           "made by cpprb's SharedMemory backend, unknown to the manager"),
        f"  add throughput        {added / ls:8.0f} transitions/s   {1e3 * add_s / add_calls:6.2f} ms per add "
        f"({add_calls} calls, ~{added / add_calls:.0f} each)",
        f"  sample throughput     {res['samples'] / us:8.0f} samples/s       "
        f"{1e3 * res['sample_seconds'] / upd:6.2f} ms per sample({cfg['batch_size']})",
        f"  update throughput     {res['updates'] / us:8.0f} updates/s       "
        f"{1e3 * res['priority_seconds'] / upd:6.2f} ms per update_priorities, "
        f"{1e3 * res['train_seconds'] / upd:.2f} ms per gradient step",
        f"  wall time             {res['wall_seconds']:.1f} s  (Ray and explorers up in "
        f"{res['ray_start_seconds']:.1f} s, learning {ls:.1f} s of which updating {us:.1f} s)",
    ]
    left = [n for n in res["shm_left"] if n not in res["shm_pending_atexit"]]
    if not res["shm_left"]:
        lines.append("  /dev/shm              nothing left behind")
    if left:
        lines.append(f"  /dev/shm              LEFT BEHIND: {len(left)} files: {' '.join(left[:20])}")
    if res["shm_pending_atexit"]:
        lines.append(f"  /dev/shm              {len(res['shm_pending_atexit'])} cpprb SharedMemory files still "
                     "present; cpprb unlinks them from an atexit hook when this process exits "
                     "(a killed learner leaks them)")
    if res["shm_foreign"]:
        lines.append(f"  /dev/shm              ({len(res['shm_foreign'])} new files never mapped or opened by this "
                     "run's processes: another program's)")
    return lines


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    curve, series = res["curve"], res["series"]
    ax1.plot([c["t"] for c in curve], [c["return"] for c in curve], marker="o", ms=3, label="greedy evaluation")
    ax1.axhline(res["config"]["target_return"], color="g", ls="--", lw=1, label="target")
    ax1.axhline(RANDOM_RETURN, color="grey", ls=":", lw=1, label="random policy")
    ax1.set_ylabel(f"mean return ({res['config']['eval_episodes']} episodes)")
    ax1.set_ylim(bottom=0)
    ax1.set_title(f"Ape-X DQN on {ENV_ID}: {res['label']}", fontsize=9)
    ax1.legend(loc="upper left", fontsize=8)
    t = [p["t"] for p in series]
    ax2.plot(t, [p["added_per_s"] for p in series], marker=".", label="transitions added/s")
    ax2.plot(t, [p["samples_per_s"] for p in series], marker=".",
             label=f"samples drawn/s ({res['config']['batch_size']} per learner update)")
    ax2.set_ylabel("transitions per second")
    ax2.legend(loc="upper right", fontsize=8)
    ax2.set_xlabel("seconds since the explorers started")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = Config()
    p.add_argument("--ctx", choices=["syncmgr", "multiprocessing"], default=d.ctx)
    for f in dataclasses.fields(Config):
        if f.name in ("ctx",):
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)), default=getattr(d, f.name))
    p.add_argument("--plot", default=None, help="PNG path (default: a file in the temp directory)")
    p.add_argument("--json", default=None, help="also write the figures as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--compare", action="store_true",
                   help="run syncmgr and multiprocessing, print the ratios, update docs/benchmarks.md")
    p.add_argument("--repeats", type=int, default=5,
                   help="with --compare: runs per context (seeds --seed, --seed+1, ...), interleaved")
    p.add_argument("--no-docs", action="store_true", help="with --compare: do not touch docs/benchmarks.md")
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> Config:
    return Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.compare:
        return compare(args, argv if argv is not None else sys.argv[1:])
    cfg = config_from(args)
    print(f"Ape-X DQN on {ENV_ID}: {cfg.explorers} explorers, seed {cfg.seed}, ctx {cfg.ctx}; "
          f"target: greedy return >= {cfg.target_return:.0f} within {cfg.max_seconds:.0f} s, "
          f"{cfg.max_updates} updates, {cfg.max_env_steps} env steps", flush=True)
    res = run(cfg, progress=not args.quiet)
    for line in summarize(res):
        print(line)
    path = args.plot or os.path.join(tempfile.gettempdir(), f"syncmgr-demo-{os.getuid()}",
                                     f"ray_replay_demo-{cfg.ctx}.png")
    plot(res, path)
    print(f"  plot                  {path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    left = [n for n in res["shm_left"] if n not in res["shm_pending_atexit"]]
    if not res["solved"]:
        print(f"demo FAILED: the policy did not reach {cfg.target_return:.0f} ({res['reason']})", file=sys.stderr)
        return 1
    if left:
        print(f"demo FAILED: {len(left)} files left in /dev/shm", file=sys.stderr)
        return 1
    if res["shm_pending_atexit"]:
        print("demo finished OK: learned; cpprb's atexit hook removes its /dev/shm files as this process exits")
    else:
        print("demo finished OK: learned, nothing left behind")
    return 0


# --- syncmgr against SyncManager ---------------------------------------------------------------


def _child_run(ctx: str, extra: list[str], out: str) -> tuple[int, dict, list[str]]:
    """One run in a fresh interpreter; returns (exit code, figures, /dev/shm files left after it exited)."""
    before = ShmWatch.listing()
    cmd = [sys.executable, os.path.abspath(__file__), "--ctx", ctx, "--json", out, *extra]
    print(f"\n=== {ctx}: {' '.join(cmd[1:])}", flush=True)
    rc = subprocess.call(cmd)
    after = ShmWatch.listing()
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError):
        return rc, {}, []
    # Only the names the child's run itself saw (a neighbour's files are not its fault).
    touched = set(res.get("shm_left", [])) | set(res.get("shm_pending_atexit", []))
    left_after_exit = sorted((after - before) & touched)
    return rc, res, left_after_exit


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    skip = {"--compare", "--no-docs"}
    extra: list[str] = []
    it = iter(argv)
    for a in it:
        if a in skip:
            continue
        if a in ("--repeats", "--ctx", "--json", "--plot", "--seed"):
            next(it, None)
            continue
        if a.startswith(("--repeats=", "--ctx=", "--json=", "--plot=", "--seed=")):
            continue
        extra.append(a)
    if "--quiet" not in extra:
        extra.append("--quiet")
    if not any(a.startswith("--min-updates") for a in extra):
        extra += ["--min-updates", str(COMPARE_MIN_UPDATES)]
    order: list[tuple[str, int]] = []  # both contexts get the same seeds, in alternating order
    for r in range(args.repeats):
        pair = ["syncmgr", "multiprocessing"] if r % 2 == 0 else ["multiprocessing", "syncmgr"]
        order += [(ctx, args.seed + r) for ctx in pair]
    runs: dict[str, list[dict]] = {"syncmgr": [], "multiprocessing": []}
    failures = []
    with tempfile.TemporaryDirectory(prefix="syncmgr-demo-compare-") as tmp:
        for i, (ctx, seed) in enumerate(order):
            rc, res, left_after = _child_run(ctx, extra + ["--seed", str(seed), "--plot", os.path.join(
                tempfile.gettempdir(), f"syncmgr-demo-{os.getuid()}", f"ray_replay_demo-{ctx}-seed{seed}.png")],
                os.path.join(tmp, f"{i}.json"))
            if not res:
                failures.append(f"{ctx} run {i} produced no figures (exit {rc})")
                continue
            res["rc"], res["shm_left_after_exit"] = rc, left_after
            runs[ctx].append(res)
    lines = compare_table(runs)
    print()
    for line in lines:
        print(line)
    for f in failures:
        print("error: " + f, file=sys.stderr)
    if not args.no_docs and all(runs.values()):
        write_bench_section(lines)
        print(f"\nwrote the comparison into {os.path.join(REPO, 'docs', 'benchmarks.md')}")
    return 0 if not failures and all(runs.values()) else 1


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def compare_table(runs: dict[str, list[dict]]) -> list[str]:
    def fig(res: dict) -> dict[str, float]:
        ex = res["explorers"]
        ls, us = res["learn_seconds"], res["updating_seconds"]
        upd = max(res["updates"], 1)
        return {"solve": res["solved_at"]["t_train"] if res["solved_at"] else float("nan"),
                "solve_launch": res["solved_at"]["t"] if res["solved_at"] else float("nan"),
                "steps": res["solved_at"]["env_steps"] if res["solved_at"] else float("nan"),
                "upd_solve": res["solved_at"]["updates"] if res["solved_at"] else float("nan"),
                "add": sum(e["added"] for e in ex) / ls, "sample": res["samples"] / us,
                "updates": res["updates"] / us,
                "add_ms": 1e3 * sum(e["add_seconds"] for e in ex) / max(sum(e["add_calls"] for e in ex), 1),
                "sample_ms": 1e3 * res["sample_seconds"] / upd, "prio_ms": 1e3 * res["priority_seconds"] / upd}

    figs = {k: [fig(r) for r in v] for k, v in runs.items()}
    med = {k: {f: _median([x[f] for x in v]) for f in (v[0] if v else {})} for k, v in figs.items()}
    s, p = med.get("syncmgr", {}), med.get("multiprocessing", {})
    rows = [("time to solve from the first update (s)", "solve", "lower"),
            ("time to solve from launching the explorers (s)", "solve_launch", "lower"),
            ("env steps to solve", "steps", "lower"), ("updates to solve", "upd_solve", "lower"),
            ("transitions added/s", "add", "higher"), ("samples drawn/s", "sample", "higher"),
            ("learner updates/s", "updates", "higher"), ("ms per add (~32 transitions)", "add_ms", "lower"),
            ("ms per sample(64)", "sample_ms", "lower"), ("ms per update_priorities(64)", "prio_ms", "lower")]
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    n = {k: len(v) for k, v in runs.items()}
    out = [f"Ape-X DQN on {ENV_ID}, syncmgr against multiprocessing.SyncManager "
           f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
           f"{os.cpu_count()} CPUs, load average {load} (1/5/15 min), Python {platform.python_version()}; "
           f"medians of {n.get('syncmgr', 0)} + {n.get('multiprocessing', 0)} runs, interleaved)", "",
           "| figure | better | syncmgr | SyncManager | syncmgr / SyncManager |", "|---|---|---:|---:|---:|"]

    def num(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.0f}" if abs(x) >= 100 else f"{x:.2f}"

    for title, key, better in rows:
        a, b = s.get(key, float("nan")), p.get(key, float("nan"))
        ratio = a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")
        out.append(f"| {title} | {better} | {num(a)} | {num(b)} | {num(ratio)} |")
    out.append("")
    for k, v in runs.items():
        solved = sum(1 for r in v if r["solved"])
        left = max((len(r.get("shm_left_after_exit", [])) for r in v), default=0)
        pend = max((len(r.get("shm_pending_atexit", [])) for r in v), default=0)
        at_end = f"{pend} files per run waiting for cpprb's atexit hook" if pend else "nothing left"
        after = f"{left} files left" if left else "nothing left"
        out.append(f"- {k}: solved {solved}/{len(v)}; /dev/shm at the end of the job: {at_end}; "
                   f"after the process exited: {after}")
    for k, v in runs.items():
        per = "; ".join(f"seed {r['config']['seed']}: {r['solved_at']['updates']} updates, "
                        f"{r['solved_at']['t_train']:.1f} s" if r["solved_at"] else f"seed {r['config']['seed']}: -"
                        for r in v)
        out.append(f"- {k}, to solve: {per}")
    out += ["", "The explorers run asynchronously, so even with the same seed every run takes its own "
            "learning path: read the time-to-solve ratio beside the env-steps-to-solve ratio (a run that "
            "needed twice the steps took twice the time whatever the manager). The throughput rows and "
            "the time per call measure the coordination itself."]
    return out


def write_bench_section(lines: list[str]) -> None:
    """Replace (or append) the demo's own section of docs/benchmarks.md, between its markers."""
    path = os.path.join(REPO, "docs", "benchmarks.md")
    text = open(path).read() if os.path.exists(path) else ""
    body = "\n".join([BENCH_BEGIN, "## The Ray replay demo: syncmgr against SyncManager", "",
                      "`make demo-compare` runs `examples/ray_replay_demo.py` on both contexts in fresh "
                      "processes, interleaved, with the same seeds, and writes this section (the rest of the "
                      "file is `make bench`'s). Each run learns for at least "
                      f"{COMPARE_MIN_UPDATES} updates so that the throughput is not start-up noise; the time "
                      "to solve is the first evaluation at or above the target. Explorers are paced by the "
                      "learner, so transitions added/s follows the learner's speed; the time per call is the "
                      "direct measure of the replay buffer's coordination.", "",
                      *lines, BENCH_END])
    start, end = text.find(BENCH_BEGIN.split(" (")[0]), text.find(BENCH_END)  # the marker's fixed part
    if start >= 0 and end > start:
        text = text[:start] + body + text[end + len(BENCH_END):]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
