"""The value encoding shared by the Python and Go clients.

The daemon stores values (queue items, ``Value('O')``, dict keys and values,
list items, Namespace attributes) as opaque bytes. A value that is *plain
data* is stored as msgpack, which the Go client reads and writes too; any
other value is stored as a pickle, which only Python reads:

* ``0xC1`` followed by one msgpack object: plain data. ``0xC1`` is the one
  byte msgpack never uses, and no pickle starts with it.
* anything else: a pickle (protocol 2 and later start with ``0x80``).

Plain data is exactly: ``None``, ``bool``, ``int`` in [-2**63, 2**64),
``float``, ``str``, ``bytes``, and ``list`` and ``dict`` of plain data,
checked by exact type (msgpack's ``strict_types``) as it is packed, so a
value always comes back as the type it went in as: a tuple, a subclass of
``int``, a ``bytearray`` or a numpy array is pickled, as is anything nested
deeper than msgpack packs (about 1,000 levels). See docs/protocol.md,
"Values".
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import msgpack

__all__ = ["TAG", "dumps", "loads", "is_plain"]

TAG = b"\xc1"
_TAG_INT = 0xC1
PICKLE_PROTOCOL = 5



_local = threading.local()


def _pack(obj: Any) -> bytes:
    # strict_types: exact types only, a tuple is not a list, no default hook,
    # so anything but plain data raises instead of changing type on the way.
    # One Packer per thread (a Packer is not thread-safe; making one per call
    # costs more than packing a small value); taken while in use, so that a
    # signal handler packing in the same thread gets a fresh one.
    p = getattr(_local, "packer", None)
    if p is None:
        p = msgpack.Packer(use_bin_type=True, strict_types=True)
    _local.packer = None
    try:
        return p.pack(obj)  # on an exception the Packer drops what it had packed
    finally:
        _local.packer = p


_NOT_PLAIN = (TypeError, ValueError, OverflowError, UnicodeEncodeError)


def is_plain(obj: Any) -> bool:
    """Whether obj is plain data (see the module docstring)."""
    try:
        _pack(obj)
    except _NOT_PLAIN:
        return False
    return True


# Types that can be plain data at the top: anything else is pickled without
# an attempt (and the exception it would cost).
_PLAIN_TYPES = frozenset((type(None), bool, int, float, str, bytes, list, dict))


def dumps(obj: Any) -> bytes:
    """obj as stored by the daemon: tagged msgpack when plain, else a pickle."""
    if type(obj) in _PLAIN_TYPES:
        try:
            return TAG + _pack(obj)
        except _NOT_PLAIN:  # not plain inside (or, e.g., a str with lone surrogates)
            pass
    return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)


def loads(data: Any) -> Any:
    """The value stored as data (bytes, bytearray or memoryview)."""
    if len(data) and data[0] == _TAG_INT:
        return msgpack.unpackb(memoryview(data)[1:], raw=False, strict_map_key=False, use_list=True)
    return pickle.loads(data)
