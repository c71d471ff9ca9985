"""`kpo <command>` ends on Ctrl-C or SIGTERM with one line and exit status 130 (kpo.cli), whatever the command."""

from __future__ import annotations

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
