"""The value encoding shared by the Python and Go clients.

The daemon stores values (queue items, ``Value('O')``, dict keys and values,
list items, Namespace attributes) as opaque bytes. A value that is *plain
data* is stored as msgpack, which the Go client reads and writes too; any
other value is stored as a pickle, which only Python reads:

* ``0xC1`` followed by one msgpack object: plain data. ``0xC1`` is the one
  byte msgpack never uses, and no pickle starts with it.
* anything else: a pickle (protocol 2 and later start with ``0x80``).

Plain data is exactly: ``None``, ``bool``, ``int`` in [-2**63, 2**64),
``float``, ``str``, ``bytes``, and ``list`` and ``dict`` of plain data (dict
keys plain scalars), checked by exact type and at most 32 levels deep, so a
value always comes back as the type it went in as: a tuple, a subclass of
``int``, a ``bytearray`` or a numpy array is pickled. See docs/protocol.md,
"Values".
"""

from __future__ import annotations

import pickle
from typing import Any

import msgpack

__all__ = ["TAG", "dumps", "loads", "is_plain"]

TAG = b"\xc1"
_TAG_INT = 0xC1
PICKLE_PROTOCOL = 5
MAX_DEPTH = 32

_SCALARS = (type(None), bool, float, str, bytes)
_KEYS = (type(None), bool, int, float, str, bytes)


def is_plain(obj: Any, depth: int = 0) -> bool:
    """Whether obj is plain data (see the module docstring)."""
    t = type(obj)
    if t in _SCALARS:
        return True
    if t is int:
        return -(2**63) <= obj < 2**64
    if depth >= MAX_DEPTH:
        return False
    if t is list:
        return all(is_plain(x, depth + 1) for x in obj)
    if t is dict:
        for k, v in obj.items():
            if type(k) not in _KEYS or (type(k) is int and not -(2**63) <= k < 2**64):
                return False
            if not is_plain(v, depth + 1):
                return False
        return True
    return False


def dumps(obj: Any) -> bytes:
    """obj as stored by the daemon: tagged msgpack when plain, else a pickle."""
    if is_plain(obj):
        try:
            return TAG + msgpack.packb(obj, use_bin_type=True)
        except (ValueError, TypeError, OverflowError, UnicodeEncodeError):
            pass  # e.g. a str with lone surrogates: pickle keeps it exactly
    return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)


def loads(data: Any) -> Any:
    """The value stored as data (bytes, bytearray or memoryview)."""
    if len(data) and data[0] == _TAG_INT:
        return msgpack.unpackb(memoryview(data)[1:], raw=False, strict_map_key=False, use_list=True)
    return pickle.loads(data)
