"""Training-dynamics figure in the paper's Figure 3 layout: reward mean, entropy, clip fraction and
policy-gradient loss against the optimizer step, one line per method (mean over seeds with a min-max band).

matplotlib's object API (``Figure`` + Agg canvas) only, so no global backend state changes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

__all__ = ["PANELS", "load_metrics", "plot_training_dynamics", "seed_band"]

# (metrics.jsonl key, panel title) in the paper's order.
PANELS = (
    ("reward_mean", "reward mean"),
    ("entropy", "entropy"),
    ("clip_frac", "clip fraction"),
    ("pg_loss", "policy-gradient loss"),
)

MetricRows = Sequence[Mapping[str, float]]


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


def _as_runs(value) -> list[MetricRows]:
    """One run (rows, a path) or several runs of one method -> list of runs."""
    if isinstance(value, (str, Path)):
        return [load_metrics(value)]
    value = list(value)
    if value and isinstance(value[0], Mapping):
        return [value]
    return [load_metrics(v) if isinstance(v, (str, Path)) else list(v) for v in value]


def _series(run: MetricRows, key: str) -> dict[int, float]:
    out = {}
    for row in run:
        value = row.get(key)
        if value is not None and math.isfinite(float(value)):
            out[int(row["step"])] = float(value)
    return out


def _trailing_mean(ys: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean [S] of ``ys`` [S] (one value per step, NaN = not logged): at step i the mean of the finite
    values among steps i - window + 1 .. i; NaN where that window holds none."""
    if ys.size == 0:  # np.convolve refuses an empty input
        return ys.astype(float)
    kernel = np.ones(window)
    finite = np.isfinite(ys)
    num = np.convolve(np.where(finite, ys, 0.0), kernel)[: len(ys)]
    den = np.convolve(finite.astype(float), kernel)[: len(ys)]
    return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def seed_band(group: Sequence[MetricRows], key: str, smooth: int = 1) -> tuple[np.ndarray, ...]:
    """One metric of several runs (seeds) as the figure draws it: ``(steps, mean, lo, hi)``, each [S] over the
    S steps any run logged ``key`` at (all empty when none did).

    Each run is first smoothed by a trailing mean over ``smooth`` steps (1 = raw); then at each step ``mean``
    is the mean and ``lo``/``hi`` the min/max over the runs with a finite value there (NaN where none has one).
    """
    series = [_series(run, key) for run in group]
    steps = sorted(set().union(*series))
    values = np.full((len(series), len(steps)), np.nan)  # [runs, S]
    for i, s in enumerate(series):
        ys = np.array([s.get(step, np.nan) for step in steps])
        values[i] = _trailing_mean(ys, smooth) if smooth > 1 else ys
    finite = np.isfinite(values)
    counts = finite.sum(axis=0)
    mean = np.where(counts > 0, np.where(finite, values, 0.0).sum(axis=0) / np.maximum(counts, 1), np.nan)
    lo = np.where(counts > 0, np.where(finite, values, np.inf).min(axis=0, initial=np.inf), np.nan)
    hi = np.where(counts > 0, np.where(finite, values, -np.inf).max(axis=0, initial=-np.inf), np.nan)
    return np.array(steps, dtype=int), mean, lo, hi


def _figure(groups: Mapping[str, list[MetricRows]], smooth: int) -> Figure:
    """The four panels, one labelled line (and min-max band over several runs) per group, with a legend even
    for one line: a figure must say what it shows, one method or one Q/V included."""
    fig = Figure(figsize=(14, 3.4), layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    for ax, (key, name) in zip(axes, PANELS):
        for label, group in groups.items():
            x, mean, lo, hi = seed_band(group, key, smooth)
            if not x.size:
                continue
            (line,) = ax.plot(x, mean, label=label, lw=1.4)
            if len(group) > 1:
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(name)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    drawn = [ax for ax in axes if ax.get_lines()]
    if drawn:
        drawn[0].legend(fontsize=8)
    return fig


def plot_training_dynamics(runs, out_path: str | Path, *, title: str | None = None, smooth: int = 1) -> Path:
    """Write the four-panel figure to ``out_path`` (PNG) and return its path.

    runs: one run (a ``metrics.jsonl`` path, a run directory, or a list of row dicts), or a mapping
        ``label -> run or list of runs`` (e.g. ``{"kpo": [seed0_rows, seed1_rows], "vanilla": [...]}``).
        With several runs per label the line is their mean at each step and the band their min-max.
    smooth: trailing moving-average window in steps applied to each run before averaging (1 = raw).
    """
    groups = (
        {("run" if title is None else title): _as_runs(runs)}
        if not isinstance(runs, Mapping)
        else {label: _as_runs(value) for label, value in runs.items()}
    )
    if smooth < 1:
        raise ValueError(f"smooth={smooth}: must be >= 1")
    fig = _figure(groups, smooth)
    if title is not None:
        fig.suptitle(title)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    return out_path
