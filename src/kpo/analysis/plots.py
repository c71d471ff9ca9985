"""Figures of ``kpo analyze`` (private to :mod:`kpo.analysis`): Figure 1 panels and the offline Figure 4 sweep.

matplotlib's object API (``Figure`` + the Agg canvas) is used, never pyplot, so no global backend state changes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from kpo.diagnostics import STAT_KEYS

STATE_COLORS = {"up": "tab:red", "down": "tab:blue", "on": "tab:gray"}
LABELS = {
    "prop_up": "proportion up",
    "prop_down": "proportion down",
    "prop_on": "proportion on",
    "runlen_up": "mean run length up",
    "runlen_down": "mean run length down",
    "runlen_on": "mean run length on",
    "switch_freq": "switch frequency",
    "lfr": "low-frequency ratio",
    "global_var": "global variance",
    "local_var": "windowed local variance",
}


def traces(
    z: np.ndarray,
    filt: np.ndarray,
    mask: np.ndarray,
    *,
    eps_low: float,
    eps_high: float,
    title: str,
    path: Path,
) -> Path:
    """Raw r_t, sequence-level exp(mean z) (GSPO) and filtered exp(rho_t) of k responses ([k, T] each).

    Left: all three at the raw ratio's scale (1st-99th percentile). Right: a zoom on the filtered and
    sequence-level ratios near 1, with the on band [1 - eps_low, 1 + eps_high] shaded. Masked positions (holes,
    padding) are gaps.
    """
    k = max(1, z.shape[0])
    fig = Figure(figsize=(13, 2.6 * k), layout="constrained")
    axes = fig.subplots(k, 2, squeeze=False, width_ratios=(3, 2))
    for i in range(z.shape[0]):
        m = mask[i]
        last = int(np.flatnonzero(m).max()) + 1
        t = np.arange(last)
        raw = np.where(m, np.exp(z[i]), np.nan)[:last]
        smooth = np.where(m, np.exp(filt[i]), np.nan)[:last]
        seq = float(np.exp(z[i][m].mean()))
        left, right = axes[i]
        left.plot(t, raw, lw=0.6, color="tab:blue", alpha=0.7, label="raw token ratio")
        left.axhline(seq, color="tab:purple", lw=1.5, label="sequence-level (GSPO)")
        left.plot(t, smooth, lw=1.5, color="tab:red", label="Kalman-filtered")
        lo, hi = np.nanpercentile(raw, [1, 99])
        lo, hi = min(lo, np.nanmin(smooth), seq, 1.0), max(hi, np.nanmax(smooth), seq, 1.0)
        pad = 0.05 * (hi - lo or 1.0)
        left.set_ylim(lo - pad, hi + pad)
        left.set_ylabel("importance ratio")
        left.set_title(f"response {i + 1}: {int(m.sum())} valid tokens", fontsize=9, loc="left")
        right.plot(t, smooth, lw=1.2, color="tab:red")
        right.axhline(seq, color="tab:purple", lw=1.2)
        right.axhspan(1.0 - eps_low, 1.0 + eps_high, color="tab:gray", alpha=0.25, lw=0, label="on band")
        right.set_title("zoom: filtered vs sequence-level", fontsize=9, loc="left")
        right.ticklabel_format(axis="y", useOffset=False)
    axes[-1][0].set_xlabel("token position")
    axes[-1][1].set_xlabel("token position")
    axes[0][0].legend(fontsize=8, loc="upper left")
    axes[0][1].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Figure 1: token ratios of example responses ({title})", fontsize=11)
    fig.savefig(path, dpi=110)
    return path


def _legend_or_note(ax, note: str, fontsize: int = 8) -> None:
    """A legend when the panel has labelled data, else the reason it is empty written in the panel."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize)
    else:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)


def _run_hist(ax, runs: dict[str, np.ndarray], title: str) -> None:
    longest = max([1] + [int(r.max()) for r in runs.values() if r.size])
    edges = np.unique(np.geomspace(1, longest + 1, 30).astype(np.int64))
    if edges.size < 2:
        edges = np.array([1, 2])
    for state, r in runs.items():
        if r.size:
            ax.hist(
                r,
                bins=edges,
                weights=np.full(r.size, 1.0 / r.size),
                histtype="step",
                lw=1.5,
                color=STATE_COLORS[state],
                label=f"{state} (mean {r.mean():.2f}, {r.size} runs)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())  # plain 1, 10, 100: short ranges stay readable
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("run length (tokens)")
    ax.set_ylabel("fraction of runs")
    ax.set_title(title, fontsize=10)
    _legend_or_note(ax, "no valid token", fontsize=7)


def dynamics(
    *,
    window_before: dict,
    window_after: dict,
    runs_before: dict,
    runs_after: dict,
    switch_before: np.ndarray,
    switch_after: np.ndarray,
    window: int,
    path: Path,
) -> Path:
    """Figure 1's statistics: window-wise off-policy frequency (mean +- 1 std across samples), run-length
    distributions before and after filtering, and the per-sample switch frequency."""
    fig = Figure(figsize=(18, 4), layout="constrained")
    ax = fig.subplots(1, 4)
    for label, w, color in (
        ("before KF (r != 1)", window_before, "tab:blue"),
        ("after KF (off band)", window_after, "tab:red"),
    ):
        if w["mean"].size:
            j = np.arange(1, w["mean"].size + 1)
            std = np.sqrt(w["var"])
            ax[0].plot(j, w["mean"], color=color, label=label)
            ax[0].fill_between(j, w["mean"] - std, w["mean"] + std, color=color, alpha=0.2)
    ax[0].set_xlabel(f"window index ({window} valid tokens each)")
    ax[0].set_ylabel("off-policy frequency (up + down) / window")
    ax[0].set_title("window-wise off-policy frequency", fontsize=10)
    _legend_or_note(ax[0], f"no sample has a full window\nof {window} valid tokens")
    _run_hist(ax[1], runs_before, "run lengths before KF")
    _run_hist(ax[2], runs_after, "run lengths after KF")
    bins = np.linspace(0.0, 1.0, 41)
    for label, sf, color in (("before KF", switch_before, "tab:blue"), ("after KF", switch_after, "tab:red")):
        sf = sf[~np.isnan(sf)]
        if sf.size:
            ax[3].hist(
                sf,
                bins=bins,
                histtype="stepfilled",
                alpha=0.4,
                color=color,
                label=f"{label} (mean {sf.mean():.3f})",
            )
    ax[3].set_xlabel("switch frequency per sample")
    ax[3].set_ylabel("samples")
    ax[3].set_title("token switch frequency", fontsize=10)
    _legend_or_note(ax[3], "no valid token")
    fig.suptitle("Figure 1: local structure of token importance ratios", fontsize=11)
    fig.savefig(path, dpi=110)
    return path


def sweep(before: dict[str, float], rows: list[dict[str, float]], *, path: Path) -> Path:
    """Offline Figure 4: each statistic after filtering at each Q/V (markers), with its value before (dashed).

    rows: one dict per Q/V with ``q_over_v`` and every key of ``STAT_KEYS``."""
    fig = Figure(figsize=(18, 6.5), layout="constrained")
    axes = fig.subplots(2, 5).ravel()
    # Q/V values sit at evenly spaced categorical positions: cheaper to lay out than a log axis, and as readable.
    pos = np.arange(len(rows))
    names = [f"{r['q_over_v']:g}" for r in rows]
    for ax, key in zip(axes, STAT_KEYS):
        ys = np.array([r[key] for r in rows], dtype=np.float64)
        ax.plot(pos, ys, marker="o", color="tab:red", label="after KF")
        if np.isfinite(before[key]):
            ax.axhline(before[key], color="tab:blue", ls="--", label="before KF")
        if key.endswith("_var") and np.all(ys[np.isfinite(ys)] > 0):
            ax.set_yscale("log")
        ax.set_xticks(pos, names)
        ax.set_title(LABELS[key], fontsize=10)
        ax.set_xlabel("Q/V")
    axes[0].legend(fontsize=8)
    fig.suptitle("Figure 4 (offline): token dynamics after Kalman filtering at each Q/V", fontsize=11)
    fig.savefig(path, dpi=110)
    return path
