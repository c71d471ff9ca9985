"""What every engine of ``kpo compare`` shares with the rest of compare, below the engines (so that each engine's
module imports it without importing :mod:`kpo.compare.engines`, which imports the engines): what a metrics row
covers and what ``--keep`` leaves of a scored run."""

from __future__ import annotations

__all__ = ["BATCH_ROWS", "KEEP", "STEP_ROWS", "first_run_errors", "keep_errors", "size_text"]

# What one row of a run's metrics.jsonl covers (Engine.rows): one optimizer step (the row's step), or one
# generation batch (the row's step is the optimizer step that ends it; each metric is the mean over the batch's
# optimizer steps, so a row holds its on-policy and off-policy steps together).
STEP_ROWS, BATCH_ROWS = "optimizer step", "generation batch"
# --keep: what stays of a run once it is scored (its metrics, scores, ratio dumps and log always stay)
KEEP = {
    "hf": "the final model's Hugging Face weights only (the default)",
    "all": "everything the trainer wrote (every checkpoint, optimizer states included)",
    "none": "no weights at all",
}


def keep_errors(cfg) -> list[str]:
    """``--keep`` names one of :data:`KEEP`."""
    if cfg.keep in KEEP:
        return []
    return [f"--keep {cfg.keep}: unknown; use {', '.join(f'{k} ({v})' for k, v in KEEP.items())}"]


def size_text(size: int) -> str:
    """``size`` bytes to read: 1.23 GB, 441 MB, 12.5 kB."""
    scale, unit = next(((s, u) for s, u in ((1e9, "GB"), (1e6, "MB")) if size >= s), (1e3, "kB"))
    return f"{size / scale:.3g} {unit}"


def first_run_errors(runs, errors_of) -> list[str]:
    """``run NAME: error`` for each error ``errors_of(run)`` finds in the distinct configurations of ``runs`` (a
    method and its loss keywords: a seed never makes one invalid), once, with the first run that has it (a bad
    ``--`` flag fails every run alike)."""
    distinct: dict[tuple, object] = {}
    for run in runs:
        distinct.setdefault((run.method, run.loss_kwargs), run)
    first: dict[str, str] = {}
    for run in distinct.values():
        for err in errors_of(run):
            first.setdefault(err, run.name)
    return [f"run {name}: {err}" for err, name in first.items()]
