"""Starting a private syncmgr daemon: the one place that does it.

``Manager()`` with no address, the test suite and the benchmark all start
their daemons through :class:`PrivateDaemon`:

* a fresh 0700 directory under the temporary directory (``$TMPDIR``, as the
  daemon's own default does; ``/tmp`` when that path would be too long for a
  Unix socket) holds the socket, the key file and the log;
* the key is random (or given) and reaches the daemon through its
  environment, never its command line (which other users can read);
* the key is also written, mode 0600, to ``syncmgr.key`` beside the socket,
  so that a process that was not given the key in its environment (a child
  of a forkserver started before the manager, a child of a second manager)
  finds the key of the daemon its proxy names (``_keys.key_for``);
  the file adds no exposure the socket does not already have: both are in
  the same 0700 directory;
* the daemon's log lines go to ``daemon.log`` in that directory and, from
  warnings up, to ``logging.getLogger("syncmgr.daemon")``, so an embedded
  daemon's warnings reach the user rather than a file deleted at exit.

Usage::

    d = PrivateDaemon(args=("--max-frame", "65536")).start()
    ... d.address, d.key, d.env() ...
    d.stop()
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from typing import IO, Optional

from . import exceptions as exc

__all__ = ["KEY_FILE", "PrivateDaemon", "find_binary", "private_dir", "sweep_dead_dirs", "write_key_file"]

KEY_FILE = "syncmgr.key"
SOCKET_FILE = "syncmgr.sock"
LOG_FILE = "daemon.log"
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 108 bytes; keep a margin

log = logging.getLogger("syncmgr.daemon")


def find_binary() -> str:
    """The syncmgr daemon binary: $SYNCMGR_BIN, the one shipped in the wheel
    (syncmgr/_bin/syncmgr), the repository's build (bin/syncmgr), or one on PATH."""
    env = os.environ.get("SYNCMGR_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise exc.SyncMgrError(f"SYNCMGR_BIN={env} is not an executable file")
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "_bin", "syncmgr"),
                 os.path.join(os.path.dirname(os.path.dirname(here)), "bin", "syncmgr")):
        if os.access(cand, os.X_OK):
            return cand
    found = shutil.which("syncmgr")
    if found and _is_elf(found):  # not the wheel's `syncmgr` wrapper script, which runs this
        return found
    raise exc.SyncMgrError(
        "cannot find the syncmgr daemon binary: install the syncmgr wheel for this platform, "
        "build it with `make build` in the syncmgr repository, put it on PATH, or point SYNCMGR_BIN at it"
    )


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


OWNER_FILE = "owner"  # "<pid> <start time>" of the process that made a private directory
LOCK_FILE = SOCKET_FILE + ".lock"  # held by the daemon for as long as it listens


def private_dir(prefix: str = "syncmgr-") -> str:
    """A fresh 0700 directory under the temporary directory, recorded as
    this process's (its owner file). Dead runs' directories are swept first
    (sweep_dead_dirs)."""
    base = tempfile.gettempdir()
    if len(os.path.join(base, "syncmgr-xxxxxxxx", SOCKET_FILE)) > _SUN_PATH_MAX:
        base = "/tmp"
    sweep_dead_dirs(base)
    d = tempfile.mkdtemp(prefix=prefix, dir=base)  # mode 0700
    fd = os.open(os.path.join(d, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return d


def _start_time(pid: int) -> Optional[int]:
    """pid's start time (clock ticks after boot, /proc/<pid>/stat field 22),
    or None when no such process runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(rest) < 20 or rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19])


def sweep_dead_dirs(base: str) -> list[str]:
    """Remove the private directories of dead runs under base, and return
    them: only directories named syncmgr-*, of this uid, mode 0700, with an
    owner file of this uid naming a process that no longer runs (its pid is
    gone, a zombie, or now another process: the start time differs), and
    whose socket lock no daemon holds. A directory without an owner file is
    never touched."""
    import fcntl

    swept: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return swept
    for name in names:
        if not name.startswith("syncmgr-"):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                continue
            fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            ost = os.fstat(fd)
            words = os.read(fd, 100).split() if stat.S_ISREG(ost.st_mode) and ost.st_uid == os.getuid() else []
        finally:
            os.close(fd)
        try:
            pid, start = int(words[0]), int(words[1])
        except (IndexError, ValueError):
            continue
        if _start_time(pid) == start:
            continue  # its owner runs
        try:
            lfd = os.open(os.path.join(path, LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            lfd = -1
        except OSError:
            continue
        if lfd >= 0:
            try:
                fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a daemon still listens there (it exits with its parent): next time
            finally:
                os.close(lfd)
        shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
    return swept


def write_key_file(directory: str, key: bytes, name: str = KEY_FILE) -> str:
    """Write key (hex) to directory/name (syncmgr.key), mode 0600, never
    through a symlink, and return its path."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex())
    return path


# The parent PrivateDaemon(shield=True) puts between itself and the daemon:
# a sh that starts the daemon with itself as --exit-with-parent, and stops it
# (SIGTERM: a graceful stop) when its own parent goes or it is asked to stop,
# then removes the file $SYNCMGR_SHIELD_RM names (a key file left for the
# node's processes). A SIGKILL of the sh is the daemon's parent dying: a
# graceful stop too, though the file then stays until the node's next start.
_SHIELD = """
p=$PPID
"$@" --exit-with-parent $$ &
d=$!
end() {
  kill -TERM $d 2>/dev/null; wait $d; r=$?
  [ -z "$SYNCMGR_SHIELD_RM" ] || rm -f -- "$SYNCMGR_SHIELD_RM"
  exit $r
}
trap end TERM INT HUP
while kill -0 $d 2>/dev/null; do
  read -r _ _ _ pp _ < /proc/$$/stat
  [ "$pp" = "$p" ] || end
  sleep 0.5
done
end
"""

# The daemon's console log lines read "<time> <LVL> <message> key=value...".
_LEVELS = {"DBG": logging.DEBUG, "INF": logging.INFO, "WRN": logging.WARNING, "ERR": logging.ERROR,
           "FTL": logging.CRITICAL, "PNC": logging.CRITICAL}


def _level_of(line: str) -> int:
    parts = line.split(" ", 2)
    if len(parts) >= 2 and parts[1] in _LEVELS:
        return _LEVELS[parts[1]]
    return logging.WARNING  # a line not from the logger (a panic, a Go runtime message)


class PrivateDaemon:
    """A syncmgr daemon on a private socket, owned by this process."""

    def __init__(self, binary: Optional[str] = None, *, key: Optional[bytes] = None, args: tuple[str, ...] = (),
                 log_level: str = "warn", exit_with_parent: bool = True, forward_log: bool = True,
                 key_file: bool = True, directory: Optional[str] = None, key_in_env: bool = True,
                 shield: bool = False) -> None:
        """directory: an existing 0700 directory of this user's to use
        instead of a fresh private one (syncmgr.ray names its daemons' by
        cluster and node). key_in_env=False gives the daemon its key in a
        0600 file (--authkey-file) that start() removes once the daemon has
        read it, so that the key is in no process's environment.

        shield=True starts the daemon as the child of a minimal ``sh`` (its
        --exit-with-parent), not of this process: a supervisor that SIGKILLs
        the direct children of a process that exits (Ray does so to a
        worker's) then kills the sh, and the daemon, seeing its parent gone,
        stops gracefully and unlinks its segments; a SIGKILLed daemon could
        not. Stopping this object stops the daemon the same way. The sh
        removes the directory's key file when the daemon ends."""
        self.binary = binary or find_binary()
        self.key = key if key is not None else os.urandom(32)
        self.args = list(args)
        self.log_level = log_level
        self.exit_with_parent = exit_with_parent
        self.forward_log = forward_log
        self.key_in_env = key_in_env
        self.shield = shield
        self.dir = directory if directory is not None else private_dir()
        self.address = os.path.join(self.dir, SOCKET_FILE)
        self.log = os.path.join(self.dir, LOG_FILE)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._tail: collections.deque[str] = collections.deque(maxlen=200)
        self._pump: Optional[threading.Thread] = None
        self.key_file = key_file
        if key_file:
            write_key_file(self.dir, self.key)

    def env(self) -> dict[str, str]:
        """The variables that let another process reach this daemon: its
        address and the key file beside its socket (the key itself only
        when there is no key file)."""
        kf = os.path.join(self.dir, KEY_FILE)
        if self.key_file:
            return {"SYNCMGR_ADDRESS": self.address, "SYNCMGR_AUTHKEY_FILE": kf}
        return {"SYNCMGR_ADDRESS": self.address, "SYNCMGR_AUTHKEY": self.key.hex()}

    def start(self, timeout: float = 15.0) -> PrivateDaemon:
        """Start the daemon (again, after stop or kill) and wait until it answers."""

        env = dict(os.environ)
        env.pop("SYNCMGR_AUTHKEY_FILE", None)
        env.pop("SYNCMGR_AUTHKEY", None)
        cmd = [self.binary, "serve", "--socket", self.address, "--log-level", self.log_level]
        once_key = None
        if self.key_in_env:
            env["SYNCMGR_AUTHKEY"] = self.key.hex()
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir, "start.key"))
            once_key = write_key_file(self.dir, self.key, "start.key")
            cmd += ["--authkey-file", once_key]
        try:
            return self._start(cmd, env, timeout)
        finally:
            if once_key is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(once_key)  # read at start; the daemon never reads it again

    def _start(self, cmd: list[str], env: dict[str, str], timeout: float) -> PrivateDaemon:
        from ._conn import Connection  # late: _conn imports this module's key helpers

        if self.shield:
            cmd = ["/bin/sh", "-c", _SHIELD, "sh", *cmd, *self.args]
            env["SYNCMGR_SHIELD_RM"] = os.path.join(self.dir, KEY_FILE)
        else:
            if self.exit_with_parent:
                cmd += ["--exit-with-parent", str(os.getpid())]
            cmd += self.args
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        assert self.proc.stdout is not None
        self._pump = threading.Thread(target=self._copy_log, args=(self.proc.stdout,),
                                      name="syncmgr-daemon-log", daemon=True)
        self._pump.start()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._pump.join(timeout=2)
                raise exc.SyncMgrError(
                    f"the syncmgr daemon exited at start (status {self.proc.returncode}):\n{self.log_tail()}")
            if os.path.exists(self.address):
                try:
                    Connection(self.address, self.key, os.urandom(16)).close()
                    return self
                except (exc.ConnectError, exc.ServerGoneError):
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise exc.SyncMgrError(f"the syncmgr daemon did not start in {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.005)

    def _copy_log(self, pipe: IO[bytes]) -> None:
        with open(self.log, "ab", buffering=0) as f:
            for raw in iter(pipe.readline, b""):
                try:
                    f.write(raw)
                except OSError:
                    pass
                line = raw.decode(errors="replace").rstrip()
                self._tail.append(line)
                if self.forward_log:
                    lvl = _level_of(line)
                    if log.isEnabledFor(lvl):
                        log.log(lvl, "%s", line)
        pipe.close()

    def log_tail(self) -> str:
        """The daemon's last log lines (for error messages)."""
        return "\n".join(self._tail) or "(the daemon wrote nothing)"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the daemon (a crash, for tests); its directory stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._join_pump()

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """SIGTERM the daemon and wait for its clean stop; its directory stays."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._join_pump()
        return proc.returncode if proc is not None else None

    def _join_pump(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)
            self._pump = None

    def close(self) -> None:
        """Stop the daemon and remove its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateDaemon:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
