"""kpo launch's exit status when its processes end (the 2-process runs are in tests/train and tests/evaluation;
here the processes are small Python programs that end as a rank would)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from kpo.launch import _wait


def _ranks(*programs: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", p]) for p in programs]


KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
# what a rank whose collective lost the dead one does once it notices (kpo.cli: one line, status 1)
PEER_LOST = "import sys, time; time.sleep(0.5); sys.exit(1)"


@pytest.mark.parametrize("dead", [0, 1])
def test_a_rank_killed_by_a_signal_is_named_with_the_shells_status(dead):
    """Rank 0 killed gave 247 (its -9 as an exit status); either rank killed is now 128 + 9, and named."""
    programs = [PEER_LOST, PEER_LOST]
    programs[dead] = KILLED
    assert _wait(_ranks(*programs), received=[]) == (128 + signal.SIGKILL, (dead, signal.SIGKILL))


def test_without_a_killed_rank_the_status_is_rank_0s_or_the_first_failures():
    assert _wait(_ranks("import sys; sys.exit(2)", "import sys; sys.exit(2)"), received=[]) == (2, None)
    assert _wait(_ranks("pass", "import sys; sys.exit(3)"), received=[]) == (3, None)
    assert _wait(_ranks("pass", "pass"), received=[]) == (0, None)


def test_more_processes_than_the_machine_has_gpus_or_cores_are_refused_before_any_starts(monkeypatch, capsys):
    """--nproc-per-node 1000 on 2 CPUs started 1000 processes."""
    from kpo import launch

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)
    slots, kind = launch._slots()
    for nproc in (slots + 1, 1000):
        assert launch.main(["--nproc-per-node", str(nproc), "train", "--max-steps", "4"]) == 2
        assert capsys.readouterr().err == (
            f"kpo launch: --nproc-per-node {nproc}: this machine has {slots} {kind}, one per process; use "
            f"--nproc-per-node {slots} or fewer\n"
        )
