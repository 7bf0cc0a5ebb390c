"""The value encoding shared by the Python and Go clients.

The daemon stores values (queue items, ``Value('O')``, dict keys and values,
list items, Namespace attributes) as opaque bytes. A value that is *plain
data* is stored as msgpack, which the Go client reads and writes too; any
other value is stored as a pickle, which only Python reads:

* ``0xC1`` followed by one msgpack object: plain data. ``0xC1`` is the one
  byte msgpack never uses, and no pickle starts with it.
* ``0xC2``: a pickle with out-of-band buffers (protocol 5), as a fast-path
  Queue put stores an item that holds large buffers (a numpy array, a
  ``bytearray``, a ``PickleBuffer``) so that the buffers are copied once,
  straight into the queue's shared ring (``dumps_parts``). Layout, little
  endian: u8 0xC2, u8 0 (format), u16 0, u32 buffer count n, u64 in-band
  length L; n times (u64 offset, u64 length) of each buffer; the in-band
  pickle (L bytes) at 16 + 16 n; each buffer at its offset, a multiple of
  64 past the in-band pickle and the buffer before it, the last one ending
  the value. ``loads`` rebuilds the object over slices of the value itself
  (numpy arrays come out writable when the value is a ``bytearray``).
  No pickle starts with 0xC2 (it is no opcode).
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
import struct
import threading
from typing import Any

import msgpack

try:  # the C extension decodes a get_many's plain scalars in one call
    from ._fastpath import loads_bins as _loads_bins
except ImportError:  # no compiler at install time: Python decodes every item
    _loads_bins = None

__all__ = ["TAG", "TAG_OOB", "dumps", "dumps_many", "dumps_parts", "is_plain", "loads", "loads_many"]

TAG = b"\xc1"
_TAG_INT = 0xC1
TAG_OOB = 0xC2
PICKLE_PROTOCOL = 5
# A buffer of at least this many bytes goes out of band (dumps_parts);
# smaller ones stay in the pickle, where the copy costs less than the
# buffer's 16 bytes of header and up to 63 of alignment.
OOB_MIN = 4096
_OOB_ALIGN = 64
_OOB_HEAD = struct.Struct("<BBHIQ")
_OOB_ENTRY = struct.Struct("<QQ")
_ZEROS = bytes(_OOB_ALIGN)

class ThreadPacker:
    """One msgpack Packer of the given options per thread: a Packer is not
    thread-safe, and making one per call (msgpack.packb) costs more than
    packing a small value. A thread's Packer is taken while in use, so that
    a signal handler packing in the same thread makes its own."""

    def __init__(self, **opts: Any) -> None:
        self._opts = opts
        self._local = threading.local()

    def take(self) -> msgpack.Packer:
        """The thread's Packer, for a batch; give it back after."""
        p = getattr(self._local, "packer", None)
        self._local.packer = None
        return p if p is not None else msgpack.Packer(**self._opts)

    def give(self, p: msgpack.Packer) -> None:
        self._local.packer = p

    def pack(self, obj: Any) -> bytes:
        # take and give, inline: this is every request's and item's packing.
        local = self._local
        p = getattr(local, "packer", None)
        if p is None:
            p = msgpack.Packer(**self._opts)
        local.packer = None
        try:
            return p.pack(obj)  # on an exception the Packer drops what it had packed
        finally:
            local.packer = p


# strict_types: exact types only, a tuple is not a list, no default hook, so
# anything but plain data raises instead of changing type on the way.
_strict = ThreadPacker(use_bin_type=True, strict_types=True)
_pack = _strict.pack


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


def dumps_many(objs: list[Any]) -> list[list[Any]]:
    """dumps_parts of each of objs (a put_many batch), with the thread's
    Packer taken once for the batch rather than once per item."""
    p = _strict.take()
    try:
        out: list[list[Any]] = []
        for obj in objs:
            if type(obj) in _PLAIN_TYPES:
                try:
                    out.append([TAG + p.pack(obj)])
                    continue
                except _NOT_PLAIN:
                    pass
            out.append(dumps_parts(obj))
        return out
    finally:
        _strict.give(p)


def loads_many(datas: list[Any]) -> list[Any]:
    """loads of each of datas (a get_many reply): plain scalars decoded in
    C when the extension is there (the same values as loads gives), the
    rest by loads."""
    if _loads_bins is not None and type(datas) is list:
        return _loads_bins(datas, loads)
    return [loads(d) for d in datas]


def dumps_parts(obj: Any) -> list[Any]:
    """obj as stored by the daemon, in pieces to concatenate: one piece (what
    dumps returns) unless obj pickles with buffers of at least OOB_MIN bytes;
    then the out-of-band format (0xC2, see the module docstring), whose
    pieces are its header and in-band pickle, the buffers themselves (not
    copied: memoryviews of obj's memory, valid while obj is unchanged) and
    the zero padding between them. Pickling errors raise here, before
    anything is stored."""
    if type(obj) in _PLAIN_TYPES:
        try:
            return [TAG + _pack(obj)]
        except _NOT_PLAIN:  # e.g. a list of numpy arrays
            pass
    bufs: list[memoryview] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        try:
            m = pb.raw()  # contiguous bytes of any shape (C or Fortran order)
        except BufferError:
            return True  # not contiguous: pickle keeps it in band (or refuses it)
        if m.nbytes < OOB_MIN:
            return True
        bufs.append(m)
        return False

    inband = pickle.dumps(obj, protocol=PICKLE_PROTOCOL, buffer_callback=keep)
    if not bufs:
        return [inband]
    head = _OOB_HEAD.size + _OOB_ENTRY.size * len(bufs)
    off = head + len(inband)
    table, pads = [], []
    for m in bufs:
        start = -(-off // _OOB_ALIGN) * _OOB_ALIGN
        pads.append(start - off)
        table.append(_OOB_ENTRY.pack(start, m.nbytes))
        off = start + m.nbytes
    first = b"".join([_OOB_HEAD.pack(TAG_OOB, 0, 0, len(bufs), len(inband)), *table, inband, _ZEROS[: pads[0]]])
    parts: list[Any] = [first]
    for i, m in enumerate(bufs):
        if i:
            parts.append(_ZEROS[: pads[i]])
        parts.append(m)
    return parts


def _loads_oob(data: Any) -> Any:
    mv = memoryview(data)
    if mv.readonly:  # bytes from a socket: the buffers get memory of their own, writable
        mv = memoryview(bytearray(mv))
    total = mv.nbytes
    if total < _OOB_HEAD.size:
        raise ValueError("malformed out-of-band item: short header")
    _, fmt, _, n, inband = _OOB_HEAD.unpack_from(mv)
    head = _OOB_HEAD.size + _OOB_ENTRY.size * n
    if fmt != 0 or n == 0 or head > total or inband > total - head:
        raise ValueError("malformed out-of-band item: bad header")
    end = head + inband
    bufs = []
    for i in range(n):
        off, size = _OOB_ENTRY.unpack_from(mv, _OOB_HEAD.size + _OOB_ENTRY.size * i)
        if off < end or off % _OOB_ALIGN or size > total - off:
            raise ValueError("malformed out-of-band item: bad buffer table")
        bufs.append(mv[off : off + size])
        end = off + size
    if end != total:
        raise ValueError("malformed out-of-band item: trailing bytes")
    return pickle.loads(mv[head : head + inband], buffers=bufs)


def loads(data: Any) -> Any:
    """The value stored as data (bytes, bytearray or memoryview)."""
    if len(data):
        if data[0] == _TAG_INT:
            return msgpack.unpackb(memoryview(data)[1:], raw=False, strict_map_key=False, use_list=True)
        if data[0] == TAG_OOB:
            return _loads_oob(data)
    return pickle.loads(data)
