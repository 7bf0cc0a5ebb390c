"""Pipelines: several proxy calls in one round trip.

``Manager.pipeline()`` (see :class:`Pipeline`) records calls of proxies'
methods and sends their requests back to back on one connection, then
reads the replies together: one round trip for the lot, where each call
alone would cost one. It is for the socket path, the path of a worker on
another node; on the daemon's host the fast path's ops cost less than any
round trip, and a pipeline sends even those over the socket.

How a recorded call becomes a request, without a second implementation of
any proxy method: the method runs on a copy of its proxy whose transport
(``_transport.Transport``) records the request it is asked for and stops
the method there (:class:`_Record`). Once the replies are in, the method
runs again on a fresh copy whose transport answers that request with its
reply (:class:`_Replay`), so the method's own decoding, errors and undo
apply as they do to a call alone. A second request the method makes (a
Queue get giving back an item it could not decode, a named object created
again after a daemon restart) goes to the daemon then, as a call alone.
What the method leaves in its copy's attributes (the run a Lock was taken
in) is written back to the proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import _fast
from ._transport import Request, Undo, give_back

if TYPE_CHECKING:
    from ._connection import Client
    from ._proxies import BaseProxy


class _Recorded(BaseException):
    """Ends a method at its request, in the recording pass (a BaseException,
    so that no ``except Exception`` in a method takes it for an error)."""

    def __init__(self, req: Request) -> None:
        super().__init__(req.op)
        self.req = req


class _Record:
    """The transport of the recording pass: the first call is the request."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:  # address, run_id, notify, flush...
        return getattr(self._client, name)

    def call(self, op: str, args: dict[str, Any], *, blob_key: Optional[str] = None, blob: Any = None,
             wait: Optional[float] = 0.0, undo: Optional[Undo] = None) -> Any:
        raise _Recorded(Request(op, args, blob_key, blob, undo))


class _Replay:
    """The transport of the replay pass: the first call gets the recorded
    request's reply (raising its error), any later one goes to the daemon."""

    def __init__(self, client: Client, op: str, err: Any, result: Any) -> None:
        self._client = client
        self._answer: Optional[tuple[str, Any, Any]] = (op, err, result)
        # What the later calls got that can be given back: (undo, result).
        self.granted: list[tuple[Undo, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def call(self, op: str, args: dict[str, Any], *, blob_key: Optional[str] = None, blob: Any = None,
             wait: Optional[float] = 0.0, undo: Optional[Undo] = None) -> Any:
        if self._answer is None:
            res = self._client.call(op, args, blob_key=blob_key, blob=blob, wait=wait, undo=undo)
            if undo is not None:
                self.granted.append((undo, res))
            return res
        want, err, result = self._answer
        self._answer = None
        if op != want:  # the method asked for another op than it did when recorded: nothing of this one ran
            give_back(undo, (err, result))
            raise RuntimeError(f"a pipelined call asked for {want!r} when recorded and {op!r} when replayed")
        if err is not None:
            from . import exceptions as exc

            raise exc.from_code(err[0], err[1])
        return result

    def unused(self) -> bool:
        """Whether the method returned without asking for its reply."""
        return self._answer is not None

    def give_back_later(self) -> None:
        """Give back what the later calls got, the latest first."""
        for undo, got in reversed(self.granted):
            give_back(undo, (None, got))
        self.granted.clear()


def _copy(cls: type[BaseProxy], state: dict[str, Any], transport: Any) -> BaseProxy:
    """A proxy of cls with state (a proxy's attributes) on transport,
    without its fast-path methods (a pipeline's calls are requests)."""
    c = cls.__new__(cls)
    c.__dict__.update(state)
    h = state.get("_fast")
    if h is not None:
        h.uninstall(c)
    c.__dict__["_client"] = transport
    return c


def _write_back(proxy: BaseProxy, state: dict[str, Any], copy: BaseProxy) -> None:
    """What the method changed in copy's attributes (against state, what
    it started from) goes to proxy. A copy that met a restarted daemon (its
    run changed) made its object again there: the proxy then moves to that
    run's fast path, as a call alone moves it."""
    skip = {"_client", "_fast", *getattr(state.get("_fast"), "methods", ())}
    for k, v in copy.__dict__.items():
        if k not in skip and state.get(k, _MISSING) is not v:
            proxy.__dict__[k] = v
    if copy.__dict__.get("_run") != state.get("_run"):
        _fast.reattach(proxy)


_MISSING = object()
# The special methods a pipeline records (a dict's or a list's item access).
_DUNDERS = frozenset({"__getitem__", "__setitem__", "__delitem__", "__len__", "__contains__"})


class _Calls:
    """``pipeline(proxy)``: its methods record calls (see Pipeline)."""

    def __init__(self, pipeline: Pipeline, proxy: BaseProxy) -> None:
        self._pipeline = pipeline
        self._proxy = proxy

    def __getattr__(self, name: str) -> Callable[..., int]:
        proxy = self._proxy
        cls = type(proxy).__name__
        if name.startswith("_") and name not in _DUNDERS:
            raise AttributeError(f"{name!r} is not a public method of {cls}")
        method = getattr(_fast.proxy_type(proxy), name, None)
        if not callable(method):
            raise AttributeError(f"{cls} has no method {name!r}")

        def record(*args: Any, **kwargs: Any) -> int:
            why = proxy._not_pipelined(name, args)
            if why is not None:
                raise ValueError(f"{cls}.{name} cannot go in a pipeline: it {why}; call it on its own")
            # The method runs twice (to record, then on its reply): a
            # one-shot iterator (a generator of items) is read once, here.
            args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
            kwargs = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
            return self._pipeline._add(proxy, method, args, kwargs)

        return record


class Pipeline:
    """Proxy calls sent together: record them, then ``execute()``::

        p = m.pipeline()
        p(q).put_many(batch)
        p(weights_version).get()
        p(stop).is_set()
        _, version, stopping = p.execute()   # one round trip

    ``p(proxy)`` takes any proxy of this manager's daemon; calling one of its
    methods records the call and returns its index in the results. Nothing
    is sent until ``execute()``, which returns each call's result in order.

    * **Order.** The daemon runs the requests in the order recorded, each as
      it would run alone; a blocking call (a ``get`` that waits) waits
      without holding up the calls after it. They are not a transaction:
      another client's requests may run between two of them. A method that
      needs two requests in the caller's order (a list's ``sort``, a slice
      assignment, a Condition's or a Barrier's ``wait``) is refused when
      recorded (ValueError).
    * **Errors.** A call that fails on the daemon had no effect, as alone.
      ``execute()`` raises the first call's error once every call has run,
      after giving back what the other calls got (items, locks), so that
      nothing is taken in the caller's name; what they stored stays stored.
      With ``raise_on_error=False`` the exceptions are in the results, and
      the other results are the caller's. A call refused before anything is
      sent (a bad argument, an item that does not pickle, a request over the
      frame limit) raises from ``execute()`` with nothing sent.
    * **Interrupted** (Ctrl-C) or a lost connection: nothing is taken in the
      caller's name. Calls still waiting are cancelled, and whatever a call
      had got is given back, as for one call; a ``put`` already stored stays
      stored.
    * **Size.** The requests of one pipeline may add up to MAX_BYTES
      (64 KiB): the daemon answers a connection's requests while the client
      is still sending them, and with more than a socket buffer of requests
      outstanding the two would wait on each other. A single call may be of
      any size (its pipeline is then that call alone).
    * The pipeline is emptied by ``execute()`` and may be used again. Use a
      pipeline from one thread at a time.
    """

    MAX_BYTES = 64 << 10

    def __init__(self, client: Client) -> None:
        self._client = client
        self._calls: list[tuple[BaseProxy, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, proxy: BaseProxy) -> Any:
        from ._proxies import BaseProxy

        if not isinstance(proxy, BaseProxy):
            raise TypeError(f"a pipeline takes syncmgr proxies, not {type(proxy).__name__}")
        if proxy._client is not self._client:
            raise ValueError(f"{proxy!r} is not on this pipeline's daemon connection ({self._client.address}): "
                             "a pipeline's calls all go to one daemon; make one pipeline per daemon")
        return _Calls(self, proxy)

    def _add(self, proxy: BaseProxy, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        self._calls.append((proxy, method, args, kwargs))
        return len(self._calls) - 1

    def __len__(self) -> int:
        return len(self._calls)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._calls = []  # what was not executed is dropped, not sent

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, self._calls = self._calls, []
        for proxy, _, _, _ in calls:
            if proxy._anon and not proxy._referenced:
                # An anonymous object first used here (a proxy that came by
                # pickle): the proxy itself takes the reference, which a
                # copy would drop when it is collected.
                proxy._args({})
        # Each call is recorded and replayed from the proxy's attributes as
        # they are now: an earlier call's replay may change them (the daemon
        # run a named object was made again in), which this call's reply,
        # sent with the others, does not know of.
        states = [dict(proxy.__dict__) for proxy, _, _, _ in calls]
        # Recording: each call's request, or its result when the method
        # needed no request (put_many of nothing). An error here (bad input)
        # is raised with nothing sent.
        reqs: list[Request] = []
        slots: list[Optional[int]] = []  # per call: its request's index, or None
        results: list[Any] = []
        for (proxy, method, args, kwargs), state in zip(calls, states):
            rec = _copy(_fast.proxy_type(proxy), state, _Record(self._client))
            try:
                results.append(method(rec, *args, **kwargs))
                slots.append(None)
            except _Recorded as r:
                rec.__dict__["_client"] = self._client  # its undo (a bound method of rec) gives back for real
                results.append(None)
                slots.append(len(reqs))
                reqs.append(r.req)
        try:
            answers = self._client.call_many(reqs, self.MAX_BYTES if len(reqs) > 1 else None) if reqs else []
        except ValueError as e:
            from .exceptions import FrameTooLargeError

            if isinstance(e, FrameTooLargeError):  # one request over the daemon's limit: its own message
                raise
            raise ValueError(f"a pipeline's requests must add up to at most Pipeline.MAX_BYTES: {e}: make large "
                             "calls (big batches, arrays) on their own or in pipelines of their own") from None
        return self._replay(calls, states, slots, reqs, answers, results, raise_on_error)

    def _replay(self, calls: list[tuple[BaseProxy, Callable[..., Any], tuple[Any, ...], dict[str, Any]]],
                states: list[dict[str, Any]], slots: list[Optional[int]], reqs: list[Request],
                answers: list[tuple[Any, Any]], results: list[Any], raise_on_error: bool) -> list[Any]:
        """Each method again, its request answered by its reply. What the
        methods change in their copies goes to the proxies only when
        execute() returns; when it raises, what the calls got is given back
        instead (each grant's undo, from its reply)."""
        first_error: Optional[BaseException] = None
        copies: list[Optional[BaseProxy]] = [None] * len(calls)
        replays: list[Optional[_Replay]] = [None] * len(calls)
        current = -1
        try:
            for i, (proxy, method, args, kwargs) in enumerate(calls):
                k = slots[i]
                if k is None:
                    continue
                current = i
                err, result = answers[k]
                replay = replays[i] = _Replay(self._client, reqs[k].op, err, result)
                copy: Optional[BaseProxy] = _copy(_fast.proxy_type(proxy), states[i], replay)
                try:
                    results[i] = method(copy, *args, **kwargs)
                    if replay.unused():
                        results[i] = RuntimeError("a pipelined call made no request when it was replayed")
                        give_back(reqs[k].undo, answers[k])
                        copy = None
                except Exception as e:
                    results[i] = e
                    copy = None  # (the method's own undo, if any, has run: as for a call alone)
                if copy is None:
                    slots[i] = None  # nothing of its reply to give back
                    replay.give_back_later()
                    if first_error is None:
                        first_error = results[i]
                copies[i] = copy
            current = -1
        except BaseException:
            # Ctrl-C while replaying: every other call gives back what it got
            # (the one being replayed does as a call alone would, once it has
            # taken its answer; before that, nothing has it but its reply).
            r = replays[current] if current >= 0 else None
            taken = r is not None and not r.unused()
            self._give_back(slots, reqs, answers, replays, skip=current if taken else -1)
            raise
        if raise_on_error and first_error is not None:
            self._give_back(slots, reqs, answers, replays, skip=-1)
            raise first_error
        for i, (proxy, _, _, _) in enumerate(calls):
            done = copies[i]
            if done is not None:
                _write_back(proxy, states[i], done)
        return results

    @staticmethod
    def _give_back(slots: list[Optional[int]], reqs: list[Request], answers: list[tuple[Any, Any]],
                   replays: list[Optional[_Replay]], skip: int) -> None:
        """Undo what the calls got, the latest first: gets of one queue put
        their items back at its head, so the earliest must go back last."""
        for i in reversed(range(len(slots))):
            if i == skip:
                continue
            r = replays[i]
            if r is not None:
                r.give_back_later()
            k = slots[i]
            if k is not None:
                give_back(reqs[k].undo, answers[k])
