"""One round trip to make a fast-path object, and none to unpickle a proxy
this process has seen before (the words it was told of are kept per daemon
run, checked against the word's tag on every use)."""

from __future__ import annotations

import os
import pickle

import pytest

from conftest import Counting
from syncmgr import _fast

FAST = os.environ.get("SYNCMGR_FASTPATH", "1") != "0" and _fast._ext is not None
pytestmark = pytest.mark.skipif(not FAST, reason="fast path not built or disabled")


@pytest.mark.parametrize("factory", ["Lock", "RLock", "Event", "Semaphore", "Condition"])
def test_creating_a_fast_path_object_is_one_request(m, factory):
    getattr(m, factory)()  # the process's fast path is attached by now
    client = m._c()
    with Counting(client) as c:
        obj = getattr(m, factory)(name=f"one-trip-{factory}")
    assert _fast.active(obj)
    assert c.ops == ["create"]


def test_creating_a_value_is_one_request(m):
    m.Value("i", 0)
    with Counting(m._c()) as c:
        v = m.Value("i", 5, name="one-trip-value")
    assert _fast.active(v) and v.value == 5
    assert c.ops == ["create"]


def test_unpickling_a_seen_proxy_takes_no_round_trip(m):
    lock = m.Lock(name="seen-lock")
    blob = pickle.dumps(lock)
    with Counting(m._c()) as c:
        again = pickle.loads(blob)
        assert _fast.active(again)
        assert again.acquire(timeout=5)
        again.release()
    assert c.ops == []


def test_a_name_made_again_is_never_taken_for_the_old_one(m):
    """A cached word is used only while it carries the same tag: after a
    delete and a create of the same name the proxy asks again, and acts on
    the new object."""
    lock = m.Lock(name="remade-lock")
    blob = pickle.dumps(lock)
    assert m.delete("remade-lock")
    filler = [m.Lock() for _ in range(4)]  # the old word may be reused by another object
    # Made again as another process would (this process is not told of it).
    m._c().call("create", {"kind": "lock", "name": "remade-lock"})
    with Counting(m._c()) as c:
        p = pickle.loads(blob)
    assert c.ops == ["fastpath_ref"]
    new = m.Lock(name="remade-lock")
    assert p.acquire(timeout=5)
    assert not new.acquire(timeout=0.05)  # the same object: held by p
    p.release()
    assert new.acquire(timeout=5)
    new.release()
    del filler
