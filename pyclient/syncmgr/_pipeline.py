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

from typing import TYPE_CHECKING, Any, Callable, Optional

from ._transport import Request, Undo

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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def call(self, op: str, args: dict[str, Any], *, blob_key: Optional[str] = None, blob: Any = None,
             wait: Optional[float] = 0.0, undo: Optional[Undo] = None) -> Any:
        if self._answer is None:
            return self._client.call(op, args, blob_key=blob_key, blob=blob, wait=wait, undo=undo)
        want, err, result = self._answer
        self._answer = None
        if op != want:  # the method asked for another op than it did when recorded: nothing of this one ran
            if err is None and undo is not None:
                undo(result)
            raise RuntimeError(f"a pipelined call asked for {want!r} when recorded and {op!r} when replayed")
        if err is not None:
            from . import exceptions as exc

            raise exc.from_code(err[0], err[1])
        return result


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
    it started from) goes to proxy."""
    skip = {"_client", "_fast", *getattr(state.get("_fast"), "methods", ())}
    for k, v in copy.__dict__.items():
        if k not in skip and state.get(k, _MISSING) is not v:
            proxy.__dict__[k] = v


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
        if name.startswith("_") and name not in _DUNDERS:
            raise AttributeError(f"{name!r} is not a public method of {type(proxy).__name__}")
        method = getattr(type(proxy), name, None)
        if not callable(method):
            raise AttributeError(f"{type(proxy).__name__} has no method {name!r}")

        def record(*args: Any, **kwargs: Any) -> int:
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
      another client's requests may run between two of them.
    * **Errors.** A call that fails on the daemon had no effect, as alone.
      ``execute()`` raises the first call's error once every call has run
      (``raise_on_error=False`` puts the exceptions in the results instead).
      A call refused before anything is sent (a bad argument, an item that
      does not pickle, a request over the frame limit) raises from
      ``execute()`` with nothing sent.
    * **Interrupted** (Ctrl-C) or a lost connection: nothing is taken in the
      caller's name. Calls still waiting are cancelled, and whatever a call
      had got (an item, a lock) is given back, as for one call; a ``put``
      already stored stays stored.
    * The pipeline is emptied by ``execute()`` and may be used again. Use a
      pipeline from one thread at a time.
    """

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
        # Recording: each call's request, or its result when the method
        # needed no request (put_many of nothing). An error here (bad input)
        # is raised with nothing sent.
        reqs: list[Request] = []
        slots: list[Optional[int]] = []  # per call: its request's index, or None
        results: list[Any] = []
        # Each call replays from the proxy's attributes as they were when it
        # was recorded (an earlier call's replay may change them: the daemon
        # run a named object was made again in, which this call's reply,
        # sent before, does not know of).
        for proxy, _, _, _ in calls:
            if proxy._anon and not proxy._referenced:
                # An anonymous object first used here (a proxy that came by
                # pickle): the proxy itself takes the reference, which a
                # copy would drop when it is collected.
                proxy._args({})
        states = [dict(proxy.__dict__) for proxy, _, _, _ in calls]
        for (proxy, method, args, kwargs), state in zip(calls, states):
            rec = _copy(type(proxy), state, _Record(self._client))
            try:
                results.append(method(rec, *args, **kwargs))
                slots.append(None)
            except _Recorded as r:
                rec.__dict__["_client"] = self._client  # its undo (a bound method of rec) gives back for real
                results.append(None)
                slots.append(len(reqs))
                reqs.append(r.req)
        answers = self._client.call_many(reqs) if reqs else []
        # Replay: each method again, its request answered by its reply.
        first_error: Optional[BaseException] = None
        done = 0
        try:
            for i, (proxy, method, args, kwargs) in enumerate(calls):
                done = i
                k = slots[i]
                if k is None:
                    continue
                err, result = answers[k]
                copy = _copy(type(proxy), states[i], _Replay(self._client, reqs[k].op, err, result))
                try:
                    results[i] = method(copy, *args, **kwargs)
                except Exception as e:
                    results[i] = e
                    if first_error is None:
                        first_error = e
                _write_back(proxy, states[i], copy)
        except BaseException:  # Ctrl-C while replaying: the calls not replayed give back what they got
            for i in range(done + 1, len(calls)):
                k = slots[i]
                undo = None if k is None else reqs[k].undo
                if k is not None and undo is not None and answers[k][0] is None:
                    undo(answers[k][1])
            raise
        if raise_on_error and first_error is not None:
            raise first_error
        return results
