"""Console output of the trainers: a progress bar with the reward (or loss) as postfix, never transformers'
default dump of every logged value at every step (the full rows are in metrics.jsonl and TensorBoard)."""

from __future__ import annotations

__all__ = ["use_quiet_progress"]


def use_quiet_progress(trainer, enabled: bool) -> None:
    """Replace ``trainer``'s printer/progress callbacks by one quiet bar (``enabled``) or by nothing."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class QuietProgress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not (state.is_world_process_zero and self.training_bar is not None and logs):
                return
            shown = {k: f"{logs[k]:.3f}" for k in ("reward", "loss") if isinstance(logs.get(k), (int, float))}
            self.training_bar.set_postfix(shown, refresh=False)

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if enabled:
        trainer.add_callback(QuietProgress())
