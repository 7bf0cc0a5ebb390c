"""cpprb's multiprocessing replay buffers with ctx=syncmgr manager."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

cpprb = pytest.importorskip("cpprb")


def _explorer(rb, n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        rb.add(obs=rng.normal(size=(8, 3)), act=rng.integers(0, 2, size=(8, 1)), done=np.zeros((8, 1)))


ENV = {"obs": {"shape": 3}, "act": {"dtype": np.int64}, "done": {}}


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("backend", ["SharedMemory", "sharedctypes"])
@pytest.mark.parametrize("cls", ["MPReplayBuffer", "MPPrioritizedReplayBuffer"])
def test_mp_buffers_across_processes(m, method, backend, cls):
    rb = getattr(cpprb, cls)(1000, ENV, ctx=m, backend=backend)
    ctx = mp.get_context(method)
    procs = [ctx.Process(target=_explorer, args=(rb, 10, i)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert rb.get_stored_size() == 3 * 10 * 8
    s = rb.sample(16)
    assert s["obs"].shape == (16, 3) and s["act"].shape == (16, 1)
    if cls == "MPPrioritizedReplayBuffer":
        rb.update_priorities(s["indexes"], np.full(16, 0.5))
        assert "weights" in rb.sample(4)


def test_default_backend_memory_lives_in_the_registry(m):
    before = {s["name"] for s in m._c().call("shm_list", {})["segments"]}
    rb = cpprb.MPReplayBuffer(100, ENV, ctx=m)
    rb.add(obs=np.ones(3), act=1, done=0)
    after = {s["name"] for s in m._c().call("shm_list", {})["segments"]}
    assert len(after - before) >= 3  # one segment per field plus the index values
    assert rb.get_stored_size() == 1
