"""cpprb's multiprocessing replay buffers with their ``ctx`` forced to a manager.

The cases are those of cpprb 11's own ``test/test_mp.py`` (MIT licence,
Copyright (c) 2019 Yamada Hiroyuki), written again here: wherever that file
lets cpprb pick its context (``ctx`` omitted, ``get_context(...)``,
``SyncManager()``, ``get_context().Manager()``), these pass a manager of the
kind under test instead:

* ``SYNCMGR_OUTSIDE_MANAGER=syncmgr``: ``syncmgr.Manager()``;
* ``SYNCMGR_OUTSIDE_MANAGER=stock``: ``multiprocessing.get_context(method).Manager()``,
  for the comparison counts.

Child processes are ``multiprocessing.Process`` under the start method in
``SYNCMGR_OUTSIDE_START_METHOD`` (fork, spawn or forkserver), and all tests run in
sequence in one process, as cpprb runs them. Spawned children import this
module by name to find the functions they run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import unittest
from multiprocessing.context import ProcessError
from typing import Any, Optional

START_METHOD = os.environ.get("SYNCMGR_OUTSIDE_START_METHOD", "fork")
MANAGER = os.environ.get("SYNCMGR_OUTSIDE_MANAGER", "syncmgr")

UNAVAILABLE: Optional[str] = None
try:
    import numpy as np
    from cpprb import MPPrioritizedReplayBuffer, MPReplayBuffer
except ImportError as e:
    UNAVAILABLE = f"cpprb or numpy is not installed ({e})"

EXCLUDED: dict[str, str] = {}

# The manager most tests use, started once for the module (cpprb's tests let
# each buffer make its own context; a shared manager is the forced one).
CTX: Any = None


def started_manager() -> Any:
    """A started manager of the kind under test."""
    if MANAGER == "stock":
        return mp.get_context(START_METHOD).Manager()
    import syncmgr

    return syncmgr.Manager().start()


def unstarted_manager() -> Any:
    """An unstarted manager (cpprb starts one it is given)."""
    if MANAGER == "stock":
        from multiprocessing.managers import SyncManager

        return SyncManager(ctx=mp.get_context(START_METHOD))
    import syncmgr

    return syncmgr.Manager()


def setUpModule() -> None:  # noqa: N802 - unittest's name
    global CTX
    if UNAVAILABLE is not None:
        raise unittest.SkipTest(UNAVAILABLE)
    mp.set_start_method(START_METHOD, force=True)
    CTX = started_manager()


def tearDownModule() -> None:  # noqa: N802
    global CTX
    if CTX is not None:
        CTX.shutdown()
        CTX = None


# --- what the child processes run -----------------------------------------------


def add_done(rb: Any) -> None:
    for _ in range(100):
        rb.add(done=0)


def sample_some(rb: Any, batch_size: int) -> None:
    for _ in range(10):
        rb.sample(batch_size)


def add_each(rb: Any, transitions: list[dict[str, Any]]) -> None:
    for t in transitions:
        rb.add(**t)


def run_children(*specs: tuple[Any, tuple[Any, ...]], together: bool = False) -> None:
    """Start a process per (target, args), one after another or all together;
    every one must exit 0 within a minute."""
    procs = [mp.Process(target=t, args=a) for t, a in specs]
    groups = [procs] if together else [[p] for p in procs]
    for g in groups:
        for p in g:
            p.start()
        for p in g:
            p.join(60)
            if p.exitcode != 0:
                p.kill()
                raise AssertionError(f"{p.name} exit code {p.exitcode}")


OBS_SHAPE = (15, 15)
ACT_DIM = 5


def transition_env() -> dict[str, Any]:
    return {"obs": {"shape": OBS_SHAPE}, "act": {"shape": ACT_DIM}, "rew": {},
            "next_obs": {"shape": OBS_SHAPE}, "done": {}}


def image_env(act_dim: int = 10) -> dict[str, Any]:
    return {"obs": {"shape": (84, 84, 3)}, "act": {"shape": act_dim}, "rew": {}, "done": {}}


class TestReplayBuffer(unittest.TestCase):
    def test_buffer(self) -> None:
        rb = MPReplayBuffer(256, transition_env(), ctx=CTX)
        for i in range(512):
            obs = np.full(OBS_SHAPE, i, dtype=np.double)
            rb.add(obs=obs, act=np.full(ACT_DIM, i, dtype=np.double), rew=i, next_obs=obs + 1, done=0)
        rb._encode_sample(range(256))
        rb.sample(32)
        rb.clear()
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (0, 0))

    def test_add(self) -> None:
        rb = MPReplayBuffer(256, transition_env(), ctx=CTX)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (0, 0))
        obs, act = np.zeros(OBS_SHAPE), np.ones(ACT_DIM)
        rb.add(obs=obs, act=act, rew=1, next_obs=obs + 1, done=0)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (1, 1))
        with self.assertRaises(KeyError):  # a missing field adds nothing
            rb.add(obs=obs)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (1, 1))
        two = np.stack((obs, obs))
        rb.add(obs=two, act=np.stack((act, act)), rew=(1, 0), next_obs=two + 1, done=(0.0, 1.0))
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (3, 3))

    def test_default_dtype(self) -> None:
        rb = MPReplayBuffer(256, {"done": {}}, default_dtype=np.float32, ctx=CTX)
        rb.add(done=1)
        self.assertEqual(rb.sample(1)["done"][0].dtype, np.float32)

    def test_multi_processing(self) -> None:
        rb = MPReplayBuffer(256, {"obs": {"dtype": int}}, ctx=CTX)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (0, 0))
        run_children((add_each, (rb, [{"obs": i} for i in range(100)])))
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (100, 100))
        np.testing.assert_allclose(rb.get_all_transitions()["obs"].ravel(), np.arange(100, dtype=int))

    def test_multi_processing2(self) -> None:
        rb = MPReplayBuffer(256, {"done": {}}, ctx=CTX)
        run_children((add_done, (rb,)), (add_done, (rb,)), together=True)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (200, 200))

    def _add_then_add_and_sample(self, rb: Any) -> None:
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (0, 0))
        run_children((add_done, (rb,)))
        run_children((add_done, (rb,)), (sample_some, (rb, 32)), together=True)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (200, 200))

    def test_multi_add_sample(self) -> None:
        self._add_then_add_and_sample(MPReplayBuffer(256, {"done": {}}, ctx=CTX))

    def test_context(self) -> None:
        # cpprb's test asks for get_context("spawn"); the manager stands in for it.
        self._add_then_add_and_sample(MPReplayBuffer(256, {"done": {}}, ctx=CTX))

    def test_backend(self) -> None:
        self._add_then_add_and_sample(MPReplayBuffer(256, {"done": {}}, ctx=CTX, backend="SharedMemory"))

    def test_unknown_backend(self) -> None:
        with self.assertRaises(ValueError):
            MPReplayBuffer(1, {"done": {}}, backend="UNKNOWN_BACKEND", ctx=CTX)

    def test_unstarted_manager(self) -> None:
        m = unstarted_manager()
        try:
            MPReplayBuffer(10, {"done": {}}, ctx=m)
        finally:
            m.shutdown()

    def test_finished_manager(self) -> None:
        with unstarted_manager() as m:
            pass
        with self.assertRaises(ProcessError):
            MPReplayBuffer(10, {"done": {}}, ctx=m)


class TestPrioritizedReplayBuffer(unittest.TestCase):
    def _add_mixed(self, rb: Any, act_dim: int = 10) -> None:
        obs, act = np.zeros((84, 84, 3)), np.ones(act_dim)
        rb.add(obs=obs, act=act, rew=1, done=0)
        rb.add(obs=obs, act=act, rew=1, done=0, priorities=1.5)
        self.assertAlmostEqual(rb.get_max_priority(), 1.5)
        obs2, act2 = np.stack((obs, obs)), np.stack((act, act))
        rb.add(obs=obs2, act=act2, rew=(1, 0), done=(0.0, 1.0))
        rb.add(obs=obs2, act=act2, rew=(1, 0), done=(0.0, 1.0), priorities=(0.2, 0.4))

    def _add_mixed_then_clear(self, rb: Any) -> None:
        self._add_mixed(rb)
        rb.clear()
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (0, 0))

    def test_add(self) -> None:
        self._add_mixed_then_clear(MPPrioritizedReplayBuffer(500, image_env(), ctx=CTX))

    def test_context(self) -> None:
        self._add_mixed_then_clear(MPPrioritizedReplayBuffer(500, image_env(), ctx=CTX))

    def test_backend(self) -> None:
        self._add_mixed_then_clear(MPPrioritizedReplayBuffer(500, image_env(), ctx=CTX, backend="SharedMemory"))

    def test_sample(self) -> None:
        rb = MPPrioritizedReplayBuffer(500, image_env(4), ctx=CTX)
        self._add_mixed(rb, act_dim=4)
        s = rb.sample(64)
        rb.update_priorities(s["indexes"], s["weights"] * s["weights"])

    def test_multi_processing(self) -> None:
        rb = MPPrioritizedReplayBuffer(256, {"obs": {"dtype": int}}, ctx=CTX)
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (0, 0))
        run_children((add_each, (rb, [{"obs": i, "priority": 0.5} for i in range(10)])))
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (10, 10))
        np.testing.assert_allclose(rb.get_all_transitions()["obs"].ravel(), np.arange(10, dtype=int))

    def _most_sampled(self, rb: Any, n_added: int) -> Any:
        s = rb.sample(100, beta=1.0)
        self.assertTrue(((s["obs"] >= 0) & (s["obs"] < n_added)).all())
        values, counts = np.unique(s["obs"], return_counts=True)
        return values[counts.argmax()]

    def test_mp_sample(self) -> None:
        rb = MPPrioritizedReplayBuffer(256, {"obs": {"dtype": int}}, ctx=CTX)
        hot = 3
        run_children((add_each, (rb, [{"obs": i, "priorities": 1e8 if i == hot else 0} for i in range(200)])))
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (200, 200))
        self.assertEqual(self._most_sampled(rb, 200), hot)

    def test_mp_update_priority(self) -> None:
        rb = MPPrioritizedReplayBuffer(256, {"obs": {"dtype": int}}, ctx=CTX)
        run_children((add_each, (rb, [{"obs": i, "priorities": 0} for i in range(200)])))
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (200, 200))
        hot = rb.sample(1, beta=1.0)["indexes"][0]
        rb.update_priorities([hot], [1e8])
        self.assertEqual((rb.get_next_index(), rb.get_stored_size()), (200, 200))
        self.assertEqual(self._most_sampled(rb, 200), hot)

    def _float_size(self, **kw: Any) -> None:
        m = started_manager()
        try:
            rb = MPPrioritizedReplayBuffer(1e2, {"done": {}}, ctx=m, **kw)
            self.assertEqual(rb.get_buffer_size(), 100)
        finally:
            m.shutdown()

    def test_float_size(self) -> None:
        self._float_size()

    def test_float_size_SharedMemory(self) -> None:  # noqa: N802 - cpprb's test name
        self._float_size(backend="SharedMemory")

    def _unsampled_mask(self, **kw: Any) -> None:
        m = started_manager()
        try:
            rb = MPPrioritizedReplayBuffer(1, {"done": {}}, ctx=m, **kw)
            rb.add(done=1.0)
            self.assertEqual(rb.get_max_priority(), 1.0)
            rb.update_priorities([0], [2.0])  # not sampled yet: ignored
            self.assertEqual(rb.get_max_priority(), 1.0)
            rb.sample(1)
            rb.update_priorities([0], [2.0])
            self.assertEqual(rb.get_max_priority(), 2.0)
        finally:
            m.shutdown()

    def test_unsampled_mask(self) -> None:
        self._unsampled_mask()

    def test_unsampled_mask_SharedMemory(self) -> None:  # noqa: N802
        self._unsampled_mask(backend="SharedMemory")

    def test_unstarted_manager(self) -> None:
        m = unstarted_manager()
        try:
            MPPrioritizedReplayBuffer(10, {"done": {}}, ctx=m)
        finally:
            m.shutdown()

    def test_finished_manager(self) -> None:
        with unstarted_manager() as m:
            pass
        with self.assertRaises(ProcessError):
            MPPrioritizedReplayBuffer(10, {"done": {}}, ctx=m)
