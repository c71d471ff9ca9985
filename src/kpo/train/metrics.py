"""A run's ``metrics.jsonl`` (one row per optimizer step): the one reader that the plots, the run card, ``kpo
summary`` and ``kpo compare`` use, and the first/last-window mean they report."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["load_metrics", "window_mean"]


def load_metrics(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.jsonl`` (or of ``<run dir>/metrics.jsonl``); a bad line is an error naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON object ({e})") from None
    return rows


def window_mean(values: list[float | None], last: bool) -> float | None:
    """Mean of the first or last 10% (at least one) of the non-None values; None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    width = max(1, len(values) // 10)
    part = values[-width:] if last else values[:width]
    return sum(part) / len(part)
