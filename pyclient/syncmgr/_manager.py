"""The manager: a drop-in for ``multiprocessing.Manager()``.

``Manager()`` with no address starts an embedded daemon on a private socket
with a fresh key; ``connect()`` (or ``Manager(address=...)``) talks to a
daemon that is already running.
"""

from __future__ import annotations

import atexit
import os
import shutil
import ssl
from typing import Any, Optional, Union

from . import _containers, _fast
from . import _proxies as px
from . import exceptions as exc
from . import shared_memory as shm
from ._connection import Client, default_address, get_client, normalize_address
from ._daemon import KEY_FILE, PrivateDaemon, find_binary, private_dir, write_key_file
from ._handshake import set_label
from ._keys import coerce_key, key_for, read_key_file
from ._pipeline import Pipeline
from ._tls import TLS_ENV

__all__ = ["Manager", "connect", "find_binary"]


class Manager:
    """A syncmgr manager, with the object factories of ``SyncManager``.

    ``Manager()`` starts (on ``start()`` or ``with``) a private daemon
    (``_daemon.PrivateDaemon``); ``shutdown()`` (also at exit, and when this
    process dies) stops it and everything it owns. Child processes find its
    key by the address their proxies name (the key file beside its socket);
    if ``SYNCMGR_ADDRESS`` is not set yet, the manager also exports
    ``SYNCMGR_ADDRESS`` and ``SYNCMGR_AUTHKEY_FILE`` (``SYNCMGR_AUTHKEY``
    when that is set already) for ``syncmgr.connect()`` in children, and
    removes them at shutdown only if they are still its own.
    ``Manager(address, authkey)`` uses a running daemon instead.
    """

    def __init__(self, address: Optional[Union[str, tuple[str, int]]] = None,
                 authkey: Union[bytes, str, None] = None, *,
                 ssl_context: Optional[ssl.SSLContext] = None, log_level: str = "warn",
                 daemon_args: tuple[str, ...] = (), label: Optional[str] = None) -> None:
        if label is not None:
            set_label(label)
        self._embedded = address is None
        self._address: Optional[str] = normalize_address(address) if address is not None else None
        self._authkey = coerce_key(authkey) if authkey is not None else None  # bytes, or hex as keygen prints it
        self._ssl = ssl_context
        self._log_level = log_level
        self._daemon_args = tuple(daemon_args)
        self._daemon: Optional[PrivateDaemon] = None
        self._exported: Optional[dict[str, str]] = None
        self._client: Optional[Client] = None
        self._own_key_dir: Optional[str] = None  # a key file written for runtime_env()
        self._state = "initial"

    # --- lifecycle -----------------------------------------------------------

    def start(self) -> Manager:
        """Start the embedded daemon (or connect to the given one)."""
        if self._state == "started":
            return self
        if self._state == "shutdown":
            raise exc.ManagerShutDownError("this manager has been shut down")
        if self._embedded:
            self._start_daemon()
        else:
            self._client = get_client(self._address or default_address(), self._authkey, self._ssl)
            self._authkey = self._client._key
            self._client.call("ping", {})
        self._state = "started"
        return self

    def _start_daemon(self) -> None:
        d = PrivateDaemon(key=self._authkey, args=self._daemon_args, log_level=self._log_level)
        try:
            d.start()
            self._client = get_client(d.address, d.key, None)
            self._client.call("ping", {})
        except BaseException:
            d.close()
            raise
        self._daemon = d
        self._address = d.address
        self._authkey = d.key
        if not os.environ.get("SYNCMGR_ADDRESS"):
            self._exported = d.env()  # the address and the key file
            if "SYNCMGR_AUTHKEY" in os.environ:  # it would win over the file: replace it
                self._exported = {"SYNCMGR_ADDRESS": d.address, "SYNCMGR_AUTHKEY": d.key.hex()}
            os.environ.update(self._exported)
        atexit.register(self.shutdown)

    def shutdown(self) -> None:
        """Stop the embedded daemon (a connected manager just closes its connections)."""
        if self._own_key_dir is not None:
            shutil.rmtree(self._own_key_dir, ignore_errors=True)
            self._own_key_dir = None
        if self._state != "started":
            self._state = "shutdown"
            return
        self._state = "shutdown"
        if self._client is not None:
            self._client.close()
        if self._embedded:
            if self._exported is not None:
                for k, v in self._exported.items():
                    if os.environ.get(k) == v:
                        del os.environ[k]
                self._exported = None
            if self._daemon is not None:
                self._daemon.close()
                self._daemon = None
            try:
                atexit.unregister(self.shutdown)
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> Manager:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def __bool__(self) -> bool:
        return True

    def __reduce__(self) -> tuple[Any, ...]:
        # A manager pickles to a client of the same daemon; the key comes from
        # the receiving process's environment.
        return (connect, (self.address,))

    def __repr__(self) -> str:
        kind = "embedded" if self._embedded else "connected"
        return f"<syncmgr.Manager {kind} {self._state} at {self._address}>"

    # --- information -----------------------------------------------------------

    @property
    def address(self) -> str:
        """The daemon's address (a socket path or tcp://host:port)."""
        if self._address is None:
            raise exc.SyncMgrError("the manager has not been started")
        return self._address

    @property
    def pid(self) -> Optional[int]:
        """The embedded daemon's process id."""
        return self._daemon.pid if self._daemon is not None else None

    def runtime_env(self) -> dict[str, Any]:
        """A Ray runtime_env that lets workers reach this daemon: its address,
        ``SYNCMGR_AUTHKEY_FILE`` naming a 0600 file that holds the key, and
        the TLS settings set here. Never the key itself: Ray shows a job's
        runtime_env in its dashboard, Jobs API and ``ray list runtime-envs``.

        The file is the embedded daemon's ``syncmgr.key``, else the file
        ``$SYNCMGR_AUTHKEY_FILE`` or the one beside the socket when it holds
        this key, else one this manager writes (0600, in a private directory
        of this host, removed at shutdown). Workers on other hosts need the
        file at the same path there (docs/ray.md)."""
        key = self._authkey if self._authkey is not None else key_for(self.address)
        env = {"SYNCMGR_ADDRESS": self.address, "SYNCMGR_AUTHKEY_FILE": self._key_file(key)}
        env.update({k: os.environ[k] for k in TLS_ENV if os.environ.get(k)})  # TLS settings, when set here
        return {"env_vars": env}

    def _key_file(self, key: bytes) -> str:
        """A 0600 file holding key, for workers (see runtime_env)."""
        cands = []
        if self._daemon is not None:
            cands.append(os.path.join(self._daemon.dir, KEY_FILE))
        if os.environ.get("SYNCMGR_AUTHKEY_FILE"):
            cands.append(os.path.abspath(os.environ["SYNCMGR_AUTHKEY_FILE"]))
        if not self.address.startswith("tcp://"):
            path = self.address[len("unix://"):] if self.address.startswith("unix://") else self.address
            cands.append(os.path.join(os.path.dirname(os.path.abspath(path)), KEY_FILE))
        if self._own_key_dir is not None:
            cands.append(os.path.join(self._own_key_dir, KEY_FILE))
        for c in cands:
            if read_key_file(c) == key:
                return c
        self._own_key_dir = private_dir("syncmgr-key-")
        return write_key_file(self._own_key_dir, key)

    def _c(self) -> Client:
        if self._state == "initial":
            self.start()
        if self._client is None or self._state != "started":
            raise exc.ManagerShutDownError("this manager has been shut down")
        return self._client

    def status(self, limit: int = 10000) -> dict[str, Any]:
        """The daemon's status: server counters, objects and sessions."""
        return self._c().call("status", {"limit": limit})

    def pipeline(self) -> Pipeline:
        """A Pipeline: proxy calls recorded, then sent to the daemon back to
        back and answered together (one round trip), for workers that reach
        the daemon over the network."""
        return Pipeline(self._c())

    def delete(self, name: str) -> bool:
        """Delete a named object now; returns whether it existed."""
        return bool(self._c().call("delete", {"name": name}))

    # --- factories ---------------------------------------------------------------

    def _create(self, cls: type[px.BaseProxy], name: Optional[str], state: Any = None, **params: Any) -> Any:
        client = self._c()
        args: dict[str, Any] = {"kind": cls._kind, **params}
        if name is not None:
            args["name"] = name
        fp = _fast.ref_path(client, cls._kind)
        if fp is not None:
            args["fastpath"] = True  # the reply carries the object's word: one round trip
        res = client.call("create", args)
        hint = None if fp is None else res.get("fp")
        adopted = None if fp is None else _fast.adopting(cls, fp, hint)
        # A proxy whose create brought its word is made as its pending class
        # (_fast.adopting), and only stored to here (cls's methods, not the
        # pending class's look-ups).
        p: px.BaseProxy = cls.__new__(cls if adopted is None else adopted[0])
        cls._bind(p, client, res["name"], owned=True, params=params or None)
        cls._setstate(p, state)
        if adopted is None:
            _fast.attach(p, hint)
        else:
            p._fp_hint = adopted[1]  # until its first op or its pickling (_fast.note_hint)
        return p

    def Lock(self, name: Optional[str] = None) -> px.LockProxy:  # noqa: N802
        return self._create(px.LockProxy, name)

    def RLock(self, name: Optional[str] = None) -> px.RLockProxy:  # noqa: N802
        return self._create(px.RLockProxy, name)

    def Semaphore(self, value: int = 1, name: Optional[str] = None) -> px.SemaphoreProxy:  # noqa: N802
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        return self._create(px.SemaphoreProxy, name, value=value)

    def BoundedSemaphore(self, value: int = 1, name: Optional[str] = None) -> px.BoundedSemaphoreProxy:  # noqa: N802
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        return self._create(px.BoundedSemaphoreProxy, name, value=value)

    def Event(self, name: Optional[str] = None) -> px.EventProxy:  # noqa: N802
        return self._create(px.EventProxy, name)

    def Condition(self, lock: Optional[px.AcquirerProxy] = None, name: Optional[str] = None) -> px.ConditionProxy:  # noqa: N802
        params = {}
        if lock is not None:
            if not isinstance(lock, (px.LockProxy, px.RLockProxy)):
                raise TypeError("Condition needs a syncmgr Lock or RLock")
            params["lock"] = lock.name
        cond = self._create(px.ConditionProxy, name, **params)
        if lock is not None:  # which kind to create again after a daemon restart (not sent to the daemon)
            cond._params = {**cond._params, "_lock_kind": lock._kind}
        return cond

    def Barrier(self, parties: int, action: Any = None, timeout: Optional[float] = None,  # noqa: N802
                name: Optional[str] = None) -> px.BarrierProxy:
        return self._create(px.BarrierProxy, name, state=(action, timeout), parties=parties,
                            action=action is not None)

    def Value(self, typecode: Any, value: Any = None, lock: bool = True, name: Optional[str] = None) -> Any:  # noqa: N802
        """A shared value. With ``lock=False`` and a ctypes type or typecode it is
        a raw ctypes object in shared memory, as ``multiprocessing.Value(lock=False)``
        (what cpprb's default backend asks for); otherwise a daemon-held value
        with atomic ``add`` and ``compare_and_set``."""
        if lock is False and not isinstance(typecode, str) or lock is False and typecode in shm._TYPECODES:
            args = () if value is None else (value,)
            return shm.RawValue(self._c(), typecode, *args, name=name)
        code = px.wire_typecode(typecode)
        if code == "O":
            p = self._create(px.ValueProxy, name, state="O", typecode="O")
            if value is not None:
                p.set(value)
            return p
        if value is None:
            value = False if code == "?" else (b"\x00" if code == "c" else 0)
        proto = px.ValueProxy.__new__(px.ValueProxy)
        proto._code = code
        return self._create(px.ValueProxy, name, state=code, typecode=code, value=proto._encode(value))

    def Queue(self, maxsize: int = 0, name: Optional[str] = None) -> px.QueueProxy:  # noqa: N802
        return self._create(px.QueueProxy, name, maxsize=maxsize)

    def JoinableQueue(self, maxsize: int = 0, name: Optional[str] = None) -> px.JoinableQueueProxy:  # noqa: N802
        return self._create(px.JoinableQueueProxy, name, maxsize=maxsize)

    def dict(self, *args: Any, name: Optional[str] = None, **kwargs: Any) -> _containers.DictProxy:
        """A shared dict, initialised like dict(*args, **kwargs)."""
        d = self._create(_containers.DictProxy, name)
        init = dict(*args, **kwargs)
        if init:
            d.update(init)
        return d

    def list(self, sequence: Any = (), name: Optional[str] = None) -> _containers.ListProxy:
        """A shared list, initialised from sequence."""
        lst = self._create(_containers.ListProxy, name)
        items = list(sequence)
        if items:
            lst.extend(items)
        return lst

    def Namespace(self, name: Optional[str] = None, **attrs: Any) -> _containers.NamespaceProxy:  # noqa: N802
        """A shared namespace; attributes live on the daemon."""
        ns = self._create(_containers.NamespaceProxy, name)
        if attrs:
            ns._update(attrs)
        return ns

    # --- shared memory -----------------------------------------------------------

    def SharedMemory(self, name: Optional[str] = None, create: bool = False, size: int = 0) -> shm.SharedMemory:  # noqa: N802
        """A daemon-owned segment with the interface of multiprocessing.shared_memory.SharedMemory."""
        return shm.SharedMemory(name, create, size, client=self._c())

    def ndarray(self, shape: Any, dtype: Any = float, name: Optional[str] = None) -> Any:
        """A zero-filled numpy array in a daemon-owned segment; pickles by name, zero-copy."""
        return shm.ndarray(self._c(), shape, dtype, name)

    def Array(self, typecode_or_type: Any, size_or_initializer: Any, lock: bool = True,  # noqa: N802
              name: Optional[str] = None) -> Any:
        """A ctypes array in a daemon-owned segment, as multiprocessing.Array."""
        raw = shm.RawArray(self._c(), typecode_or_type, size_or_initializer, name=name)
        if lock is False:
            return raw
        lk = self.RLock() if lock is True else lock
        return shm.SynchronizedArray(raw, lk)

    def RawArray(self, typecode_or_type: Any, size_or_initializer: Any) -> Any:  # noqa: N802
        return shm.RawArray(self._c(), typecode_or_type, size_or_initializer)

    def RawValue(self, typecode_or_type: Any, *args: Any) -> Any:  # noqa: N802
        return shm.RawValue(self._c(), typecode_or_type, *args)


def connect(address: Optional[Union[str, tuple[str, int]]] = None, authkey: Union[bytes, str, None] = None, *,
            ssl_context: Optional[ssl.SSLContext] = None, label: Optional[str] = None) -> Manager:
    """A manager for a running daemon: address defaults to $SYNCMGR_ADDRESS,
    authkey to $SYNCMGR_AUTHKEY (hex) or the file named by $SYNCMGR_AUTHKEY_FILE.
    An authkey given here is the key's bytes, or a str of hex as
    ``syncmgr keygen`` prints it.
    ``label`` names this process in ``syncmgr status`` (default: program
    name and pid, plus the Ray worker id in a Ray worker)."""
    m = Manager(address or default_address(), authkey, ssl_context=ssl_context, label=label)
    m._state = "started"
    addr = m._address or default_address()
    m._client = get_client(addr, m._authkey, ssl_context)
    m._authkey = m._client._key
    return m

