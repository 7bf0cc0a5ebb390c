"""Shared memory owned by the syncmgr daemon.

The daemon creates each segment as a 0600 file in its shared-memory
directory (``/dev/shm``) and is the only one that ever unlinks it, so no
resource tracker is involved: a process that attaches and exits leaves the
segment alone and prints no warning, and the daemon's graceful stop removes
everything. See docs/shared-memory.md.

Three views are offered on a segment:

* :class:`SharedMemory`, the interface of
  :class:`multiprocessing.shared_memory.SharedMemory`;
* :func:`ndarray`, a numpy array;
* :func:`RawArray` / :func:`RawValue` (and the locked wrappers behind
  ``Manager.Array`` and ``Manager.Value(..., lock=False)``), ctypes objects
  as ``multiprocessing.sharedctypes`` makes them, which is what cpprb's
  default backend asks its ``ctx`` for.

Every one of them pickles as (daemon address, segment name, layout) and maps
the same memory again in the receiving process.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
from typing import TYPE_CHECKING, Any, Callable

from ._transport import Transport
from .exceptions import NoSuchObjectError, SegmentNotFoundError, SyncMgrError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "SharedMemory",
    "SharedMemoryHostError",
    "SharedMemoryFileError",
    "ndarray",
    "RawArray",
    "RawValue",
    "SynchronizedArray",
    "typecode_to_ctype",
]


class SharedMemoryHostError(SyncMgrError):
    """The segment lives on another host than this process: it cannot be mapped."""


class SharedMemoryFileError(SyncMgrError, PermissionError):
    """A segment's file is not the daemon's own private file of the expected size.

    Raised instead of mapping a file someone else could read, change or
    shrink (a shrunk mapping kills the process with SIGBUS on access).
    """


def _check_segment_file(st: os.stat_result, size: int, daemon_uid: Any) -> str:
    """What is wrong with an opened segment file, or ''."""
    owner = int(daemon_uid) if isinstance(daemon_uid, int) else os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != owner:
        return f"belongs to uid {st.st_uid}, not to the daemon's uid {owner}"
    if st.st_mode & 0o077:
        return f"has mode {st.st_mode & 0o7777:04o}: others may read or write it"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} links"
    if st.st_size != size:
        return f"is {st.st_size} bytes, the daemon says {size}"
    return ""


def _no_client(address: str) -> Transport:  # pragma: no cover - replaced by the package
    raise RuntimeError("syncmgr.shared_memory used before the syncmgr package was imported")


# Set by the package: returns the client for a daemon address, connecting
# with the key from this process's environment.
client_for: Callable[[str], Transport] = _no_client


def _local_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class SharedMemory:
    """A daemon-owned shared-memory segment.

    ``SharedMemory(name=None, create=False, size=0)`` as in
    :mod:`multiprocessing.shared_memory`: with ``create=True`` a new segment
    of ``size`` bytes (named ``name``, or a generated name) is made;
    otherwise the segment called ``name`` is attached. ``unlink()`` asks the
    daemon to remove it; ``close()`` only unmaps it here.
    """

    _mmap: mmap.mmap | None
    _buf: memoryview | None

    def __init__(self, name: str | None = None, create: bool = False, size: int = 0, *, client: Transport) -> None:
        self._client = client
        self._mmap = None
        self._buf = None
        if create:
            if not isinstance(size, int) or size <= 0:
                raise ValueError("'size' must be a positive integer")
            args: dict[str, Any] = {"size": size}
            if name is not None:
                args["name"] = name
            info = client.call("shm_create", args)
        else:
            if name is None:
                raise ValueError("'name' can only be None if create=True")
            try:
                info = client.call("shm_attach", {"name": name})
            except NoSuchObjectError:
                raise SegmentNotFoundError(
                    f"no shared memory segment {name!r} at syncmgr {client.address}: create it with "
                    f"SharedMemory(name={name!r}, create=True, size=...) first (a segment lives until it is "
                    "unlinked or the daemon stops gracefully)") from None
        self._name: str = info["name"]
        self._size: int = int(info["size"])
        boot = info.get("boot_id") or ""
        local = _local_boot_id()
        if boot and local and boot != local:
            client.notify("shm_detach", {"name": self._name})
            raise SharedMemoryHostError(
                f"shared memory segment {self._name!r} lives on the host of the syncmgr daemon at "
                f"{client.address}, not on this host: shared memory does not cross hosts (see docs/ray.md)"
            )
        try:
            # Never through a symlink: the file must be the daemon's own.
            fd = os.open(info["path"], os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise SegmentNotFoundError(
                f"shared memory segment {self._name!r} has no file at {info['path']}: it was unlinked meanwhile, "
                "or the daemon's --shm-dir is not this host's") from exc
        except OSError as exc:
            client.notify("shm_detach", {"name": self._name})
            raise SharedMemoryFileError(
                f"shared memory segment {self._name!r}: cannot open {info['path']}: {exc}"
            ) from exc
        try:
            problem = _check_segment_file(os.fstat(fd), self._size, info.get("uid"))
            if problem:
                client.notify("shm_detach", {"name": self._name})
                raise SharedMemoryFileError(f"shared memory segment {self._name!r} refused: {info['path']} {problem}")
            self._mmap = mmap.mmap(fd, self._size)
        finally:
            os.close(fd)
        self._buf = memoryview(self._mmap)

    @property
    def name(self) -> str:
        """The segment's name in the daemon's registry."""
        return self._name

    @property
    def size(self) -> int:
        """The segment's size in bytes."""
        return self._size

    @property
    def buf(self) -> memoryview:
        """A writable memoryview of the whole segment."""
        if self._buf is None:
            raise ValueError("shared memory segment is closed")
        return self._buf

    @property
    def address(self) -> str:
        """The address of the daemon that owns the segment."""
        return self._client.address

    def close(self) -> None:
        """Unmap the segment in this process. The segment itself stays."""
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                # numpy arrays or ctypes objects still use the mapping; it is
                # unmapped when they are gone.
                pass
            self._mmap = None
            try:
                self._client.notify("shm_detach", {"name": self._name})
            except Exception:  # noqa: BLE001 - best-effort bookkeeping
                pass

    def unlink(self) -> None:
        """Ask the daemon to remove the segment. Mappings stay valid until closed."""
        self._client.call("shm_unlink", {"name": self._name})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_attach, (self._client.address, self._name))

    def __enter__(self) -> SharedMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._buf is not None:
                self._buf.release()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r}, size={self._size})"


def _attach(address: str, name: str) -> SharedMemory:
    return SharedMemory(name, client=client_for(address))


# --- numpy -----------------------------------------------------------------


def _np() -> Any:
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - numpy is optional
        raise ImportError("syncmgr's ndarray needs numpy: pip install numpy") from exc
    return numpy


_ndarray_class: type | None = None


def _shared_ndarray_class() -> type:
    """The numpy subclass is made on first use, so numpy stays optional."""
    global _ndarray_class
    if _ndarray_class is None:
        np = _np()

        class SharedNDArray(np.ndarray):  # type: ignore[misc, name-defined]
            """A numpy array in a syncmgr segment; pickles by segment name, zero-copy."""

            _shm: SharedMemory | None

            def __array_finalize__(self, obj: Any) -> None:
                self._shm = getattr(obj, "_shm", None)

            def __reduce__(self) -> tuple[Any, ...]:
                shm = self._shm
                if shm is None or shm._mmap is None:
                    return np.asarray(self).__reduce__()
                base = np.frombuffer(shm.buf, dtype=np.uint8).__array_interface__["data"][0]
                offset = self.__array_interface__["data"][0] - base
                return (_rebuild_ndarray, (shm.address, shm.name, self.shape, self.dtype.str, offset, self.strides))

            @property
            def shm(self) -> SharedMemory | None:
                """The segment behind the array."""
                return self._shm

        _ndarray_class = SharedNDArray
    return _ndarray_class


def ndarray(client: Transport, shape: Any, dtype: Any = float, name: str | None = None) -> np.ndarray:
    """A zero-filled numpy array in a new segment (``Manager.ndarray``)."""
    np = _np()
    dt = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = max(int(np.prod(shape, dtype=np.int64)) * dt.itemsize, 1)
    shm = SharedMemory(name, create=True, size=nbytes, client=client)
    return _view(shm, shape, dt.str, 0, None)


def _view(shm: SharedMemory, shape: Any, dtype: str, offset: int, strides: Any) -> np.ndarray:
    cls = _shared_ndarray_class()
    arr = cls(shape, dtype=dtype, buffer=shm.buf, offset=offset, strides=strides)
    arr._shm = shm
    return arr


def _rebuild_ndarray(address: str, name: str, shape: Any, dtype: str, offset: int, strides: Any) -> np.ndarray:
    return _view(_attach(address, name), shape, dtype, offset, strides)


# --- ctypes (multiprocessing.sharedctypes) -----------------------------------

_TYPECODES: dict[str, Any] = {
    "c": ctypes.c_char, "u": ctypes.c_wchar,
    "b": ctypes.c_byte, "B": ctypes.c_ubyte,
    "h": ctypes.c_short, "H": ctypes.c_ushort,
    "i": ctypes.c_int, "I": ctypes.c_uint,
    "l": ctypes.c_long, "L": ctypes.c_ulong,
    "q": ctypes.c_longlong, "Q": ctypes.c_ulonglong,
    "f": ctypes.c_float, "d": ctypes.c_double, "?": ctypes.c_bool,
}


def typecode_to_ctype(typecode_or_type: Any) -> Any:
    """A ctypes type for a typecode ('i', 'd', ...) or a ctypes type."""
    if isinstance(typecode_or_type, str):
        try:
            return _TYPECODES[typecode_or_type]
        except KeyError:
            raise ValueError(f"unknown typecode {typecode_or_type!r}") from None
    return typecode_or_type


_subclasses: dict[Any, type] = {}


def _picklable(base: Any) -> Any:
    """A subclass of a ctypes type whose instances pickle by segment name."""
    cls = _subclasses.get(base)
    if cls is None:

        def __reduce__(self: Any) -> tuple[Any, ...]:
            shm: SharedMemory = self._shm
            return (_rebuild_ctypes, (shm.address, shm.name, self._layout))

        cls = type(base.__name__, (base,), {"__reduce__": __reduce__, "__module__": __name__})
        _subclasses[base] = cls
    return cls


def _ctype_of(layout: tuple[str, Any, int]) -> Any:
    kind, t, n = layout
    ct = typecode_to_ctype(t)
    return ct * n if kind == "array" else ct


def _map_ctypes(shm: SharedMemory, layout: tuple[str, Any, int]) -> Any:
    obj = _picklable(_ctype_of(layout)).from_buffer(shm.buf)
    obj._shm = shm
    obj._layout = layout
    return obj


def _rebuild_ctypes(address: str, name: str, layout: tuple[str, Any, int]) -> Any:
    return _map_ctypes(_attach(address, name), layout)


def _layout_type(t: Any) -> Any:
    """What goes into a pickle for a ctypes type: its typecode where it has one."""
    for code, ct in _TYPECODES.items():
        if ct is t:
            return code
    return t


def RawArray(client: Transport, typecode_or_type: Any, size_or_initializer: Any, name: str | None = None) -> Any:  # noqa: N802
    """A ctypes array in a new segment, as ``multiprocessing.sharedctypes.RawArray``."""
    ct = typecode_to_ctype(typecode_or_type)
    if isinstance(size_or_initializer, int):
        n, init = size_or_initializer, None
    else:
        init = list(size_or_initializer)
        n = len(init)
    layout = ("array", _layout_type(ct), n)
    shm = SharedMemory(name, create=True, size=max(ctypes.sizeof(ct) * n, 1), client=client)
    arr = _map_ctypes(shm, layout)
    if init is not None:
        arr[:] = init
    return arr


def RawValue(client: Transport, typecode_or_type: Any, *args: Any, name: str | None = None) -> Any:  # noqa: N802
    """A ctypes value in a new segment, as ``multiprocessing.sharedctypes.RawValue``."""
    ct = typecode_to_ctype(typecode_or_type)
    layout = ("value", _layout_type(ct), 1)
    shm = SharedMemory(name, create=True, size=ctypes.sizeof(ct), client=client)
    obj = _map_ctypes(shm, layout)
    if args:
        obj.value = args[0]
    return obj


class SynchronizedArray:
    """A shared ctypes array with a syncmgr lock, as ``multiprocessing.Array(lock=True)``."""

    def __init__(self, obj: Any, lock: Any) -> None:
        self._obj = obj
        self._lock = lock
        self.acquire = lock.acquire
        self.release = lock.release

    def get_obj(self) -> Any:
        return self._obj

    def get_lock(self) -> Any:
        return self._lock

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._lock.__exit__(*exc)

    def __len__(self) -> int:
        return len(self._obj)

    def __getitem__(self, i: Any) -> Any:
        with self._lock:
            return self._obj[i]

    def __setitem__(self, i: Any, value: Any) -> None:
        with self._lock:
            self._obj[i] = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (SynchronizedArray, (self._obj, self._lock))

    def __repr__(self) -> str:
        return f"<SynchronizedArray wrapper for {self._obj!r}>"
