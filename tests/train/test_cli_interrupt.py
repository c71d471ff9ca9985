"""`kpo <command>` ends on Ctrl-C or SIGTERM with one line and exit status 130 (kpo.cli), whatever the command, and
on a file-system fault a user can fix with one line and its status; a bug keeps its traceback."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
import types

import pytest

from kpo import cli


def _command(monkeypatch, name: str, main) -> None:
    """Make ``kpo name`` run ``main(argv)``."""
    module = types.ModuleType(f"fake_{name}")
    module.main = main
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli.COMMANDS, name, (module.__name__, "test"))


def _ctrl_c(argv):
    raise KeyboardInterrupt


def _sigterm(argv):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler interrupts this at once
    return 0


@pytest.mark.parametrize("main", [_ctrl_c, _sigterm])
@pytest.mark.parametrize(
    "name, kept",
    [
        (
            "eval",
            "with --output (or --cache), the generations finished so far are cached: rerun the same command to "
            "continue",
        ),
        ("compare", "finished runs are kept: rerun the same command to continue with the others"),
    ],
)
def test_interrupt_prints_one_line_and_exits_130(monkeypatch, capsys, name, kept, main):
    _command(monkeypatch, name, main)
    before = signal.getsignal(signal.SIGTERM)
    start = time.monotonic()
    assert cli.main([name]) == 130
    assert time.monotonic() - start < 4
    captured = capsys.readouterr()
    assert captured.err == f"kpo {name}: interrupted; {kept}\n" and captured.out == ""
    assert signal.getsignal(signal.SIGTERM) is before  # put back for whoever called main


def test_an_interrupt_with_its_own_message_prints_that(monkeypatch, capsys):
    """kpo train's interrupt (kpo.train.interrupt.TrainingInterrupted) carries where it stopped and how to resume."""
    from kpo.train.interrupt import TrainingInterrupted

    def train(argv):
        raise TrainingInterrupted(
            "interrupted by SIGINT at step 4/8, ...; resume with: kpo train ... --resume"
        )

    _command(monkeypatch, "train", train)
    assert cli.main(["train"]) == 130
    assert capsys.readouterr().err == (
        "kpo train: interrupted by SIGINT at step 4/8, ...; resume with: kpo train ... --resume\n"
    )


def _raise(exc):
    def main(argv):
        raise exc

    return main


@pytest.mark.parametrize(
    "name, exc, line, status",
    [
        (
            "train",
            OSError(errno.ENOSPC, "No space left on device", "runs/x/checkpoint-8"),
            "runs/x/checkpoint-8: no space left on the device; free space there or write elsewhere, then continue "
            "the run with the same command and --resume (from its last complete checkpoint)",
            74,
        ),
        (
            "eval",
            OSError(errno.EROFS, "Read-only file system", "ro/res.json"),
            "ro/res.json: read-only file system; give a path you can write, then rerun the same command (with "
            "--output or --cache it continues from the cached generations)",
            2,
        ),
        (
            "analyze",
            OSError(errno.EACCES, "Permission denied", "out"),
            "out: permission denied; give a path you can write, or change its permissions",
            2,
        ),
    ],
)
def test_a_file_system_fault_is_one_line_with_its_status(monkeypatch, capsys, name, exc, line, status):
    _command(monkeypatch, name, _raise(exc))
    assert cli.main([name]) == status
    assert capsys.readouterr().err == f"kpo {name}: {line}\n"


@pytest.mark.parametrize(
    "exc", [RuntimeError("a bug"), OSError(errno.EIO, "Input/output error"), OSError("no errno")]
)
def test_anything_else_keeps_its_traceback(monkeypatch, exc):
    _command(monkeypatch, "eval", _raise(exc))
    with pytest.raises(type(exc)):
        cli.main(["eval"])


def test_a_rank_whose_peer_died_says_so_in_one_line(monkeypatch, capsys):
    """On one of several processes, a collective that lost the process on its other side (gloo's words)."""
    gloo = RuntimeError(
        "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:13186: Connection reset by peer"
    )
    _command(monkeypatch, "train", _raise(gloo))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["train"]) == 1
    assert capsys.readouterr().err == (
        "kpo train: rank 1 of 2 stopped: another rank of this run ended, so an exchange with it failed (the launcher "
        "names it and why)\n"
    )
    monkeypatch.setenv("WORLD_SIZE", "1")  # in one process the same error is a bug
    with pytest.raises(RuntimeError):
        cli.main(["train"])
