"""Fixtures every test folder may use."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny matmuls on a shared 2-core machine run fastest single-threaded,
    and the generation tests time nothing but compare paths that must agree at any thread count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt during the test (Python's default), whatever this process inherited: a
    background job of a non-interactive shell (``make test &`` in a script) starts with SIGINT ignored, and a test
    that sends SIGINT, or checks what a guard restores, relies on the disposition it sets here."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, options)``: a tmpfs mounted at tmp_path/name (``options`` as mount -o: ``size=4m``, ``ro``),
    unmounted after the test; None where this machine refuses (only root may mount, and not in every container)."""
    mounted = []

    def mount(name: str, options: str) -> Path | None:
        folder = tmp_path / name
        folder.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)]
        if (
            os.geteuid() != 0
            or not shutil.which("mount")
            or subprocess.run(command, capture_output=True).returncode
        ):
            return None
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def read_only_dir(tmpfs, tmp_path) -> tuple[Path, str]:
    """(a folder nothing can be written in, why, as kpo says it): a read-only tmpfs as root, a folder without write
    permission otherwise (root writes any folder of a writable file system, so chmod stops it not)."""
    folder = tmpfs("ro", "ro,size=64k")
    if folder is not None:
        return folder, "is on a read-only file system"
    if os.geteuid() == 0:
        pytest.skip(
            "root writes any folder of a writable file system, and this machine refuses a tmpfs mount"
        )
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder, "is not writable"
