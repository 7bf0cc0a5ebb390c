"""The Q-network: a ReLU MLP in numpy with a weighted Huber loss, its gradient and Adam;
greedy evaluation; and the ``.npz`` format the demo saves its policy in.

The ``.npz`` holds arrays ``W0, b0, W1, b1, ...``: layer i computes
``x @ Wi + bi``, followed by ReLU on every layer but the last, whose outputs
are the Q-values; the greedy action is their argmax. Nothing else is needed
to run the policy (see ``greedy_returns``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np


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


def save_policy(params: list[np.ndarray], path: str, **meta: Any) -> None:
    """Write params as W0, b0, W1, b1, ... (plus scalar metadata) to path, atomically."""
    arrays = {f"{'W' if i % 2 == 0 else 'b'}{i // 2}": p for i, p in enumerate(params)}
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays, **{f"meta_{k}": np.asarray(v) for k, v in meta.items()})
    os.replace(tmp, path)


def load_policy(path: str) -> list[np.ndarray]:
    """The [W0, b0, W1, b1, ...] list of a saved policy."""
    with np.load(path) as z:
        n = sum(1 for k in z.files if k.startswith("W"))
        return [z[f"{kind}{i}"] for i in range(n) for kind in ("W", "b")]


def greedy_returns(params: list[np.ndarray], env_id: str, seeds: list[int]) -> list[float]:
    """The return of the greedy policy on one episode per seed.

    Each observation goes through the network alone, as one row, exactly as
    the re-evaluation in docs/ray.md does it: a float32 matmul of 20 rows rounds
    differently from one of a single row (BLAS picks another kernel), and where
    two Q-values nearly tie that changes an action and so a return. Row by
    row, anyone's one-environment re-evaluation of the saved ``.npz`` gives
    these returns exactly; it costs about 7 us more per step than a batch.
    """
    import gymnasium as gym

    returns = []
    for seed in seeds:
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            act = int(np.argmax(q_forward(params, obs[None].astype(np.float32))[0]))
            obs, r, term, trunc, _ = env.step(act)
            total, done = total + float(r), term or trunc
        env.close()
        returns.append(total)
    return returns
