"""Issue 12 hardening seen from the Python client: segment files are checked before mapping."""

from __future__ import annotations

import os

import pytest

from syncmgr.shared_memory import SharedMemoryFileError


def _swap(path: str, make) -> None:
    """Replace path with what make(tmp) creates, through a rename (a new inode)."""
    tmp = path + ".swap"
    make(tmp)
    os.rename(tmp, path)


def test_attach_refuses_a_symlinked_segment(m, tmp_path):
    seg = m.SharedMemory(create=True, size=4096)
    path = m._c().call("shm_attach", {"name": seg.name})["path"]
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * 4096)
    _swap(path, lambda tmp: os.symlink(target, tmp))
    with pytest.raises(SharedMemoryFileError):
        m.SharedMemory(seg.name)
    with pytest.raises(PermissionError):  # it is a PermissionError too
        m.SharedMemory(seg.name)
    seg.close()


@pytest.mark.parametrize("problem", ["shrunk", "readable by others", "hard link"])
def test_attach_refuses_a_changed_segment_file(m, problem):
    seg = m.SharedMemory(create=True, size=8192)
    path = m._c().call("shm_attach", {"name": seg.name})["path"]
    if problem == "shrunk":  # mapping it would SIGBUS the reader past the end
        os.truncate(path, 100)
    elif problem == "readable by others":
        os.chmod(path, 0o644)
    else:
        os.link(path, path + ".extra")
    try:
        with pytest.raises(SharedMemoryFileError):
            m.SharedMemory(seg.name)
    finally:
        if os.path.exists(path + ".extra"):
            os.unlink(path + ".extra")
    seg.close()
