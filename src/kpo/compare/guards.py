"""No trainer outlives its compare and no two processes write one run: a child process dies with the process
that started it (:func:`die_with_parent`), and the process that writes a run holds its lock (an exclusive ``flock``
on its :data:`LOCK_FILE`, or its :data:`PID_FILE` created exclusively: :func:`use_pid_files`), which a trainer it
starts inherits; docs/compare.md, "Processes". Below both :mod:`kpo.compare.run` and the engines."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import socket
from pathlib import Path

__all__ = ["LOCK_FILE", "PID_FILE", "busy", "busy_line", "die_with_parent", "held_lock", "lock_holder", "lock_run",
           "unlock_run", "use_pid_files"]

LOCK_FILE = "kpo-compare.lock"  # in a run's folder: the pid of the process that writes the run
PID_FILE = "kpo-compare.pid"  # the same, where runs are locked with pid files: "<pid> <host>"
# "1": runs are locked with pid files; set in kpo compare's environment, so that its workers (spawned) lock alike
PID_FILES_ENV = "KPO_COMPARE_PID_LOCKS"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_locks: dict[Path, int | None] = {}  # run folder -> the fd of its flock (None: its pid file), while held here


def die_with_parent(parent: int) -> None:
    """In a child process (a pool initializer, a Popen ``preexec_fn``, given the pid of the process that started
    it, read there: ``functools.partial(die_with_parent, os.getpid())``): get SIGKILL when that parent ends,
    however it ends (Linux's ``prctl(PR_SET_PDEATHSIG)``; a SIGKILL of kpo compare runs no handler that could stop
    its trainers). If the parent is gone already (the child was adopted before the call), exit at once."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def use_pid_files() -> None:
    """Lock runs with exclusive pid files from now on, in this process and the workers it starts."""
    os.environ[PID_FILES_ENV] = "1"


def _pid_files() -> bool:
    return os.environ.get(PID_FILES_ENV) == "1"


def lock_run(folder: Path) -> int | bool | None:
    """Take the lock of the run in ``folder``: the fd of its flock (kept until :func:`unlock_run`; the kernel drops
    it when the last process holding the fd ends, the worker and a trainer it passes the fd to: a killed compare
    leaves no stale lock), True for a pid file (:func:`use_pid_files`), None when another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _pid_files():
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_FLOCK:
                raise
            print(f"kpo compare: {folder} has no flock ({e.strerror}); each run is locked with an exclusive pid "
                  f"file instead ({PID_FILE})", flush=True)  # fmt: skip
            use_pid_files()
        else:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            _locks[folder] = fd
            return fd
    if not _create_pid_file(folder / PID_FILE):
        return None
    _locks[folder] = None
    return True


def _create_pid_file(path: Path) -> bool:
    """Create ``path`` exclusively with this process's pid and host; a file of a gone process of this host is
    taken over."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if not _stale(path):
                return False
            path.unlink(missing_ok=True)
            continue
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        os.close(fd)
        return True
    return False


def _stale(path: Path) -> bool:
    """Whether the pid file ``path`` names a process of this host that is gone."""
    try:
        pid, host = path.read_text().split()
    except (OSError, ValueError):
        return False  # being written, or not kpo's: not ours to take
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def unlock_run(folder: Path) -> None:
    fd = _locks.pop(folder)
    if fd is None:
        (folder / PID_FILE).unlink(missing_ok=True)
    else:
        os.close(fd)


def held_lock(folder: Path) -> int | None:
    """The fd of the flock this process holds on the run in ``folder`` (a trainer it starts keeps it), or None
    (none held, or a pid file)."""
    return _locks.get(folder)


def busy(folder: Path) -> str | None:
    """Why the run in ``folder`` cannot be written now (another process holds its lock); None when it is free."""
    if not (folder / (PID_FILE if _pid_files() else LOCK_FILE)).exists():
        return None
    if lock_run(folder) is not None:
        unlock_run(folder)
        return None
    return busy_line(folder)


def lock_holder(folder: Path) -> tuple[str, Path, str]:
    """Who holds the lock of ``folder`` ("PID", or "PID on HOST" for a pid file; "?" where its file is gone), the
    lock's file, and what to do about it."""
    lock = folder / (PID_FILE if _pid_files() else LOCK_FILE)
    holder = " on ".join(lock.read_text().split()) if lock.exists() else ""
    fix = "wait for it to end or stop it" + (f" (gone? remove {lock})" if _pid_files() else "")
    return holder or "?", lock, fix


def busy_line(folder: Path) -> str:
    holder, lock, fix = lock_holder(folder)
    return (
        f"run {folder.name} ({folder}) is being written by process {holder} or a trainer it started (lock: "
        f"{lock}): {fix}; two processes must not write one run"
    )
