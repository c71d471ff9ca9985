"""Training-dynamics figure in the paper's Figure 3 layout: reward mean, entropy, clip fraction and
policy-gradient loss against the optimizer step, one line per method (mean over seeds with a min-max band).

Per-step values are noisy, so each line is a trailing mean (its window is written on the figure) drawn over the
faint per-step mean; a panel says in words what it lacks (a metric no run logged) or hides (a constant line).

matplotlib's object API (``Figure`` + Agg canvas) only, so no global backend state changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from kpo.train.metrics import load_metrics

__all__ = ["PANELS", "auto_window", "plot_training_dynamics", "seed_band", "training_figure"]

# (metrics.jsonl key, panel title, y-axis label with its unit, the metric's floor (None: unbounded below)) in the
# paper's order. A floor anchors the axis there, so a small clip fraction reads as small, not as a flat line.
PANELS = (
    ("reward_mean", "reward mean", "mean reward per completion", None),
    ("entropy", "entropy", "policy entropy (nats per token)", 0.0),
    ("clip_frac", "clip fraction", "share of valid tokens clipped", 0.0),
    ("pg_loss", "policy-gradient loss", "loss per optimizer step (no unit)", None),
)

MetricRows = Sequence[Mapping[str, float]]


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


def auto_window(steps: int) -> int:
    """The trailing-mean window the figure uses for a run of ``steps`` logged steps: about a twentieth of it."""
    return max(1, round(steps / 20))


def _note(ax, text: str) -> None:
    ax.text(0.02, 0.97, text, transform=ax.transAxes, ha="left", va="top", fontsize=8, color="0.3")


def _figure(groups: Mapping[str, list[MetricRows]], smooth: int) -> Figure:
    """The four panels, one labelled line (and min-max band over several runs) per group, with a legend even
    for one line: a figure must say what it shows, one method or one Q/V included. With ``smooth`` > 1 the
    per-step mean is drawn faint under the smoothed line."""
    fig = Figure(figsize=(14, 3.6), layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    for ax, (key, name, ylabel, floor) in zip(axes, PANELS):
        missing, drawn = [], []
        for label, group in groups.items():
            x, mean, lo, hi = seed_band(group, key, smooth)
            if not x.size:
                missing.append(label)
                continue
            (line,) = ax.plot(x, mean, label=label, lw=1.5, zorder=3)
            if smooth > 1:
                ax.plot(x, seed_band(group, key)[1], color=line.get_color(), lw=0.7, alpha=0.3, zorder=2)
            if len(group) > 1:
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0, zorder=1)
            drawn.append(mean[np.isfinite(mean)])
        values = np.concatenate(drawn) if drawn else np.array([])
        notes = [f"not logged: {', '.join(missing)}"] if missing else []
        if values.size and values.min() == values.max():  # autoscale would hide the value in an offset
            notes.append(f"every value is {values[0]:.3g}")
        if notes:
            _note(ax, "\n".join(notes))
        if floor is not None and values.size:
            ax.set_ylim(bottom=floor)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
        ax.set_title(name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    bands = " (bands: min-max over seeds)" if any(len(g) > 1 for g in groups.values()) else ""
    lines = f"lines: trailing mean over {smooth} steps, faint: per step" if smooth > 1 else "lines: per step"
    # Below the panels, not inside one (with several methods it covered the first panel's lines), and titled
    # with what the lines and bands are.
    legend_ax = next((ax for ax in axes if ax.get_legend_handles_labels()[0]), None)
    if legend_ax is None:
        fig.supxlabel(lines + bands, fontsize=8, color="0.3")
    else:
        handles, labels = legend_ax.get_legend_handles_labels()
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=min(len(labels), 4),
            fontsize=8,
            title=lines + bands,
            title_fontsize=8,
        )
    return fig


def training_figure(runs, *, title: str | None = None, smooth: int | None = None) -> Figure:
    """The figure :func:`plot_training_dynamics` writes (arguments as there)."""
    groups = (
        {("run" if title is None else title): _as_runs(runs)}
        if not isinstance(runs, Mapping)
        else {label: _as_runs(value) for label, value in runs.items()}
    )
    if smooth is None:
        smooth = auto_window(max((len(run) for group in groups.values() for run in group), default=1))
    if smooth < 1:
        raise ValueError(f"smooth={smooth}: must be >= 1")
    fig = _figure(groups, smooth)
    if title is not None:
        fig.suptitle(title)
    return fig


def plot_training_dynamics(
    runs, out_path: str | Path, *, title: str | None = None, smooth: int | None = None
) -> Path:
    """Write the four-panel figure to ``out_path`` (PNG) and return its path.

    runs: one run (a ``metrics.jsonl`` path, a run directory, or a list of row dicts), or a mapping
        ``label -> run or list of runs`` (e.g. ``{"kpo": [seed0_rows, seed1_rows], "vanilla": [...]}``).
        With several runs per label the line is their mean at each step and the band their min-max.
    smooth: trailing moving-average window in steps applied to each run before averaging (1 = raw; None =
        :func:`auto_window` of the longest run).
    """
    fig = training_figure(runs, title=title, smooth=smooth)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    return out_path
