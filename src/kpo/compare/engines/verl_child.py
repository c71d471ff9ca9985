"""verl's ``main_ppo`` as a child process of a ``kpo compare`` worker (:mod:`kpo.compare.engines.verl`, without a Ray
cluster): in its own session, dying with the worker, holding the run's lock."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from pathlib import Path

from kpo.compare.guards import die_with_parent, held_lock

__all__ = ["STOP_SECONDS", "run_child"]

STOP_SECONDS = 60  # after an interrupt, how long main_ppo may take to stop before it is killed


def run_child(argv: list[str], env: dict[str, str], out: Path) -> None:
    """main_ppo as a child process in its own session: an interrupt stops it and every process it started (Ray's
    too), and nothing else; it dies with this worker (Ray's processes share its fate) and holds the run's lock
    while it lives."""
    lock = held_lock(out)
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
        pass_fds=() if lock is None else (lock,),
    )
    try:
        code = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    if code != 0:
        raise RuntimeError(f"verl's main_ppo exited with status {code} (its output is above, in this log)")


def _stop(proc: subprocess.Popen) -> None:
    """Stop main_ppo and its process group: SIGINT, then SIGKILL after :data:`STOP_SECONDS`."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
