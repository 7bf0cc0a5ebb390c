"""The Queue families: Queue and JoinableQueue ops on a ring of records
the daemon keeps in a memory file of its own, mapped by each client on its
host (docs/protocol.md, "Queue rings").
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional, cast

from .. import _values
from .. import exceptions as exc
from .._args import check_count, queue_timeout
from .handle import Handle
from .segment import BUSY, OK, FastPath, _ext, request_with_fds, session_connection

if TYPE_CHECKING:
    from .._proxies import BaseProxy, QueueProxy


def open_ring(fp: FastPath, kind: str, name: str) -> Any:
    """Map a Queue's ring: queue_attach on a connection of this session kept
    for it (not the anchor, whose reader thread owns it), whose reply
    carries the ring's memory file (SCM_RIGHTS). None: use the socket
    path."""
    client = fp.client
    with fp.ring_lock:
        conn = fp.ring_conn
        if conn is None or conn.closed:
            try:
                conn = session_connection(client)
            except (exc.SyncMgrError, OSError):
                return None
            fp.ring_conn = conn
        fds: list[int] = []
        try:
            # tasks: this client keeps a JoinableQueue's task counts in its ring.
            err, info, fds = request_with_fds(conn, "queue_attach", {"kind": kind, "name": name, "tasks": True}, 1)
            if err is not None or len(fds) != 1 or int(info["slot"]) != fp.slot:
                return None
            return _ext.Ring(fds[0], int(info["size"]), int(info["capacity"]),  # type: ignore[union-attr]
                             int(info["inline"]), fp.slot, int(info["maxsize"]), bool(info.get("joinable")))
        except (exc.SyncMgrError, OSError, ValueError, KeyError, TypeError):
            conn.close()  # the stream cannot be trusted: a fresh one next time
            fp.ring_conn = None
            return None
        finally:
            for fd in fds:
                os.close(fd)


# What the ring's gets return for Python to decode: an item's encoding, as
# a bytearray, or as a memoryview of memory the extension reuses for large
# items (fp_itembuf.c). Plain scalars come back decoded.
_ENCODED = (bytearray, memoryview)


def _prepared(x: Any) -> Any:
    """A put_many item that is not a plain scalar, encoded (a pickling error
    raises here, before anything is stored): a bytearray, or the list of its
    pieces when it has large buffers (_values.dumps_parts)."""
    parts = _dumps_parts(x)
    return bytearray(parts[0]) if len(parts) == 1 else parts


class QueueHandle(Handle):
    """A Queue's ring ops. Items are stored as the socket path stores them
    (_values: plain data as msgpack, anything else pickled), so socket and
    ring clients share one FIFO. Any answer DAEMON (the daemon holds items
    outside the ring, the item is too large for it, the daemon is gone)
    sends the op over the socket."""

    methods: tuple[str, ...] = ("put", "get", "put_nowait", "get_nowait", "qsize", "empty", "full", "put_many",
                                "get_many")

    def __init__(self, proxy: BaseProxy, fp: FastPath, ring: Any) -> None:
        self.ring = ring
        self.maxsize = int(ring.maxsize)
        super().__init__(proxy, fp, 0, 0)

    @classmethod
    def open(cls, proxy: BaseProxy, fp: FastPath) -> None:
        """Give proxy the ring methods when the daemon keeps its items in a
        shared ring."""
        ring = open_ring(fp, proxy._kind, proxy._name)
        if ring is not None:
            cls(proxy, fp, ring).install(proxy)

    def detach(self) -> None:
        self.ring.detach()

    def move(self, old: FastPath, fp: Optional[FastPath]) -> None:
        # A forked child maps the ring again for its own session (the
        # slot id written in the latch must be the child's).
        old.handles.discard(self)
        p = self.proxy()
        if p is None:
            return
        self.ring.invalidate()
        self.uninstall(p)
        if fp is not None and fp.ok:
            type(self).open(p, fp)

    def rebind(self) -> bool:
        super().rebind()
        return False  # this handle is the parent's: slow() hands the call to the child's

    def slow(self, method: str, *args: Any) -> Any:
        p = self.proxy()
        h = None if p is None else p.__dict__.get("_fast")
        if h is not None and h is not self:  # a forked child's own handle
            return getattr(h, method)(*args)
        return super().slow(method, *args)

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        t = -1.0 if block is True and timeout is None else queue_timeout(block, timeout)
        if self.fp.ok or self.usable():
            # A plain scalar is encoded by the extension straight into the
            # ring; anything else here (a pickle refused before any latch).
            r = self.ring.put_item(item, t)
            if r is None:
                return
            if r is _QENCODE:
                self._put_parts(item, _dumps_parts(item), t, block, timeout)
                return
            if r is _QEMPTY:
                raise exc.Full(_FULL)
        self.slow("put", item, block, timeout)

    def _put_parts(self, item: Any, parts: list[Any], t: float, block: bool, timeout: Optional[float]) -> None:
        """put of item, encoded as parts (_values.dumps_parts). Large
        buffers (numpy arrays) go out of band: gathered by the extension
        straight into the ring record, one copy."""
        r = self.ring.put(parts[0], t) if len(parts) == 1 else self.ring.put_parts(parts, t)
        if r == OK:
            return
        if r == BUSY:
            raise exc.Full(_FULL)
        p = cast("Optional[QueueProxy]", self.proxy())
        if p is not None and p.__dict__.get("_fast") is self:  # not pickled twice
            p._put_encoded(parts, block, timeout)
            return
        self.slow("put", item, block, timeout)

    def put_nowait(self, item: Any) -> None:
        self.put(item, False)

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        t = -1.0 if block is True and timeout is None else queue_timeout(block, timeout)
        if self.fp.ok or self.usable():
            r = self.ring.get_item(t)
            if type(r) in _ENCODED:  # not a plain scalar: Python decodes it
                return _loads(r)
            if r is _QEMPTY:
                raise exc.Empty(_EMPTY)
            if r is not _QDAEMON:
                return r
        return self.slow("get", block, timeout)

    def get_nowait(self) -> Any:
        return self.get(False)

    def try_get(self) -> Any:
        """The head item if the ring has one now, else MISSING (empty, or
        the daemon serves the queue now): no wait and no exception, for a
        caller that must not block and tries again (an asyncio consumer)."""
        if self.fp.ok or self.usable():
            r = self.ring.get_item(0.0)
            if type(r) in _ENCODED:
                return _loads(r)
            if r is not _QEMPTY and r is not _QDAEMON:
                return r
        return MISSING

    def try_put(self, item: Any) -> Optional[bool]:
        """Put a plain scalar if the ring has room now: True (stored), False
        (full, or the daemon serves the queue now), None (not a plain scalar:
        use put_nowait). No wait and no exception."""
        if self.fp.ok or self.usable():
            r = self.ring.put_item(item, 0.0)
            if r is None:
                return True
            if r is _QENCODE:
                return None
        return False

    def put_many(self, items: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Put every item of items, all together (adjacent and in order) or
        none. Every item is encoded (an unpicklable one refused) before any
        is stored. The ring takes a batch of plain scalars and small items
        under one latch and one commit; anything else (an item with large
        buffers or over the ring's inline limit, a batch that may never fit
        the ring, the daemon's flags) goes to the daemon as one put_many
        request, which is just as atomic."""
        items = list(items)
        if not items:
            return
        t = queue_timeout(block, timeout)
        # Plain scalars go as they are (the extension encodes them); the
        # rest as a bytearray of their encoding, or, for items with large
        # buffers (numpy arrays), the list of its pieces, which the
        # extension gathers straight into the record (one copy).
        prepared = [x if type(x) in _SCALARS else _prepared(x) for x in items]
        start = time.monotonic()
        if self.fp.ok or self.usable():
            r = self.ring.put_many(prepared, t)
            if r == OK:
                return
            if r == BUSY:
                raise exc.Full(_FULL)
            if t > 0:  # DAEMON, nothing stored: the daemon gets what is left of the wait
                t = max(0.0, t - (time.monotonic() - start))
        parts = [x if type(x) is list else [x] if type(x) is bytearray else _dumps_parts(x) for x in prepared]
        p = cast("Optional[QueueProxy]", self.proxy())
        if p is not None and p.__dict__.get("_fast") is self:  # not encoded twice
            p._put_many_encoded(parts, block, None if t < 0 else t)
            return
        self.slow("put_many", items, block, None if t < 0 else t)

    def get_many(self, max_items: int = 1 << 30, block: bool = True, timeout: Optional[float] = None) -> list[Any]:
        """Get at least one item (waiting as get does) and then as many more
        as are there at once, up to max_items."""
        check_count(max_items)
        t = queue_timeout(block, timeout)
        if self.fp.ok or self.usable():
            r = self.ring.get_many(max_items, t)
            if type(r) is list:
                return [_loads(x) if type(x) in _ENCODED else x for x in r]
            if r == BUSY:
                raise exc.Empty(_EMPTY)
        return self.slow("get_many", max_items, block, timeout)  # type: ignore[no-any-return]

    def qsize(self) -> int:
        if self.usable():
            n = self.ring.qsize()
            if n >= 0:
                return int(n)
        return int(self.slow("qsize"))

    def empty(self) -> bool:
        if self.usable():
            n = self.ring.qsize()
            if n >= 0:
                return bool(n == 0)
        return bool(self.slow("empty"))

    def full(self) -> bool:
        if self.usable():
            n = self.ring.qsize()
            if n >= 0:
                return bool(0 < self.maxsize <= n)
        return bool(self.slow("full"))


class JoinableQueueHandle(QueueHandle):
    """A JoinableQueue's ring ops: its task counts are in its ring too."""

    methods = (*QueueHandle.methods, "task_done", "join")

    def task_done(self) -> None:
        if self.fp.ok or self.usable():
            r = self.ring.task_done()
            if r == OK:
                return
            if r == BUSY:
                raise ValueError("task_done() called too many times")
        self.slow("task_done")

    def join(self, timeout: Optional[float] = None) -> bool:
        """Wait until every item put has been marked done (timeout: extension,
        returns False on expiry)."""
        t = queue_timeout(True, timeout)
        if self.fp.ok or self.usable():
            r = self.ring.join(t)
            if r == OK:
                return True
            if r == BUSY:
                return False
        return bool(self.slow("join", timeout))


_dumps = _values.dumps
_dumps_parts = _values.dumps_parts
_loads = _values.loads
# try_get's answer when the ring has nothing to give now.
MISSING: Any = object()
_QENCODE = getattr(_ext, "QENCODE", None)
_QEMPTY = getattr(_ext, "QEMPTY", None)
_QDAEMON = getattr(_ext, "QDAEMON", None)
_SCALARS = frozenset((type(None), bool, int, float, str, bytes))
# The daemon's words for the same errors, so both paths read alike.
_FULL, _EMPTY = "queue full", "queue empty"
