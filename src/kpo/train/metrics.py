"""A run's ``metrics.jsonl`` (one row per optimizer step): the one reader that the plots, the run card, ``kpo
summary`` and ``kpo compare`` use, and the first/last-window mean they report."""

from __future__ import annotations

import json
from pathlib import Path

from kpo._files import complete_part

__all__ = ["load_metrics", "parse_rows", "window_mean"]


def load_metrics(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.jsonl`` (or of ``<run dir>/metrics.jsonl``), without a torn last line (a row being
    appended, or cut by a kill); any other bad line is an error naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return parse_rows(path, complete_part(path.read_bytes()))


def parse_rows(path: Path, data: bytes) -> list[dict]:
    """The rows of ``data``, the whole lines of the metrics file ``path``; ValueError naming a line that is not a
    JSON object."""
    rows = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON object ({e})") from None
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}:{number}: not a metrics row (a JSON object with a step)")
        rows.append(row)
    return rows


def window_mean(values: list[float | None], last: bool) -> float | None:
    """Mean of the first or last 10% (at least one) of the non-None values; None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    width = max(1, len(values) // 10)
    part = values[-width:] if last else values[:width]
    return sum(part) / len(part)
