"""Framing: how requests and replies are laid out on the wire.

A frame is a 4-byte big-endian body length followed by a msgpack body
(docs/protocol.md, "Frames"). A request body is ``[id, op, args]``; a reply
body is ``[id, error, result]`` with ``error`` either nil or
``[code, message]``.

This module only lays out bytes; it does no I/O and knows nothing of
sockets, sessions or semantics. Two things here matter for speed:

* a large blob (a queue item or a value) is not copied into the frame: the
  frame is returned as a list of buffers, the blob being one of them, for
  ``sendmsg``;
* a reply that is ``[id, nil, <bin>]`` is parsed by hand so that a large
  item is returned as a view of the receive buffer, sparing msgpack's copy.

Every request frame is checked against the daemon's frame limit as a whole
(header, arguments and blob) before anything is sent, so an oversized
request fails with :class:`~syncmgr.FrameTooLargeError` and costs nothing
else: the connection, and what the process holds, stay as they were.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Optional

from . import exceptions as exc
from ._values import ThreadPacker, dumps_many

try:  # the C extension encodes a batch of plain scalars in one call
    from ._fastpath import pack_bins as _pack_bins
except ImportError:  # no compiler at install time: Python encodes every batch
    _pack_bins = None

HEADER = struct.Struct(">I")
# Blobs smaller than this are packed into the frame; larger ones are sent as
# a buffer of their own, without a copy.
INLINE_BLOB = 16 << 10
# Where a large reply's item starts in the buffer it is read into: a
# multiple of this many bytes past the buffer's start (_values._OOB_ALIGN).
ITEM_ALIGN = 64

Frame = list[Any]
"""A frame as a list of buffers; the first starts with the 4-byte header."""


packb = ThreadPacker(use_bin_type=True).pack
"""obj packed as MessagePack (str as str, bytes as bin), by the thread's Packer."""


def frame(body: bytes) -> bytes:
    """A frame holding body."""
    return HEADER.pack(len(body)) + body


def body_size(f: Frame) -> int:
    """The body length a frame declares."""
    return int(HEADER.unpack_from(f[0])[0])


def check_size(f: Frame, max_frame: int, what: str) -> None:
    """Raise FrameTooLargeError when f's body is over the daemon's limit."""
    n = body_size(f)
    if n > max_frame:
        raise exc.FrameTooLargeError(
            f"{what}: a request of {n} bytes is over the daemon's frame limit of {max_frame} bytes "
            "(nothing was sent; raise the limit with `syncmgr serve --max-frame`)"
        )


def encode_request(rid: int, op: str, args: dict[str, Any], blob_key: Optional[str] = None,
                   blob: Any = None) -> Frame:
    """A request frame as a list of buffers. A large ``blob`` (an item or a
    value) is not copied into the frame: it is sent as its own buffer, or as
    its pieces when it is a list of buffers to concatenate (an item's
    out-of-band encoding, _values.dumps_parts: a numpy array's memory goes
    to the socket as it is)."""
    if blob_key is not None:
        pieces = blob if isinstance(blob, list) else [blob]
        # A plain item is one bytes piece: its size is its length, and it
        # goes into the frame as it is.
        one = pieces[0] if len(pieces) == 1 and type(pieces[0]) is bytes else None
        size = len(one) if one is not None else sum(memoryview(b).nbytes for b in pieces)
        if size < INLINE_BLOB:
            args = dict(args)
            args[blob_key] = one if one is not None else b"".join(pieces)
            blob_key = None
    if blob_key is None:
        body = packb([rid, op, args])
        return [HEADER.pack(len(body)) + body]
    n = len(args) + 1
    parts = [b"\x93", packb(rid), packb(op)]
    parts.append(bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n))
    for k, v in args.items():
        parts.append(packb(k))
        parts.append(packb(v))
    parts.append(packb(blob_key))
    parts.append(bin_header(size))
    prefix = b"".join(parts)
    return [HEADER.pack(len(prefix) + size) + prefix, *pieces]


def bin_header(size: int) -> bytes:
    """The MessagePack bin header of a bin of size bytes."""
    if size < 256:
        return b"\xc4" + bytes([size])
    if size < 65536:
        return b"\xc5" + struct.pack(">H", size)
    return b"\xc6" + struct.pack(">I", size)


def bin_array(items: list[list[Any]]) -> list[Any]:
    """A MessagePack array of bins, one per item, each item given as the
    pieces of its encoding (_values.dumps_parts), as a list of buffers to
    concatenate: the items' large buffers are not copied (put_many's
    ``items`` argument)."""
    if all(len(pieces) == 1 for pieces in items):
        # Every item in one piece (plain data, a pickle without large
        # buffers): the C packer writes the whole array of bins at once.
        return [packb([pieces[0] for pieces in items])]
    n = len(items)
    out: list[Any] = [bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n) if n < 65536
                      else b"\xdd" + struct.pack(">I", n)]
    for pieces in items:
        out.append(bin_header(sum(memoryview(b).nbytes for b in pieces)))
        out.extend(pieces)
    return out


def pack_items(objs: list[Any]) -> list[Any]:
    """A socket put_many's ``items`` argument for objs: a MessagePack array
    of bins, each item as _values.dumps stores it, as a list of buffers to
    concatenate. A batch of plain scalars is encoded by the C extension in
    one call; any other (or without the extension) item by item
    (_values.dumps_many), its large buffers not copied. Encoding errors
    (an unpicklable item) raise here, before anything is sent."""
    if _pack_bins is not None:
        packed = _pack_bins(objs)
        if packed is not None:
            return [packed]
    return bin_array(dumps_many(objs))


_UINT = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_BINLEN = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def bin_start(head: Any) -> Optional[tuple[int, int, int]]:
    """The reply id, the offset and the length of the bin of a frame body
    shaped ``[id, nil, <bin>]``, read from its first bytes (head); None for
    any other shape, or when head is too short to tell."""
    if len(head) < 2 or head[0] != 0x93:
        return None
    c = head[1]
    if c < 0x80:
        rid, pos = c, 2
    elif c in _UINT:
        k = _UINT[c]
        if len(head) < 2 + k:
            return None
        rid, pos = int.from_bytes(head[2:2 + k], "big"), 2 + k
    else:
        return None
    if len(head) < pos + 2 or head[pos] != 0xC0 or head[pos + 1] not in _BINLEN:
        return None
    k = _BINLEN[head[pos + 1]]
    if len(head) < pos + 2 + k:
        return None
    return rid, pos + 2 + k, int.from_bytes(head[pos + 2:pos + 2 + k], "big")


def bin_reply(body: Any) -> Optional[tuple[int, Any, Any]]:
    """Parse ``[id, nil, <bin>]`` by hand and return the bin as a view of the
    frame buffer, sparing msgpack's copy of a large item; None for any other
    shape (the caller then decodes normally)."""
    b = bin_start(body)
    if b is None or b[1] + b[2] != len(body):
        return None
    return b[0], None, memoryview(body)[b[1]:]


def sendmsg_all(sock: socket.socket, buffers: list[Any]) -> None:
    """Send every buffer, in order, with as few system calls as the kernel allows."""
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        sent = sock.sendmsg(views[:512])
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0
