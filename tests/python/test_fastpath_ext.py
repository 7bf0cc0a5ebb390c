"""The C extension syncmgr._fastpath on a segment made here, without a daemon.

The segment's layout is the daemon's (statemem/layout.go); these tests write
its header themselves so that the word operations can be checked alone:
mutual exclusion across processes, futex waits with timeouts, Ctrl-C during
a wait, RLock ownership, Semaphore units and ledger, Event generations and
Value arithmetic.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import struct
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

fp = pytest.importorskip("syncmgr._fastpath")

MAGIC = 0x5752474D434E5953
VERSION = 2  # statemem.Version
SLOTS = 16
SIZE = SLOTS * 64
RING_MAGIC = 0x5152474D434E5953  # "SYNCMGRQ"
RING_HEADER = 128 + 16 * 1024 + 4 * 1024  # statemem.RingHeader
BIT_WAITERS = 1 << 29
BIT_DAEMON = 1 << 30
LOCK, RLOCK, EVENT, VALUE, SEM = 64, 128, 192, 256, 320  # object offsets used below
LEDGER, LEDGER_LEN = 512, 128  # SEM's ledger: slots 8-15, one u32 per session slot
LATCH_SHIFT = 32
CTX = mp.get_context("fork")


def make_segment() -> int:
    """A segment as the daemon makes it: a memfd, mode 0600, sealed against
    resizing. Its path for these tests is /proc/self/fd/N (a forked child
    inherits N), which reopens the same memory."""
    fd = os.memfd_create("test-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.fchmod(fd, 0o600)
    os.pwrite(fd, struct.pack("<QIII", MAGIC, VERSION, 64, SLOTS).ljust(SIZE, b"\0"), 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    os.pwrite(fd, struct.pack("<II", LEDGER, LEDGER_LEN), SEM + 40)
    return fd


def poke(path: str, off: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, off)
    finally:
        os.close(fd)


def set_sem(path: str, word: int) -> None:
    poke(path, SEM, struct.pack("<Q", word))


def open_segment(path: str) -> fp.Segment:
    fd = os.open(path, os.O_RDWR)
    try:
        return fp.Segment(fd, SIZE)
    finally:
        os.close(fd)


@pytest.fixture
def seg_path() -> Iterator[str]:
    fd = make_segment()
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


@pytest.fixture
def seg(seg_path: str) -> fp.Segment:
    return open_segment(seg_path)


def test_refuses_unsealed_files() -> None:
    # A file anyone of the user can truncate under the mapping (SIGBUS) is
    # refused, however right its owner, mode, size and header.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "seg")
        with open(path, "wb") as f:
            f.write(struct.pack("<QIII", MAGIC, VERSION, 64, SLOTS).ljust(SIZE, b"\0"))
        os.chmod(path, 0o600)
        with pytest.raises(PermissionError, match="sealed"):
            open_segment(path)
    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, 0o600)
        os.pwrite(fd, struct.pack("<QIII", MAGIC, VERSION, 64, SLOTS).ljust(SIZE, b"\0"), 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)  # shrink only: it could still grow
        with pytest.raises(PermissionError, match="sealed"):
            fp.Segment(fd, SIZE)
    finally:
        os.close(fd)


def test_refuses_bad_files(seg_path: str) -> None:
    os.chmod(seg_path, 0o644)
    with pytest.raises(PermissionError):
        open_segment(seg_path)
    os.chmod(seg_path, 0o600)
    fd = os.open(seg_path, os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            fp.Segment(fd, SIZE + 64)  # size differs from the file's
        with pytest.raises(ValueError):
            fp.Segment(fd, 100)
        os.pwrite(fd, b"\0" * 8, 0)
        with pytest.raises(ValueError, match="header"):
            fp.Segment(fd, SIZE)
    finally:
        os.close(fd)


def test_bad_arguments(seg: fp.Segment) -> None:
    for off in (0, 65, SIZE, -64):
        with pytest.raises((ValueError, OverflowError)):
            seg.lock_acquire(off, 1, 1, 0)
    with pytest.raises(ValueError):
        seg.lock_acquire(LOCK, 0, 1, 0)  # slot 0 is nobody
    with pytest.raises(ValueError):
        seg.lock_acquire(LOCK, 1 << 29, 1, 0)
    with pytest.raises(ValueError):
        seg.lock_acquire(LOCK, 1, 1, float("nan"))
    with pytest.raises(TypeError):
        seg.lock_acquire(LOCK, 1, 1)
    with pytest.raises(ValueError):
        seg.value_get(VALUE, ord("x"))
    assert seg.state(LOCK) == 0, "a refused call changed the word"


def test_lock(seg: fp.Segment) -> None:
    assert seg.lock_release(LOCK) == fp.NOT_OWNER
    assert seg.lock_acquire(LOCK, 3, 42, 0) == fp.OK
    assert seg.state(LOCK) == 3
    assert seg.lock_acquire(LOCK, 4, 1, 0) == fp.BUSY
    t0 = time.monotonic()
    assert seg.lock_acquire(LOCK, 4, 1, 0.05) == fp.BUSY
    assert time.monotonic() - t0 >= 0.05
    assert seg.state(LOCK) == 3 | BIT_WAITERS
    assert seg.lock_release(LOCK) == fp.OK
    assert seg.state(LOCK) == 0


def test_daemon_bit_changes_nothing(seg: fp.Segment, seg_path: str) -> None:
    assert seg.lock_acquire(LOCK, 3, 42, 0) == fp.OK
    fd = os.open(seg_path, os.O_RDWR)
    os.pwrite(fd, struct.pack("<Q", 3 | BIT_DAEMON), LOCK)
    os.pwrite(fd, struct.pack("<Q", BIT_DAEMON), EVENT)
    os.close(fd)
    assert seg.lock_release(LOCK) == fp.DAEMON
    assert seg.lock_acquire(LOCK, 4, 1, -1) == fp.DAEMON
    assert seg.state(LOCK) == 3 | BIT_DAEMON
    assert seg.event_set(EVENT) == fp.DAEMON
    assert not seg.event_is_set(EVENT)


def _count(path: str, slot: int, n: int) -> None:
    s = open_segment(path)
    mem = os.open(path, os.O_RDWR)
    for _ in range(n):
        assert s.lock_acquire(LOCK, slot, os.getpid(), -1) == fp.OK
        # a plain read-modify-write of a reserved field, under the lock
        (v,) = struct.unpack("<Q", os.pread(mem, 8, LOCK + 40))
        os.pwrite(mem, struct.pack("<Q", v + 1), LOCK + 40)
        assert s.lock_release(LOCK) == fp.OK
    os.close(mem)


def test_lock_mutual_exclusion_across_processes(seg_path: str) -> None:
    procs = [CTX.Process(target=_count, args=(seg_path, i + 1, 2000)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with open(seg_path, "rb") as f:
        f.seek(LOCK + 40)
        assert struct.unpack("<Q", f.read(8))[0] == 6000


def _take_and_report(path: str, q: mp.Queue, timeout: float) -> None:
    s = open_segment(path)
    q.put("waiting")
    t0 = time.monotonic()
    r = s.lock_acquire(LOCK, 7, 1, timeout)
    q.put((r, time.monotonic() - t0))


def test_release_wakes_a_sleeper(seg: fp.Segment, seg_path: str) -> None:
    assert seg.lock_acquire(LOCK, 3, 1, 0) == fp.OK
    q: mp.Queue = CTX.Queue()
    p = CTX.Process(target=_take_and_report, args=(seg_path, q, 30.0))
    p.start()
    assert q.get(timeout=10) == "waiting"
    deadline = time.monotonic() + 10
    while not seg.state(LOCK) & BIT_WAITERS:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert seg.lock_release(LOCK) == fp.OK
    r, waited = q.get(timeout=10)
    assert r == fp.OK and waited < 10
    p.join(10)
    assert seg.state(LOCK) & 0x1FFFFFFF == 7


def _sleep_forever(path: str, q: mp.Queue) -> None:
    s = open_segment(path)
    q.put("waiting")
    try:
        s.lock_acquire(LOCK, 8, 1, -1)
        q.put("acquired")
    except KeyboardInterrupt:
        q.put(("interrupted", s.state(LOCK) & 0x1FFFFFFF))


def test_ctrl_c_during_a_wait_takes_nothing(seg: fp.Segment, seg_path: str) -> None:
    assert seg.lock_acquire(LOCK, 3, 1, 0) == fp.OK
    q: mp.Queue = CTX.Queue()
    p = CTX.Process(target=_sleep_forever, args=(seg_path, q))
    p.start()
    assert q.get(timeout=10) == "waiting"
    deadline = time.monotonic() + 10
    while not seg.state(LOCK) & BIT_WAITERS:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(0.05)
    os.kill(p.pid, signal.SIGINT)
    assert q.get(timeout=10) == ("interrupted", 3)
    p.join(10)
    assert seg.state(LOCK) & 0x1FFFFFFF == 3, "the interrupted waiter must not hold the lock"


def test_release_with_an_awake_heir_still_wakes_a_sleeper(seg: fp.Segment, seg_path: str) -> None:
    # The release clears the sleepers bit; when the heir it aims its wake-up
    # at is not asleep (between two looks), it wakes one sleeper instead of
    # nobody, or that sleeper would sleep for good.
    assert seg.lock_acquire(LOCK, 3, 1, 0) == fp.OK
    q: mp.Queue = CTX.Queue()
    p = CTX.Process(target=_sleep_forever, args=(seg_path, q))  # slot 8, no timeout
    p.start()
    try:
        assert q.get(timeout=10) == "waiting"
        deadline = time.monotonic() + 10
        while not seg.state(LOCK) & BIT_WAITERS:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(0.05)  # asleep on the futex by now
        poke(seg_path, LOCK + 48, struct.pack("<I", 5))  # slot 5 is the heir, and awake
        assert seg.lock_release(LOCK) == fp.OK
        time.sleep(0.05)
        poke(seg_path, LOCK + 48, struct.pack("<I", 0))  # the heir left without its turn
        assert q.get(timeout=10) == "acquired"
        p.join(10)
        assert seg.state(LOCK) & 0x1FFFFFFF == 8
    finally:
        if p.is_alive():
            p.kill()


def test_rlock(seg: fp.Segment) -> None:
    for _ in range(3):
        assert seg.rlock_acquire(RLOCK, 2, 10, 0) == fp.OK
    assert seg.state(RLOCK) == 2 | 3 << 32
    assert seg.rlock_acquire(RLOCK, 2, 11, 0) == fp.BUSY  # another thread
    assert seg.rlock_acquire(RLOCK, 5, 10, 0) == fp.BUSY  # another session
    assert seg.rlock_release(RLOCK, 2, 11) == fp.NOT_OWNER
    assert seg.rlock_release(RLOCK, 5, 10) == fp.NOT_OWNER
    for _ in range(3):
        assert seg.rlock_release(RLOCK, 2, 10) == fp.OK
    assert seg.state(RLOCK) == 0
    assert seg.rlock_release(RLOCK, 2, 10) == fp.NOT_OWNER
    # Thread ids are Python ints of either sign.
    assert seg.rlock_acquire(RLOCK, 2, -5, 0) == fp.OK
    assert seg.rlock_acquire(RLOCK, 2, (1 << 64) - 5, 0) == fp.OK
    assert seg.rlock_release(RLOCK, 2, -5) == fp.OK
    assert seg.rlock_release(RLOCK, 2, -5) == fp.OK


def _event_waiter(path: str, q: mp.Queue) -> None:
    s = open_segment(path)
    q.put("waiting")
    q.put(s.event_wait(EVENT, 30.0))


def test_event(seg: fp.Segment, seg_path: str) -> None:
    assert not seg.event_is_set(EVENT)
    assert seg.event_wait(EVENT, 0) is False
    t0 = time.monotonic()
    assert seg.event_wait(EVENT, 0.05) is False
    assert time.monotonic() - t0 >= 0.05
    q: mp.Queue = CTX.Queue()
    p = CTX.Process(target=_event_waiter, args=(seg_path, q))
    p.start()
    assert q.get(timeout=10) == "waiting"
    time.sleep(0.1)
    # A set followed at once by a clear still releases the waiter.
    assert seg.event_set(EVENT) == fp.OK
    seg.event_clear(EVENT)
    assert q.get(timeout=10) is True
    p.join(10)
    assert seg.event_set(EVENT) == fp.OK
    assert seg.event_is_set(EVENT) and seg.event_wait(EVENT, -1)


def cls(c: str, width: int = 0) -> int:
    return ord(c) | width << 8


def test_value(seg: fp.Segment) -> None:
    i8, u16, q, d, f, b = cls("i", 8), cls("u", 16), cls("i", 64), cls("d"), cls("f"), cls("?")
    seg.value_set(VALUE, i8, 127)
    assert seg.value_add(VALUE, i8, 1) == -128
    with pytest.raises(OverflowError):
        seg.value_set(VALUE, i8, 128)
    assert seg.value_get(VALUE, i8) == -128, "a refused set changed the value"
    seg.value_set(VALUE, u16, 0)
    assert seg.value_add(VALUE, u16, -1) == 65535
    seg.value_set(VALUE, q, -(1 << 63))
    assert seg.value_get(VALUE, q) == -(1 << 63)
    assert seg.value_cas(VALUE, q, -(1 << 63), 5) is True
    assert seg.value_cas(VALUE, q, 4, 6) is False
    assert seg.value_cas(VALUE, q, 1 << 70, 6) is False
    assert seg.value_get(VALUE, q) == 5
    seg.value_set(VALUE, d, 0.1)
    assert seg.value_add(VALUE, d, 0.2) == 0.1 + 0.2
    seg.value_set(VALUE, f, 0.1)
    assert seg.value_get(VALUE, f) == struct.unpack("f", struct.pack("f", 0.1))[0]
    assert seg.value_cas(VALUE, f, struct.unpack("f", struct.pack("f", 0.1))[0], 2.5) is True
    assert seg.value_get(VALUE, f) == 2.5
    seg.value_set(VALUE, b, 7)
    assert seg.value_get(VALUE, b) is True
    with pytest.raises(TypeError):
        seg.value_add(VALUE, b, 1)


def test_semaphore(seg: fp.Segment, seg_path: str) -> None:
    set_sem(seg_path, 2)
    assert seg.sem_taken(SEM, 3) == 0
    assert seg.sem_taken(SEM, LEDGER_LEN) is None  # past the ledger
    assert seg.sem_acquire(SEM, LEDGER_LEN, 0, 0) == fp.DAEMON
    assert seg.sem_release(SEM, 3) == fp.DAEMON  # no units of its own: the daemon decides
    assert seg.sem_acquire(SEM, 3, 0, 0) == fp.OK
    assert seg.sem_acquire(SEM, 4, 0, 0) == fp.OK
    assert seg.state(SEM) == 0 and seg.sem_taken(SEM, 3) == 1 and seg.sem_taken(SEM, 4) == 1
    t0 = time.monotonic()
    assert seg.sem_acquire(SEM, 3, 0, 0.05) == fp.BUSY
    assert time.monotonic() - t0 >= 0.05
    assert seg.sem_release(SEM, 4) == fp.OK
    assert seg.state(SEM) == 1 and seg.sem_taken(SEM, 4) == 0  # the failed wait's sleepers bit is gone
    assert seg.sem_release(SEM, 4) == fp.DAEMON
    set_sem(seg_path, 1 | BIT_DAEMON)
    assert seg.sem_acquire(SEM, 3, 0, -1) == fp.DAEMON
    assert seg.sem_release(SEM, 3) == fp.DAEMON
    assert seg.sem_taken(SEM, 3) == 1


def test_semaphore_latch_is_waited_out(seg: fp.Segment, seg_path: str) -> None:
    # Another session's op is in flight (its latch set). An acquire waits for
    # the latch as long as it would wait for a unit: a non-blocking one 2 ms,
    # a timed one its timeout, then the daemon answers (with the time left);
    # a blocking one until the latch is let go (a dead holder's by the
    # daemon at its session's end, a stray one by its sweeper), never by
    # sending the op to the daemon, where it would queue and send everyone
    # to the socket.
    for timeout in (0, 0.3):
        set_sem(seg_path, 1 | 9 << LATCH_SHIFT)
        t0 = time.monotonic()
        assert seg.sem_acquire(SEM, 3, 0, timeout) == fp.DAEMON
        assert time.monotonic() - t0 < timeout + 0.25, "waited for a held latch past the op's timeout"
        assert seg.sem_taken(SEM, 3) == 0
        set_sem(seg_path, 1 | 9 << LATCH_SHIFT)
        assert seg.sem_release(SEM, 3) == fp.DAEMON  # no units of its own: the daemon's anyway
    set_sem(seg_path, 1 | 9 << LATCH_SHIFT)
    freer = threading.Timer(0.3, set_sem, (seg_path, 1))  # the holder's op ends: latch free, unit there
    freer.start()
    t0 = time.monotonic()
    assert seg.sem_acquire(SEM, 3, 0, -1) == fp.OK  # waited in shared memory, not sent to the daemon
    assert time.monotonic() - t0 >= 0.25
    freer.join()
    assert seg.sem_taken(SEM, 3) == 1
    seg.sem_release(SEM, 3)
    set_sem(seg_path, 1)
    assert seg.sem_acquire(SEM, 3, 0, 0) == fp.OK
    assert seg.state(SEM) == 0 and seg.sem_taken(SEM, 3) == 1
    set_sem(seg_path, 9 << LATCH_SHIFT)
    t0 = time.monotonic()
    assert seg.sem_release(SEM, 3) == fp.DAEMON  # a release, too, stops waiting after the grace
    assert time.monotonic() - t0 < 0.25 and seg.sem_taken(SEM, 3) == 1


def _sem_count(path: str, slot: int, n: int) -> None:
    s = open_segment(path)
    mem = os.open(path, os.O_RDWR)
    for _ in range(n):
        assert s.sem_acquire(SEM, slot, 0, -1) == fp.OK
        (v,) = struct.unpack("<Q", os.pread(mem, 8, LOCK + 48))
        os.pwrite(mem, struct.pack("<Q", v + 1), LOCK + 48)
        assert s.sem_release(SEM, slot) == fp.OK
    os.close(mem)


def test_semaphore_of_one_excludes_across_processes(seg_path: str) -> None:
    set_sem(seg_path, 1)
    procs = [CTX.Process(target=_sem_count, args=(seg_path, i + 1, 2000)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seg = open_segment(seg_path)
    with open(seg_path, "rb") as f:
        f.seek(LOCK + 48)
        assert struct.unpack("<Q", f.read(8))[0] == 6000
    assert seg.state(SEM) == 1
    assert [seg.sem_taken(SEM, i + 1) for i in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("seals,mode", [(fcntl.F_SEAL_SHRINK, 0o600), (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, 0o644)])
def test_ring_refuses_unsealed_or_open_files(seals: int, mode: int) -> None:
    # A Queue ring is checked as the state segment is: a descriptor that could
    # be resized under the mapping, or that others could open, is refused,
    # however right its size and header.
    cap = 4096
    size = RING_HEADER + cap
    fd = os.memfd_create("ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, mode)
        os.pwrite(fd, struct.pack("<QIIQ", RING_MAGIC, 2, RING_HEADER, cap).ljust(size, b"\0"), 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        with pytest.raises(PermissionError, match="ring"):
            fp.Ring(fd, size, cap, 1024, 1, 0)
    finally:
        os.close(fd)
