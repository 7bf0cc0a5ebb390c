"""Proxies: local handles on objects held by the daemon.

A proxy is (client, kind, name). It pickles as (proxy class, daemon
address, name, what the class needs); unpickling binds it to the receiving
process's client for that address, which connects lazily with the key from
that process's environment. The authkey is never pickled.

Anonymous objects are reference counted by the daemon: each proxy instance
holds one reference, taken by ``create`` for the creating proxy and by an
``incref`` sent with the first call of an unpickled one, and dropped by a
``decref`` queued when the proxy is garbage collected.

A proxy remembers the daemon run it last saw its object in, and the
parameters it was created with. When the daemon has restarted since (its
run id changed) and no longer has the object:

* a **named** object is created again, empty, with the kind and parameters
  the proxy carries (get-or-create, as its factory does), and the call goes
  on: a proxy pickled into a Ray worker keeps working across a restart;
* an **anonymous** object cannot be found again by anyone, so the call
  raises ``ServerRestartedError``, which says to call the factory again.

A proxy class's methods are the socket path. On the daemon's host the fast
path (``_fast``) may put methods of its own in a proxy's ``__dict__``, which
call the class's methods for whatever they cannot serve; the few methods
it calls beyond the public ones are marked as the fast path's hooks
(``AcquirerProxy._taken_in``, ``QueueProxy._put_encoded`` and
``_put_many_encoded``). See ``_transport``.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from . import _fast, _values
from . import exceptions as exc
from ._args import check_count, timeout_arg
from ._connection import get_client
from ._framing import bin_array, pack_items
from ._transport import Transport

# A value as the daemon stores it: plain data as msgpack the Go client reads
# too, anything else as a pickle (see _values); and back.
_dumps = _values.dumps
_loads = _values.loads


_log = logging.getLogger("syncmgr")

if TYPE_CHECKING:
    from .aio import View


def _no_aio(proxy: BaseProxy) -> View:
    raise RuntimeError("syncmgr.aio is not imported")  # it always is: syncmgr/__init__ imports it


# The view maker of syncmgr.aio, which sets it when imported (aio imports
# this module, so this one cannot import aio).
_aio_view: Callable[[BaseProxy], View] = _no_aio


def _rebuild(cls: type[BaseProxy], address: str, name: str, state: Any, params: Optional[dict[str, Any]] = None,
             run: str = "", word: Any = None) -> BaseProxy:
    p = cls.__new__(cls)
    p._bind(get_client(address), name, owned=False, params=params, run=run)
    p._setstate(state)
    _fast.attach_unpickled(p, word)
    return p


class BaseProxy:
    """Common behaviour of all proxies."""

    _kind: ClassVar[str] = ""
    _client: Transport
    _name: str
    _fp_hint: Any  # a fast-path create's word until the first op (_fast.adopting), on some proxies only

    def _bind(self, client: Transport, name: str, owned: bool, params: Optional[dict[str, Any]] = None,
              run: str = "") -> None:
        # Only stores: the proxy may already be of its pending class (a
        # fast-path create: _fast.adopting), whose every attribute read is a
        # Python call.
        anon = name.startswith("anon-")
        self._client = client
        self._name = name
        self._anon = anon
        self._shared = False
        self._referenced = owned
        self._params = params  # the create arguments beyond kind and name (for a re-create after a restart)
        self._run = run or getattr(client, "run_id", "")  # the daemon run the object was last seen in
        if anon and owned:
            weakref.finalize(self, client.notify, "decref", {"name": name})

    def _setstate(self, state: Any) -> None:
        pass

    def _getstate(self) -> Any:
        return None

    def _not_pipelined(self, method: str, args: tuple[Any, ...]) -> Optional[str]:
        """Why the call method(*args) cannot go in a pipeline (_pipeline),
        or None. A pipeline sends each call's first request with the
        others' and replays the method on its reply, so a method that makes
        a second request in the caller's order, or whose grant cannot be
        given back, says so here (each family for its own methods)."""
        return None

    @property
    def name(self) -> str:
        """The object's name on the daemon (generated for anonymous objects)."""
        return self._name

    def _args(self, args: dict[str, Any]) -> dict[str, Any]:
        if self._anon and not self._referenced:
            self._referenced = True
            self._client.notify("incref", {"name": self._name})
            weakref.finalize(self, self._client.notify, "decref", {"name": self._name})
        args["kind"] = self._kind
        args["name"] = self._name
        return args

    def _call(self, op: str, **args: Any) -> Any:
        """The request op with args (the object's kind and name added), made
        once more after a daemon restart re-created a named object
        (_after_restart). Its steps are inline, as in _call_blocking: they
        are every socket call's Python."""
        if self._anon and not self._referenced:
            self._args(args)
        args["kind"] = self._kind
        args["name"] = self._name
        try:
            return self._client.call(op, args)
        except exc.NoSuchObjectError as e:
            self._after_restart(e)
        return self._client.call(op, self._args(args))

    def _call_blocking(self, op: str, wait: Optional[float], undo: Any = None, blob_key: Optional[str] = None,
                       blob: Any = None, **args: Any) -> Any:
        """_call of an op that may wait on the daemon (wait, as the
        transport's call takes it), take something (undo) or carry a large
        argument (blob_key, blob)."""
        if self._anon and not self._referenced:
            self._args(args)
        args["kind"] = self._kind
        args["name"] = self._name
        try:
            return self._client.call(op, args, wait=wait, undo=undo, blob_key=blob_key, blob=blob)
        except exc.NoSuchObjectError as e:
            self._after_restart(e)
        return self._client.call(op, self._args(args), wait=wait, undo=undo, blob_key=blob_key, blob=blob)

    def _after_restart(self, e: exc.NoSuchObjectError) -> None:
        """Called when the daemon says the object does not exist: returns
        once a named object lost in a daemon restart has been created again
        (the caller then repeats its call, which had no effect); raises
        otherwise (see the module docstring)."""
        now = getattr(self._client, "run_id", "")
        if not self._run or not now or now == self._run:
            raise e  # the same daemon run: deleted (or never there)
        what = _TYPEIDS.get(self._kind, self._kind)
        if self._anon:
            raise exc.ServerRestartedError(
                f"the syncmgr daemon at {self._client.address} restarted, and this anonymous {what} was lost with it "
                f"(anonymous objects cannot be found again): create it again with the manager's factory "
                f"(m.{what}(...)), or give it a name, which is created again on first use after a restart"
            ) from None
        params = {k: v for k, v in (self._params or {}).items() if not k.startswith("_")}
        lock, lock_kind = params.get("lock"), (self._params or {}).get("_lock_kind")
        if lock is not None:  # a Condition over a Lock of its own: that one first (get-or-create)
            if str(lock).startswith("anon-") or not lock_kind:
                raise exc.ServerRestartedError(
                    f"the syncmgr daemon at {self._client.address} restarted, and the anonymous lock of the "
                    f"Condition {self._name!r} was lost with it: create both again with the manager's factories"
                ) from None
            self._client.call("create", {"kind": lock_kind, "name": lock})
        self._client.call("create", {"kind": self._kind, "name": self._name, **params})
        _log.warning("syncmgr daemon at %s restarted: created the %s %r again, empty", self._client.address, what,
                     self._name)
        self._run = now
        _fast.reattach(self)

    @property
    def aio(self) -> View:
        """An awaitable view of this object: its blocking ops as coroutines
        (``syncmgr.aio``; kept on the proxy once made)."""
        return _aio_view(self)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._anon and not self._shared:
            # Synchronous, so the object outlives this process's references
            # even if the pickle is unpickled much later.
            self._client.call("share", {"name": self._name})
            self._shared = True
        # The object's word, when this process knows it: unpickled on this
        # host (here too), the proxy needs no round trip for it.
        word = _fast.word_of(self)
        args = (_fast.proxy_type(self), self._client.address, self._name, self._getstate(), self._params, self._run)
        return (_rebuild, args if word is None else (*args, word))

    def delete(self) -> bool:
        """Delete the object on the daemon now (for named objects)."""
        return bool(self._client.call("delete", {"name": self._name}))

    def __repr__(self) -> str:
        # The stock proxies' form, which code and tests match on, plus where the object lives.
        typeid = _TYPEIDS.get(self._kind, self._kind)
        return (f"<{type(self).__name__} object, typeid {typeid!r} at {id(self):#x}; "
                f"name {self._name!r} on {self._client.address}>")


# SyncManager's type ids, by wire kind (for repr).
_TYPEIDS = {"lock": "Lock", "rlock": "RLock", "semaphore": "Semaphore", "bounded_semaphore": "BoundedSemaphore",
            "event": "Event", "condition": "Condition", "barrier": "Barrier", "queue": "Queue",
            "joinable_queue": "JoinableQueue", "value": "Value", "dict": "dict", "list": "list",
            "namespace": "Namespace"}


class AcquirerProxy(BaseProxy):
    """Lock, RLock, Semaphore and BoundedSemaphore, as SyncManager's AcquirerProxy.

    A successful acquire remembers the daemon's run id; release names it, so
    that after a daemon restart the release raises ``ServerRestartedError``
    instead of releasing a lock another process acquired since."""

    _held_run: str = ""

    def _acquired(self, got: Any) -> bool:
        if got:
            self._held_run = getattr(self._client, "run_id", "")  # a transport without run ids: ""
        return bool(got)

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        tid = threading.get_ident()
        if not blocking:
            if timeout is not None and timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return self._acquired(self._call_blocking("acquire", 0.0, undo=self._undo_acquire, block=False, tid=tid))
        t = timeout_arg(True, timeout, minus_one_forever=True)
        if t is not None and t > threading.TIMEOUT_MAX:
            raise OverflowError("timeout value is too large")
        return self._acquired(self._call_blocking("acquire", t, undo=self._undo_acquire, tid=tid, timeout=t))

    def _taken_in(self, run: str) -> None:
        """The fast path's hook (_fast): this process took the object in the
        shared memory of daemon run ``run``, which has gone since, and is
        about to release it over the socket. The release names that run, as
        one after a socket-path acquire would (ServerRestartedError after a
        restart), unless the object was taken over the socket since, in a
        later run."""
        if self._held_run in ("", run):
            self._held_run = run

    def _undo_acquire(self, got: Any) -> None:
        if got is True:
            self._client.call("release", self._args({"tid": threading.get_ident()}))

    def release(self) -> None:
        if self._held_run:
            self._call("release", tid=threading.get_ident(), run=self._held_run)
        else:
            self._call("release", tid=threading.get_ident())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


class LockProxy(AcquirerProxy):
    _kind = "lock"


class RLockProxy(AcquirerProxy):
    _kind = "rlock"


class SemaphoreProxy(AcquirerProxy):
    _kind = "semaphore"


class BoundedSemaphoreProxy(AcquirerProxy):
    _kind = "bounded_semaphore"


class EventProxy(BaseProxy):
    """A shared threading.Event."""

    _kind = "event"

    def is_set(self) -> bool:
        return bool(self._call("is_set"))

    def set(self) -> None:
        self._call("set")

    def clear(self) -> None:
        self._call("clear")

    def wait(self, timeout: Optional[float] = None) -> bool:
        if timeout is not None and not math.isnan(timeout) and timeout < 0:
            timeout = 0.0
        t = timeout_arg(True, timeout, minus_one_forever=False)
        return bool(self._call_blocking("wait", t, timeout=t))


# Wire typecodes the daemon stores as numbers (it can add and cas them).
_NUMERIC = set("bBhHiIlLqQfd?")
_CTYPE_CODES = {
    ctypes.c_byte: "b", ctypes.c_ubyte: "B", ctypes.c_short: "h", ctypes.c_ushort: "H",
    ctypes.c_int: "i", ctypes.c_uint: "I", ctypes.c_long: "l", ctypes.c_ulong: "L",
    ctypes.c_longlong: "q", ctypes.c_ulonglong: "Q", ctypes.c_float: "f", ctypes.c_double: "d",
    ctypes.c_bool: "?", ctypes.c_char: "c", ctypes.c_int8: "b", ctypes.c_uint8: "B",
    ctypes.c_int16: "h", ctypes.c_uint16: "H", ctypes.c_int32: "i", ctypes.c_uint32: "I",
    ctypes.c_int64: "q", ctypes.c_uint64: "Q", ctypes.c_size_t: "L", ctypes.c_ssize_t: "l",
}


def wire_typecode(typecode: Any) -> str:
    """The daemon's typecode for a Python typecode or ctypes type; anything
    else is stored as a pickle ('O')."""
    if isinstance(typecode, str):
        return typecode if typecode in _NUMERIC or typecode == "c" else "O"
    return _CTYPE_CODES.get(typecode, "O")


class ValueProxy(BaseProxy):
    """A shared value, as SyncManager's ValueProxy, plus atomic add and compare-and-set.

    Numeric typecodes are stored as numbers by the daemon; ``add`` and
    ``compare_and_set`` run there atomically, with no lock round trips.
    """

    _kind = "value"
    _code: str

    def _setstate(self, state: Any) -> None:
        self._code = state

    def _getstate(self) -> Any:
        return self._code

    @property
    def typecode(self) -> str:
        return self._code

    def _encode(self, v: Any) -> Any:
        if self._code == "O":
            return _dumps(v)
        if self._code == "c":
            if isinstance(v, int):
                v = bytes([v])
            if not isinstance(v, (bytes, bytearray)) or len(v) != 1:
                raise TypeError("a value of typecode 'c' holds one byte")
            return bytes(v)
        if hasattr(v, "item") and not isinstance(v, (int, float, bool)):  # numpy scalars
            v = v.item()
        if not isinstance(v, (int, float, bool)):
            raise TypeError(f"a value of typecode {self._code!r} holds numbers, not {type(v).__name__}")
        if isinstance(v, bool) and self._code != "?":
            return int(v)  # a bool is an int, as multiprocessing.Value('i', True) accepts
        return v

    def _decode(self, v: Any) -> Any:
        if self._code == "O":
            # Nothing stored yet (Value("O") with no value, or one created
            # again after a daemon restart) reads as None.
            return _loads(v) if v is not None and len(v) else None
        return v

    def get(self) -> Any:
        return self._decode(self._call("get"))

    def set(self, value: Any) -> None:
        if self._code == "O":
            self._call_blocking("set", 0.0, blob_key="value", blob=_dumps(value))
        else:
            self._call("set", value=self._encode(value))

    # Through the instance, so that the fast path's get and set serve it too.
    value = property(lambda self: self.get(), lambda self, v: self.set(v))

    def add(self, delta: Any = 1) -> Any:
        """Add delta atomically on the daemon and return the new value."""
        return self._call("add", delta=self._encode(delta))

    def compare_and_set(self, expected: Any, new: Any) -> bool:
        """Replace the value with new if it equals expected, atomically."""
        return bool(self._call("cas", expected=self._encode(expected), new=self._encode(new)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._code!r}, {self.get()!r})"


class QueueProxy(BaseProxy):
    """A shared queue.Queue. Items are stored as _values encodes them (plain
    data as msgpack, anything else pickled)."""

    _kind = "queue"

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        # Large buffers (numpy arrays) out of band: sent from the item's own
        # memory, not copied into a pickle first.
        self._put_encoded(_values.dumps_parts(item), block, timeout)

    def _put_encoded(self, data: Any, block: bool, timeout: Optional[float]) -> None:
        """put of an item already encoded: the pieces of
        _values.dumps_parts (sent as they are). Also the fast path's hook:
        its ring hands over an item it cannot store, encoded once."""
        t = 0.0 if not block else None if timeout is None else timeout_arg(True, timeout, minus_one_forever=False)
        self._call_blocking("put", t, blob_key="item", blob=data, block=block, timeout=t)

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        t = 0.0 if not block else None if timeout is None else timeout_arg(True, timeout, minus_one_forever=False)
        return _loads(self._call_blocking("get", t, undo=self._undo_get, block=block, timeout=t))

    def _undo_get(self, data: Any) -> None:
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._client.call("unget", self._args({}), blob_key="item", blob=data)

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        return int(self._call("qsize"))

    def empty(self) -> bool:
        return bool(self._call("empty"))

    def full(self) -> bool:
        return bool(self._call("full"))

    def put_many(self, items: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Put every item of items, all together (adjacent and in order) or
        none, in one request (faster-fifo's batch call). Every item is
        encoded (an unpicklable one refused) before anything is sent. When
        there is no room for the whole batch it waits, as put does, and
        raises Full at the deadline with nothing stored; a batch of more
        items than maxsize can never fit and raises ValueError at once."""
        objs = list(items)
        if not objs:
            return
        blob = pack_items(objs)
        self._put_many_blob(blob, block, 0.0 if not block else timeout_arg(True, timeout, minus_one_forever=False))

    def _put_many_encoded(self, parts: list[list[Any]], block: bool, timeout: Optional[float]) -> None:
        """put_many of items already encoded (each as _values.dumps_parts'
        pieces): the fast path's hook, where its ring hands over a batch it
        cannot store, encoded once."""
        self._put_many_blob(bin_array(parts), block, timeout)

    def _put_many_blob(self, blob: list[Any], block: bool, timeout: Optional[float]) -> None:
        """The one put_many request, its items argument encoded (pack_items,
        bin_array)."""
        t = 0.0 if not block else timeout
        self._call_blocking("put_many", t, blob_key="items", blob=blob, block=block, timeout=t)

    def get_many(self, max_items: int = 1 << 30, block: bool = True, timeout: Optional[float] = None) -> list[Any]:
        """Get at least one item (waiting as get does), then as many more as
        are there at once, up to max_items, in one request (faster-fifo's
        batch call). The reply fits one frame of the daemon's (--max-frame):
        items past that stay at the head for the next call."""
        check_count(max_items)
        t = 0.0 if not block else timeout_arg(True, timeout, minus_one_forever=False)
        datas = self._call_blocking("get_many", t, undo=self._undo_get_many, n=min(max_items, 1 << 20), block=block,
                                    timeout=t)
        try:
            return _values.loads_many(datas)
        except BaseException:
            self._undo_get_many(datas)  # an item that does not decode: all go back, nothing taken
            raise

    def _undo_get_many(self, datas: Any) -> None:
        if isinstance(datas, list):
            for d in reversed(datas):  # each goes to the front: the last first
                self._undo_get(d)


class JoinableQueueProxy(QueueProxy):
    """A shared JoinableQueue: a Queue with task_done and join."""

    _kind = "joinable_queue"

    def task_done(self) -> None:
        try:
            self._call("task_done")
        except exc.SyncMgrValueError as e:
            raise ValueError("task_done() called too many times") from e

    def join(self, timeout: Optional[float] = None) -> bool:
        """Wait until every item put has been marked done (timeout: extension, returns False on expiry)."""
        t = timeout_arg(True, timeout, minus_one_forever=False)
        return bool(self._call_blocking("join", t, timeout=t))


class ConditionProxy(AcquirerProxy):
    """A shared threading.Condition over a syncmgr Lock or RLock."""

    _kind = "condition"

    def wait(self, timeout: Optional[float] = None) -> bool:
        if timeout is not None and not math.isnan(timeout) and timeout < 0:
            timeout = 0.0
        t = timeout_arg(True, timeout, minus_one_forever=False)
        completed: list[Any] = []
        try:
            return bool(self._call_blocking("wait", t, undo=completed.append, tid=threading.get_ident(), timeout=t))
        except KeyboardInterrupt:
            # A cancelled wait leaves the lock released; take it back, as
            # threading.Condition.wait does, unless the wait completed first.
            if not completed:
                self.acquire()
            raise

    def _not_pipelined(self, method: str, args: tuple[Any, ...]) -> Optional[str]:
        if method in ("wait", "wait_for"):
            return "gives the Condition's lock up and takes it back, in the caller's order"
        return super()._not_pipelined(method, args)

    def wait_for(self, predicate: Callable[[], Any], timeout: Optional[float] = None) -> Any:
        endtime = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            if endtime is not None:
                remaining = endtime - time.monotonic()
                if remaining <= 0:
                    break
                self.wait(remaining)
            else:
                self.wait()
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        self._call("notify", tid=threading.get_ident(), n=n)

    def notify_all(self) -> None:
        self._call("notify_all", tid=threading.get_ident())

    notifyAll = notify_all  # noqa: N815 - the old threading name


class BarrierProxy(BaseProxy):
    """A shared threading.Barrier. The action runs in the process of the last
    party to arrive, before the others are released."""

    _kind = "barrier"
    _action: Optional[Callable[[], Any]]
    _timeout: Optional[float]

    def _setstate(self, state: Any) -> None:
        self._action, self._timeout = state

    def _getstate(self) -> Any:
        return (self._action, self._timeout)

    def _not_pipelined(self, method: str, args: tuple[Any, ...]) -> Optional[str]:
        if method == "wait":
            return ("cannot be undone, and may run the barrier's action, which the other parties wait "
                    "for")
        return None

    def wait(self, timeout: Optional[float] = None) -> int:
        if timeout is None:
            timeout = self._timeout
        t = timeout_arg(True, timeout, minus_one_forever=False)
        try:
            res = self._call_blocking("wait", t, undo=self._undo_wait, timeout=t)
        except exc.BrokenBarrierError:
            raise
        if res.get("action"):
            try:
                if self._action is not None:
                    self._action()
            except BaseException:
                self._call("action_done", ok=False)
                raise
            self._call("action_done", ok=True)
        return int(res["index"])

    def _undo_wait(self, res: Any) -> None:
        # Interrupted with the reply "run the action" on its way: the action
        # is reported failed, which breaks the barrier, instead of leaving
        # the other parties waiting for it.
        if isinstance(res, dict) and res.get("action"):
            self._client.call("action_done", self._args({"ok": False}))

    def abort(self) -> None:
        self._call("abort")

    def reset(self) -> None:
        self._call("reset")

    @property
    def parties(self) -> int:
        return int(self._call("parties"))

    @property
    def n_waiting(self) -> int:
        return int(self._call("n_waiting"))

    @property
    def broken(self) -> bool:
        return bool(self._call("broken"))
