"""The shared-memory registry: daemon-owned segments, attached by name from any process."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import syncmgr
from conftest import start_daemon, start_daemon_proc


def ours() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("syncmgr-")}


def test_create_attach_read_write(m):
    a = m.SharedMemory(create=True, size=64)
    a.buf[:5] = b"hello"
    b = m.SharedMemory(a.name)
    assert bytes(b.buf[:5]) == b"hello" and b.size == 64
    b.buf[0:1] = b"J"
    assert bytes(a.buf[:5]) == b"Jello"
    st = os.stat(os.path.join("/dev/shm", next(f for f in ours() if f.endswith(a.name))))
    assert st.st_mode & 0o777 == 0o600
    b.close()
    a.close()
    a.unlink()
    with pytest.raises(FileNotFoundError):
        m.SharedMemory(a.name)


def test_errors(m):
    with pytest.raises(ValueError):
        m.SharedMemory(create=True, size=0)
    with pytest.raises(ValueError):
        m.SharedMemory(name="../etc", create=True, size=10)
    with pytest.raises(ValueError):
        m.SharedMemory(name="a/b", create=True, size=10)
    seg = m.SharedMemory(name="dup-seg", create=True, size=10)
    with pytest.raises(FileExistsError):
        m.SharedMemory(name="dup-seg", create=True, size=10)
    with pytest.raises(FileNotFoundError):
        m.SharedMemory(name="never-made")
    seg.unlink()


def test_shm_limit():
    d = start_daemon("--shm-limit", "1M")
    try:
        m = syncmgr.connect(d.address, d.key)
        a = m.SharedMemory(create=True, size=512 << 10)
        with pytest.raises(syncmgr.LimitError):
            m.SharedMemory(create=True, size=768 << 10)
        a.unlink()
        m.SharedMemory(create=True, size=768 << 10)  # room again
    finally:
        d.stop()


def _child_write(seg, arr):
    seg.buf[0] = 42
    arr[1] = 7.5


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_across_processes(m, method):
    seg = m.SharedMemory(create=True, size=16)
    arr = m.ndarray((4,), np.float64)
    p = mp.get_context(method).Process(target=_child_write, args=(seg, arr))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert seg.buf[0] == 42 and arr[1] == 7.5


def test_attaching_process_exit_destroys_nothing_and_warns_nothing(m, daemon):
    seg = m.SharedMemory(create=True, size=32)
    seg.buf[:3] = b"abc"
    code = """
        import pickle, sys
        seg = pickle.loads(sys.stdin.buffer.read())
        assert bytes(seg.buf[:3]) == b"abc"
        seg.buf[:3] = b"xyz"
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], input=pickle.dumps(seg),
                         capture_output=True, env=daemon.env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr == b""  # no resource_tracker "leaked shared_memory" warning
    assert bytes(seg.buf[:3]) == b"xyz"
    again = m.SharedMemory(seg.name)  # still attachable by name
    assert bytes(again.buf[:3]) == b"xyz"


def test_ndarray_views_pickle_zero_copy(m):
    a = m.ndarray((4, 3), np.int32)
    a[:] = np.arange(12).reshape(4, 3)
    row = pickle.loads(pickle.dumps(a[2]))
    assert list(row) == [6, 7, 8]
    row[0] = 100  # the same memory
    assert a[2, 0] == 100
    col = pickle.loads(pickle.dumps(a[:, 1]))
    assert list(col) == [1, 4, 100 if False else 7, 10]


def test_ctypes_array_and_raw_value(m):
    arr = m.Array("d", [1.0, 2.0, 3.0])
    assert arr[:] == [1.0, 2.0, 3.0]
    with arr.get_lock():
        arr[0] = 5.0
    raw = m.Array(ctypes.c_int, 4, lock=False)
    view = np.ctypeslib.as_array(raw)
    view[:] = [1, 2, 3, 4]
    raw2 = pickle.loads(pickle.dumps(raw))
    assert list(raw2) == [1, 2, 3, 4]
    val = m.Value(ctypes.c_size_t, 3, lock=False)
    val2 = pickle.loads(pickle.dumps(val))
    val2.value += 1
    assert val.value == 4
    arr2 = pickle.loads(pickle.dumps(arr))
    assert arr2[0] == 5.0 and arr2.get_lock().acquire(timeout=1)
    arr2.get_lock().release()


def test_graceful_shutdown_removes_every_segment():
    before = ours()
    with syncmgr.Manager() as m:
        m.SharedMemory(create=True, size=4096)
        m.ndarray((100,), np.uint8)
        names = ours() - before
        assert len(names) == 2
    assert not (ours() & names)


def test_daemon_sigkill_then_restart_adopts_segments():
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        seg = m.SharedMemory(name="survives", create=True, size=128)
        seg.buf[:4] = b"data"
        d.kill()
        assert any(f.endswith("-survives") for f in ours())
        start_daemon_proc(d)
        again = m.SharedMemory("survives")  # adopted by the restarted daemon
        assert bytes(again.buf[:4]) == b"data"
        listed = m._c().call("shm_list", {})["segments"]
        assert [s["adopted"] for s in listed if s["name"] == "survives"] == [True]
    finally:
        d.stop()
    assert not any(f.endswith("-survives") for f in ours())  # and unlinked at its graceful stop


def test_other_host_is_refused(m, monkeypatch):
    from syncmgr import shared_memory

    seg = m.SharedMemory(create=True, size=8)
    monkeypatch.setattr(shared_memory, "_local_boot_id", lambda: "another-host")
    with pytest.raises(syncmgr.SharedMemoryHostError):
        m.SharedMemory(seg.name)
