"""The paired contrasts of ``kpo compare``: each pair of arms' difference by seed, its verdict, Holm's procedure
over them, and their table and forest plot (rules: :data:`kpo.compare.claims.CLAIM_RULES`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kpo._files import replacing
from kpo.compare.claims import CLAIM_RULES
from kpo.compare.stats import ALPHA, centre, holm_adjusted, mcnemar_exact, paired_accuracy
from kpo.evaluation.metrics import paired_diff_ci

__all__ = ["collapsed", "contrast", "contrast_table", "decide", "plot_contrasts", "pyplot", "save_figure", "verdict"]


def verdict(low: float | None, high: float | None) -> str:
    """A contrast's verdict from its interval alone (fractions): better / worse / equivalent (the interval inside
    the +-margin) / undecided."""
    margin = CLAIM_RULES["margin"]
    if low is None or high is None:
        return "undecided"
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    if -margin <= low and high <= margin:
        return "equivalent"
    return "undecided"


def collapsed(entry: dict, warm: dict | None) -> bool | None:
    """Whether a run ended below its seed's warm start (None: the warm start is not evaluated)."""
    if warm is None:
        return None
    return float(np.mean(entry["outcome"]["per_problem"])) < float(np.mean(warm["outcome"]["per_problem"]))


def contrast(a: list[dict], b: list[dict], warm: dict[int, dict]) -> dict:
    """The paired difference of arms ``a`` and ``b`` (entries by seed) over the seeds both have, by
    :func:`kpo.compare.stats.paired_accuracy` (t where no run of a pair collapsed, else the sign test; one seed:
    the t-interval over problems), its interval at the claims' level, with the McNemar test of their collapses
    (``warm``: seed -> its warm start's evaluation). Fractions (each problem's outcome is out of 1); ``sd`` in
    points."""
    level, seeds = CLAIM_RULES["ci_level"], min(len(a), len(b))
    sa, sb = [[e["outcome"]["per_problem"] for e in arm[:seeds]] for arm in (a, b)]
    per_seed = [float(np.mean(np.subtract(x, y))) for x, y in zip(sa, sb)]
    fell_a = [collapsed(e, warm.get(s)) for s, e in enumerate(a[:seeds])]
    fell_b = [collapsed(e, warm.get(s)) for s, e in enumerate(b[:seeds])]
    known = None not in fell_a + fell_b
    if seeds == 1:
        mean, low, high = paired_diff_ci([sa[0]], [sb[0]], 1.0, level=level)
        found = {"method": "t over problems", "mean": mean, "median": mean, "low": low, "high": high, "p": None}
    else:
        pairs = [x or y for x, y in zip(fell_a, fell_b)] if known else None
        both = [x and y for x, y in zip(fell_a, fell_b)] if known else None  # ties: two collapsed runs
        found = paired_accuracy(per_seed, pairs, level, both=both)
    return {
        **found,
        "seeds": seeds,
        "half_width": None if found["low"] is None else (found["high"] - found["low"]) / 2,
        "per_seed": per_seed,
        "sd": float(np.std(per_seed, ddof=1)) * 100 if seeds > 1 else None,
        "collapses": mcnemar_exact(fell_a, fell_b) if known else None,
        "verdict": verdict(found["low"], found["high"]),
    }


def decide(found: dict) -> dict:
    """The contrasts' verdicts: the key and ablation contrasts' tests of no difference go through Holm's
    procedure, better / worse only where Holm rejects, equivalent where the interval lies inside the margin, else
    undecided; each of them gets ``holm_rejected``."""
    family = [name for name, c in found.items() if c["kind"] in ("key", "ablation") and c["p"] is not None]
    for name, rejected in zip(family, (a <= ALPHA for a in holm_adjusted([found[name]["p"] for name in family]))):
        c = found[name]
        if rejected:
            c["verdict"] = "better" if centre(c) > 0 else "worse"
        elif c["verdict"] in ("better", "worse"):
            c["verdict"] = "undecided"
        c["holm_rejected"] = rejected
    return found


def contrast_table(results: dict, predicted: dict) -> str:
    """One row per contrast: points, test, its 95% paired interval, p, measured and predicted half-width,
    collapses, verdict."""
    lines = [
        "| contrast | kind | seeds | difference (points) | test | 95% paired interval | p | half-width | planned "
        "half-width | per-seed sd | collapsed a only / b only | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in results.items():
        plan = predicted.get(name, {}).get("half_width")
        plan = "-" if plan is None else f"{plan:.1f}"
        sd = "-" if c["sd"] is None else f"{c['sd']:.1f}"
        estimate = centre(c)
        interval = "-" if c["low"] is None else f"[{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
        half = "-" if c["half_width"] is None else f"{100 * c['half_width']:.1f}"
        p = "-" if c["p"] is None else f"{c['p']:.2g}"
        fell = "-" if c["collapses"] is None else f"{c['collapses']['a_only']} / {c['collapses']['b_only']}"
        lines.append(
            f"| {name} | {c['kind']} | {c['seeds']} | {100 * estimate:+.1f}{' (median)' if c['method'] == 'sign' else ''} "
            f"| {c['method']} | {interval} | {p} | {half} | {plan} | {sd} | {fell} | {c['verdict']} |"
        )
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the Agg backend: figures go to files, never to a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig`` (tightly, unless it has a layout of its own), write it to ``path`` whole (a PNG) and close
    it."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with replacing(path) as partial:
        fig.savefig(partial, dpi=110, bbox_inches="tight", format="png")
    pyplot().close(fig)
    return path


def plot_contrasts(results: dict, path: Path) -> Path:
    """A forest plot of the contrasts between arms (not those against the warm start, tens of points away): each
    one's paired interval, its per-seed differences as dots, the +-margin band."""
    plt = pyplot()
    names = [name for name, c in results.items() if c["kind"] != "warm"]
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(names) + 1.6))
    margin = 100 * CLAIM_RULES["margin"]
    ax.axvspan(-margin, margin, color="0.92", label=f"+-{margin:g} points (equivalence margin)")
    ax.axvline(0, color="0.4", lw=0.8)
    for i, name in enumerate(names):
        c = results[name]
        y = len(names) - 1 - i
        color = {"key": "C0", "ablation": "C2", "aa": "C3"}[c["kind"]]
        ax.scatter([100 * d for d in c["per_seed"]], [y] * len(c["per_seed"]), s=12, color=color, alpha=0.45)
        estimate = centre(c)
        if c["low"] is None:  # the sign test below 6 pairs: no interval
            ax.plot(100 * estimate, y, "o", color=color)
            continue
        xerr = [[100 * (estimate - c["low"])], [100 * (c["high"] - estimate)]]
        ax.errorbar(100 * estimate, y, xerr=xerr, fmt="o", color=color, capsize=4)
    ax.set_yticks(range(len(names)), [f"{n} ({results[n]['seeds']} seeds)" for n in reversed(names)], fontsize=8)
    ax.set_xlabel(
        "difference in held-out accuracy, points (dots: seeds; bars: 95% paired t-interval, or the median's interval "
        "where runs collapsed)"
    )
    ax.set_title("blue: KPO against the baselines; green: the ablations; red: A/A (the noise floor)", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path)
