"""syncmgr.aio's transport: one connection per event loop and daemon, an
asyncio Protocol that matches replies to request ids, shared by every
coroutine of the loop (see syncmgr.aio for what it serves and how a
cancelled request takes nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import ssl
import threading
from typing import Any, Callable, Optional

import msgpack

from . import exceptions as exc
from ._conn import CONNECT_TIMEOUT, _check_server_uid
from ._connection import (
    Route,
    fresh_route,
    get_client,
    session_id,
)
from ._framing import HEADER, check_size, encode_request, frame, packb
from ._handshake import _HANDSHAKE_MAX, Handshake
from ._proxies import BaseProxy
from ._tls import check_pin, pinned_tls_context

# How long a cancelled request's outcome is awaited (the daemon answers a
# cancel at once; this bounds a daemon that has stopped answering).
_SETTLE_TIMEOUT = 10.0

Undo = Callable[[Any], None]


class _Protocol(asyncio.Protocol):
    """Frames in and out of one connection. During the handshake whole
    frames go to ``frames``; afterwards each reply resolves the future of
    its request id."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.transport: Optional[asyncio.Transport] = None
        self.buf = bytearray()
        self.frames: asyncio.Queue[Any] = asyncio.Queue()
        self.pending: dict[int, tuple[asyncio.Future[Any], Optional[Undo]]] = {}
        self.handshaking = True
        self.lost: Optional[BaseException] = None
        self.max_frame = 64 << 20
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = HEADER.unpack_from(self.buf, 0)
            limit = _HANDSHAKE_MAX if self.handshaking else self.max_frame + 4096
            if n == 0 or n > limit:
                self._fail(exc.ProtocolError(f"syncmgr at {self.address} sent a frame of {n} bytes"))
                return
            if len(self.buf) < 4 + n:
                return
            body = bytes(self.buf[4:4 + n])
            del self.buf[:4 + n]
            try:
                msg = msgpack.unpackb(body, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as e:
                self._fail(exc.ProtocolError(f"malformed frame from syncmgr at {self.address}: {e}"))
                return
            if self.handshaking:
                self.frames.put_nowait(msg)
            else:
                self._reply(msg)

    def _reply(self, msg: Any) -> None:
        try:
            rid, err, result = msg
        except (TypeError, ValueError):
            self._fail(exc.ProtocolError(f"malformed reply from syncmgr at {self.address}"))
            return
        if rid == 0:
            if err:  # the daemon's notice (it is shutting down): every waiter gets it
                self._fail(exc.from_code(err[0], err[1]))
            return
        entry = self.pending.pop(rid, None)
        if entry is None:
            return  # the reply to a request nobody waits for any more (its cancel's own answer)
        fut, undo = entry
        if fut.cancelled():
            # The waiter was cancelled while its reply was on the way: give
            # back what the reply grants, so that nothing is taken in its name.
            if err is None and undo is not None:
                undo(result)
            return
        fut.set_result((err, result))

    def connection_lost(self, err: Optional[Exception]) -> None:
        self._fail(exc.ServerGoneError(f"the connection to syncmgr at {self.address} was lost"
                                       + (f": {err}" if err else "")))

    def _fail(self, e: BaseException) -> None:
        if self.lost is None:
            self.lost = e
        pending, self.pending = self.pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(e)
        if self.handshaking:
            self.frames.put_nowait(e)
        self._writable.set()
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def write(self, parts: list[Any]) -> None:
        assert self.transport is not None
        self.transport.writelines(parts)

    async def drain(self) -> None:
        await self._writable.wait()

    async def next_frame(self) -> Any:
        msg = await self.frames.get()
        if isinstance(msg, BaseException):
            raise msg
        return msg


async def _open(route: Route, session: bytes) -> _Protocol:
    """A new authenticated connection to route's daemon, in the running loop."""
    loop = asyncio.get_running_loop()
    address = route.dial
    proto = _Protocol(address)
    try:
        if address.startswith("tcp://"):
            host, _, port = address[len("tcp://"):].rpartition(":")
            host = host.strip("[]")
            ctx = route.ssl_context if route.pin is None else (route.ssl_context or pinned_tls_context())
            name = None if ctx is None or route.pin is not None else host
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: proto, host, int(port), ssl=ctx, server_hostname=name),
                CONNECT_TIMEOUT)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if route.pin is not None:
                check_pin(transport.get_extra_info("ssl_object"), route.pin, address, route.peer)
        else:
            path = address[len("unix://"):] if address.startswith("unix://") else address
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, path), CONNECT_TIMEOUT)
                _check_server_uid(sock, address)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                sock.close()
                raise exc.ConnectError(
                    f"no syncmgr daemon is running at {address} ({e.strerror}): start one with `syncmgr serve` "
                    "(or use syncmgr.Manager() for a private one), or set SYNCMGR_ADDRESS to a running daemon's "
                    "address") from e
            except BaseException:
                sock.close()
                raise
            await loop.create_unix_connection(lambda: proto, sock=sock)
    except (OSError, ValueError, asyncio.TimeoutError, ssl.SSLError) as e:
        if isinstance(e, exc.SyncMgrError):
            raise
        raise exc.ConnectError(f"cannot connect to syncmgr at {address}: {e}") from e
    try:
        shake = Handshake(address, route.key, session,
                          f" (the key came from {route.key_source})" if route.key_source else "")
        proto.write([frame(packb({"t": "ready"}))])
        ns = shake.hello(await asyncio.wait_for(proto.next_frame(), CONNECT_TIMEOUT), True)
        proto.max_frame = shake.max_frame
        proto.write([frame(shake.auth(ns))])
        shake.welcome(await asyncio.wait_for(proto.next_frame(), CONNECT_TIMEOUT))
    except BaseException as e:
        proto._fail(exc.ConnectError(f"handshake with syncmgr at {address} failed"))
        if isinstance(e, (asyncio.TimeoutError, exc.ServerGoneError)):
            raise exc.ConnectError(f"handshake with syncmgr at {address} failed: {e or 'timed out'}") from e
        raise
    proto.handshaking = False
    if proto.buf:  # a reply cannot come before a request, but keep the stream in step
        proto.data_received(b"")
    return proto


def _undo_outcome(fut: asyncio.Future[Any], undo: Optional[Undo]) -> None:
    """Give back what a request's reply granted (undo), when fut holds that
    reply: its caller was cancelled after the reader had taken it."""
    if undo is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
        err, result = fut.result()
        if err is None:
            undo(result)


class AsyncClient:
    """One event loop's connection to one daemon: the asyncio transport.
    Requests from every coroutine of the loop share it, each under its own
    id; a lost connection fails the requests in flight (their grants, never
    delivered, are undone by the daemon) and the next call connects again."""

    def __init__(self, address: str, route: Route) -> None:
        self.address = address
        self.route = route
        self._ids = itertools.count(1)
        self._proto: Optional[_Protocol] = None
        self._connecting: Optional[asyncio.Future[_Protocol]] = None

    async def _conn(self) -> _Protocol:
        p = self._proto
        if p is not None and p.lost is None:
            return p
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            p = await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None
        self._proto = p
        return p

    async def _open(self) -> _Protocol:
        try:
            return await _open(self.route, session_id())
        except (exc.AuthenticationError, exc.ConnectError):
            # A cluster-on-Ray address: the cluster may have been started
            # again under the same name; ask for its route once more.
            fresh = await asyncio.get_running_loop().run_in_executor(None, fresh_route, self.address, self.route)
            if fresh is None:
                raise
            self.route = fresh
            return await _open(self.route, session_id())

    async def call(self, op: str, args: dict[str, Any], *, blob_key: Optional[str] = None, blob: Any = None,
                   undo: Optional[Undo] = None) -> Any:
        """Send one request and await its result. Cancelled while waiting,
        the request is cancelled on the daemon and undo gets a result that
        raced in (see the module docstring)."""
        p = await self._conn()
        rid = next(self._ids)
        req = encode_request(rid, op, args, blob_key, blob)
        check_size(req, p.max_frame, op)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        p.pending[rid] = (fut, undo)
        p.write(req)
        try:
            await p.drain()
            err, result = await fut
        except asyncio.CancelledError:
            if p.lost is None and rid in p.pending:
                await self._settle(p, rid, undo)
            else:
                # The reply came (and was read) before this task resumed:
                # nobody else will give its grant back.
                _undo_outcome(fut, undo)
            raise
        if err is not None:
            raise exc.from_code(err[0], err[1])
        return result

    async def _settle(self, p: _Protocol, rid: int, undo: Optional[Undo]) -> None:
        """After the caller of request rid was cancelled: cancel it on the
        daemon and wait for its outcome (the daemon answers every request),
        so that a grant that raced the cancellation is given back (undo)
        before the cancellation goes on. Cancelled again meanwhile, the
        outcome is left to the reader, which undoes it when it comes."""
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        p.pending[rid] = (outcome, undo)
        p.write(encode_request(0, "cancel", {"id": rid}))
        try:
            err, result = await asyncio.wait_for(asyncio.shield(outcome), _SETTLE_TIMEOUT)
        except (asyncio.CancelledError, asyncio.TimeoutError, exc.SyncMgrError):
            if not outcome.cancel():  # it has its answer already: give back what it granted
                _undo_outcome(outcome, undo)
            return
        if err is None and undo is not None:
            undo(result)

    def notify(self, op: str, args: dict[str, Any]) -> None:
        """Send a request that needs no reply (an undo), if connected."""
        p = self._proto
        if p is not None and p.lost is None:
            p.write(encode_request(0, op, args))

    def close(self) -> None:
        p, self._proto = self._proto, None
        if p is not None and p.transport is not None:
            p.transport.close()

    def abandon(self) -> None:
        """End the connection of a client whose loop is closed: its socket
        is shut down, so that the daemon ends what it still has in flight
        (a parked get takes no item for a reader that is gone). A closed
        loop's transport cannot be closed (that schedules a callback on the
        loop); its descriptor is closed when the transport is collected."""
        p, self._proto = self._proto, None
        if p is not None and p.transport is not None:
            sock = p.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


# Each loop's clients, by daemon address. A client's transport refers to its
# loop, so a loop here is never collected: the clients of closed loops are
# abandoned, and their loops forgotten, whenever a client is made.
_clients: dict[asyncio.AbstractEventLoop, dict[str, AsyncClient]] = {}
_clients_lock = threading.Lock()


def client_for(proxy: BaseProxy) -> AsyncClient:
    """The running loop's AsyncClient for proxy's daemon (made on first use;
    it reaches the daemon as the proxy's own client does: same route, key
    and TLS)."""
    loop = asyncio.get_running_loop()
    address = proxy._client.address
    with _clients_lock:
        per_loop = _clients.get(loop)
        c = None if per_loop is None else per_loop.get(address)
        if c is None:
            _forget_closed_loops()
            route = getattr(proxy._client, "route", None)
            if route is None:
                route = get_client(address).route
            c = _clients.setdefault(loop, {})[address] = AsyncClient(address, route)
    return c


def _forget_closed_loops() -> None:
    """Abandon the clients of every closed loop, and forget those loops;
    under _clients_lock."""
    for loop in [lp for lp in _clients if lp.is_closed()]:
        for c in _clients.pop(loop).values():
            c.abandon()
