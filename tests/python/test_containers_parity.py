"""dict, list and Namespace behave as SyncManager's proxies where CPython's
own manager tests found them apart: Namespace fields named like proxy
methods, empty lists, and iteration while the container changes."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest

from syncmgr._containers import ListProxy

# Every public attribute the old proxy had (from DictProxy and BaseProxy).
PROXY_ATTRS = ["name", "items", "keys", "values", "get", "update", "copy", "clear", "pop", "popitem",
               "setdefault", "delete"]


def test_namespace_fields_are_not_shadowed_by_proxy_attributes(m):
    n = m.Namespace()
    for a in PROXY_ATTRS:
        assert not hasattr(n, a), a  # the stock Namespace proxy has none of these
    for i, a in enumerate(PROXY_ATTRS):
        setattr(n, a, i)
    assert [getattr(n, a) for a in PROXY_ATTRS] == list(range(len(PROXY_ATTRS)))
    n.name = "Bob"
    n.job = "Builder"
    n._hidden = "hidden"  # local, as with the stock proxy
    assert (n.name, n.job) == ("Bob", "Builder")
    del n.job
    assert not hasattr(n, "job")
    with pytest.raises(AttributeError):
        del n.job
    assert "name='Bob'" in repr(n) and "_hidden" not in repr(n)
    n2 = pickle.loads(pickle.dumps(n))
    assert n2.name == "Bob" and not hasattr(n2, "_hidden")


def test_namespace_initial_attributes(m):
    n = m.Namespace(items=[1], get="g")
    assert n.items == [1] and n.get == "g"
    with pytest.raises(ValueError):
        m.Namespace(_local=1)


def test_empty_list_reads_as_empty(m):
    b = m.list()
    assert b[:] == [] and list(b) == [] and b.copy() == [] and repr(b) == "[]"
    assert b + [1] == [1] and b * 3 == [] and list(reversed(b)) == []
    b.sort()
    b.reverse()
    assert len(b) == 0


class _NilItems:
    """A transport answering `snapshot` as the daemon used to for an empty
    list: items as nil (msgpack nil decodes to None). A unit test of the
    client's decoding; the tests above use the real daemon."""

    address = "unit"

    def call(self, op, args, **kw):
        assert op == "snapshot"
        return {"items": None, "version": 3}

    def notify(self, op, args):
        pass


def test_list_snapshot_tolerates_nil_items():
    lst = ListProxy.__new__(ListProxy)
    lst._bind(_NilItems(), "named-list", owned=False)
    assert lst[:] == [] and lst.copy() == [] and repr(lst) == "[]" and lst + [1] == [1]


def test_dict_iterator_raises_when_the_dict_changes_size(m):
    d = m.dict({i: chr(i) for i in range(65, 70)})
    it = iter(d)
    assert list(it) == list(range(65, 70))
    assert list(it) == []
    it = iter(d)
    d.clear()
    with pytest.raises(RuntimeError):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    d[1] = 1
    it = iter(d)
    d[1] = 2  # a change that keeps the size, as with a dict
    assert next(it) == 1


def _append(lst, d):
    lst.append("late")
    d["late"] = 1


def test_iteration_sees_another_process(m):
    a = m.list([0, 1])
    d = m.dict(a=1, b=2)
    ait, dit = iter(a), iter(d)
    assert next(ait) == 0 and next(dit) == "a"
    p = mp.get_context("spawn").Process(target=_append, args=(a, d))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert list(ait) == [1, "late"]  # live, as the stock ListProxy
    with pytest.raises(RuntimeError):  # as the stock DictProxy's iterator
        next(dit)


def test_list_iteration_is_live(m):
    a = m.list(range(10))
    it = iter(a)
    a[0] = 100
    assert next(it) == 100
