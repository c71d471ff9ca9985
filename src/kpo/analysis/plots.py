"""Figures of ``kpo analyze``: Figure 1 panels and the offline Figure 4 sweep, each returned as a ``Figure``
(:mod:`kpo.analysis.report` saves them). Every panel labels both axes with units; where a statistic is
undefined the panel says so in words instead of dropping the point.

matplotlib's object API (``Figure`` + the Agg canvas) is used, never pyplot, so no global backend state changes.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

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
UNITS = {  # y-axis label of each statistic in the sweep
    "prop_up": "share of valid tokens",
    "prop_down": "share of valid tokens",
    "prop_on": "share of valid tokens",
    "runlen_up": "tokens",
    "runlen_down": "tokens",
    "runlen_on": "tokens",
    "switch_freq": "switches per adjacent pair",
    "lfr": "share of spectral energy",
    "global_var": "variance of the signal",
    "local_var": "variance of the signal",
}
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 1, 2, 5, 10, 0.01: no 10^k and no "1.0"


def qv_label(x: float) -> str:
    """One notation for every Q/V: ``1e-6``, ``2.5e-4``, ``1.024e-3`` (never ``0.0001`` beside ``1e-06``)."""
    return np.format_float_scientific(x, trim="-", exp_digits=1)


def traces(
    z: np.ndarray,
    filt: np.ndarray,
    mask: np.ndarray,
    *,
    eps_low: float,
    eps_high: float,
    title: str,
) -> Figure:
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
        right.set_ylabel("importance ratio (zoom)")
        right.ticklabel_format(axis="y", useOffset=False)
    axes[-1][0].set_xlabel("token position")
    axes[-1][1].set_xlabel("token position")
    axes[0][0].legend(fontsize=8, loc="upper left")
    axes[0][1].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Figure 1: token ratios of example responses ({title})", fontsize=11)
    return fig


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
    if longest >= 10:  # heavy tails: log axes with ticks at 1, 2, 5, 10, 20, ... written plainly
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(PLAIN)
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:  # a few lengths only: integer ticks on a linear axis (a log axis would label only "1")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(NullFormatter())
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
) -> Figure:
    """Figure 1's statistics: window-wise off-policy frequency (mean +- 1 std across samples, the band clipped
    to the frequency's range [0, 1]), run-length distributions before and after filtering, and the per-sample
    switch frequency."""
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
            lo, hi = np.clip(w["mean"] - std, 0.0, 1.0), np.clip(w["mean"] + std, 0.0, 1.0)
            ax[0].fill_between(j, lo, hi, color=color, alpha=0.2)
    ax[0].set_xlabel(f"window index ({window} valid tokens each)")
    ax[0].set_ylabel("off-policy share of the window's tokens")
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
    ax[3].set_xlabel("switch frequency per sample (switches per adjacent pair)")
    ax[3].set_ylabel("samples")
    ax[3].set_title("token switch frequency", fontsize=10)
    _legend_or_note(ax[3], "no valid token")
    fig.suptitle("Figure 1: local structure of token importance ratios", fontsize=11)
    return fig


def sweep(before: dict[str, float], rows: list[dict[str, float]]) -> Figure:
    """Offline Figure 4: each statistic after filtering at each Q/V (markers), with its value before (dashed).

    rows: one dict per Q/V with ``q_over_v`` and every key of ``STAT_KEYS``. A statistic undefined at a Q/V (no
    run of that state, say) is written in the panel, and so is one undefined before filtering."""
    fig = Figure(figsize=(18, 6.5), layout="constrained")
    axes = fig.subplots(2, 5).ravel()
    # Q/V values sit at evenly spaced categorical positions: cheaper to lay out than a log axis, and as readable.
    pos = np.arange(len(rows))
    names = [qv_label(r["q_over_v"]) for r in rows]
    for ax, key in zip(axes, STAT_KEYS):
        ys = np.array([r[key] for r in rows], dtype=np.float64)
        ax.plot(pos, ys, marker="o", color="tab:red", label="after KF")
        notes = []
        if np.isfinite(before[key]):
            ax.axhline(before[key], color="tab:blue", ls="--", label="before KF")
        else:
            notes.append("before KF: undefined")
        undefined = [n for n, y in zip(names, ys) if not np.isfinite(y)]
        if undefined:
            notes.append(f"undefined at Q/V = {', '.join(undefined)}")
        if notes:
            ax.text(0.02, 0.97, "\n".join(notes), transform=ax.transAxes, ha="left", va="top", fontsize=8)
        if key.endswith("_var") and np.all(ys[np.isfinite(ys)] > 0):
            ax.set_yscale("log")
        ax.set_xticks(pos, names)
        ax.set_title(LABELS[key], fontsize=10)
        ax.set_xlabel("Q/V")
        ax.set_ylabel(UNITS[key])
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Figure 4 (offline): token dynamics after Kalman filtering at each Q/V", fontsize=11)
    return fig
