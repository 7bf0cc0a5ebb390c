"""The per-process client, over connections (``_conn``), and the routes to daemons.

A :class:`Client` is one process's view of one daemon. It keeps a small
pool of authenticated connections; a call takes a connection, sends one
request and reads its reply, then puts the connection back. One thread thus
never waits behind another's blocking call, and the common single-threaded
path has no thread hand-off. All connections of a process present the same
session id, so the daemon treats them as one client: what the process holds
is released when its last connection closes (for instance when it is
killed). After ``fork`` the child gets a new session id and never touches
the parent's sockets.

Socket and msgpack errors become syncmgr exceptions here and in ``_conn``
(one connection: its socket, handshake and frames), nowhere else. Where a
key comes from is ``_keys``; TLS settings and pins are ``_tls``.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

from . import exceptions as exc
from ._conn import (
    CONNECT_TIMEOUT,
    Connection,
    _idle_check,
    default_address,  # noqa: F401 - callers find the default address beside normalize_address
)
from ._framing import (
    HEADER,
    INLINE_BLOB,
    Frame,
    body_size,
    check_size,
    encode_request,
)
from ._handshake import (
    _HandshakeDropped,
)
from ._keys import coerce_key, key_and_source_for
from ._tls import tls_context_from_env

_header_from = HEADER.unpack_from
_header = HEADER.pack

_log = logging.getLogger("syncmgr")
_log.addHandler(logging.NullHandler())

# A pooled connection idle for longer than this is checked (one poll) before
# use, so that a daemon restart is noticed without failing a call.
_IDLE_CHECK = 0.5

# --- session identity, renewed in a forked child -------------------------

_session_id = os.urandom(16)
_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _session_id, _clients_lock
    _session_id = os.urandom(16)
    _clients_lock = threading.Lock()
    for c in list(_clients.values()):
        c._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def session_id() -> bytes:
    """This process's session id (a forked child gets its own)."""
    return _session_id


def normalize_address(address: Any) -> str:
    """A daemon address as a string that means the same in any process.

    A ``(host, port)`` pair (as ``multiprocessing.managers`` takes) becomes
    ``tcp://host:port``; a relative socket path becomes absolute, so a proxy
    pickled here still works in a child with another working directory.
    """
    if isinstance(address, (tuple, list)) and len(address) == 2:
        host, port = address
        host = str(host)
        return f"tcp://[{host}]:{int(port)}" if ":" in host else f"tcp://{host}:{int(port)}"
    if not isinstance(address, str):
        raise TypeError(f"a syncmgr address is a socket path, 'tcp://host:port' or (host, port), not {address!r}")
    if address.startswith("tcp://"):
        return address
    if address.startswith("unix://"):
        return "unix://" + os.path.abspath(address[len("unix://"):])
    return os.path.abspath(address) if address else address


class Route:
    """How this process reaches the daemon an address names: where it dials,
    with which key (and words for where the key came from), and how it
    checks the daemon over TLS. Usually the address itself; a daemon of a
    syncmgr cluster on Ray (``syncmgr.ray``) is named by its node's socket
    path in every process, and reached there over the socket on its own
    node and over TCP+TLS, pinned to its certificate's SHA-256, from any
    other."""

    __slots__ = ("dial", "key", "key_source", "ssl_context", "pin", "peer")

    def __init__(self, dial: str, key: bytes, key_source: str, ssl_context: Optional[ssl.SSLContext] = None,
                 pin: Optional[str] = None, peer: str = "") -> None:
        self.dial = dial
        self.key = key
        self.key_source = key_source
        self.ssl_context = ssl_context
        self.pin = pin
        self.peer = peer  # what the daemon is, for errors ("node ... of syncmgr cluster ...")

    def connect(self, session: bytes, retry: bool = True) -> Connection:
        """A new authenticated connection to the daemon, for session."""
        return Connection(self.dial, self.key, session, self.ssl_context, retry=retry, key_source=self.key_source,
                          pin=self.pin, peer=self.peer)


def route_for(address: str) -> Optional[Route]:
    """The Route of a syncmgr-on-Ray address (imported only when an address
    is one), or None for an address that is dialled as it is."""
    if _RAY_MARK not in address:
        return None
    from . import ray as _ray  # noqa: PLC0415 - Ray is optional and heavy: only for its addresses

    return _ray.route(address)


_RAY_MARK = "/syncmgr-ray-"


def fresh_route(address: str, old: Route) -> Optional[Route]:
    """For an address of a syncmgr cluster on Ray whose route failed (a
    refused key or pin, nobody at its port): the route asked anew, if it
    differs from old; None otherwise (nothing to try again)."""
    if _RAY_MARK not in address:
        return None
    from . import ray as _ray  # noqa: PLC0415 - Ray is optional and heavy: only for its addresses

    _ray.forget(address)
    try:
        new = _ray.route(address)
    except exc.SyncMgrError:
        return None
    if new is None or (new.dial, new.key, new.pin) == (old.dial, old.key, old.pin):
        return None
    return new


def get_client(address: str, authkey: Any = None, ssl_context: Optional[ssl.SSLContext] = None) -> Client:
    """The process's client for address (created on first use). authkey:
    bytes, or a str of hex (coerce_key); None finds it (key_and_source_for,
    or the address's Route)."""
    address = normalize_address(address)
    if ssl_context is None and address.startswith("tcp://"):
        ssl_context = tls_context_from_env()
    key = coerce_key(authkey) if authkey is not None else None

    def serves(c: Optional[Client]) -> bool:  # the process's client for address, if it fits the arguments
        return c is not None and (key is None or c._key == key) and (ssl_context is None or c._ssl is ssl_context)

    with _clients_lock:
        c = _clients.get(address)
        if serves(c):
            return c  # type: ignore[return-value]
    route = route_for(address)  # (outside the lock: it may ask Ray)
    with _clients_lock:
        c = _clients.get(address)
        if serves(c):
            return c  # type: ignore[return-value]
        if route is not None:
            if key is not None:
                route = Route(route.dial, key, route.key_source, route.ssl_context, route.pin, route.peer)
        elif key is not None:
            route = Route(address, key, "the authkey passed to connect() or Manager()", ssl_context)
        else:
            route = Route(address, *key_and_source_for(address), ssl_context)
        c = _clients[address] = Client(address, route)
        return c


# --- the per-process client --------------------------------------------------

from ._transport import Request, Undo, give_back  # noqa: E402


class Client:
    """A process's connections to one daemon: the socket transport
    (``_transport.Transport``)."""

    def __init__(self, address: str, route: Route) -> None:
        self.address = address  # what proxies pickle
        self.route = route  # how this process reaches it
        self._pid = os.getpid()
        self._pool: list[Connection] = []
        self._lock = threading.Lock()
        self._notes: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()
        self._ids = itertools.count(1)
        self.boot_id = ""
        self.run_id = ""
        self.max_frame = 64 << 20
        self._connected_once = False
        self._lost = False  # a connection was lost: log the next one made
        self._stopping = False  # the daemon said it is shutting down (and has not been reached since)

    @property
    def dial(self) -> str:
        """Where this process connects to reach address."""
        return self.route.dial

    @property
    def _key(self) -> bytes:
        return self.route.key

    @property
    def _ssl(self) -> Optional[ssl.SSLContext]:
        return self.route.ssl_context

    def _forget_after_fork(self) -> None:
        # The parent's sockets are not ours: drop them without a word on the wire.
        for c in self._pool:
            c.closed = True
            try:
                c.sock.detach()
            except OSError:
                pass
        self._pool = []
        self._lock = threading.Lock()
        self._notes = collections.deque()
        self._pid = os.getpid()

    def _take(self) -> Connection:
        # (A forked child has already dropped its parent's connections: see
        # _after_fork_in_child.)
        deadline = 0.0  # set at the first connect: taking a pooled connection needs none
        pause = 0.01
        while True:
            while True:
                with self._lock:
                    if not self._pool:
                        break
                    conn = self._pool.pop()
                if time.monotonic() - conn.last_used < _IDLE_CHECK:
                    return conn
                alive, notice = _idle_check(conn)
                if alive:
                    return conn
                self._noticed(notice)
                conn.close()  # the daemon closed it (e.g. it restarted): the others are stale too
                self.close()
                if not self._lost:
                    _log.info("syncmgr at %s closed idle connections (restarted?); reconnecting", self.address)
                    self._lost = True
            if not deadline:
                deadline = time.monotonic() + CONNECT_TIMEOUT
            try:
                conn = self._connect_fresh()
                break
            except (exc.LimitError, _HandshakeDropped) as e:
                # The daemon's caps or its handshake budget: try again (a
                # connection of ours may come back to the pool meanwhile).
                wait = getattr(e, "retry_after", 0.0) or pause
                pause = min(2 * pause, 0.5)
                if time.monotonic() + wait >= deadline:
                    raise
                time.sleep(wait)
            except exc.ConnectError as e:
                if self._stopping:  # it said it was shutting down: say that, not "gone"
                    raise exc.ShuttingDownError(
                        f"the syncmgr daemon at {self.address} has shut down (a graceful stop), and its objects with "
                        "it: start it again (`syncmgr serve`); named objects are then created again, empty, on first "
                        "use, and anonymous ones must be made again with the manager's factories"
                    ) from e
                if self._connected_once:  # it was there before: the daemon is gone
                    _log.warning("syncmgr daemon at %s is gone: %s", self.address, e)
                    raise exc.ServerGoneError(f"the syncmgr daemon at {self.address} is gone: {e}") from e
                raise
        if not self._connected_once:
            _log.debug("connected to syncmgr at %s (pid %d)", self.address, os.getpid())
        elif self._lost:
            _log.info("reconnected to syncmgr at %s", self.address)
        self._lost = False
        self._stopping = False
        self.boot_id, self.run_id, self.max_frame = conn.boot_id, conn.run_id, conn.max_frame
        self._connected_once = True
        return conn

    def _lost_connection(self, e: OSError) -> exc.ServerGoneError:
        """The error for a connection that failed mid-call (logged once until
        the next connection is made)."""
        if not self._lost:
            _log.warning("lost the connection to syncmgr at %s: %s", self.address, e)
            self._lost = True
        return exc.ServerGoneError(f"lost the connection to syncmgr at {self.address}: {e}")

    def _noticed(self, notice: Optional[exc.SyncMgrError]) -> None:
        """Remember a shutdown the daemon announced (an unasked reply)."""
        if isinstance(notice, exc.ShuttingDownError):
            self._stopping = True

    def _connect_fresh(self) -> Connection:
        """A new connection by the route; a cluster-on-Ray address whose
        route was refused or found nobody is routed anew once (the cluster
        was started again under the same name)."""
        try:
            return self.route.connect(_session_id, retry=False)
        except (exc.AuthenticationError, exc.ConnectError):
            fresh = fresh_route(self.address, self.route)
            if fresh is None:
                raise
            self.route = fresh
            return self.route.connect(_session_id, retry=False)

    def _give_back(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.last_used = time.monotonic()
        with self._lock:
            if len(self._pool) < 16:
                self._pool.append(conn)
                return
        conn.close()

    def notify(self, op: str, args: dict[str, Any]) -> None:
        """Queue a request that needs no reply; it goes out with the next call.
        Safe to call from a finalizer: it does no I/O."""
        self._notes.append((op, args))

    def flush(self) -> None:
        """Send queued notifications now."""
        if self._notes:
            self.call("ping", {})

    def _send_with_notes(self, frames: list[Frame], ops: Sequence[str], undos: dict[int, Optional[Undo]],
                         first_attempt: int = 0) -> Connection:
        """Send the queued notifications and frames (each with its op in
        ops, for the size error) back to back on one connection, and return
        it for the replies. A frame over the daemon's limit raises before
        anything is sent. A pooled connection the daemon closed since its
        last use (a restart within _IDLE_CHECK) fails the send, so the daemon
        read nothing of it, and all is sent once more on a fresh connection;
        a shutdown the daemon announced on it is raised as such. Ctrl-C
        during the send cancels the requests of undos (request id -> undo)
        on the connection (_interrupted_many) and is raised. first_attempt
        1: a send on a pooled connection failed already (no retry left)."""
        notes = []
        while self._notes:
            try:
                notes.append(self._notes.popleft())
            except IndexError:
                break
        if notes:
            frames = [encode_request(0, note[0], note[1]) for note in notes] + frames
        for attempt in range(first_attempt, 2):
            try:
                conn = self._take()
            except BaseException:
                self._notes.extendleft(reversed(notes))
                raise
            limit = conn.max_frame
            for f, op in zip(frames[len(notes):], ops):
                if _header_from(f[0])[0] > limit:
                    self._notes.extendleft(reversed(notes))
                    self._give_back(conn)
                    check_size(f, limit, op)  # raises FrameTooLargeError
            try:
                conn.send_requests(frames)
                return conn
            except BaseException as e:
                if not self._send_failed(conn, e, undos, attempt):
                    raise
        raise AssertionError("unreachable")  # the second attempt returns or raises

    def _send_failed(self, conn: Connection, e: BaseException, undos: dict[int, Optional[Undo]],
                     attempt: int) -> bool:
        """What follows a send on conn that raised e: True when the
        requests are to go once more on a fresh connection (conn was pooled
        and the daemon had closed it, attempt 0); False when the caller
        re-raises e; or the error to raise instead."""
        if isinstance(e, KeyboardInterrupt):
            self._interrupted_many(conn, undos, {})
            return False
        if isinstance(e, OSError):
            _, notice = _idle_check(conn) if conn.last_used else (False, None)
            conn.close()
            self._noticed(notice)
            if notice is not None:
                raise notice from None
            if attempt == 0 and conn.last_used:
                self.close()
                return True
            raise self._lost_connection(e) from None
        conn.close()
        return False

    def call(self, op: str, args: dict[str, Any], *, blob_key: Optional[str] = None, blob: Any = None,
             wait: Optional[float] = 0.0, undo: Optional[Undo] = None, _again: bool = False) -> Any:
        """Send one request and return its result.

        ``wait`` is how long the op may block on the daemon (None: for ever);
        the daemon bounds every wait, and a dead daemon closes the socket, so
        the client needs no timer of its own. When the wait is interrupted (Ctrl-C), the request is cancelled on the
        daemon and ``undo`` gets any result that raced in, so nothing is
        taken in the caller's name.
        """
        rid = next(self._ids)
        if not self._notes:
            # The common case, _send_with_notes's steps inline: no
            # notification is queued to go with the request.
            conn = self._take()
            try:
                # encode_request's two small cases, with the connection's
                # Packer: no blob, or one small piece in the frame.
                if blob_key is None:
                    body = conn.packb([rid, op, args])
                    req = [_header(len(body)) + body]
                elif type(blob) is list and len(blob) == 1 and type(blob[0]) is bytes and len(blob[0]) < INLINE_BLOB:
                    body = conn.packb([rid, op, {**args, blob_key: blob[0]}])
                    req = [_header(len(body)) + body]
                else:
                    req = encode_request(rid, op, args, blob_key, blob)
                if _header_from(req[0])[0] > conn.max_frame:
                    check_size(req, conn.max_frame, op)  # raises FrameTooLargeError
            except BaseException:
                self._give_back(conn)
                raise
            try:
                conn._send(req)
            except BaseException as e:
                if not self._send_failed(conn, e, {rid: undo}, 0):
                    raise
                conn = self._send_with_notes([req], (op,), {rid: undo}, 1)
        else:
            req = encode_request(rid, op, args, blob_key, blob)
            conn = self._send_with_notes([req], (op,), {rid: undo})
        try:
            rep_id, err, result = conn.recv_reply()
            while rep_id != rid:  # a stray reply (e.g. to a cancel); skip it
                if rep_id == 0 and err:
                    notice = exc.from_code(err[0], err[1])
                    self._noticed(notice)
                    if conn.last_used and not _again and isinstance(notice, exc.ShuttingDownError):
                        # A pooled connection whose daemon stopped while it
                        # was idle (a TLS socket cannot be peeked): the
                        # notice came before our request, which a stopping
                        # daemon refuses unread, so it goes once more on a
                        # fresh connection (to the daemon now at the address).
                        conn.close()
                        self.close()
                        return self.call(op, args, blob_key=blob_key, blob=blob, wait=wait, undo=undo, _again=True)
                    raise notice
                rep_id, err, result = conn.recv_reply()
        except KeyboardInterrupt:
            self._interrupted_many(conn, {rid: undo}, {})
            raise
        except exc.SyncMgrError as e:
            conn.close()
            if isinstance(e, exc.ServerGoneError) and not self._lost:
                _log.warning("%s", e)
                self._lost = True
            raise
        except OSError as e:
            conn.close()
            raise self._lost_connection(e) from None
        except BaseException:
            conn.close()
            raise
        self._give_back(conn)
        if err is not None:
            raise exc.from_code(err[0], err[1])
        return result

    def call_many(self, reqs: list[Request], max_bytes: Optional[int] = None,
                  _again: bool = False) -> list[tuple[Any, Any]]:
        """Send reqs back to back on one connection (one write) and read
        their replies together: (error, result) per request, in reqs' order,
        the error None or the reply's [code, message]. The daemon runs one
        connection's requests in order, but answers a parked one (a get
        that waits) when it ends, so replies are matched by id.

        Nothing is taken in the caller's name when this raises: on Ctrl-C
        every request still unanswered is cancelled on the daemon, and on a
        lost connection the daemon undoes the grants of replies it had not
        sent; either way each grant whose reply came is given back (its
        undo) before the exception goes on. With max_bytes, requests whose
        bodies add up to more raise ValueError, nothing sent."""
        rids = [next(self._ids) for _ in reqs]
        frames = [encode_request(rid, r.op, r.args, r.blob_key, r.blob) for rid, r in zip(rids, reqs)]
        if max_bytes is not None:
            size = sum(body_size(f) for f in frames)
            if size > max_bytes:
                raise ValueError(f"the requests add up to {size} bytes, over the limit of {max_bytes}; nothing was "
                                 "sent")
        undos = {rid: r.undo for rid, r in zip(rids, reqs)}
        answers: dict[int, tuple[Any, Any]] = {}

        conn = self._send_with_notes(frames, [r.op for r in reqs], undos)
        try:
            while len(answers) < len(rids):
                rep_id, err, result = conn.recv_reply()
                if rep_id in undos and rep_id not in answers:
                    answers[rep_id] = (err, result)
                elif rep_id == 0 and err:
                    notice = exc.from_code(err[0], err[1])
                    self._noticed(notice)
                    if (conn.last_used and not _again and not answers
                            and isinstance(notice, exc.ShuttingDownError)):
                        # As in call: a pooled connection whose daemon stopped
                        # while it was idle refused all of them unread; they go
                        # once more on a fresh connection.
                        conn.close()
                        self.close()
                        return self.call_many(reqs, max_bytes, _again=True)
                    raise notice
        except KeyboardInterrupt:
            self._interrupted_many(conn, undos, answers)
            raise
        except BaseException as e:
            conn.close()
            self._give_back_grants(undos, answers)
            if isinstance(e, OSError):
                raise self._lost_connection(e) from None
            raise
        self._give_back(conn)
        return [answers[rid] for rid in rids]

    def _interrupted_many(self, conn: Connection, undos: dict[int, Optional[Undo]],
                          answers: dict[int, tuple[Any, Any]]) -> None:
        """Cancel every request of undos (request id -> undo, in request
        order) still unanswered, wait for their outcomes (bounded), and give
        back every grant that came: a call's Ctrl-C (one request) and a
        batch's."""
        try:
            conn.sock.settimeout(5.0)
            pending = [rid for rid in undos if rid not in answers]
            conn.send_requests([encode_request(0, "cancel", {"id": rid}) for rid in pending])
            while len(answers) < len(undos):
                rep_id, err, result = conn.recv_reply()
                if rep_id in undos and rep_id not in answers:
                    answers[rep_id] = (err, result)
            conn.sock.settimeout(None)
            self._give_back(conn)
        except BaseException:
            conn.close()
        self._give_back_grants(undos, answers)

    @staticmethod
    def _give_back_grants(undos: dict[int, Optional[Undo]], answers: dict[int, tuple[Any, Any]]) -> None:
        """Give back each successful answer's grant, the latest request
        first: gets of one queue put their items back at its head, so the
        earliest must go back last (undos is in request order)."""
        for rid in reversed(undos):
            if rid in answers:
                give_back(undos[rid], answers[rid])

    def close(self) -> None:
        """Close every idle connection (a call afterwards reconnects)."""
        with self._lock:
            pool, self._pool = self._pool, []
        for c in pool:
            c.close()
