"""The demo's weights broadcast (examples/apex/weights.py): one syncmgr segment and a version
Value. Readers in other processes never see a set torn between two publications."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from typing import Any

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "examples"))

from apex.weights import WeightsBroadcast  # noqa: E402

SHAPES = [(256, 512), (512,), (512, 256), (256,)]  # about 1 MiB: a copy takes long enough to meet a write


def _writer(w: WeightsBroadcast, publications: int, done: Any) -> None:
    for k in range(1, publications + 1):
        w.publish([np.full(s, float(k), np.float32) for s in SHAPES], k, 2 * k)
    done.set()


def _reader(w: WeightsBroadcast, done: Any, out: Any) -> None:
    reads = torn = backwards = 0
    versions = set()
    last, last_updates = -1, 0
    while True:
        finished = done.is_set()
        got = w.read(last)
        if got is not None:
            version, arrays, head = got
            reads += 1
            versions.add(version)
            k = head["updates"]
            if head["env_steps"] != 2 * k or any(not np.all(a == k) for a in arrays):
                torn += 1
            backwards += k < last_updates
            last, last_updates = version, k
        if finished and got is None:
            break
    out.put({"reads": reads, "torn": torn, "backwards": backwards, "versions": len(versions),
             "retries": w.retries, "last_updates": last_updates})


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_readers_never_see_a_torn_set(m, method) -> None:
    ctx = mp.get_context(method)
    w = WeightsBroadcast(m.SharedMemory(create=True, size=WeightsBroadcast.size_for(SHAPES)), m.Value("q", 0),
                         SHAPES)
    assert w.read() is None  # nothing published yet
    w.publish([np.zeros(s, np.float32) for s in SHAPES], 0, 0)
    done, out = ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(w, done, out)) for _ in range(3)]
    for p in readers:
        p.start()
    writer = ctx.Process(target=_writer, args=(w, 1500, done))
    writer.start()
    try:
        results = [out.get(timeout=150) for _ in readers]
        writer.join(30)
        for p in readers:
            p.join(30)
        assert writer.exitcode == 0 and all(p.exitcode == 0 for p in readers)
    finally:
        for p in [writer, *readers]:
            p.kill()
    for r in results:
        assert r["torn"] == 0 and r["backwards"] == 0, r
        assert r["reads"] > 0 and r["last_updates"] == 1500, r  # every reader ends on the last set
    assert sum(r["versions"] for r in results) > 3, results  # they read while the writer published
    got = w.read()
    assert got is not None and got[0] == 2 * 1501 and w.read(got[0]) is None  # unchanged: None, no copy


def test_a_wrong_shape_is_refused_before_anything_is_written(m) -> None:
    w = WeightsBroadcast(m.SharedMemory(create=True, size=WeightsBroadcast.size_for(SHAPES)), m.Value("q", 0),
                         SHAPES)
    ok = [np.ones(s, np.float32) for s in SHAPES]
    v = w.publish(ok, 1, 2)
    with pytest.raises(ValueError):
        w.publish([np.zeros((2, 2), np.float32)], 3, 4)
    with pytest.raises(ValueError):
        w.publish([*ok[:-1], np.zeros(7, np.float32)], 3, 4)
    got = w.read()  # the refused calls left the published set as it was
    assert got is not None and got[0] == v and got[2] == {"updates": 1, "env_steps": 2}
    with pytest.raises(ValueError):
        WeightsBroadcast(m.SharedMemory(create=True, size=16), m.Value("q", 0), SHAPES).publish([], 0, 0)
