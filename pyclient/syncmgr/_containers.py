"""dict, list and Namespace proxies: server-held containers of pickled values.

The daemon never unpickles, so it cannot hash Python keys. A dict key is
sent twice: as a canonical encoding that is equal for keys Python considers
equal (``1``, ``1.0`` and ``True`` are one key, as in a dict), and as its
pickle, which ``keys()`` returns. Keys of types the encoding does not cover
(other than None, bool, int, float, str, bytes and tuples of them) are
compared by their pickle, which is right for most types but not for, e.g.,
frozensets whose pickles differ in element order.

Every operation is one atomic request. List operations that read and write
the whole list (slicing assignment, ``sort``, ``reverse``, ``*=``) take a
versioned snapshot and replace it only if nobody changed the list in
between, retrying otherwise.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any, Optional

import msgpack

from . import exceptions as exc
from ._proxies import BaseProxy, _dumps, _loads

_MISSING = object()


class _NotCanonical(Exception):
    pass


def _norm(k: Any) -> Any:
    if k is None or isinstance(k, (str, bytes)):
        return k
    if isinstance(k, bool):
        return int(k)
    if isinstance(k, float) and k.is_integer():
        k = int(k)
    if isinstance(k, int):
        if -(2**63) <= k < 2**64:
            return k
        return msgpack.ExtType(1, str(k).encode())
    if isinstance(k, float):
        return k
    if type(k) is tuple:
        return [_norm(x) for x in k]
    raise _NotCanonical


def canonical_key(key: Any) -> bytes:
    """Bytes equal for keys that compare equal (see the module docstring)."""
    hash(key)  # unhashable keys fail as they do in a dict
    try:
        return b"m" + msgpack.packb(_norm(key), use_bin_type=True)
    except _NotCanonical:
        return b"p" + pickle.dumps(key, protocol=5)


# Why a pipeline refuses a container's pop: when execute() raises, what the
# other calls got is given back, and a popped value could not be put back
# where it was (another client may have written meanwhile).
_TAKES = "takes a value that could not be given back if another call of the pipeline failed"


class DictProxy(BaseProxy):
    """A shared dict, as SyncManager's DictProxy."""

    _kind = "dict"

    def _not_pipelined(self, method: str, args: tuple[Any, ...]) -> Optional[str]:
        return _TAKES if method in ("pop", "popitem") else None

    def _entry(self, key: Any, value: Any) -> dict[str, Any]:
        return {"key": canonical_key(key), "kp": _dumps(key), "value": _dumps(value)}

    def __getitem__(self, key: Any) -> Any:
        try:
            return _loads(self._call("get", key=canonical_key(key)))
        except exc.KeyNotFoundError:
            raise exc.KeyNotFoundError(key) from None

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        self._call("set", **self._entry(key, value))

    def __delitem__(self, key: Any) -> None:
        try:
            self._call("del", key=canonical_key(key))
        except exc.KeyNotFoundError:
            raise exc.KeyNotFoundError(key) from None

    def __contains__(self, key: Any) -> bool:
        return bool(self._call("contains", key=canonical_key(key)))

    def __len__(self) -> int:
        return int(self._call("len"))

    def __iter__(self) -> Iterator[Any]:
        """The keys of a snapshot taken now; like the stock proxy's iterator,
        ``next`` raises RuntimeError once the dict's size has changed."""
        return _DictKeyIterator(self)

    def items(self) -> list[tuple[Any, Any]]:
        """A snapshot of the items."""
        return [(_loads(kp), _loads(v)) for kp, v in self._call("items") or ()]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def copy(self) -> dict[Any, Any]:
        return dict(self.items())

    def clear(self) -> None:
        self._call("clear")

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        try:
            return _loads(self._call("pop", key=canonical_key(key)))
        except exc.KeyNotFoundError:
            if default is _MISSING:
                raise exc.KeyNotFoundError(key) from None
            return default

    def popitem(self) -> tuple[Any, Any]:
        try:
            kp, v = self._call("popitem")
        except exc.KeyNotFoundError:
            raise exc.KeyNotFoundError("popitem(): dictionary is empty") from None
        return _loads(kp), _loads(v)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return _loads(self._call("setdefault", **self._entry(key, default)))

    def update(self, other: Any = (), **kwargs: Any) -> None:
        """Store several entries in one atomic request."""
        pairs = list(other.items() if hasattr(other, "items") else other) + list(kwargs.items())
        triples = [[canonical_key(k), _dumps(k), _dumps(v)] for k, v in pairs]
        self._call("update", items=msgpack.packb(triples, use_bin_type=True))

    def __repr__(self) -> str:
        return repr(self.copy())


class _DictKeyIterator(Iterator[Any]):
    """Iterates over a snapshot of a shared dict's keys, taken when the
    iterator is made. Each step asks the daemon for the dict's length and
    raises RuntimeError if it changed, as iterating a dict (or the stock
    DictProxy, whose iterator lives in the manager process) does."""

    def __init__(self, d: DictProxy) -> None:
        self._d: Optional[DictProxy] = d
        self._keys = iter(d.keys())
        self._len = len(d)

    def __next__(self) -> Any:
        if self._d is None:
            raise StopIteration
        if len(self._d) != self._len:
            self._d = None  # a changed dict's iterator stays broken, as dict's does
            raise RuntimeError("dictionary changed size during iteration")
        try:
            return next(self._keys)
        except StopIteration:
            self._d = None
            raise


class NamespaceProxy(BaseProxy):
    """A shared namespace, as SyncManager's NamespaceProxy: every attribute
    whose name does not start with '_' is an entry on the daemon. The proxy
    has no public attributes of its own (not even ``name`` or ``delete``), so
    no field is ever shadowed; names that start with '_' stay local."""

    _kind = "namespace"

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_"):
            return object.__getattribute__(self, name)
        call = object.__getattribute__(self, "_call")
        try:
            return _loads(call("get", key=canonical_key(name)))
        except exc.KeyNotFoundError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._call("set", key=canonical_key(name), kp=_dumps(name), value=_dumps(value))

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            object.__delattr__(self, name)
            return
        try:
            self._call("del", key=canonical_key(name))
        except exc.KeyNotFoundError:
            raise AttributeError(name) from None

    def _items(self) -> list[tuple[str, Any]]:
        return [(_loads(kp), _loads(v)) for kp, v in self._call("items") or ()]

    def _update(self, attrs: dict[str, Any]) -> None:
        """Set several attributes in one atomic request (``Manager.Namespace(**attrs)``)."""
        for k in attrs:
            if not isinstance(k, str) or k.startswith("_"):
                raise ValueError(f"a Namespace attribute name must be a str not starting with '_': {k!r}")
        triples = [[canonical_key(k), _dumps(k), _dumps(v)] for k, v in attrs.items()]
        self._call("update", items=msgpack.packb(triples, use_bin_type=True))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items())
        return f"Namespace({inner})"


class ListProxy(BaseProxy):
    """A shared list, as SyncManager's ListProxy. Items compare by pickle in
    ``remove``, ``index``, ``count`` and ``in``."""

    _kind = "list"

    def _snapshot(self) -> tuple[list[Any], int]:
        res = self._call("snapshot")
        # An empty list's items may come back as nil.
        return [_loads(b) for b in res.get("items") or ()], int(res["version"])

    def _not_pipelined(self, method: str, args: tuple[Any, ...]) -> Optional[str]:
        two = "reads the list and writes it back, two requests in the caller's order"
        if method == "pop":
            return _TAKES
        if method in ("sort", "reverse", "__imul__"):
            return two
        if method in ("__setitem__", "__delitem__") and args and isinstance(args[0], slice):
            return two  # (an int index is one request)
        return None

    def _rewrite(self, fn: Any) -> Any:
        """Apply fn to a copy of the list and store it if nobody wrote meanwhile."""
        for _ in range(1000):
            items, version = self._snapshot()
            result = fn(items)
            packed = msgpack.packb([_dumps(x) for x in items], use_bin_type=True)
            if self._call("replace", items=packed, version=version):
                return result
        raise exc.SyncMgrError("list changed too often to apply the update")

    def __len__(self) -> int:
        return int(self._call("len"))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._snapshot()[0][i]
        try:
            return _loads(self._call("getitem", index=int(i)))
        except exc.IndexOutOfRangeError:
            raise exc.IndexOutOfRangeError("list index out of range") from None

    def __setitem__(self, i: Any, value: Any) -> None:
        if isinstance(i, slice):
            vals = list(value)

            def assign(items: list[Any]) -> None:
                items[i] = vals

            self._rewrite(assign)
            return
        try:
            self._call("setitem", index=int(i), value=_dumps(value))
        except exc.IndexOutOfRangeError:
            raise exc.IndexOutOfRangeError("list assignment index out of range") from None

    def __delitem__(self, i: Any) -> None:
        if isinstance(i, slice):

            def delete(items: list[Any]) -> None:
                del items[i]

            self._rewrite(delete)
            return
        try:
            self._call("delitem", index=int(i))
        except exc.IndexOutOfRangeError:
            raise exc.IndexOutOfRangeError("list assignment index out of range") from None

    def __iter__(self) -> Iterator[Any]:
        """Live iteration by index, as the stock ListProxy (which iterates
        through ``__getitem__``): one request per item; changes made meanwhile
        are seen by the items not yet reached, and nothing raises. For one
        atomic snapshot in one request use ``a[:]`` or ``a.copy()``."""
        i = 0
        while True:
            try:
                item = _loads(self._call("getitem", index=i))
            except exc.IndexOutOfRangeError:
                return
            yield item
            i += 1

    def __reversed__(self) -> Iterator[Any]:
        """Live, by index from the current end (see ``__iter__``)."""
        i = len(self) - 1
        while i >= 0:
            try:
                item = _loads(self._call("getitem", index=i))
            except exc.IndexOutOfRangeError:
                return
            yield item
            i -= 1

    def __contains__(self, value: Any) -> bool:
        return int(self._call("count", value=_dumps(value))) > 0

    def append(self, value: Any) -> None:
        self._call("append", value=_dumps(value))

    def extend(self, values: Iterable[Any]) -> None:
        self._call("extend", items=msgpack.packb([_dumps(v) for v in values], use_bin_type=True))

    def __iadd__(self, values: Iterable[Any]) -> ListProxy:
        self.extend(values)
        return self

    def __imul__(self, n: int) -> ListProxy:
        def mul(items: list[Any]) -> None:
            items *= n

        self._rewrite(mul)
        return self

    def __add__(self, other: Iterable[Any]) -> list[Any]:
        return self._snapshot()[0] + list(other)

    def __mul__(self, n: int) -> list[Any]:
        return self._snapshot()[0] * n

    __rmul__ = __mul__

    def insert(self, i: int, value: Any) -> None:
        self._call("insert", index=int(i), value=_dumps(value))

    def pop(self, i: int = -1) -> Any:
        try:
            return _loads(self._call("pop", index=int(i)))
        except exc.IndexOutOfRangeError as e:
            raise exc.IndexOutOfRangeError(str(e).split(": ", 1)[-1]) from None

    def remove(self, value: Any) -> None:
        try:
            self._call("remove", value=_dumps(value))
        except exc.SyncMgrValueError:
            raise ValueError("list.remove(x): x not in list") from None

    def index(self, value: Any, *args: Any) -> int:
        if args:
            return self._snapshot()[0].index(value, *args)
        try:
            return int(self._call("index", value=_dumps(value)))
        except exc.SyncMgrValueError:
            raise ValueError(f"{value!r} is not in list") from None

    def count(self, value: Any) -> int:
        return int(self._call("count", value=_dumps(value)))

    def reverse(self) -> None:
        self._rewrite(lambda items: items.reverse())

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        self._rewrite(lambda items: items.sort(key=key, reverse=reverse))

    def copy(self) -> list[Any]:
        return self._snapshot()[0]

    def __repr__(self) -> str:
        return repr(self._snapshot()[0])
