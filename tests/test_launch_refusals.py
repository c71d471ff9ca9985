"""`kpo launch` runs the data-parallel commands (train, eval) alone: any other kpo command is refused in one line
before a process starts (issue 48: two `kpo task` wrote one folder, two `kpo compare` ran every run twice)."""

from __future__ import annotations

import pytest

from kpo import launch
from kpo.cli import COMMANDS


@pytest.fixture
def no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"train", "eval"}))
def test_a_command_that_is_not_data_parallel_is_refused(capsys, no_process, command):
    assert launch.main(["--nproc-per-node", "2", command, "--out", "x"]) == 2
    assert capsys.readouterr().err == (
        f"kpo launch: {command} is not data-parallel (N processes would each run all of it, over the same files); "
        f"run `kpo {command} ...` without kpo launch (kpo launch runs train and eval)\n"
    )


def test_train_and_eval_are_launched(monkeypatch, capsys):
    """The command after the launcher's options is what each process runs, with its own arguments."""
    started = []

    class Process:
        def __init__(self, argv, **kwargs):
            started.append(argv[3:])

        def poll(self):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Process)
    monkeypatch.setattr(launch, "_slots", lambda: (2, "CPU cores"))
    assert launch.main(["--nproc-per-node", "2", "eval", "--model", "compare"]) == 0
    assert started == [["eval", "--model", "compare"]] * 2
