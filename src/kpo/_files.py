"""Files that a later command reads, and the faults of the file system a user can fix.

- :func:`replacing`: a file or folder is written aside (``.NAME.partial`` beside it), flushed to the disk, then
  renamed into place, so a kill or a full disk at any instant leaves the previous version or the new one, whole,
  or (for a folder that had none) nothing. A folder that replaces a folder is swapped in atomically with Linux's
  ``renameat2(RENAME_EXCHANGE)``; where the kernel or file system lacks it, the old folder goes aside first, and
  a kill between the two renames leaves neither at ``NAME`` (the new one whole at ``.NAME.partial``, the old at
  ``.NAME.old``; the next write of ``NAME`` removes both). One writer per path.
- :func:`complete_part`: an append-only log (``metrics.jsonl``, ``kpo eval``'s generation cache) without the last
  line a kill or a full disk cut short (each append writes whole lines, so only the last can be torn).
- :func:`writing` and :func:`file_fault`: a full disk, a read-only or forbidden path, a missing file, as one line
  that names the path and what to do, with an exit status (2: a path given that cannot be used; 74, sysexits'
  EX_IOERR: out of space). Anything else keeps its traceback: it is a bug.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["NO_SPACE", "complete_part", "file_fault", "flush_to_disk", "replacing", "write_json", "writing"]

NO_SPACE = 74  # sysexits.h EX_IOERR: the command could not write for want of space
# errno -> (what happened, what to do, exit status)
_FAULTS = {
    errno.ENOSPC: ("no space left on the device", "free space there or write elsewhere", NO_SPACE),
    errno.EDQUOT: ("disk quota exceeded", "free space there or write elsewhere", NO_SPACE),
    errno.EFBIG: ("file too large for its file system", "write elsewhere", NO_SPACE),
    errno.EROFS: ("read-only file system", "give a path you can write", 2),
    errno.EACCES: ("permission denied", "give a path you can write, or change its permissions", 2),
    errno.EPERM: ("operation not permitted", "give a path you can write", 2),
    errno.ENOENT: ("no such file or directory", "check the path", 2),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "check the path", 2),
    errno.EISDIR: ("is a directory, not a file", "give a file", 2),
}
# How Rust's standard library (safetensors) names an errno in its messages: "... (os error 28)".
_RUST_ERRNO = re.compile(r"\(os error (\d+)\)")
_PROBE_BYTES = 1 << 20


def file_fault(exc: BaseException) -> tuple[str, int] | None:
    """(one line, exit status) of a file-system fault a user can fix (see the module docstring); None for any
    other exception."""
    if not isinstance(exc, OSError) or exc.errno not in _FAULTS:
        return None
    what, fix, status = _FAULTS[exc.errno]
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{what}; {fix}", status


@contextlib.contextmanager
def writing(where: str | os.PathLike) -> Iterator[None]:
    """Around writes to ``where`` (a file or folder): a fault of the file system leaves as an OSError that names
    ``where`` (:func:`file_fault` turns it into one line). A library that writes through its own code may report
    the fault without an errno (torch.save: "unexpected pos 704 vs 598"; safetensors names it in its text): then a
    write of 1 MiB beside ``where`` asks the file system itself, and an exception it does not explain (a bug)
    leaves as it came."""
    try:
        yield
    except OSError as e:
        if e.errno not in _FAULTS or e.filename:
            raise
        raise OSError(e.errno, os.strerror(e.errno), str(where)) from e
    except Exception as e:
        found = _RUST_ERRNO.search(str(e))
        number = int(found[1]) if found else _probe(Path(where))
        if number not in _FAULTS:
            raise
        raise OSError(number, os.strerror(number), str(where)) from e


def _probe(where: Path) -> int | None:
    """The errno of a 1 MiB write (flushed to the disk) in the nearest existing folder of ``where``; None if it
    succeeds."""
    folder = next(p for p in (where, *where.parents) if p.is_dir())
    probe = folder / f".kpo-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * _PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e.errno
    finally:
        probe.unlink(missing_ok=True)
    return None


def flush_to_disk(path: Path) -> None:
    """fsync ``path``: a file, or a folder with every file and folder in it."""
    for p in [path] if path.is_file() else [*path.rglob("*"), path]:
        _fsync(p)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """``with replacing(path) as partial:`` write the file or folder ``partial`` (not yet there); on leaving the
    block it is flushed to the disk and renamed to ``path``, replacing what was there. A failure in the block
    removes it and leaves ``path`` as it was; what a kill leaves aside (``.NAME.partial``, ``.NAME.old``) the next
    write of ``path`` removes."""
    path = Path(path)
    partial, old = path.with_name(f".{path.name}.partial"), path.with_name(f".{path.name}.old")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(partial)
        _remove(old)
        try:
            yield partial
            flush_to_disk(partial)
        except BaseException:
            _remove(partial)
            raise
        if partial.is_dir() and path.is_dir():
            # rename cannot replace a folder that holds files: swap the two atomically, else set the old one aside
            # first (a kill before the next rename leaves no folder at path, never a mix of both)
            if _exchange(partial, path):
                _remove(partial)
            else:
                path.rename(old)
                partial.rename(path)
                _remove(old)
        else:
            os.replace(partial, path)
        _fsync(path.parent)  # the rename itself


_RENAME_EXCHANGE = 2  # linux/fs.h


@functools.cache
def _renameat2():
    """glibc's renameat2 (2.28+), or None where the C library lacks it."""
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders ``a`` and ``b`` in one atomic step (Linux renameat2 with RENAME_EXCHANGE); False where the
    kernel, the C library or the file system cannot, and the caller renames in two steps."""
    call = _renameat2()
    if call is None:
        return False
    at_cwd = -100  # AT_FDCWD
    if call(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    number = ctypes.get_errno()
    if number in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(number, os.strerror(number), str(b))


def complete_part(data: bytes) -> bytes:
    """``data`` of an append-only log up to its last newline: without the torn line a kill or a full disk leaves
    at the end."""
    return data[: data.rfind(b"\n") + 1]


def write_json(path: str | os.PathLike, value, **options) -> None:
    """``json.dumps(value, **options)`` and a newline in ``path``, written whole or not at all (:func:`replacing`)."""
    with replacing(Path(path)) as partial:
        partial.write_text(json.dumps(value, **options) + "\n")
