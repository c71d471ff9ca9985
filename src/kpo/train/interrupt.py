"""Ctrl-C and SIGTERM during ``kpo train``: stop at a generation-batch boundary, with a checkpoint that
``--resume`` continues on the same trajectory.

Why a boundary: TRL keeps a generation batch's unused mini-batches in memory only, so a checkpoint inside a batch
could not be resumed without regenerating them, and the resumed run would diverge (``kpo train --resume``
refuses such checkpoints). So, after the first SIGINT or SIGTERM:

- while the trainer generates or scores a batch, that batch is abandoned at once (:class:`AbandonBatch`). The
  weights, optimizer and scheduler are still those the last finished batch left (generating changes none of
  them), and :class:`KPOTrainer` rewinds the random-number generators to that batch's end before it writes the
  checkpoint: the checkpoint is the one a save at that step would have written, and the resumed run redoes the
  abandoned batch exactly;
- while it trains on a generated batch, it finishes the batch's remaining mini-batches (forward and backward
  passes, no generation) and stops where the next batch would start, as above.

A second signal stops at once without a checkpoint (:class:`StopNow`), except while a checkpoint or the final
model is being written: a half-written ``checkpoint-N`` would be what the next ``--resume`` picks up.

Several processes (``kpo launch``, torchrun) must stop at the same boundary, or one would write a
checkpoint while another waits for it in a collective. So there a signal is only recorded, and the processes
agree (a max over ranks, :func:`kpo._distributed.max_over_ranks`) at two points of every generation batch that
all of them reach together: before it is generated, and after it is generated and scored. If any of them
received a signal, all abandon the batch there, as above. A signal while they train on a batch therefore stops
them after it; one while they generate, once it is generated (no process leaves a generation that the others
are still in: TRL gathers its rewards and lengths across processes).
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading

import numpy as np
import torch

__all__ = ["AbandonBatch", "InterruptGuard", "StopNow", "TrainingInterrupted", "restore_rng", "rng_state"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class AbandonBatch(BaseException):
    """Raised inside the trainer to abandon the generation batch in progress. A BaseException, like
    KeyboardInterrupt, so that no library's ``except Exception`` around generation swallows it."""


class StopNow(BaseException):
    """A second signal: stop inside the current step, with no checkpoint of it."""


class TrainingInterrupted(KeyboardInterrupt):
    """``run_training`` stopped by SIGINT/SIGTERM. ``str(e)`` is the one line to show the user: where the run
    stopped and how to resume it. ``checkpoint`` is the checkpoint a resume continues from (None: none yet)."""

    def __init__(self, message: str, checkpoint=None):
        super().__init__(message)
        self.checkpoint = checkpoint


class InterruptGuard:
    """While entered (``with guard:``), SIGINT and SIGTERM are recorded in ``received`` (the first signal's
    name) instead of raising KeyboardInterrupt or killing the process; the trainer asks it where it may stop.
    Entered outside the main thread (where Python cannot handle signals), it changes nothing.

    ``processes > 1``: one of that many launched together, which stop where they agree to (module docstring)."""

    def __init__(self, processes: int = 1):
        self.processes = processes
        self.received: str | None = None
        self._generating = False
        self._deferred = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        again = self.received is not None
        self.received = self.received or signal.Signals(signum).name
        if self._deferred:
            return
        if self._generating and self.processes == 1:
            raise AbandonBatch
        if again:
            raise StopNow

    def _stop_agreed(self) -> bool:
        """Whether this process, or with several processes any of them, has received a signal; every process
        calls it at the same point. A process that received none takes the signal's name from the others (the
        higher-numbered one where they received different signals)."""
        if self.processes == 1:
            return self.received is not None
        from kpo._distributed import max_over_ranks

        number = max_over_ranks(signal.Signals[self.received].value if self.received else 0)
        if number and self.received is None:
            self.received = signal.Signals(number).name
        return bool(number)

    @contextlib.contextmanager
    def generation(self):
        """Around the generation and scoring of a batch: a signal received before or during it abandons it (at
        once in one process; with several, where they agree: before the batch, or once it is scored)."""
        self._generating = True
        try:
            if self._stop_agreed():
                raise AbandonBatch
            yield
            if self.processes > 1 and self._stop_agreed():
                raise AbandonBatch
        finally:
            self._generating = False

    @contextlib.contextmanager
    def deferred(self):
        """Around writing a checkpoint or the final model: signals are only recorded, so none is left half-written."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1


def rng_state() -> dict:
    """The random-number generator states a transformers checkpoint carries (python, numpy, torch CPU and every
    CUDA device), to rewind to with :func:`restore_rng`."""
    # numpy's legacy global generator: the one transformers saves and restores
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Set the generators to a :func:`rng_state` snapshot."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.random.set_rng_state_all(state["cuda"])
