"""The paired contrasts of ``kpo compare``: each pair of arms' difference by seed, its verdict, the looks of a
sequential compare and Holm's procedure over them, and their table and forest plot (rules:
:data:`kpo.compare.claims.CLAIM_RULES`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kpo.compare.claims import CLAIM_RULES
from kpo.compare.stats import (
    ALPHA,
    centre,
    discordance_seeds,
    holm,
    holm_adjusted,
    mcnemar_exact,
    paired_accuracy,
    seeds_for_effect,
    spending,
)
from kpo.evaluation.metrics import paired_diff_ci

__all__ = [
    "collapsed",
    "contrast",
    "contrast_table",
    "decide",
    "looked",
    "looks_section",
    "plot_contrasts",
    "scores",
    "verdict",
]


def scores(entry: dict) -> tuple[list[float], float]:
    """(per-problem scores, out of) of the claims' metric: the model's outcome (kpo.compare.outcome), out of 1."""
    return entry["outcome"]["per_problem"], 1.0


def verdict(low: float | None, high: float | None) -> str:
    """A contrast's verdict from its interval alone (fractions): better / worse / equivalent / undecided."""
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
    return float(np.mean(scores(entry)[0])) < float(np.mean(scores(warm)[0]))


def contrast(
    a: list[dict], b: list[dict], warm: dict[int, dict], level: float = CLAIM_RULES["ci_level"]
) -> dict:
    """The paired difference of arms ``a`` and ``b`` (entries by seed) over the seeds both have, by
    :func:`kpo.compare.stats.paired_accuracy` (t where no run of a pair collapsed, else the sign test; one seed:
    the t-interval over problems), its interval at ``level``, with the McNemar test of their collapses (``warm``:
    seed -> its warm start's evaluation). Fractions; ``sd`` in points."""
    seeds = min(len(a), len(b))
    sa, sb = [scores(e) for e in a[:seeds]], [scores(e) for e in b[:seeds]]
    n = sa[0][1]
    per_seed = [float(np.mean(np.subtract(x, y)) / n) for (x, _), (y, _) in zip(sa, sb)]
    fell_a = [collapsed(e, warm.get(s)) for s, e in enumerate(a[:seeds])]
    fell_b = [collapsed(e, warm.get(s)) for s, e in enumerate(b[:seeds])]
    known = None not in fell_a + fell_b
    if seeds == 1:
        mean, low, high = paired_diff_ci([sa[0][0]], [sb[0][0]], n, level=level)
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


def looked(cfg, groups: dict, warm: dict[int, dict], taken: tuple[int, ...]) -> list[dict]:
    """The contrasts at each look ``taken`` (the key arms' seeds): per look, name -> {"kind", **contrast}. One
    look: every contrast, at CLAIM_RULES' level. Two (``--max-seeds``): a key contrast at look k is read at level
    1 - alpha_k, its look's share of the error (:func:`kpo.compare.stats.spending`), and carries "look" and
    "alpha"; the ablations and the A/A contrast keep their seeds, so they are read once, at look 1, at the full
    level."""
    from kpo.compare.plan import at_look, contrasts, looks

    planned = looks(cfg)
    shares = spending(ALPHA, planned)
    per_look = []
    for k, n in enumerate(taken):
        found = {}
        for c in contrasts(at_look(cfg, n)):
            if len(planned) == 1:
                found[c.name] = {
                    "kind": c.kind,
                    **contrast(groups[c.a][: c.seeds], groups[c.b][: c.seeds], warm),
                }
            elif c.kind == "key" or k == 0:
                share = shares[k] if c.kind == "key" else ALPHA
                pairs = contrast(groups[c.a][: c.seeds], groups[c.b][: c.seeds], warm, 1 - share)
                found[c.name] = {"kind": c.kind, **pairs, "look": k + 1, "alpha": share}
        per_look.append(found)
    return per_look


def decide(per_look: list[dict], sequential: bool) -> tuple[dict, bool]:
    """The contrasts' verdicts from their looks (:func:`looked`), and whether the compare stops (every key
    contrast decided). At each look the key and ablation contrasts' tests of no difference go through Holm's
    procedure: better / worse only where Holm rejects, equivalent where the look's interval lies inside the
    margin, else undecided. With one look that is all. With two (``sequential``), a contrast's p at look k is
    multiplied by ALPHA / alpha_k (its look-split p), Holm reads each contrast's sequential p (the least
    look-split p of its looks), and a contrast once decided is looked at no more: its verdict, direction and
    numbers are those of the look that decided it; each contrast of the family gets "sequential" (its looks' p
    and look-split p, its sequential p, the look that decided it)."""
    results, interval, history, decided_at, before = {}, {}, {}, {}, {}
    for k, found in enumerate(per_look, start=1):
        for name, c in found.items():
            if name in results and results[name]["verdict"] != "undecided":
                continue  # decided at an earlier look: looked at no more
            results[name], interval[name] = c, c["verdict"]
            if c["p"] is not None:
                p_look = min(1.0, c["p"] * ALPHA / c["alpha"]) if sequential else c["p"]
                history.setdefault(name, []).append(
                    {"look": k, "seeds": c["seeds"], "alpha": c.get("alpha"), "p": c["p"], "p_look": p_look}
                )
        family = [name for name, c in results.items() if c["kind"] in ("key", "ablation") and name in history]
        p_seq = {name: min(x["p_look"] for x in history[name]) for name in family}
        for name, rejected in zip(family, holm([p_seq[name] for name in family])):
            c = results[name]
            if rejected:
                c["verdict"] = "better" if centre(c) > 0 else "worse"
            elif interval[name] in ("better", "worse"):
                c["verdict"] = "undecided"
            c["holm_rejected"] = rejected
        for name, c in results.items():  # the look that gave each contrast its verdict
            if c["verdict"] != "undecided" and c["verdict"] != before.get(name):
                decided_at[name] = k
            before[name] = c["verdict"]
    for name in family if sequential else ():
        k = decided_at.get(name)
        results[name]["sequential"] = {
            "looks": history[name],
            "p_sequential": p_seq[name],
            "decided_at": None if k is None else {"look": k, "seeds": results[name]["seeds"]},
        }
    stop = all(c["verdict"] != "undecided" for c in results.values() if c["kind"] == "key")
    return results, stop


def _seeds_needed(c: dict, level: float) -> int | None:
    """Seeds an 80%-power test of no difference at ``level`` would need for contrast ``c``, from what its last
    look measured: t power from the per-seed sd, or for the sign test exact binomial power over its signs
    (:mod:`kpo.compare.stats`); None without spread or without a lopsided sign."""
    d = np.asarray(c["per_seed"], dtype=np.float64)
    if c["method"] == "sign":
        return discordance_seeds(int(np.sum(d > 0)), int(np.sum(d < 0)), d.size, 1, level)
    return seeds_for_effect(float(np.std(d, ddof=1)) if d.size > 1 else None, c["mean"], level)


def looks_section(results: dict, scheduled: tuple[int, ...], taken: tuple[int, ...], stopped: bool):
    """The looks of a sequential compare: (markdown lines, report.json's "looks"); adds to each contrast of the
    family its Holm-adjusted p (:func:`kpo.compare.stats.holm_adjusted`, over the sequential p-values) and, undecided, the seeds that would
    decide it (at the level it had at its last look: its look's share of the error over Holm's divisor for the
    contrasts not rejected)."""
    shares = spending(ALPHA, scheduled)
    family = [name for name, c in results.items() if "sequential" in c]
    open_ = [name for name in family if not results[name]["holm_rejected"]]
    adjusted = holm_adjusted([results[name]["sequential"]["p_sequential"] for name in family])
    for name, p_adjusted in zip(family, adjusted):
        c, entry = results[name], results[name]["sequential"]
        entry["p_adjusted"] = float(p_adjusted)
        if c["verdict"] == "undecided":
            entry["seeds_needed_level"] = c["alpha"] / len(open_)
            entry["seeds_needed"] = _seeds_needed(c, entry["seeds_needed_level"])
    plan_text = "; ".join(
        f"look {k} at {n} seeds, alpha_{k} = {a:.4f}" for k, (n, a) in enumerate(zip(scheduled, shares), 1)
    )
    why = (
        f"every key contrast was decided at look {len(taken)}, so the compare stopped there"
        if stopped
        else f"look {len(taken)} is the cap (--max-seeds {scheduled[-1]}), and a key contrast is still undecided"
    )
    header = ["contrast"]
    header += [f"look {k} ({n} seeds): p / look-split p" for k, n in enumerate(scheduled, 1)]
    header += [
        "sequential p",
        f"Holm-adjusted p ({len(family)} contrasts)",
        "decided at",
        "verdict",
        "seeds that would decide it",
    ]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in family:
        c, entry = results[name], results[name]["sequential"]
        by_look = {x["look"]: f"{x['p']:.2g} / {x['p_look']:.2g}" for x in entry["looks"]}
        decided = entry["decided_at"]
        needed = entry.get("seeds_needed")
        cells = [
            name,
            *(by_look.get(k, "-") for k in range(1, len(scheduled) + 1)),
            f"{entry['p_sequential']:.2g}",
            f"{entry['p_adjusted']:.2g}",
            "-" if decided is None else f"look {decided['look']} ({decided['seeds']} seeds)",
            c["verdict"],
            "-"
            if "seeds_needed_level" not in entry
            else f"{f'{needed} seeds in all' if needed else 'not estimable'} (80% power at level "
            f"{entry['seeds_needed_level']:.2g})",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    md = [
        "## Looks: seeds added until decided (`--max-seeds`)",
        "",
        f"Planned, before any run: {plan_text} (O'Brien-Fleming spending, Lan-DeMets; {ALPHA:g} in all), the second "
        "look taken only while a key contrast is undecided; a look reads the runs of its first seeds once all have "
        "finished. The ablations and the A/A arm keep their own seeds: they are read once, at look 1, at the full "
        f"{ALPHA:g}. Taken: {', '.join(f'look {k} ({n} seeds)' for k, n in enumerate(taken, 1))}; {why}.",
        "",
        "p: the contrast's test of no difference at the look (t or sign test, as in the table above); look-split p: "
        f"p x {ALPHA:g} / alpha_k; sequential p: the least look-split p of its looks; Holm-adjusted p: Holm's "
        f"step-down adjustment of the sequential p over the family (rejected where it is {ALPHA:g} or less). A "
        "contrast's interval at look k is at level 1 - alpha_k. A contrast decided at a look is looked at no more: "
        "its verdict, direction and numbers in the table above are that look's. A contrast undecided at the end "
        "gets the seeds an 80%-power test would need at the level it had (its look's alpha over Holm's divisor), "
        "from what it measured.",
        "",
        *rows,
        "",
    ]
    looked = {
        "planned": [
            {"look": k, "seeds": n, "alpha": a} for k, (n, a) in enumerate(zip(scheduled, shares), 1)
        ],
        "taken": list(taken),
        "stopped": "every key contrast decided" if stopped else "at the cap",
    }
    return md, looked


def contrast_table(results: dict, predicted: dict, interval: str = "95% paired interval") -> str:
    """One row per contrast: points, test, interval (its column titled ``interval``), p, measured and predicted
    half-width, collapses, verdict."""
    lines = [
        f"| contrast | kind | seeds | difference (points) | test | {interval} | p | half-width | planned "
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


def plot_contrasts(results: dict, path: Path) -> Path:
    """A forest plot of the contrasts between arms (not those against the warm start, tens of points away): each
    one's paired interval, its per-seed differences as dots, the +-margin band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.errorbar(
            100 * estimate,
            y,
            xerr=[[100 * (estimate - c["low"])], [100 * (c["high"] - estimate)]],
            fmt="o",
            color=color,
            capsize=4,
        )
    ax.set_yticks(
        range(len(names)), [f"{n} ({results[n]['seeds']} seeds)" for n in reversed(names)], fontsize=8
    )
    ax.set_xlabel(
        "difference in held-out accuracy, points (dots: seeds; bars: 95% paired t-interval, or the median's interval "
        "where runs collapsed)"
    )
    ax.set_title(
        "blue: KPO against the baselines; green: the ablations; red: A/A (the noise floor)", fontsize=9
    )
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
