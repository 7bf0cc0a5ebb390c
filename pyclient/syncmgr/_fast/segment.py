"""The fast path's mapping of a daemon's state segment: the attach on a
connection of the process's session kept open for it (the anchor), the
lookup of an object's word, and what a fork does to them (see the package's
docstring).
"""

from __future__ import annotations

import _thread
import os
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional, cast

from .. import _connection
from .. import exceptions as exc
from .._conn import Connection, _notice_in
from .._connection import Client
from .._framing import encode_request

if TYPE_CHECKING:
    from .._transport import Transport
    from .handle import Handle

try:
    import syncmgr._fastpath as _ext
except ImportError:  # built without a compiler: the socket path only
    _ext = None

OK, BUSY, DAEMON = 0, 1, 2
_MAX_REFS = 1 << 16  # entries of a FastPath's refs before it starts again


def enabled_by_env() -> bool:
    """Whether this process may use the fast path at all: the extension is
    built and SYNCMGR_FASTPATH is not 0 (read at each call, so a process
    may turn it off at any time)."""
    if _ext is None:
        return False
    # os.environ's own store (bytes to bytes on POSIX, where the extension
    # is built), which its writes keep current: one dict look-up per create
    # or unpickle, where os.environ.get encodes the key and decodes the
    # value (0.7 us). A replaced os.environ has none.
    data = getattr(os.environ, "_data", None)
    if type(data) is dict:
        return data.get(b"SYNCMGR_FASTPATH", b"1") != b"0"
    return os.environ.get("SYNCMGR_FASTPATH", "1") != "0"


def _local_boot_id() -> str:
    override = os.environ.get("SYNCMGR_FASTPATH_BOOT_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def session_connection(client: Client, retry: bool = True) -> Connection:
    """A new connection of this process's session to client's daemon, for
    the fast path's own use (the anchor, a Queue ring's attach): the
    session is what the daemon's slot ids and ledgers are kept for."""
    return client.route.connect(_connection._session_id, retry=retry)


def request_with_fds(conn: Connection, op: str, args: dict[str, Any], maxfds: int) -> tuple[Any, Any, list[int]]:
    """Ask op on conn, a connection that has nothing else in flight, and
    return the reply's error and result and the descriptors that came with
    it (SCM_RIGHTS; the caller closes them)."""
    conn.send_requests([encode_request(1, op, args)])
    _, err, result, fds = conn.recv_reply_with_fds(maxfds)
    return err, result, fds


class FastPath:
    """One process's mapping of one daemon's state segment."""

    def __init__(self, client: Client) -> None:
        self.ok = False
        self.pid = os.getpid()
        self.client = client
        self.ring_conn: Optional[Connection] = None  # queue_attach's connection (see ring.open_ring)
        self.ring_lock = threading.Lock()
        self.handles: weakref.WeakSet[Handle] = weakref.WeakSet()  # the handles using this mapping
        self.refs: dict[tuple[str, str], tuple[int, int]] = {}  # (kind, name) -> (offset, tag) seen in this run
        # No retry here: a refused attach is tried again later (path_for).
        self.anchor = session_connection(client, retry=False)
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
        # The watcher is started without waiting for it to run (what
        # threading.Thread.start does, two context switches that are a
        # fresh process's largest cost after its handshake): it only
        # blocks in recv until the daemon says it is going. Like a daemon
        # thread, it does not hold up the interpreter's exit.
        _thread.start_new_thread(self._watch, ())

    def _attach(self) -> tuple[dict[str, Any], list[int]]:
        """fastpath_attach on the anchor: its reply and the descriptors that
        came with it (the caller closes them)."""
        err, result, fds = request_with_fds(self.anchor, "fastpath_attach", {}, 4)
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
        sock = cast("socket.socket", self.anchor.sock)  # (an anchor is a Unix socket: fastpath_attach)
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
        self.client._noticed(_notice_in(got))
        self.ok = False
        self.seg.detach()  # sleepers leave their waits for the socket path
        for h in list(self.handles):
            h.detach()

    def note(self, kind: str, name: str, hint: Any) -> None:
        """Keep a create reply's word for the object (hint: its "fp", or
        the word a pickle carried) for this process's first op on it or on
        any proxy of it unpickled here, which then need no fastpath_ref (the
        tag is checked at that use). A word of another run, or an offset
        outside the segment, is not kept."""
        try:
            word = self._word(hint)
            if word is not None:
                self.seg.tag(word[0])  # inside the segment: a pickle's word is not the daemon's own
        except (KeyError, TypeError, ValueError, OverflowError):
            return
        if word is not None:
            self._keep((kind, name), *word)

    def _word(self, r: Any) -> Optional[tuple[int, int]]:
        """The offset and tag of an object's word as the daemon gave it
        (fastpath_ref's {"off", "tag", "run"}, or a create reply's and a
        pickle's [off, tag, run]), or None when another daemon run gave it:
        its offsets are not for this segment."""
        if isinstance(r, (list, tuple)):
            if len(r) != 3 or r[2] != self.run_id:
                return None
            return int(r[0]), int(r[1])
        if not isinstance(r, dict) or r.get("run") != self.run_id:
            return None
        return int(r["off"]), int(r["tag"])

    def _keep(self, key: tuple[str, str], off: int, tag: int) -> None:
        """Remember an object's word (refs), starting the table again once
        it holds _MAX_REFS entries."""
        if len(self.refs) >= _MAX_REFS:
            self.refs.clear()
        self.refs[key] = (off, tag)

    def ref(self, kind: str, name: str) -> Optional[tuple[int, int]]:
        """The word offset and tag (kind | generation << 8) of an object, or
        None to use the socket. An object this process has seen before in
        this daemon run (refs: a create's reply noted, an earlier ref) is
        found with no round trip, as long as its word still carries the
        same tag: a name deleted and made again has another generation, so
        a stale entry is never used."""
        key = (kind, name)
        known = self.refs.get(key)
        if known is not None and self.seg.tag(known[0]) == known[1]:
            return known
        try:
            word = self._word(self.client.call("fastpath_ref", {"kind": kind, "name": name}))
        except exc.SyncMgrError:
            return None
        if word is None or self.seg.tag(word[0]) != word[1]:  # another run's, or deleted and reused since
            return None
        self._keep(key, *word)
        return word


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


def path_for(client: Transport) -> Optional[FastPath]:
    """This process's fast path to client's daemon, or None. It rides on
    the socket transport (its route and session): a proxy on any other
    transport has none. A failed attach (the daemon busy, out of slots) is
    not kept for the client's life: it is tried again after a pause that
    doubles per failure (0.5 s to 30 s)."""
    if not isinstance(client, Client):
        return None
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
