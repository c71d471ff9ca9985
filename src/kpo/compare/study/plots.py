"""A study's figures (descriptive, beside the tests): collapse rates per arm and cell with their
exact intervals, the generation batch at which collapsed runs fell, and final accuracy (each run, the
interquartile mean with its stratified bootstrap interval, and performance profiles)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kpo.compare.contrasts import pyplot, save_figure
from kpo.compare.study.plan import group_arms, rule_text

__all__ = ["plot_study"]


def plot_study(report: dict, plan: dict, folder: Path) -> list[str]:
    """Draw the figures that have data into ``folder``; returns their file names."""
    plt = pyplot()

    drawn = []
    groups = report["descriptive"]
    rows = [(g, c, a, v) for g, d in groups.items() for c, arms in d["cells"].items() for a, v in arms.items()]
    if not any(v["accuracy"] for *_, v in rows):
        return drawn

    # collapse rates, one panel per cell
    cells = [(g, c) for g, d in groups.items() for c in d["cells"]]
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.6), squeeze=False)
    for ax, (g, c) in zip(axes[0], cells):
        arms = groups[g]["cells"][c]
        names = list(arms)
        rate = [arms[a]["collapse"]["rate"] or 0.0 for a in names]
        low = [arms[a]["collapse"]["low95"] or 0.0 for a in names]
        high = [arms[a]["collapse"]["upper95"] or 0.0 for a in names]
        x = np.arange(len(names))
        ax.bar(x, rate, color="tab:red", alpha=0.6)
        ax.errorbar(x, rate, yerr=[np.subtract(rate, low), np.subtract(high, rate)], fmt="none", color="k")
        ax.set_xticks(x, names, rotation=35, ha="right")
        ax.set_ylim(0, 1)
        ax.set_title(c, fontsize=9)
    axes[0][0].set_ylabel("collapsed runs (exact 95% interval)")
    fig.suptitle(f"collapse: {rule_text(plan['collapse'])}", fontsize=10)
    save_figure(fig, folder / "collapse.png")
    drawn.append("collapse.png")

    # paired time to collapse: per cell, each seed's arms joined, a survivor drawn above the last batch
    falls = [(g, c) for g, c in cells if any(b is not None for v in groups[g]["cells"][c].values()
                                              for b in v["batch_of_collapse"])]
    if falls:
        batches = plan["setup"]["batches"]
        fig, axes = plt.subplots(1, len(falls), figsize=(4.6 * len(falls), 3.8), squeeze=False, layout="constrained")
        for ax, (g, c) in zip(axes[0], falls):
            arms = groups[g]["cells"][c]
            names = list(arms)
            by_seed: dict[int, list] = {}
            for i, a in enumerate(names):
                for seed, b in zip(arms[a]["seeds"], arms[a]["batch_of_collapse"]):
                    by_seed.setdefault(seed, []).append((i, batches + 2 if b is None else b))
            # seeds spread a little apart along both axes: most share the same points (survived, batch 2)
            spread = np.linspace(-0.15, 0.15, len(by_seed)) if len(by_seed) > 1 else [0.0]
            for shift, points in zip(spread, by_seed.values()):
                xs, ys = zip(*sorted(points))
                ax.plot(np.add(xs, shift), np.add(ys, 2 * shift), color="0.4", lw=0.7, alpha=0.6, marker="o", ms=3)
            ax.axhline(batches + 1, color="k", lw=0.5, ls=":")
            ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
            ax.set_ylim(0, batches + 3)
            ticks = list(range(0, batches + 1, max(1, batches // 4)))
            ax.set_yticks([*ticks, batches + 2], [*map(str, ticks), "survived"])
            ax.set_title(c, fontsize=9)
        axes[0][0].set_ylabel("generation batch of collapse")
        fig.suptitle("when runs collapsed, each seed's arms joined (training reward below half its first batch's)",
                     fontsize=10)
        save_figure(fig, folder / "time_to_collapse.png")
        drawn.append("time_to_collapse.png")

    # final accuracy: every run and the interquartile mean per group; performance profiles
    fig, axes = plt.subplots(1, 2 * len(groups), figsize=(5.0 * 2 * len(groups), 3.8), squeeze=False)
    for k, (g, d) in enumerate(groups.items()):
        ax, prof = axes[0][2 * k], axes[0][2 * k + 1]
        arms = group_arms(plan, g)
        for i, a in enumerate(arms):
            ys = [y for c in d["cells"] for y in d["cells"][c][a]["accuracy"]]
            ax.scatter(i + np.linspace(-0.2, 0.2, len(ys)) if ys else [], ys, s=10, alpha=0.6)
            if a in d["iqm"]:
                v = d["iqm"][a]
                ax.errorbar([i], [v["iqm"]], yerr=[[v["iqm"] - v["low"]], [v["high"] - v["iqm"]]], fmt="D",
                            color="k", capsize=4)
            taus = np.linspace(0, 1, 101)
            if ys:
                prof.plot(taus, [np.mean(np.asarray(ys) > t) for t in taus], label=a)
        ax.set_xticks(range(len(arms)), arms, rotation=35, ha="right")
        ax.set_ylabel("final held-out accuracy")
        ax.set_title(f"{g} cells: runs and IQM (95% stratified bootstrap)", fontsize=9)
        prof.set_xlabel("accuracy threshold tau")
        prof.set_ylabel("share of runs above tau")
        prof.set_title(f"{g} cells: performance profiles", fontsize=9)
        prof.legend(fontsize=7)
    save_figure(fig, folder / "accuracy.png")
    drawn.append("accuracy.png")
    return drawn
