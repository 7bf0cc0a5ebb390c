"""The same-host fast path: Lock, RLock, Condition's lock, Semaphore,
BoundedSemaphore, Event and numeric Value ops on state words the daemon keeps
in shared memory, and Queue ops on a ring of records the daemon keeps in a
memory file of its own (see _QueueHandle).

A client on the daemon's host (Unix socket, same boot id) maps the daemon's
state segment and does uncontended operations with one compare-and-swap in
the C extension ``syncmgr._fastpath``, without a system call; contended
waits sleep on a futex on the word. The daemon stays the arbiter: while it
has waiters of its own queued on an object it sets the word's daemon bit,
and every op the extension answers with ``DAEMON`` is sent over the socket
instead, as is every op that would be an error (so errors are the daemon's,
worded and typed as on the socket path). Layout and protocol:
docs/protocol.md, "Same-host fast path".

The fast path is used when all of these hold, and otherwise every op goes
over the socket as before:

* the extension was built (a C compiler at install time) and
  ``SYNCMGR_FASTPATH`` is not ``0``;
* the daemon is reached over a Unix socket and reports this host's boot id
  (``SYNCMGR_FASTPATH_BOOT_ID``, for tests only, replaces the local one);
* the daemon agrees (``fastpath_attach``, whose reply carries the segment's
  descriptor), the descriptor passes the owner, mode, size and seal checks,
  and the object has a word (``fastpath_ref``) in that daemon run's segment.

Each process keeps one extra connection of its session open while it uses
the fast path (the anchor): the session, and so the slot id written in the
words, lives as long as that connection; if the daemon goes away the anchor
sees it and every handle falls back to the socket path, which reports it.

A forked child inherits its parent's handles; the first op on any of them
moves them all to the child's own session (its own slot and anchor), keeping
the offsets, so a child's first ops are as fast as its parent's.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional, cast

from . import _connection, _values
from . import exceptions as exc
from ._args import check_count, queue_timeout
from ._framing import encode_request

if TYPE_CHECKING:
    from ._connection import Client
    from ._proxies import AcquirerProxy, BaseProxy, QueueProxy, ValueProxy

try:
    from . import _fastpath as _ext
except ImportError:  # built without a compiler: the socket path only
    _ext = None

OK, BUSY, DAEMON = 0, 1, 2
# The C handle's kinds.
_HANDLE_LOCK, _HANDLE_RLOCK, _HANDLE_SEMAPHORE = 0, 1, 2

# Value typecodes the words hold: (class, width) as the extension takes them.
_VALUE_CLASS = {
    "b": ord("i") | 8 << 8, "B": ord("u") | 8 << 8, "h": ord("i") | 16 << 8, "H": ord("u") | 16 << 8,
    "i": ord("i") | 32 << 8, "I": ord("u") | 32 << 8, "l": ord("i") | 64 << 8, "L": ord("u") | 64 << 8,
    "q": ord("i") | 64 << 8, "Q": ord("u") | 64 << 8, "f": ord("f"), "d": ord("d"), "?": ord("?"),
}

_get_ident = threading.get_ident

# A contended Lock, RLock or Semaphore acquire, and an Event wait, sleep on
# the word's futex for their whole timeout, each holding an entry of the
# segment's waiter table (so `syncmgr status` shows them); a waiter
# that has waited 1 ms becomes the heir a release hands the lock to
# (docs/protocol.md, "Waits").


def enabled_by_env() -> bool:
    """Whether this process may use the fast path at all: the extension is
    built and SYNCMGR_FASTPATH is not 0."""
    return _ext is not None and os.environ.get("SYNCMGR_FASTPATH", "1") != "0"


def _local_boot_id() -> str:
    override = os.environ.get("SYNCMGR_FASTPATH_BOOT_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class FastPath:
    """One process's mapping of one daemon's state segment."""

    def __init__(self, client: Client) -> None:
        self.ok = False
        self.pid = os.getpid()
        self.client = client
        self.ring_conn: Optional[_connection.Connection] = None  # queue_attach's connection (see _open_ring)
        self.ring_lock = threading.Lock()
        self.handles: weakref.WeakSet[_Handle] = weakref.WeakSet()  # the handles using this mapping
        self.refs: dict[tuple[str, str], tuple[int, int]] = {}  # (kind, name) -> (offset, tag) seen in this run
        # No retry here: a refused attach is tried again later (path_for).
        self.anchor = client.route.connect(_connection._session_id, retry=False)
        try:
            info, fds = self._attach()
            try:
                if not info.get("boot_id") or info.get("boot_id") != _local_boot_id():
                    raise OSError("the daemon is on another host (boot id differs)")
                # The segment comes as a descriptor with the reply, over the
                # connection that answered: it is that daemon run's, never a
                # file some other process named or planted.
                if len(fds) != 1 or not self.anchor.run_id or info.get("run") != self.anchor.run_id:
                    raise OSError("fastpath_attach did not pass this daemon run's segment")
                self.seg = _ext.Segment(fds[0], int(info["size"]))  # type: ignore[union-attr]
                st = os.fstat(fds[0])
                # Which segment this is: a forked child's handles keep their
                # offsets only in the very same one (not a restarted daemon's).
                self.identity = (self.anchor.run_id, st.st_dev, st.st_ino)
            finally:
                for fd in fds:
                    os.close(fd)
            self.slot = int(info["slot"])
            self.run_id = self.anchor.run_id  # the daemon run whose words these are
        except BaseException:
            self.anchor.close()
            raise
        self.ok = True
        threading.Thread(target=self._watch, name="syncmgr-fastpath-anchor", daemon=True).start()

    def _attach(self) -> tuple[dict[str, Any], list[int]]:
        """fastpath_attach on the anchor: its reply and the descriptors that
        came with it (the caller closes them)."""
        err, result, fds = _request_with_fds(self.anchor, "fastpath_attach", {}, 4)
        if err is None and isinstance(result, dict):
            return result, fds
        for fd in fds:
            os.close(fd)
        if err is not None:
            raise exc.from_code(err[0], err[1])
        raise exc.ProtocolError("malformed fastpath_attach reply")

    def _watch(self) -> None:
        # Nothing is asked on the anchor after the attach: what comes is the
        # daemon's notice that it is shutting down (an unasked reply), then
        # the close (or the close alone: it died).
        sock = self.anchor.sock
        got = b""
        try:
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                if len(got) < 4096:
                    got += data
        except (OSError, ValueError):
            pass
        # Before the sleepers wake: their calls go to the socket path, and
        # the client then says "shutting down", not "gone".
        self.client._noticed(_connection._notice_in(got))
        self.ok = False
        self.seg.detach()  # sleepers leave their waits for the socket path
        for h in list(self.handles):
            h.detach()

    def ref(self, kind: str, name: str, hint: Any = None) -> Optional[tuple[int, int]]:
        """The word offset and tag (kind | generation << 8) of an object, or
        None to use the socket. hint is the create reply's copy of the
        fastpath_ref answer; without one, an object this process has seen
        before in this daemon run is found with no round trip (refs), as
        long as its word still carries the same tag: a name deleted and
        made again has another generation, so a stale entry is never used."""
        key = (kind, name)
        r = hint
        if r is None:
            known = self.refs.get(key)
            if known is not None and self.seg.tag(known[0]) == known[1]:
                return known
            try:
                r = self.client.call("fastpath_ref", {"kind": kind, "name": name})
            except exc.SyncMgrError:
                return None
        if not isinstance(r, dict) or r.get("run") != self.run_id:
            return None  # another daemon run answered: its offsets are not for this segment
        off, tag = int(r["off"]), int(r["tag"])
        if self.seg.tag(off) != tag:  # deleted and reused since the reply
            return None
        if len(self.refs) >= _MAX_REFS:
            self.refs.clear()
        self.refs[key] = (off, tag)
        return off, tag


def _request_with_fds(conn: _connection.Connection, op: str, args: dict[str, Any],
                      maxfds: int) -> tuple[Any, Any, list[int]]:
    """Ask op on conn, a connection that has nothing else in flight, and
    return the reply's error and result and the descriptors that came with
    it (SCM_RIGHTS; the caller closes them)."""
    conn.send_requests([encode_request(1, op, args)])
    _, err, result, fds = conn.recv_reply_with_fds(maxfds)
    return err, result, fds


_paths: dict[int, Optional[FastPath]] = {}
_paths_lock = threading.Lock()
_retry: dict[int, tuple[float, float]] = {}  # id(client) -> (when to try attaching again, pause)
reasons: dict[str, str] = {}  # address -> why the fast path is off (for tests and debugging)
_RETRY_FIRST, _RETRY_MAX = 0.5, 30.0


def _after_fork_in_child() -> None:
    global _paths_lock
    for fp in _paths.values():
        if fp is not None:
            fp.ok = False
            fp.seg.invalidate()  # the parent's slot is not ours
    _paths.clear()
    _retry.clear()
    _paths_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def path_for(client: Client) -> Optional[FastPath]:
    """This process's fast path to client's daemon, or None. A failed
    attach (the daemon busy, out of slots) is not kept for the client's
    life: it is tried again after a pause that doubles per failure
    (0.5 s to 30 s)."""
    key = id(client)
    if key in _paths:
        fp = _paths[key]
        if fp is None or fp.ok or fp.pid != os.getpid():
            return fp
        with _paths_lock:  # that daemon run has ended (its anchor closed): map the next one's
            if _paths.get(key) is fp:
                del _paths[key]
    r = _retry.get(key)
    if r is not None and time.monotonic() < r[0]:
        return None
    with _paths_lock:
        if key in _paths:
            return _paths[key]
        r = _retry.get(key)
        if r is not None and time.monotonic() < r[0]:
            return None
        if client.dial.startswith("tcp://"):
            reasons[client.address] = "not a Unix socket"
            _paths[key] = None
            return None
        try:
            fp = FastPath(client)
        except (exc.SyncMgrError, OSError, ValueError) as e:
            reasons[client.address] = str(e)
            pause = min(2 * r[1], _RETRY_MAX) if r is not None else _RETRY_FIRST
            _retry[key] = (time.monotonic() + pause, pause)
            return None
        _retry.pop(key, None)
        _paths[key] = fp
        return fp


_MAX_REFS = 1 << 16  # entries of a FastPath's refs before it starts again


def wants_ref(client: Client, kind: str) -> bool:
    """Whether a create of kind should ask for the object's word in its
    reply (the "fastpath" argument): the fast path is on for client."""
    if kind not in _WORDS or not enabled_by_env():
        return False
    fp = path_for(client)
    return fp is not None and fp.ok


def attach(proxy: BaseProxy, hint: Any = None) -> None:
    """Give proxy fast methods when its object is on the fast path (hint:
    the create reply's "fp", the object's word). Which handle serves it is
    the families' table (_FAMILIES)."""
    if not enabled_by_env():
        return
    kind = proxy._kind
    ring = _RINGS.get(kind)
    if ring is not None:
        fp = path_for(proxy._client)
        if fp is not None and fp.ok:
            ring.open(proxy, fp)
        return
    words = _WORDS.get(kind)
    if words is None or not all(cls.serves(proxy) for cls in words.values()):
        return
    fp = path_for(proxy._client)
    if fp is None or not fp.ok:
        return
    ref = fp.ref(kind, proxy._name, hint)
    if ref is None:
        return
    off, tag = ref
    cls = words.get(tag & 0xFF)  # a Condition's word is its Lock's or its RLock's
    if cls is not None and cls.fits(fp, off):
        cls(proxy, fp, off, tag).install(proxy)


def reattach(proxy: BaseProxy) -> None:
    """Move proxy to the fast path of the daemon run its client reaches now
    (after its object was created again in a restarted daemon): the old
    handle's words and ring belong to the run that ended."""
    h = proxy.__dict__.get("_fast")
    if h is not None:
        h.fp.handles.discard(h)
        h.uninstall(proxy)
    attach(proxy)


def active(proxy: BaseProxy) -> bool:
    """Whether proxy's ops take the fast path now."""
    h = proxy.__dict__.get("_fast")
    return h is not None and h.fp.ok


class _Handle:
    """A proxy's fast methods. It keeps the proxy only weakly (the proxy
    keeps the handle's bound methods), and calls the proxy class's own
    socket-path methods whenever the word cannot be used."""

    # The proxy methods the family serves: install puts them in the proxy's
    # __dict__, where they come before the class's socket-path methods, and
    # uninstall takes them out again. The one list of them.
    methods: tuple[str, ...] = ()

    @classmethod
    def serves(cls, proxy: BaseProxy) -> bool:
        """Whether this family can serve proxy at all (asked before its word
        is looked up)."""
        return True

    @classmethod
    def fits(cls, fp: FastPath, off: int) -> bool:
        """Whether fp's session can use the words of the object at off
        (asked at attach, and when a forked child moves the handle; the
        offset and tag are checked apart)."""
        return True

    def __init__(self, proxy: BaseProxy, fp: FastPath, off: int, tag: int) -> None:
        self.proxy = weakref.ref(proxy)
        self.cls = type(proxy)
        self.off = off
        self.tag = tag
        self.bind(fp)

    def bind(self, fp: FastPath) -> None:
        """Use fp's mapping and session (subclasses take what they need of it)."""
        self.fp = fp
        self.seg = fp.seg
        fp.handles.add(self)

    def served_by(self) -> Any:
        """What has the methods install puts in the proxy: the handle itself,
        unless the family's calls run in C (_LockHandle)."""
        return self

    def install(self, proxy: BaseProxy) -> None:
        d = proxy.__dict__
        d["_fast"] = self
        impl = self.served_by()
        for m in self.methods:
            d[m] = getattr(impl, m)

    def uninstall(self, proxy: BaseProxy) -> None:
        d = proxy.__dict__
        for m in self.methods:
            d.pop(m, None)
        d.pop("_fast", None)

    def detach(self) -> None:
        """The daemon run has ended: let go of what the handle maps beside
        the segment (a Queue's ring)."""

    def slow(self, method: str, *args: Any) -> Any:
        p = self.proxy()
        if p is None:
            raise exc.SyncMgrError("the proxy is gone")
        return getattr(self.cls, method)(p, *args)

    def usable(self) -> bool:
        """Whether the word may be used now: False once the daemon is gone.
        In a forked child the handle moves to the child's own fast path
        first (see rebind)."""
        return self.fp.ok or (self.fp.pid != os.getpid() and self.rebind())

    def rebind(self) -> bool:
        """In a forked child, on the first use of any inherited handle: move
        every handle of the parent's mapping to the child's own fast path
        (its own session, slot and anchor, set up once by path_for), keeping
        the objects' offsets. No object costs a request, and the child's
        first op on each object is as fast as its parent's: cpprb, for one,
        has a start-up race that only stays harmless while an explorer's
        first Event.wait is quick."""
        p = self.proxy()
        if p is None:
            return False
        old = self.fp
        fp = path_for(p._client)
        for h in list(old.handles):
            h.move(old, fp)
        return self.fp is fp and fp.ok

    def move(self, old: FastPath, fp: Optional[FastPath]) -> None:
        """Leave old for fp (a forked child's fast path). The offset is kept
        only in the very file old mapped and while its slot still carries
        the object's tag; otherwise the proxy goes back to the socket path."""
        old.handles.discard(self)
        p = self.proxy()
        if p is None:
            return
        if (fp is None or not fp.ok or fp.identity != old.identity or fp.seg.tag(self.off) != self.tag
                or not self.fits(fp, self.off)):
            self.uninstall(p)
            return
        self.bind(fp)
        self.install(p)


def _acquire_timeout(blocking: bool, timeout: Optional[float]) -> Optional[float]:
    """The extension's timeout (< 0: for ever) for threading-style arguments,
    or None when they are invalid (the socket path then raises as it does)."""
    if blocking is True and timeout is None:
        return -1.0
    if not blocking:
        return 0.0 if timeout is None or timeout == -1 else None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return None
    if timeout == -1:
        return -1.0
    if timeout != timeout or timeout < 0 or timeout > 1e9:  # NaN, negative, or for the socket path's checks
        return None
    return float(timeout)


class _LockHandle(_Handle):
    # (with-statements call the type's __enter__, which calls self.acquire)
    methods = ("acquire", "release")
    handle_kind = _HANDLE_LOCK

    def bind(self, fp: FastPath) -> None:
        super().bind(fp)
        self.slot = fp.slot
        self.take = fp.seg.lock_acquire
        self.give = fp.seg.lock_release

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        t = _acquire_timeout(blocking, timeout)
        if t is None or not self.usable():
            return bool(self.slow("acquire", blocking, timeout))
        start = time.monotonic()
        r = self.take(self.off, self.slot, _get_ident(), t)
        if r == OK:
            return True
        if r == BUSY:
            return False
        # DAEMON (the daemon has waiters queued, or is gone): the socket path, for the rest of the timeout.
        if t > 0:
            timeout = max(0.0, t - (time.monotonic() - start))
        return bool(self.slow("acquire", blocking, timeout))

    chandle: Any = None  # the C handle: one per proxy for its whole life

    def served_by(self) -> Any:
        # The common calls run in C (no Python frame); this class's methods
        # are their slow paths. A forked child keeps the very same C handle,
        # pointed at its own mapping and slot (rebind), so that references
        # to proxy.acquire taken before the fork stay on the C path.
        h = self.chandle
        if h is None:
            h = self.chandle = _ext.LockHandle(self.seg, self.off, self.slot,  # type: ignore[union-attr]
                                               self.handle_kind, self.acquire, self.release)
        else:
            h.rebind(self.seg, self.off, self.slot)
        return h

    def release(self) -> None:
        if not (self.usable() and self.give(self.off) == OK):
            self.slow_release()

    def slow_release(self) -> None:
        """Release over the socket: DAEMON, or an error the daemon words. When
        the daemon that served this handle is gone, a lock taken by CAS was
        taken in its run: the release names that run, so that after a restart
        it raises ServerRestartedError as on the socket path (unless the lock
        was taken again over the socket since, in the new run)."""
        fp, p = self.fp, cast("Optional[AcquirerProxy]", self.proxy())
        if p is not None and not fp.ok and fp.pid == os.getpid():
            p._taken_in(fp.run_id)
        self.slow("release")


class _RLockHandle(_LockHandle):
    handle_kind = _HANDLE_RLOCK

    def bind(self, fp: FastPath) -> None:
        super().bind(fp)
        self.take = fp.seg.rlock_acquire
        self.give_r = fp.seg.rlock_release

    def release(self) -> None:
        if not (self.usable() and self.give_r(self.off, self.slot, _get_ident()) == OK):
            self.slow_release()


class _SemHandle(_LockHandle):
    """Semaphore and BoundedSemaphore: units taken by CAS are counted in the
    session's ledger entry, so the daemon gives them back when the session
    ends; a release of units taken through the daemon (or of none) goes to
    the daemon, which decides whose count it comes off."""

    handle_kind = _HANDLE_SEMAPHORE

    def bind(self, fp: FastPath) -> None:
        super().bind(fp)
        self.take = fp.seg.sem_acquire
        self.give_s = fp.seg.sem_release

    @classmethod
    def fits(cls, fp: FastPath, off: int) -> bool:
        """Whether fp's session slot has an entry in the ledger of the
        Semaphore at off (a slot id past its length takes units through the
        daemon)."""
        return fp.seg.sem_taken(off, fp.slot) is not None

    def release(self) -> None:
        if not (self.usable() and self.give_s(self.off, self.slot) == OK):
            self.slow_release()


class _EventHandle(_Handle):
    methods = ("is_set", "set", "clear", "wait")

    def is_set(self) -> bool:
        if self.usable():
            return self.seg.event_is_set(self.off)  # type: ignore[no-any-return]
        return bool(self.slow("is_set"))

    def set(self) -> None:
        if not (self.usable() and self.seg.event_set(self.off) == OK):
            self.slow("set")

    def clear(self) -> None:
        if not self.usable():
            self.slow("clear")
            return
        self.seg.event_clear(self.off)

    def wait(self, timeout: Optional[float] = None) -> bool:
        if timeout is None:
            t = -1.0
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
            return bool(self.slow("wait", timeout))
        else:
            t = max(0.0, float(timeout))
            if t > 1e9:
                return bool(self.slow("wait", timeout))
        if not self.usable():
            return bool(self.slow("wait", timeout))
        r = self.seg.event_wait_since(self.off, self.seg.event_gen(self.off), t, self.fp.slot)
        if r is None:  # the daemon went away during the wait
            return bool(self.slow("wait", timeout))
        return bool(r)


class _ValueHandle(_Handle):
    methods = ("get", "set", "add", "compare_and_set")

    @classmethod
    def serves(cls, proxy: BaseProxy) -> bool:
        return getattr(proxy, "typecode", "O") in _VALUE_CLASS  # numbers only: the word holds no pickle

    def __init__(self, proxy: BaseProxy, fp: FastPath, off: int, tag: int) -> None:
        super().__init__(proxy, fp, off, tag)
        code = cast("ValueProxy", proxy).typecode
        self.cls_code = _VALUE_CLASS[code]
        # The Python types the word takes as they are; anything else (numpy
        # scalars, wrong types, out-of-range ints) goes to the socket path,
        # which converts or refuses it exactly as before.
        if code in "fd":
            self.types: tuple[type, ...] = (int, float)
        elif code == "?":
            self.types = (bool,)
        else:
            self.types = (int,)
        self.delta_types: tuple[type, ...] = () if code == "?" else ((int, float) if code in "fd" else (int,))

    def get(self) -> Any:
        if self.usable():
            return self.seg.value_get(self.off, self.cls_code)
        return self.slow("get")

    def set(self, value: Any) -> None:
        if type(value) in self.types and self.usable():
            try:
                self.seg.value_set(self.off, self.cls_code, value)
                return
            except (OverflowError, TypeError, ValueError):
                pass  # the daemon refuses it with its own error
        self.slow("set", value)

    def add(self, delta: Any = 1) -> Any:
        if type(delta) in self.delta_types and self.usable():
            try:
                return self.seg.value_add(self.off, self.cls_code, delta)
            except (OverflowError, TypeError, ValueError):
                pass
        return self.slow("add", delta)

    def compare_and_set(self, expected: Any, new: Any) -> bool:
        if type(expected) in self.types and type(new) in self.types and self.usable():
            try:
                return bool(self.seg.value_cas(self.off, self.cls_code, expected, new))
            except (OverflowError, TypeError, ValueError):
                pass
        return bool(self.slow("compare_and_set", expected, new))


def _open_ring(fp: FastPath, kind: str, name: str) -> Any:
    """Map a Queue's ring: queue_attach on a connection of this session kept
    for it (not the anchor, whose reader thread owns it), whose reply
    carries the ring's memory file (SCM_RIGHTS). None: use the socket
    path."""
    client = fp.client
    with fp.ring_lock:
        conn = fp.ring_conn
        if conn is None or conn.closed:
            try:
                conn = client.route.connect(_connection._session_id)
            except (exc.SyncMgrError, OSError):
                return None
            fp.ring_conn = conn
        fds: list[int] = []
        try:
            # tasks: this client keeps a JoinableQueue's task counts in its ring.
            err, info, fds = _request_with_fds(conn, "queue_attach", {"kind": kind, "name": name, "tasks": True}, 1)
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


def _prepared(x: Any) -> Any:
    """A put_many item that is not a plain scalar, encoded (a pickling error
    raises here, before anything is stored): a bytearray, or the list of its
    pieces when it has large buffers (_values.dumps_parts)."""
    parts = _dumps_parts(x)
    return bytearray(parts[0]) if len(parts) == 1 else parts


class _QueueHandle(_Handle):
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
        ring = _open_ring(fp, proxy._kind, proxy._name)
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
            if type(r) is bytearray:  # not a plain scalar: Python decodes it
                return _loads(r)
            if r is _QEMPTY:
                raise exc.Empty(_EMPTY)
            if r is not _QDAEMON:
                return r
        return self.slow("get", block, timeout)

    def get_nowait(self) -> Any:
        return self.get(False)

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
                return [_loads(x) if type(x) is bytearray else x for x in r]
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


class _JoinableQueueHandle(_QueueHandle):
    """A JoinableQueue's ring ops: its task counts are in its ring too."""

    methods = (*_QueueHandle.methods, "task_done", "join")

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
_QENCODE = getattr(_ext, "QENCODE", None)
_QEMPTY = getattr(_ext, "QEMPTY", None)
_QDAEMON = getattr(_ext, "QDAEMON", None)
_SCALARS = frozenset((type(None), bool, int, float, str, bytes))
# The daemon's words for the same errors, so both paths read alike.
_FULL, _EMPTY = "queue full", "queue empty"


# The fast path's families, one line each: a handle class and the proxy
# kinds it serves, each with the kind of word the daemon keeps for such an
# object (the low byte of the word's tag: statemem's Kind* numbers), or
# RING for a Queue's, whose items are in a ring of its own. attach picks
# the handle here; a new family is a handle class and a line.
RING = -1
_FAMILIES: tuple[tuple[type[_Handle], dict[str, int]], ...] = (
    (_LockHandle, {"lock": 1, "condition": 1}),
    (_RLockHandle, {"rlock": 2, "condition": 2}),
    (_SemHandle, {"semaphore": 3, "bounded_semaphore": 4}),
    (_EventHandle, {"event": 5}),
    (_ValueHandle, {"value": 6}),
    (_QueueHandle, {"queue": RING}),
    (_JoinableQueueHandle, {"joinable_queue": RING}),
)
_WORDS: dict[str, dict[int, type[_Handle]]] = {}  # proxy kind -> word kind -> handle
_RINGS: dict[str, type[_QueueHandle]] = {}  # proxy kind -> ring handle
for _cls, _kinds in _FAMILIES:
    for _kind, _word in _kinds.items():
        if _word == RING:
            _RINGS[_kind] = cast("type[_QueueHandle]", _cls)
        else:
            _WORDS.setdefault(_kind, {})[_word] = _cls
