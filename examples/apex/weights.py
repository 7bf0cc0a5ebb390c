"""The weights broadcast: one shared-memory segment and a version counter.

The learner (the only writer) publishes a set of weights and a small header
(updates, env steps) into one segment; readers (explorers, the evaluator)
copy it out. A push costs the same for 2 or 64 readers, and a reader whose
version is current learns so from one read of the counter (on syncmgr's fast
path, a load from shared memory, with no daemon round trip).

The counter is a seqlock: the writer makes it odd before writing and even
(two more than before) after; a reader reads it, copies the segment, reads it
again, and keeps the copy only if both reads gave the same even number. A
reader therefore never returns a set of weights torn between two
publications.

The segment and the counter are any objects with ``.buf`` (a writable
buffer) and ``.value`` (an integer): a syncmgr manager's ``SharedMemory`` and
``Value("q")``, or their ``multiprocessing`` counterparts.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

HEADER = 2  # int64 words before the arrays: updates, env steps


def layout(shapes: list[tuple[int, ...]]) -> tuple[list[tuple[int, tuple[int, ...]]], int]:
    """[(byte offset, shape)] of each float32 array after the header, and the total size."""
    off, out = HEADER * 8, []
    for shape in shapes:
        out.append((off, tuple(shape)))
        off += 4 * int(np.prod(shape))
    return out, off


class WeightsBroadcast:
    """Publish (one writer) and read (any number of readers) a list of float32 arrays."""

    def __init__(self, segment: Any, version: Any, shapes: list[tuple[int, ...]]) -> None:
        self.segment, self.version = segment, version
        self.shapes = [tuple(s) for s in shapes]
        self.offsets, self.nbytes = layout(self.shapes)
        self._view: Optional[np.ndarray] = None
        self.retries = 0  # reads that met a publication and started again

    @staticmethod
    def size_for(shapes: list[tuple[int, ...]]) -> int:
        return layout(shapes)[1]

    def __getstate__(self) -> dict:
        return {"segment": self.segment, "version": self.version, "shapes": self.shapes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["segment"], state["version"], state["shapes"])  # type: ignore[misc]

    def _bytes(self) -> np.ndarray:
        if self._view is None:
            buf = self.segment.buf
            if len(buf) < self.nbytes:
                raise ValueError(f"the weights segment has {len(buf)} bytes, the layout needs {self.nbytes}")
            self._view = np.frombuffer(buf, np.uint8, count=self.nbytes)
        return self._view

    def publish(self, params: list[np.ndarray], updates: int, env_steps: int) -> int:
        """Write a new set (the caller is the only writer); returns its version."""
        if [tuple(p.shape) for p in params] != self.shapes:
            raise ValueError(f"arrays of shapes {[p.shape for p in params]} where the layout has {self.shapes}")
        view = self._bytes()
        v = int(self.version.value)
        if v & 1:
            raise RuntimeError("the weights version is odd: another writer, or one that died mid-publication")
        self.version.value = v + 1
        view[:HEADER * 8].view(np.int64)[:] = (updates, env_steps)
        for (off, shape), p in zip(self.offsets, params):
            n = 4 * int(np.prod(shape))
            view[off:off + n].view(np.float32)[:] = p.ravel()
        self.version.value = v + 2
        return v + 2

    def current(self) -> int:
        """The version now published (even), or odd while a publication is under way."""
        return int(self.version.value)

    def read(self, last: int = -1, timeout: float = 5.0) -> Optional[tuple[int, list[np.ndarray], dict]]:
        """(version, arrays, header) of the newest set, or None if it is still version ``last``
        (or nothing was ever published). Raises TimeoutError if every try for ``timeout`` s met a
        publication (a writer that died mid-publication)."""
        view = self._bytes()
        deadline = time.monotonic() + timeout
        spins = 0
        while True:
            v1 = int(self.version.value)
            if v1 == last or v1 == 0:
                return None
            if not v1 & 1:
                data = view.copy()
                if int(self.version.value) == v1:
                    break
            self.retries += 1
            spins += 1
            if time.monotonic() > deadline:
                raise TimeoutError("the weights segment stayed mid-publication")
            if spins > 100:
                time.sleep(0.0005)
        updates, env_steps = (int(x) for x in data[:HEADER * 8].view(np.int64))
        arrays = [data[off:off + 4 * int(np.prod(shape))].view(np.float32).reshape(shape)
                  for off, shape in self.offsets]
        return v1, arrays, {"updates": updates, "env_steps": env_steps}
