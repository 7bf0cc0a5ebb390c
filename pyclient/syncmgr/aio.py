"""asyncio: awaitable forms of syncmgr's blocking ops.

Every proxy has ``proxy.aio``, an awaitable view of the same object (for
proxies that arrive by pickle, as in a Ray async actor)::

    async with lock.aio:            # Lock, RLock, Semaphore, BoundedSemaphore
        ...
    await lock.aio.acquire(timeout=1.0)
    await event.aio.wait()
    async with cond.aio:
        await cond.aio.wait_for(lambda: ready.value)
    await barrier.aio.wait()
    item = await q.aio.get()
    await q.aio.put(item)
    items = await q.aio.get_many(64)
    await jq.aio.join()

``syncmgr.aio.Manager()`` and ``syncmgr.aio.connect()`` return managers
whose factories return such views directly. Non-blocking ops (``release``,
``set``, ``qsize``, ``put_nowait``...) stay plain calls on the view.

How it waits, with no thread per wait:

* **On the socket path** a wait is a request in flight on one connection
  per event loop and daemon, shared by every coroutine of that loop; the
  daemon answers each under its request id when the wait ends, and bounds
  it by the ``timeout`` given.
* **On the fast path** an op that can complete at once does so inline (a C
  call on the object's word or ring, as the blocking API's); when it would
  wait, the wait goes to the daemon as above, which arbitrates the same
  word or ring (the fast path's own waiters park there too).

Cancellation (``task.cancel()``, ``asyncio.timeout``, ``asyncio.wait_for``)
takes nothing: the request is cancelled on the daemon and its outcome
awaited (one round trip), and a grant that raced the cancellation is given
back before the cancellation goes on (a lock released, an item put back at
the head of its queue). A cancelled ``Condition.wait`` takes the
lock back before the cancellation goes on, as ``asyncio.Condition.wait``
does. A ``put`` is the exception the daemon cannot undo: one cancelled after
the daemon stored its item leaves the item stored (as a put whose reply was
lost would).

Ownership: a Lock or Semaphore taken through a view belongs to the process
(its session), as one taken by a thread does. An RLock's and a Condition's
owner is the task: each task holds its own count, as with threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from . import _fast, _proxies, _values
from . import exceptions as exc
from ._aio_transport import AsyncClient, Undo, client_for
from ._args import check_count, timeout_arg
from ._fast.ring import MISSING
from ._framing import pack_items
from ._manager import Manager as _SyncManager
from ._manager import connect as _sync_connect
from ._proxies import (
    AcquirerProxy,
    BarrierProxy,
    BaseProxy,
    ConditionProxy,
    EventProxy,
    JoinableQueueProxy,
    QueueProxy,
)

__all__ = ["AsyncClient", "Manager", "connect", "view"]

T = TypeVar("T")


# --------------------------------------------------------------------------
# views


# How long a fast-path op that would wait keeps trying inline, yielding to
# the loop between tries, before it waits in the daemon: a hand-off whose
# other side is at work completes in microseconds, and the daemon's wait
# costs a round trip and a wake-up chain.
_SPIN = 100e-6


async def _spin(attempt: Callable[[], T], none: type[BaseException], budget: float = _SPIN) -> Any:
    """attempt() until it does not raise none, within budget seconds, yielding
    between tries; _MISS when it never succeeded."""
    end = time.perf_counter() + budget
    while True:
        try:
            return attempt()
        except none:
            pass
        if time.perf_counter() >= end:
            return _MISS
        await asyncio.sleep(0)


_MISS = object()


def _wait_arg(timeout: Optional[float]) -> Optional[float]:
    """A wait's timeout (None: for ever), checked as the blocking API checks it."""
    return timeout_arg(True, timeout, minus_one_forever=False)


class View:
    """An awaitable view of a proxy: its blocking ops as coroutines; every
    other attribute is the proxy's own (non-blocking ops stay plain calls).
    A view pickles as its proxy's view."""

    def __init__(self, proxy: BaseProxy) -> None:
        self._p = proxy

    @property
    def proxy(self) -> BaseProxy:
        """The blocking proxy this view is of."""
        return self._p

    def __getattr__(self, name: str) -> Any:
        return getattr(self._p, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (view, (self._p,))

    def __repr__(self) -> str:
        return f"<aio view of {self._p!r}>"

    def _fast(self) -> bool:
        """Whether the proxy has fast-path methods installed. They may be
        a forked parent's until their first use moves them to this
        process's session, which the installed methods do themselves (and
        when the fast path is gone they hand the op to the socket)."""
        return _fast.handle(self._p) is not None

    async def _call(self, op: str, undo: Optional[Undo] = None, blob_key: Optional[str] = None, blob: Any = None,
                    **args: Any) -> Any:
        p = self._p
        return await client_for(p).call(op, p._args(args), blob_key=blob_key, blob=blob, undo=undo)

    def _notify(self, op: str, **args: Any) -> None:
        args["kind"] = self._p._kind
        args["name"] = self._p._name
        client_for(self._p).notify(op, args)


# Kinds whose owner is the task that acquired (an RLock's count is per owner).
_TASK_OWNED = frozenset(("rlock", "condition"))


def _task_tid() -> int:
    """The owner id of an RLock or Condition taken by the current task."""
    task = asyncio.current_task()
    return id(task) if task is not None else threading.get_ident()


class AcquirerView(View):
    """Lock, RLock, Semaphore, BoundedSemaphore: ``await acquire()``,
    ``async with``."""

    _p: AcquirerProxy

    def __init__(self, proxy: BaseProxy) -> None:
        super().__init__(proxy)
        self._task_owned = proxy._kind in _TASK_OWNED
        self._seen: Any = None  # the proxy's fast acquire that _try was taken from
        self._try: Optional[Callable[[], Optional[bool]]] = None

    def _tid(self) -> int:
        return _task_tid() if self._p._kind in _TASK_OWNED else threading.get_ident()

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        tid = self._tid()
        if not blocking:
            if timeout is not None and timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return self._p._acquired(await self._call("acquire", undo=lambda r: self._undo(r, tid), block=False,
                                                      tid=tid))
        t = timeout_arg(True, timeout, minus_one_forever=True)
        if t is not None and t > threading.TIMEOUT_MAX:
            raise OverflowError("timeout value is too large")
        attempt = self._try_acquire()
        if attempt is not None:
            r = attempt()  # uncontended: inline, on the word
            if r is None:  # the word's handle cannot serve now (a forked parent's: the call moves it)
                r = self._p.acquire(False)
            if r:
                return True
        got = await self._call("acquire", undo=lambda r: self._undo(r, tid), tid=tid, timeout=t)
        return self._p._acquired(got)

    def _undo(self, got: Any, tid: int) -> None:
        if got is True:
            self._notify("release", tid=tid)

    def release(self) -> None:
        """Release (a plain call, as it never waits)."""
        if self._p._kind in _TASK_OWNED:
            self._p._call("release", tid=self._tid())
            return
        self._p.release()

    def _try_acquire(self) -> Optional[Callable[[], Optional[bool]]]:
        """The fast path's non-blocking acquire (the word's C handle's
        try_acquire: True, False when held, None to ask the daemon), for
        the kinds whose owner is the process; None on the socket path."""
        if self._task_owned:
            return None
        acq = self._p.__dict__.get("acquire")
        if acq is None:
            return None
        if acq is not self._seen:  # a handle installed (or replaced) since
            self._seen, self._try = acq, getattr(getattr(acq, "__self__", None), "try_acquire", None)
        return self._try

    async def __aenter__(self) -> bool:
        # _try_acquire, written out: this is the uncontended `async with`'s
        # whole cost beside the coroutine itself.
        if not self._task_owned and self._p.__dict__.get("acquire") is self._seen and self._try is not None:
            if self._try():
                return True
        return await self.acquire()

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._task_owned:
            self.release()
        else:
            self._p.release()


class EventView(View):
    """Event: ``await wait()``."""

    _p: EventProxy

    async def wait(self, timeout: Optional[float] = None) -> bool:
        if timeout is not None and not math.isnan(timeout) and timeout < 0:
            timeout = 0.0
        t = _wait_arg(timeout)
        if self._fast() and self._p.is_set():
            return True
        return bool(await self._call("wait", timeout=t))


class ConditionView(AcquirerView):
    """Condition: ``async with``, ``await wait()``, ``await wait_for()``;
    ``notify`` and ``notify_all`` are plain calls."""

    _p: ConditionProxy

    async def wait(self, timeout: Optional[float] = None) -> bool:
        if timeout is not None and not math.isnan(timeout) and timeout < 0:
            timeout = 0.0
        t = _wait_arg(timeout)
        tid = self._tid()
        completed: list[Any] = []
        reacquiring = False

        def undo(r: Any) -> None:
            # A success reply: the daemon took the lock back for the wait.
            if reacquiring:
                # It came after _settle gave up and _reacquire was sent: give
                # that hold back, or the lock is held twice (an RLock's depth
                # 2, or a Lock that _reacquire then waits for for ever).
                self._notify("release", tid=tid)
            else:
                completed.append(r)

        try:
            return bool(await self._call("wait", undo=undo, tid=tid, timeout=t))
        except asyncio.CancelledError:
            # The daemon released the lock for the wait; take it back before
            # the cancellation goes on (asyncio.Condition.wait does the same),
            # unless the wait completed (and took it back) first. Cancelled
            # again meanwhile, keep waiting for it: the caller's __aexit__
            # releases it.
            if not completed:
                reacquiring = True
                reacq = asyncio.ensure_future(self._reacquire(tid))
                while not reacq.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(reacq)
                reacq.result()
            raise

    async def _reacquire(self, tid: int) -> None:
        await self._call("acquire", tid=tid)

    async def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = None) -> T:
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        result = predicate()
        while not result:
            if end is not None:
                left = end - loop.time()
                if left <= 0:
                    break
                await self.wait(left)
            else:
                await self.wait()
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        self._p._call("notify", tid=self._tid(), n=n)

    def notify_all(self) -> None:
        self._p._call("notify_all", tid=self._tid())


class BarrierView(View):
    """Barrier: ``await wait()`` (the action runs in the process of the last
    party to arrive, as with the blocking API)."""

    _p: BarrierProxy

    async def wait(self, timeout: Optional[float] = None) -> int:
        if timeout is None:
            timeout = self._p._timeout
        t = _wait_arg(timeout)
        res = await self._call("wait", undo=self._undo, timeout=t)
        if res.get("action"):
            try:
                if self._p._action is not None:
                    self._p._action()
            except BaseException:
                self._p._call("action_done", ok=False)
                raise
            self._p._call("action_done", ok=True)
        return int(res["index"])

    def _undo(self, res: Any) -> None:
        # A cancelled last party that was to run the action breaks the
        # barrier (as one that times out), instead of leaving the others parked.
        if isinstance(res, dict) and res.get("action"):
            self._notify("action_done", ok=False)


class QueueView(View):
    """Queue: ``await get()``, ``await put(item)``, ``await get_many(n)``,
    ``await put_many(items)``."""

    _p: QueueProxy

    async def put(self, item: Any, timeout: Optional[float] = None) -> None:
        t = None if timeout is None else _wait_arg(timeout)
        h = _fast.handle(self._p)
        if h is not None:
            # On the ring first, with no exception and no coroutine: it has
            # room, or gets some within the spin (a consumer at work).
            budget = _SPIN if t is None or t > 0 else 0.0
            r = h.try_put(item)
            if r is None:  # not a plain scalar: the handle's own put encodes it
                stored = await _spin(lambda: self._p.put_nowait(item), exc.Full, budget)
                if stored is not _MISS:
                    return
            else:
                end = time.perf_counter() + budget
                while not r and time.perf_counter() < end:
                    await asyncio.sleep(0)
                    r = h.try_put(item)
                if r:
                    return
        await self._call("put", blob_key="item", blob=_values.dumps_parts(item), timeout=t)

    async def put_many(self, items: Any, timeout: Optional[float] = None) -> None:
        """All the items, adjacent and in order, or none (see put_many)."""
        t = _wait_arg(timeout)
        objs = list(items)
        if not objs:
            return
        blob = pack_items(objs)  # an item that cannot be encoded raises before anything is stored
        if self._fast():
            try:
                self._p.put_many(objs, block=False)
                return
            except exc.Full:
                pass
        await self._call("put_many", blob_key="items", blob=blob, timeout=t)

    async def get(self, timeout: Optional[float] = None) -> Any:
        t = None if timeout is None else _wait_arg(timeout)
        h = _fast.handle(self._p)
        if h is not None:
            # From the ring first, with no exception and no coroutine: an
            # item is there, or comes within the spin (a producer at work).
            x = h.try_get()
            end = time.perf_counter() + (_SPIN if t is None or t > 0 else 0.0)
            while x is MISSING and time.perf_counter() < end:
                await asyncio.sleep(0)
                x = h.try_get()
            if x is not MISSING:
                return x
        data = await self._call("get", undo=self._unget, timeout=t)
        return _values.loads(data)

    async def get_many(self, max_items: int = 1 << 30, timeout: Optional[float] = None) -> list[Any]:
        check_count(max_items)
        t = _wait_arg(timeout)
        if self._fast():
            try:
                return self._p.get_many(max_items, block=False)
            except exc.Empty:
                pass
        datas = await self._call("get_many", undo=self._unget_many, n=min(max_items, 1 << 20), timeout=t)
        return _values.loads_many(datas)

    def _unget(self, data: Any) -> None:
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._notify("unget", item=bytes(data))

    def _unget_many(self, datas: Any) -> None:
        if isinstance(datas, list):
            for d in reversed(datas):
                self._unget(d)


class JoinableQueueView(QueueView):
    """JoinableQueue: the Queue's, and ``await join()``."""

    _p: JoinableQueueProxy

    async def join(self, timeout: Optional[float] = None) -> bool:
        """Wait until every item put has been marked done (timeout: returns
        False on expiry)."""
        t = _wait_arg(timeout)
        return bool(await self._call("join", timeout=t))


def view(proxy: BaseProxy) -> View:
    """The awaitable view of proxy (also ``proxy.aio``, which keeps it)."""
    v = proxy.__dict__.get("_aio_view")
    if v is None:
        v = proxy.__dict__["_aio_view"] = _new_view(proxy)
    return v  # type: ignore[no-any-return]


def _new_view(proxy: BaseProxy) -> View:
    if isinstance(proxy, ConditionProxy):
        return ConditionView(proxy)
    if isinstance(proxy, AcquirerProxy):
        return AcquirerView(proxy)
    if isinstance(proxy, EventProxy):
        return EventView(proxy)
    if isinstance(proxy, BarrierProxy):
        return BarrierView(proxy)
    if isinstance(proxy, JoinableQueueProxy):
        return JoinableQueueView(proxy)
    if isinstance(proxy, QueueProxy):
        return QueueView(proxy)
    return View(proxy)


# --------------------------------------------------------------------------
# managers


class _AioManager:
    """A manager whose factories return awaitable views (``syncmgr.aio``).
    Everything else is the blocking manager's."""

    def __init__(self, m: Any) -> None:
        self._m = m

    @property
    def manager(self) -> Any:
        """The blocking manager underneath."""
        return self._m

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._m, name)
        if name[:1].isupper() and callable(attr):  # a factory: Lock, Queue, ...

            def factory(*args: Any, **kwargs: Any) -> Any:
                obj = attr(*args, **kwargs)
                return view(obj) if isinstance(obj, BaseProxy) else obj

            return factory
        return attr

    def start(self) -> _AioManager:
        """Start the manager (its daemon, or its connection)."""
        self._m.start()
        return self

    def __enter__(self) -> _AioManager:
        self._m.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._m.__exit__(*exc_info)

    async def __aenter__(self) -> _AioManager:
        return self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        self._m.shutdown()


def Manager(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the multiprocessing name
    """syncmgr.Manager(), started, whose factories return awaitable views."""
    return _AioManager(_SyncManager(*args, **kwargs))


def connect(*args: Any, **kwargs: Any) -> Any:
    """syncmgr.connect(), whose factories return awaitable views."""
    return _AioManager(_sync_connect(*args, **kwargs))


_proxies._aio_view = view  # BaseProxy.aio
