"""The cross-language value encoding (syncmgr._values): plain data as tagged
msgpack that the Go client reads, everything else as a pickle, and every
value back as the type it went in as."""

from __future__ import annotations

import fractions
import math
import pickle

import pytest

from syncmgr import _values


class MyInt(int):
    pass


class MyList(list):
    pass


PLAIN = [None, True, False, 0, -1, 2**63, 2**64 - 1, -(2**63), 1.5, -0.0, math.inf, "", "héllo", b"", b"\x00\xff",
         [], [1, "a", None, [b"x", 2.5]], {}, {"a": 1, "b": [True, {"c": None}]}, {1: "x", b"k": 2, None: 3, 2.5: 4}]

NOT_PLAIN = [(1, 2), {1, 2}, frozenset(), bytearray(b"x"), 2**64, -(2**63) - 1, fractions.Fraction(1, 3),
             [1, (2, 3)], {(1, 2): "tuple key"}, {"a": {1, 2}}, "\udcff", MyInt(3), MyList([1])]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_data_is_tagged_msgpack_and_round_trips_exactly(value):
    data = _values.dumps(value)
    assert data[:1] == _values.TAG
    back = _values.loads(data)
    assert back == value or (isinstance(value, float) and math.isnan(value))
    assert type(back) is type(value)
    if isinstance(value, dict):
        assert list(back) == list(value)  # key order kept
        assert [type(k) for k in back] == [type(k) for k in value]


@pytest.mark.parametrize("value", NOT_PLAIN, ids=lambda v: type(v).__name__)
def test_everything_else_is_pickled_and_round_trips(value):
    data = _values.dumps(value)
    assert data[:1] == b"\x80", data[:4]
    back = _values.loads(data)
    assert back == value
    assert type(back) is type(value)


def test_nesting_deeper_than_msgpack_packs_falls_back_to_pickle():
    def nest(n: int) -> list:
        deep: list = []
        cur = deep
        for _ in range(n):
            cur.append([])
            cur = cur[0]
        return deep

    assert _values.dumps(nest(40))[:1] == _values.TAG
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(10000)  # pickle needs it for this depth too
    try:
        deep = nest(1100)
        assert _values.dumps(deep)[:1] == b"\x80"
        back = _values.loads(_values.dumps(deep))
        depth = 0
        while back:
            back, depth = back[0], depth + 1
        assert depth == 1100
    finally:
        sys.setrecursionlimit(old)


def test_a_failed_pack_leaves_nothing_behind():
    # The per-thread Packer must not carry a half-packed value into the next.
    for bad in ([1, 2, (3,)], {"a": [b"x", {1, 2}]}, [1] * 1000 + [(1,)]):
        assert _values.dumps(bad)[:1] == b"\x80"
        assert _values.dumps([1, "a"]).hex() == "c19201a161"


def test_threads_pack_at_once():
    import threading

    errors: list = []

    def work(i: int) -> None:
        for j in range(2000):
            v = {"t": i, "j": j, "xs": list(range(j % 7))}
            if _values.loads(_values.dumps(v)) != v:
                errors.append((i, j))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert errors == []


def test_self_referencing_list_is_pickled():
    x: list = [1]
    x.append(x)
    back = _values.loads(_values.dumps(x))
    assert back[1] is back


def test_pickles_written_before_the_tag_existed_still_load():
    for v in (1, "a", [1, 2], {"k": (1,)}):
        assert _values.loads(pickle.dumps(v, protocol=5)) == v
        assert _values.loads(pickle.dumps(v, protocol=2)) == v


def test_the_bytes_go_expects():
    # The same vectors pin the Go side (proxy/values_test.go).
    assert _values.dumps(None).hex() == "c1c0"
    assert _values.dumps([1, "a", None]).hex() == "c19301a161c0"
    assert _values.dumps({"a": 1, "b": [True]}).hex() == "c182a16101a16291c3"
    assert _values.dumps({b"k": 1}).hex() == "c181c4016b01"
    assert _values.dumps(70000).hex() == "c1ce00011170"


_EDGES = [None, True, False, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
          -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63, 0.0, -0.0, 1.5, math.inf, math.nan,
          "", "é", "x" * 31, "x" * 32, "x" * 255, "x" * 256, "x" * 65535, "x" * 65536, b"", b"\0", b"y" * 255,
          b"y" * 256, b"y" * 65535, b"y" * 65536]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 300, 65536])
def test_a_batch_of_plain_scalars_encodes_as_python_encodes_it(n):
    from syncmgr import _framing

    if _framing._pack_bins is None:
        pytest.skip("the C extension is not built")
    items = [_EDGES[i % len(_EDGES)] for i in range(n)]
    c = _framing._pack_bins(items)
    assert c is not None
    assert c == b"".join(bytes(b) for b in _framing.bin_array(_values.dumps_many(items)))


def test_without_the_extension_a_batch_encodes_the_same(monkeypatch):
    from syncmgr import _framing

    items = [_EDGES[i % len(_EDGES)] for i in range(100)] + [(1, 2), {"k": [1.5]}]
    want = b"".join(bytes(b) for b in _framing.pack_items(items))
    monkeypatch.setattr(_framing, "_pack_bins", None)
    assert b"".join(bytes(b) for b in _framing.pack_items(items)) == want
    assert b"".join(bytes(b) for b in _framing.pack_items(items[:100])) == b"".join(
        bytes(b) for b in _framing.bin_array(_values.dumps_many(items[:100])))


@pytest.mark.parametrize("odd", [2**64, -2**63 - 1, "\ud800", [1], (1,), {"a": 1}, 1j, bytearray(b"x")])
def test_a_batch_with_anything_else_is_left_to_python(odd):
    from syncmgr import _framing

    if _framing._pack_bins is None:
        pytest.skip("the C extension is not built")
    assert _framing._pack_bins([1, b"x", odd, "y"]) is None
    # ... and pack_items then encodes it item by item, the same bytes the daemon gets either way
    items = [1, b"x", odd, "y"]
    def joined(pieces):
        return b"".join(bytes(b) for b in pieces)

    assert joined(_framing.pack_items(items)) == joined(_framing.bin_array(_values.dumps_many(items)))


def _same(a, b):
    """Equal values of equal types, NaN equal to NaN, -0.0 told from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return type(a) is type(b) and (math.isnan(a) and math.isnan(b) or math.copysign(1, a) == math.copysign(1, b)
                                       and a == b)
    return type(a) is type(b) and a == b


def test_a_get_many_reply_decodes_in_c_as_python_decodes_it():
    if _values._loads_bins is None:
        pytest.skip("the C extension is not built")
    np = pytest.importorskip("numpy")
    odd = [2**64, -2**63 - 1, [1], (1,), {"a": 1}, 1j, bytearray(b"x"), np.arange(3)]
    items = _EDGES + odd
    datas = [_values.dumps(x) for x in items]
    datas.append(memoryview(_values.dumps(7)))  # a record read as a view: Python decodes it
    items.append(7)
    got = _values.loads_many(datas)
    for g, want in zip(got, items, strict=True):
        if isinstance(want, np.ndarray):
            assert (g == want).all()
        else:
            assert _same(g, want), (g, want)


def test_a_record_c_cannot_decode_goes_to_python_and_its_error_is_raised():
    if _values._loads_bins is None:
        pytest.skip("the C extension is not built")
    bad_utf8 = _values.TAG + b"\xa2\xff\xfe"  # a str record whose bytes are not UTF-8: msgpack refuses it too
    with pytest.raises(ValueError):
        _values.loads_many([_values.dumps(1), bad_utf8])
    trailing = _values.dumps(5) + b"\x00"  # a scalar with a byte after it is not a plain scalar record
    with pytest.raises(Exception) as c_err:
        _values.loads_many([trailing])
    with pytest.raises(type(c_err.value)):
        _values.loads(trailing)
    with pytest.raises(TypeError):
        _values._loads_bins((_values.dumps(1),), _values.loads)  # a tuple, not a list


def test_without_the_extension_a_reply_decodes_the_same(monkeypatch):
    datas = [_values.dumps(x) for x in _EDGES[:20]]
    want = _values.loads_many(datas)
    monkeypatch.setattr(_values, "_loads_bins", None)
    assert all(_same(a, b) for a, b in zip(_values.loads_many(datas), want, strict=True))
