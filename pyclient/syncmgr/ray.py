"""syncmgr on a Ray cluster: a daemon on every node, placed and supervised by Ray.

::

    import ray, syncmgr.ray
    ray.init()
    cluster = syncmgr.ray.start()          # one daemon per alive node
    m = cluster.local()                    # this node's daemon: Unix socket, fast path
    q = m.Queue(name="ingest")             # pickles to any task or actor, on any node

Each node's daemon is the child process of a small actor of this module
(``num_cpus=0``) pinned to the node by a hard node affinity; it listens on a
Unix socket of the node (the fast path for the node's processes) and on
TCP+TLS on the node's address for the other nodes, with a certificate it
made itself at start. A *keeper* actor generates the cluster's key in its
own process, creates the node actors (so they share its fate and, unless
``detached``, the job's) and answers for the cluster: its nodes, their
addresses and certificate fingerprints, and the key.

**Addresses.** A proxy made through ``cluster.local()`` or ``cluster.on()``
is named by its daemon's socket path, ``<tmp>/syncmgr-ray-<uid>/<cluster>/
<node id prefix>/syncmgr.sock``, and pickles by that address as every proxy
does. In each process the address is resolved once (:func:`route`): on the
daemon's own node it is dialled as a socket (fast path); on any other node
the process dials the node's TCP address, checks the daemon's certificate
against the SHA-256 fingerprint the keeper gave it, and authenticates with
the key. So a Queue made on node A and passed to a task on node B works
there over TCP+TLS with nothing set up by hand.

**The key** is made by the keeper (``os.urandom(32)``) and reaches a process
only as the result of an actor call (``secret()``), once per process and
cluster; a node actor passes it to its daemon in a 0600 file removed once
read, and leaves a 0600 ``syncmgr.key`` beside the node's socket, in the
node's 0700 directory, for same-user processes of that node that are not
Ray workers (a spawned child); the directory goes when the daemon stops.
The key is never in a ``runtime_env``, an environment variable, a command
line, a pickle or a log. docs/ray.md, "Trust", says who can get it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
from typing import Any, Optional

from . import exceptions as exc
from ._connection import Route
from ._daemon import KEY_FILE, SOCKET_FILE, PrivateDaemon, write_key_file
from ._keys import read_key_file
from ._manager import Manager, connect
from ._tls import pinned_tls_context

__all__ = ["Cluster", "attach", "route", "start"]

NAMESPACE = "syncmgr"
_log = logging.getLogger("syncmgr")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_ADDRESS = re.compile(r"/syncmgr-ray-(?P<uid>\d+)/(?P<cluster>[A-Za-z0-9_.-]{1,40})/(?P<node>[0-9a-f]{16})/"
                      + re.escape(SOCKET_FILE) + "$")
_START_TIMEOUT = 60.0  # for one node's daemon to answer (an actor placed, a process started)

# The flags of `syncmgr serve` that start() takes as keyword arguments
# (max_queue=... is --max-queue ...): the daemon's limits.
LIMITS = frozenset((
    "max_frame", "max_objects", "max_objects_per_client", "max_queue", "max_conns", "max_conns_per_client",
    "max_object_bytes", "max_bytes", "max_parked", "max_handshakes", "handshake_timeout", "share_grace",
    "shm_limit", "queue_ring_bytes", "fastpath_objects", "gc_floor", "shutdown_timeout", "log_level",
))


def _ray() -> Any:
    try:
        import ray  # noqa: PLC0415 - optional: only this module needs it
    except ImportError:
        raise exc.RayClusterError("syncmgr.ray needs Ray: pip install 'ray>=2.9'") from None
    return ray


def _connected_ray() -> Any:
    ray = _ray()
    if not ray.is_initialized():
        raise exc.RayClusterError(
            "this process is not connected to Ray: call ray.init() first (ray.init(address='auto') joins a "
            "running cluster); in a Ray task or actor it already is"
        )
    return ray


def _keeper_name(name: str) -> str:
    return f"syncmgr:{name}"


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a syncmgr cluster name is 1 to 40 of A-Z a-z 0-9 _ . - (got {name!r})")
    return name


def _flags(limits: dict[str, Any]) -> list[str]:
    unknown = sorted(set(limits) - LIMITS)
    if unknown:
        raise TypeError(f"start() got unknown daemon limits {unknown}; it takes {sorted(LIMITS)} "
                        "(and daemon_args=(...) for any other flag of `syncmgr serve`)")
    out: list[str] = []
    for k, v in sorted(limits.items()):
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


# --- the actors ----------------------------------------------------------------

_remotes: dict[type, Any] = {}


def _remote(cls: type) -> Any:
    """cls as a Ray actor class (made once per process)."""
    r = _remotes.get(cls)
    if r is None:
        r = _remotes[cls] = _ray().remote(cls)
    return r


def _node_states(ray: Any) -> dict[str, bool]:
    """Every node the Ray cluster knows: node id -> alive."""
    return {n["NodeID"]: bool(n.get("Alive")) for n in ray.nodes()}


def node_dir(cluster: str, node_id: str) -> str:
    """The directory of cluster's daemon on node_id: its socket, the key file
    for the node's processes, its info file and its log."""
    base = tempfile.gettempdir()
    if len(base) > 40:  # a Unix socket path has room for about 100 bytes
        base = "/tmp"
    return os.path.join(base, f"syncmgr-ray-{os.getuid()}", cluster, node_id[:16])


def _private_dirs(path: str) -> None:
    """Make path and its parents up to the syncmgr-ray-<uid> directory, each
    0700 and this user's (refusing one that is not: another user could
    have made it to watch or replace the socket)."""
    top = os.path.dirname(os.path.dirname(path))
    for d in (top, os.path.dirname(path), path):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise exc.RayClusterError(f"{d} is not a private directory of this user (uid {os.getuid()}, mode 0700)")


def _listening(sock: str) -> bool:
    """Whether a process accepts connections on the Unix socket sock."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1.0)
            s.connect(sock)
        return True
    except OSError:
        return False


def _sweep(top: str) -> None:
    """Remove the node directories under top (<tmp>/syncmgr-ray-<uid>) whose
    daemon is gone (its socket answers nobody): what a daemon killed with its
    job's driver left (its log; the key file, when its sh parent was killed
    too). Run by every node daemon's start; a directory changed in the last
    two minutes is left alone (its daemon may be starting)."""
    now = time.time()
    for cdir in glob.glob(os.path.join(top, "*")):
        for ndir in glob.glob(os.path.join(cdir, "*")):
            try:
                if now - os.lstat(ndir).st_mtime < 120:
                    continue  # maybe a daemon that is starting now (another cluster's, on this host)
            except OSError:
                continue
            if not _listening(os.path.join(ndir, SOCKET_FILE)):
                shutil.rmtree(ndir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(cdir)


class NodeDaemon:
    """A node's daemon, run as the child of this actor (see start())."""

    def __init__(self, cluster: str, node_id: str) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.daemon: Optional[PrivateDaemon] = None
        self.dir = node_dir(cluster, node_id)

    def start(self, key: bytes, args: list[str]) -> dict[str, Any]:
        """Start the daemon and return where it listens: its socket, its TCP
        address and its certificate's SHA-256."""
        ray = _ray()
        ip = ray.util.get_node_ip_address()
        if _listening(os.path.join(self.dir, SOCKET_FILE)):
            raise exc.RayClusterError(f"a daemon of syncmgr cluster {self.cluster!r} already runs on this node "
                                      f"({self.dir})")
        shutil.rmtree(self.dir, ignore_errors=True)  # a dead run's: its info file must not be read as ours
        _private_dirs(self.dir)
        _sweep(os.path.dirname(os.path.dirname(self.dir)))  # other dead runs' directories
        info_file = os.path.join(self.dir, "info.json")
        host = f"[{ip}]" if ":" in ip else ip
        d = PrivateDaemon(key=key, args=("--tcp", f"{host}:0", "--tls-self-signed", "--info-file", info_file, *args),
                          exit_with_parent=True, forward_log=False, key_file=False, directory=self.dir,
                          key_in_env=False, shield=True)
        try:
            d.start(timeout=_START_TIMEOUT)
            deadline = time.monotonic() + _START_TIMEOUT
            while not os.path.exists(info_file):
                if time.monotonic() > deadline or not d.running():
                    raise exc.RayClusterError(f"the daemon wrote no {info_file}:\n{d.log_tail()}")
                time.sleep(0.01)
            with open(info_file, encoding="utf-8") as f:
                info = json.load(f)
            write_key_file(self.dir, key)  # for this node's processes outside Ray (0600, in a 0700 directory)
        except BaseException:
            d.close()
            raise
        self.daemon = d
        return {"node_id": self.node_id, "socket": d.address, "tcp": f"tcp://{info['tcp']}",
                "tls_sha256": str(info["tls_sha256"]).lower(), "pid": int(info["pid"]), "ip": ip}

    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.running()

    def stop(self) -> None:
        """Stop the daemon gracefully (its segments are unlinked) and remove
        the node's directory."""
        if self.daemon is not None:
            self.daemon.close()
            self.daemon = None
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.dir))  # the cluster's directory, once its last node's is gone


class Keeper:
    """The cluster's key and its node daemons' actors (see the module docstring)."""

    def __init__(self, name: str, detached: bool, args: list[str]) -> None:
        self.name = name
        self.detached = detached
        self.args = list(args)
        self.key = os.urandom(32)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.actors: dict[str, Any] = {}

    def secret(self) -> bytes:
        return self.key

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "detached": self.detached, "nodes": dict(self.nodes)}

    def start_nodes(self, node_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Start a daemon on each node (not yet started); if any cannot start,
        stop the ones this call started and raise an error naming the node."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

        todo = [n for n in node_ids if n not in self.nodes]
        handles = {}
        for nid in todo:
            opts: dict[str, Any] = {
                "num_cpus": 0, "max_restarts": 0, "namespace": NAMESPACE,
                "name": f"syncmgr:{self.name}:{nid[:16]}",
                "scheduling_strategy": NodeAffinitySchedulingStrategy(nid, soft=False),
            }
            if self.detached:
                opts["lifetime"] = "detached"
            handles[nid] = _remote(NodeDaemon).options(**opts).remote(self.name, nid)
        refs = {nid: h.start.remote(self.key, self.args) for nid, h in handles.items()}
        failed: dict[str, BaseException] = {}
        for nid, ref in refs.items():
            try:
                self.nodes[nid] = ray.get(ref, timeout=_START_TIMEOUT + 30)
                self.actors[nid] = handles[nid]
            except Exception as e:  # noqa: BLE001 - reported below, naming the node
                failed[nid] = e
        if failed:
            for nid, h in handles.items():
                if nid in self.actors:
                    with contextlib.suppress(Exception):
                        ray.get(h.stop.remote(), timeout=30)
                    self.actors.pop(nid, None)
                    self.nodes.pop(nid, None)
                with contextlib.suppress(Exception):
                    ray.kill(h)
            first, error = next(iter(failed.items()))
            cause = getattr(error, "cause", None) or error
            raise exc.RayClusterError(f"the syncmgr daemon on node {first} could not start: {cause}"
                                      + ("" if len(failed) == 1 else f" (and on {len(failed) - 1} more nodes)")
                                      + "; the daemons this call started were stopped")
        return {nid: self.nodes[nid] for nid in node_ids}

    def ensure_node(self, node_id: str) -> dict[str, Any]:
        """The node's daemon, started first if it has none (a node that
        joined after start(), or whose daemon died)."""
        ray = _ray()
        h = self.actors.get(node_id)
        if h is not None:
            try:
                if ray.get(h.alive.remote(), timeout=30):
                    return self.nodes[node_id]
            except Exception:  # noqa: BLE001 - its actor died: start it again below
                pass
            self.nodes.pop(node_id, None)
            self.actors.pop(node_id, None)
            with contextlib.suppress(Exception):
                ray.kill(h)
        return self.start_nodes([node_id])[node_id]

    def shutdown(self) -> int:
        """Stop every node's daemon; returns how many were stopped."""
        ray = _ray()
        refs = [(nid, h, h.stop.remote()) for nid, h in self.actors.items()]
        for _nid, h, ref in refs:
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=30)
            with contextlib.suppress(Exception):
                ray.kill(h)
        n = len(refs)
        self.actors.clear()
        self.nodes.clear()
        return n


# --- this process's view ---------------------------------------------------------


class _Known:
    """What this process learnt of one cluster from its keeper: the key and
    the nodes (fetched once, the nodes again when one is missing)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.key: Optional[bytes] = None
        self.nodes: dict[str, dict[str, Any]] = {}

    def keeper(self) -> Any:
        ray = _connected_ray()
        try:
            return ray.get_actor(_keeper_name(self.name), namespace=NAMESPACE)
        except ValueError:
            raise exc.RayClusterError(
                f"no syncmgr cluster named {self.name!r} runs in this Ray cluster (it was shut down, or its job "
                "ended): start one with syncmgr.ray.start(name=...), or `syncmgr ray-start --name NAME`"
            ) from None

    def fetch(self, *, key: bool) -> None:
        ray = _ray()
        k = self.keeper()
        if key and self.key is None:
            self.key = bytes(ray.get(k.secret.remote(), timeout=60))
        self.nodes = dict(ray.get(k.info.remote(), timeout=60)["nodes"])

    def node(self, prefix: str) -> Optional[dict[str, Any]]:
        for nid, info in self.nodes.items():
            if nid.startswith(prefix):
                return info
        return None


_known: dict[str, _Known] = {}
_known_lock = threading.Lock()
# Keepers this process started: Ray ends an actor that is not detached once
# no handle to it is left, so the starting process (the job's driver, whose
# end ends the cluster) holds one until shutdown().
_started: dict[str, Any] = {}


def _known_for(name: str) -> _Known:
    with _known_lock:
        k = _known.get(name)
        if k is None:
            k = _known[name] = _Known(name)
        return k


def _here() -> str:
    """This process's Ray node id."""
    return str(_connected_ray().get_runtime_context().get_node_id())


def forget(address: str) -> None:
    """Forget what this process was told about the cluster address names
    (its key, its nodes' addresses and pins), so that the next route() asks
    the keeper again: a cluster started again under the same name (a
    test's, a restarted job's) has another key and other ports, and a Ray
    worker process outlives clusters."""
    m = _ADDRESS.search(address)
    if m is not None:
        with _known_lock:
            _known.pop(m["cluster"], None)


def route(address: str) -> Optional[Route]:
    """How this process reaches the daemon a syncmgr.ray address names (see
    the module docstring), or None if address is not one."""
    m = _ADDRESS.search(address)
    if m is None:
        return None
    name, prefix = m["cluster"], m["node"]
    ray = _ray()
    if not ray.is_initialized():
        # A process of the node outside Ray (a spawned child of a worker):
        # the node's key file, if this is the daemon's node.
        key = read_key_file(os.path.join(os.path.dirname(address), KEY_FILE))
        if key is not None and os.path.exists(address):
            return Route(address, key, "the syncmgr.key file beside the node's socket")
        _connected_ray()  # raises: says to connect to Ray
    known = _known_for(name)
    with known.lock:
        if known.key is None or known.node(prefix) is None:
            known.fetch(key=True)
        info = known.node(prefix)
        if info is None:
            raise exc.RayClusterError(
                f"syncmgr cluster {name!r} has no daemon on the node {prefix}... that {address} names "
                "(the node left the Ray cluster, or the cluster was started again)")
        key = known.key
    assert key is not None
    source = f"syncmgr cluster {name!r} (its keeper actor)"
    if _here().startswith(prefix):
        return Route(address, key, source)
    return Route(info["tcp"], key, source, pinned_tls_context(), info["tls_sha256"],
                 peer=f"node {info['node_id']} of syncmgr cluster {name!r}")


class Cluster:
    """A syncmgr cluster on Ray: one daemon per node. Picklable (by name):
    a task or actor that gets it reaches the same daemons."""

    def __init__(self, name: str) -> None:
        self.name = _check_name(name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Cluster, (self.name,))

    def __repr__(self) -> str:
        return f"<syncmgr.ray.Cluster {self.name!r}>"

    def _known(self) -> _Known:
        return _known_for(self.name)

    def nodes(self) -> dict[str, dict[str, Any]]:
        """node id -> {"socket", "tcp", "tls_sha256", "ip", "pid"} of each
        node's daemon (asks the keeper)."""
        k = self._known()
        with k.lock:
            k.fetch(key=False)
            return {nid: dict(info) for nid, info in k.nodes.items()}

    def local(self) -> Manager:
        """A Manager for this process's own node's daemon (its Unix socket,
        so the fast path), from a driver, task or actor on any node. A node
        that has no daemon yet (it joined after start()) gets one first."""
        nid = _here()
        k = self._known()
        with k.lock:
            info = k.node(nid[:16])
            if info is None:
                k.fetch(key=False)
                info = k.node(nid[:16])
            if info is None:
                _ray().get(k.keeper().ensure_node.remote(nid), timeout=_START_TIMEOUT + 60)
                k.fetch(key=False)
                info = k.node(nid[:16])
        assert info is not None
        return connect(info["socket"])

    def on(self, node_id: str) -> Manager:
        """A Manager for node_id's daemon; from another node, over TCP+TLS."""
        if not isinstance(node_id, str) or not re.fullmatch(r"[0-9a-f]{16,}", node_id):
            raise ValueError(f"a Ray node id is a hex string (ray.get_runtime_context().get_node_id()), "
                             f"not {node_id!r}")
        ray = _connected_ray()
        k = self._known()
        with k.lock:
            k.fetch(key=False)
            info = k.nodes.get(node_id)
        alive = _node_states(ray)
        if info is None:
            state = ("has left the Ray cluster" if alive.get(node_id) is False else
                     "is not a node of this Ray cluster" if node_id not in alive else
                     "has no syncmgr daemon of this cluster (call cluster.local() on it, or start() again)")
            raise exc.RayClusterError(f"node {node_id} {state}; syncmgr cluster {self.name!r} has daemons on "
                                      f"{sorted(k.nodes)}")
        if not alive.get(node_id, False):
            raise exc.RayClusterError(f"node {node_id} has left the Ray cluster: its syncmgr daemon is gone")
        return connect(info["socket"])

    def shutdown(self) -> None:
        """Stop every node's daemon (no daemon process and no /dev/shm file
        is left on any node) and the keeper. From any job."""
        ray = _connected_ray()
        k = self._known()
        try:
            keeper = k.keeper()
        except exc.RayClusterError:
            return  # already gone
        with contextlib.suppress(Exception):
            ray.get(keeper.shutdown.remote(), timeout=120)
        with contextlib.suppress(Exception):
            ray.kill(keeper)
        # ray.kill returns before the name is free: wait until it is, so that a
        # start() right after makes a new cluster instead of finding this one
        # on its way out.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(_keeper_name(self.name), namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.05)
        _started.pop(self.name, None)
        with _known_lock:
            _known.pop(self.name, None)


def start(nodes: Optional[list[str]] = None, *, name: Optional[str] = None, detached: bool = False,
          daemon_args: tuple[str, ...] = (), **limits: Any) -> Cluster:
    """Start one daemon per node and return the Cluster.

    nodes: Ray node ids (default: every alive node). name: the cluster's
    name (default: one per Ray job, ``job-<job id>``). detached: the daemons
    outlive the driver (Ray's detached actors) until ``shutdown()`` or
    ``syncmgr ray-stop``; a later job reaches them with ``attach(name)``.
    limits: the daemon's limits as keywords (``max_queue=...`` is
    ``--max-queue``; see LIMITS); daemon_args: any other flags of
    ``syncmgr serve``.

    A cluster of that name that runs already is returned as it is (a second
    ``start()`` in a job returns the first one's cluster).
    """
    ray = _connected_ray()
    if name is None:
        name = f"job-{ray.get_runtime_context().get_job_id()}"
    _check_name(name)
    args = _flags(limits) + [str(a) for a in daemon_args]
    alive = [nid for nid, up in _node_states(ray).items() if up]
    if nodes is None:
        want = alive
    else:
        want = list(nodes)
        gone = [n for n in want if n not in alive]
        if gone:
            raise exc.RayClusterError(f"not alive nodes of this Ray cluster: {gone}")
    with contextlib.suppress(ValueError):
        ray.get_actor(_keeper_name(name), namespace=NAMESPACE)
        _log.info("syncmgr cluster %r runs already: returning it", name)
        return Cluster(name)
    opts: dict[str, Any] = {"name": _keeper_name(name), "namespace": NAMESPACE, "num_cpus": 0, "max_restarts": 0,
                            "max_concurrency": 1}
    if detached:
        opts["lifetime"] = "detached"
    keeper = _remote(Keeper).options(**opts).remote(name, detached, args)
    _started[name] = keeper
    try:
        ray.get(keeper.start_nodes.remote(want), timeout=_START_TIMEOUT + 60 + 10 * len(want))
    except BaseException as e:
        _started.pop(name, None)
        with contextlib.suppress(Exception):
            ray.kill(keeper)
        if isinstance(e, exc.RayClusterError):
            raise
        cause = getattr(e, "cause", None)
        if isinstance(cause, exc.RayClusterError):
            raise exc.RayClusterError(str(cause)) from None
        raise
    return Cluster(name)


def attach(name: str) -> Cluster:
    """The running cluster of that name (started detached by another job, or
    with `syncmgr ray-start --name NAME`)."""
    _check_name(name)
    c = Cluster(name)
    c._known().keeper()  # raises a clear error if there is none
    return c



