"""Every knob of a run, the environments the demo knows, and how it picks its defaults."""

from __future__ import annotations

import dataclasses
import os

import numpy as np


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """An environment and its solve rule: gymnasium's registered reward_threshold."""

    id: str
    obs_dim: int
    n_actions: int
    threshold: float
    random_return: float  # mean return of a uniformly random policy, for the plot
    overrides: tuple[tuple[str, object], ...] = ()  # Config defaults of its own (a flag given wins)


ENVS = {
    "CartPole-v1": EnvSpec("CartPole-v1", 4, 2, 475.0, 22.0),
    # Longer episodes (up to 1000 steps), 8 inputs, 4 actions: a wider network, a bigger buffer,
    # rarer evaluations and a longer budget.
    "LunarLander-v3": EnvSpec("LunarLander-v3", 8, 4, 200.0, -180.0,
                              (("hidden", 128), ("buffer_size", 200_000), ("target_every", 500),
                               ("eval_every", 2_000), ("max_seconds", 900.0), ("max_env_steps", 3_000_000))),
}

SETUPS = ("syncmgr", "syncmanager", "mp", "single")


def machine_cpus() -> int:
    """The CPUs this process may run on (the affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_explorers(cpus: int) -> int:
    """Two explorers on up to 3 CPUs; beyond that one per CPU left after the learner and the evaluator."""
    return max(2, min(cpus - 2, 32))


@dataclasses.dataclass
class Config:
    """Every knob of a run; the defaults learn CartPole-v1 on 2 cores."""

    env: str = "CartPole-v1"
    setup: str = "syncmgr"
    seed: int = 0
    explorers: int = 0  # 0: default_explorers(the machine's CPUs)
    # Q-network and optimiser
    hidden: int = 64
    lr: float = 1e-3
    grad_clip: float = 10.0
    gamma: float = 0.99
    nstep: int = 3
    target_every: int = 200
    # replay and the rate limiter
    buffer_size: int = 50_000
    batch_size: int = 64
    alpha: float = 0.6
    beta0: float = 0.4
    beta_updates: int = 10_000
    replay_ratio: float = 8.0  # target samples drawn per transition inserted
    tolerance: int = 0  # the limiter's error buffer, in samples; 0: from the explorer count
    warmup: int = 1_000  # transitions inserted before the first sample
    chunk: int = 32  # env steps an explorer takes between adds
    # explorers
    eps_base: float = 0.4
    eps_exp: float = 7.0
    publish_every: int = 50  # learner updates between two weight publications
    # evaluation and stopping
    eval_every: int = 500  # the evaluator waits for this many more updates before the next evaluation
    eval_episodes: int = 20
    solve_streak: int = 3  # evaluations in a row at or above the threshold
    threshold: float = 0.0  # 0: the environment's reward_threshold
    max_seconds: float = 150.0  # learning budget, from the moment the explorers start
    max_updates: int = 100_000
    max_env_steps: int = 1_000_000
    num_cpus: int = 0  # 0: the machine's

    def resolved(self) -> Config:
        """The same config with every 0-means-default field filled in."""
        spec = ENVS[self.env]
        cpus = self.num_cpus or machine_cpus()
        explorers = self.explorers or default_explorers(cpus)
        tol = self.tolerance or default_tolerance(explorers, self.chunk, self.nstep, self.replay_ratio,
                                                  self.batch_size)
        return dataclasses.replace(self, num_cpus=cpus, explorers=explorers, tolerance=tol,
                                   threshold=self.threshold or spec.threshold)

    @property
    def spec(self) -> EnvSpec:
        return ENVS[self.env]

    def epsilons(self) -> list[float]:
        """Ape-X's per-explorer epsilons: explorer 0 explores most, the last least."""
        n = self.explorers
        if n == 1:
            return [self.eps_base]
        return [self.eps_base ** (1 + self.eps_exp * i / (n - 1)) for i in range(n)]

    def eval_seeds(self, k: int) -> list[int]:
        """The episode seeds of the k-th evaluation, derived from the run's seed."""
        ss = np.random.SeedSequence(entropy=self.seed, spawn_key=(0xE7A1, k))
        return [int(s) for s in ss.generate_state(self.eval_episodes) % (2**31)]


def default_tolerance(explorers: int, chunk: int, nstep: int, ratio: float, batch: int) -> int:
    """The limiter's error buffer: room for one add from every explorer at once, plus a batch.

    Any smaller and explorers that finished a chunk together would wait for
    each other; twice the buffer must exceed one add plus one batch or
    neither side could ever move (the limiter checks that).
    """
    return int(max(explorers, 2) * (chunk + nstep) * ratio + batch)
