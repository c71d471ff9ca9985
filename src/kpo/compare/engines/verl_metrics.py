"""verl's metrics as ``kpo compare --engine verl`` reads them (:mod:`kpo.compare.engines.verl`): each attempt of a
run has its file of verl's file-logger rows (``verl_metrics-K.jsonl``, ``{"step": s, "data": {...}}`` a training
step), read whole lines only (:func:`attempt_rows`), merged over the attempts (:func:`merge_rows`) and written as
kpo's rows (:func:`metrics_rows`)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["FITTED", "METRICS", "attempt_files", "attempt_rows", "merge_rows", "metrics_rows"]

# verl's metric -> kpo's metrics.jsonl name (kpo.train.metrics; the report reads these)
METRICS = {
    "reward_mean": "critic/score/mean",
    "entropy": "actor/entropy",
    "clip_frac": "actor/pg_clipfrac",
    "pg_loss": "actor/pg_loss",
    "ppo_kl": "actor/ppo_kl",
    "response_length": "response_length/mean",
    "step_time": "timing_s/step",
}
# the plugin's fitted memory (memory=auto) -> kpo's names, where a row has them
FITTED = {"kpo/q": "actor/kpo/q", "kpo/memory_tokens": "actor/kpo/memory_tokens"}
VALIDATION = "val-"  # verl's validation metrics: val-core/..., val-aux/...


def attempt_files(out: Path) -> list[Path]:
    """verl's metrics files of the run in ``out``, one per attempt, in order."""
    return sorted(out.glob("verl_metrics-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))


def attempt_rows(path: Path) -> tuple[list[dict], str | None]:
    """(rows, torn) of one attempt's metrics file: verl's file logger appends whole lines, so only the last can be
    cut short, by a read while it writes or a kill mid-write; that line (``torn``, its text) is left out. An
    unreadable line before it is a ValueError naming it."""
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):
                return rows, line
            raise ValueError(f"{path}, line {number}: not a JSON row ({e}); verl's file logger wrote it") from None
    return rows, None


def merge_rows(rows: list[dict]) -> list[dict]:
    """verl's file-logger rows (``{"step": s, "data": {...}}``) of every attempt of a run, in the order written,
    as one row per trained step. A row with training metrics (any not verl's validation's ``val-*``) is its
    step's training row, a later attempt's replacing an earlier's (a resumed run redoes the steps after its
    checkpoint); validation metrics join their step's row and never replace its training metrics
    (``val_before_train`` logs a validation-only row at the step a resumed run starts from: its checkpoint's,
    already trained). A step with validation only (step 0: the start model) has no training row, so no row here:
    it stays in its ``verl_metrics-K.jsonl``."""
    train: dict[int, dict] = {}
    val: dict[int, dict] = {}
    for row in rows:
        data = row["data"]
        trained = {k: v for k, v in data.items() if not k.startswith(VALIDATION)}
        if trained:
            train[row["step"]] = trained
        val.setdefault(row["step"], {}).update({k: v for k, v in data.items() if k.startswith(VALIDATION)})
    return [{"step": s, "data": train[s] | val[s]} for s in sorted(train)]


def metrics_rows(rows: list[dict], steps_per_batch: int) -> list[dict]:
    """kpo's metrics rows from verl's merged rows (:func:`merge_rows`, one per training step = generation batch):
    ``step`` = s x steps_per_batch (the optimizer step that ends the batch), ``batch`` = s, kpo's names (:data:`METRICS`, and
    :data:`FITTED` where the row has them) and every verl metric under its own name. verl averages each metric
    over the batch's optimizer steps: a row is a generation batch (:data:`kpo.compare.contract.BATCH_ROWS`)."""
    return [
        {
            "step": row["step"] * steps_per_batch,
            "batch": row["step"],
            **{k: row["data"].get(v) for k, v in METRICS.items()},
            **{k: row["data"][v] for k, v in FITTED.items() if v in row["data"]},
            **row["data"],
        }
        for row in rows
    ]
