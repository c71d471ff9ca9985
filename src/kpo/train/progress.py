"""Console output of the trainers. On a terminal: one progress bar with the reward (or loss) as postfix. In a
log (stderr not a terminal): one line every 5% of the steps. With progress off: nothing. Never transformers'
default dump of every logged value at every step (the full rows are in metrics.jsonl and TensorBoard), and the
libraries' own bars (datasets' map, "Loading weights", "Writing model shards") only on a terminal with progress
on. Also keeps out the transformers deprecation warnings that TRL's own calls raise (see ``TRL_DEPRECATIONS``)."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from typing import TextIO

from kpo._progress import clock, library_bars

__all__ = ["TRL_DEPRECATIONS", "checkpointing_arg", "library_bars", "use_quiet_progress"]

# FutureWarnings of newer transformers (5.24 has them, 5.10 not) that TRL 1.16 raises from its own code
# (trl.models.utils toggles checkpointing around generation through the old names); kpo never calls these,
# so it cannot fix them.
TRL_DEPRECATIONS = (
    "is_gradient_checkpointing",
    "gradient_checkpointing_disable",
    "gradient_checkpointing_enable",
)
LINES_PER_RUN = 20  # outside a terminal: a line every 1/20 of max_steps


def checkpointing_arg(enabled: bool) -> dict[str, bool]:
    """The TrainingArguments keyword that sets activation checkpointing, as ``**`` keywords of a TRL config:
    ``activation_checkpointing`` where transformers has it (TRL's configs default the deprecated
    ``gradient_checkpointing`` to True, which then warns), else ``gradient_checkpointing``."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing": enabled
    }


def use_quiet_progress(trainer, enabled: bool, stream: TextIO | None = None) -> None:
    """Replace ``trainer``'s printer/progress callbacks by one quiet bar (``enabled`` on a terminal), by a line
    every 5% of the steps (``enabled``, ``stream`` not a terminal) or by nothing; :func:`library_bars` alike;
    ignore exactly the ``TRL_DEPRECATIONS`` warnings. ``stream`` defaults to stderr, where the bars go."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback

    stream = stream or sys.stderr
    name = type(trainer).__name__

    def shown(logs) -> dict[str, str]:
        return {k: f"{logs[k]:.3f}" for k in ("reward", "loss") if isinstance(logs.get(k), (int, float))}

    class QuietProgress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs:
                self.training_bar.set_postfix(shown(logs), refresh=False)

    class LineProgress(TrainerCallback):
        """One line at the first logged step, then at the first log at or past each 1/LINES_PER_RUN of
        max_steps, and at max_steps; from the step a resumed run starts at. None when training stops early
        (an interrupt says itself where it stopped)."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.start, self.first_step, self.next_step = (
                time.monotonic(),
                state.global_step,
                state.global_step,
            )
            self.every = max(1, math.ceil(state.max_steps / LINES_PER_RUN))
            self.values: dict[str, str] = {}
            self.printed = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.values |= shown(logs or {})
            if state.is_world_process_zero and state.global_step >= self.next_step:
                self.line(state)
                self.next_step = (state.global_step // self.every + 1) * self.every

        def on_train_end(self, args, state, control, **kwargs):
            done = state.global_step >= state.max_steps
            if state.is_world_process_zero and done and self.printed != state.global_step:
                self.line(state)

        def line(self, state) -> None:
            step, total = state.global_step, state.max_steps
            elapsed = time.monotonic() - self.start
            done = step - self.first_step
            left = f", ~{clock(elapsed / done * (total - step))} left" if 0 < done and step < total else ""
            values = "".join(f"  {k} {v}" for k, v in self.values.items())
            print(
                f"{name} step {step}/{total} ({100 * step // max(total, 1)}%){values}  {clock(elapsed)} elapsed"
                f"{left}",
                file=stream,
                flush=True,
            )
            self.printed = step

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if enabled:
        trainer.add_callback(QuietProgress() if stream.isatty() else LineProgress())
    library_bars(enabled, stream)
    for deprecated in TRL_DEPRECATIONS:
        warnings.filterwarnings(
            "ignore",
            message=f"`{deprecated}` is deprecated",
            category=FutureWarning,
            module=r"transformers\.modeling_utils",
        )
