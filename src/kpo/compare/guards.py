"""No trainer outlives its compare and no two processes write one run: a child process dies with the process
that started it (:func:`die_with_parent`), and the process that writes a run holds its lock (:data:`LOCK_FILE`),
which a trainer it starts inherits. Below both :mod:`kpo.compare.run` and the engines that start trainers."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
from pathlib import Path

__all__ = ["LOCK_FILE", "busy", "busy_line", "die_with_parent", "held_lock", "lock_run", "unlock_run"]

LOCK_FILE = "kpo-compare.lock"  # in a run's folder: the pid of the process that writes the run
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_locks: dict[Path, int] = {}  # run folder -> the fd of its lock, while this process holds it


def die_with_parent() -> None:
    """In a child process (a pool initializer, a Popen ``preexec_fn``): get SIGKILL when the parent that started it
    ends, however it ends (Linux's ``prctl(PR_SET_PDEATHSIG)``; a SIGKILL of kpo compare runs no handler that could
    stop its trainers). If the parent is already gone, exit at once."""
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def lock_run(folder: Path) -> int | None:
    """Take the lock of the run in ``folder`` (an exclusive ``flock`` on ``folder/LOCK_FILE``, which then holds
    this pid): its fd, kept until :func:`unlock_run`, or None when another process holds it. The kernel drops the
    lock when the last process holding the fd ends (the worker, and a trainer it passes the fd to): a killed
    compare leaves no stale lock."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _locks[folder] = fd
    return fd


def unlock_run(folder: Path) -> None:
    os.close(_locks.pop(folder))


def held_lock(folder: Path) -> int | None:
    """The fd of the lock this process holds on the run in ``folder`` (a trainer it starts keeps it), or None."""
    return _locks.get(folder)


def busy(folder: Path) -> str | None:
    """Why the run in ``folder`` cannot be written now (another process holds its lock); None when it is free."""
    if not (folder / LOCK_FILE).exists():
        return None
    if lock_run(folder) is not None:
        unlock_run(folder)
        return None
    return busy_line(folder)


def busy_line(folder: Path) -> str:
    holder = (folder / LOCK_FILE).read_text().strip() or "?"
    return (
        f"run {folder.name} ({folder}) is being written by process {holder} or a trainer it started (lock: "
        f"{folder / LOCK_FILE}): wait for it to end or stop it; two processes must not write one run"
    )
