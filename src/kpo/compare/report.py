"""The report of ``kpo compare``: the design, the paired contrasts that decide, the paper's Figure 3, Table 1,
Figure 4 and Table 2 on the runs of one comparison, and a "claims" section that says plainly whether each of the
paper's claims holds here.

The claim rules (``CLAIM_RULES``) were committed before the default compare ran:
- Metric: each model's outcome (:mod:`kpo.compare.outcome`): its exact expected held-out accuracy
  (``expected.json``, :mod:`kpo.evaluation.expected`: the probability that a sample is right, with no sampling
  noise) where the task has one right response (the running-sum task), else the sampled avg@n per problem.
- A run **collapsed** when its final held-out accuracy is below its seed's warm start's; Table 1 gives each arm's
  collapses with their exact 95% bound, and each contrast the exact McNemar test of the two arms' collapses.
- Every difference is paired by seed (the arms of a seed share its warm start, its prompt stream and its
  evaluation samples), over the seeds both arms ran, by :func:`kpo.compare.stats.paired_accuracy`: the Student-t
  interval over the seed pairs where no run of a pair collapsed, else the exact sign test (and the median's
  order-statistic interval from 6 pairs); with one seed, the t-interval over problems
  (:func:`kpo.evaluation.metrics.paired_diff_ci`). A contrast's verdict: "better" or "worse" when its test of no
  difference is rejected by Holm's procedure over the key and ablation contrasts (the family of the claims
  below), "equivalent" when its 95% interval lies inside +-``margin`` points, else "undecided"; the A/A contrast
  and those against the warm start are read from their interval alone.
- Table 1: KPO (the subject: clipped, at the length-matched memory) is best: "better" against every baseline
  (vanilla, GSPO and any other method without a filter).
- Ablations, each against the subject: the filter matters beyond its clip band (vs the token ratio clipped at
  KPO's band, no filter), the ramp from the prior matters (vs the constant-gain moving average), the matched
  memory matters (vs KPO at the paper's Q/V). Each holds when the subject is "better".
- A/A: the subject against its replica (same warm starts, other RL seeds) must be consistent with 0 (its
  interval contains 0); otherwise the design's intervals are too narrow, and the report says so.
- Figure 3, reward: vanilla GRPO collapses (its final reward ends ``collapse_drop`` or more below its peak) while
  KPO keeps rising (its final reward is within ``rise_tolerance`` of its peak and above its first steps').
- Figure 3, entropy: GRPO's entropy collapses (its final entropy is at most ``entropy_collapse`` of its first)
  while KPO's does not, in every seed.
- Table 2: filtering lengthens runs (mean run length of the three states) and removes switching (switch frequency).
- Figure 4: a longer filter memory (smaller Q/V) gives a higher final training reward (monotone over the sweep,
  and the longest memory above the shortest).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from kpo._files import replacing
from kpo.compare.stats import (
    ALPHA,
    collapse_count,
    discordance_seeds,
    holm,
    holm_adjusted,
    mcnemar_exact,
    paired_accuracy,
    seeds_for_effect,
    spending,
)
from kpo.diagnostics import STAT_KEYS
from kpo.evaluation.metrics import bootstrap_avg_ci, paired_diff_ci
from kpo.losses.kpo import KALMAN_LOSSES
from kpo.train.metrics import load_metrics
from kpo.train.plots import plot_training_dynamics

__all__ = ["CLAIM_RULES", "write_report", "reward_summary"]

CLAIM_RULES = {
    "smooth": 5,  # steps of the trailing mean of the figures' curves, and the least window of first/peak/final
    "final_frac": 0.1,  # first/peak/final reward: means over windows of 10% of the steps (at least `smooth`)
    "collapse_drop": 0.1,  # collapse: final reward at least this far below the smoothed peak
    "rise_tolerance": 0.02,  # still rising: final within this of the smoothed peak
    "entropy_collapse": 0.1,  # entropy collapse: final entropy at most this fraction of the first
    "metric": "exact expected held-out accuracy (running task), else sampled avg@n",
    "collapse": "a run's final held-out accuracy below its seed's warm start's; exact McNemar between arms",
    "ci": "kpo.compare.stats.paired_accuracy: Student-t over seed pairs where no run of a pair collapsed, else "
    "the exact sign test (median interval from 6 pairs)",
    "multiplicity": "Holm at 0.05 over the key and ablation contrasts' tests of no difference",
    "ci_level": 0.95,  # the intervals' coverage
    "margin": 0.05,  # "equivalent": the interval inside +-5 points
}
# Table 2 statistics less prop_up/prop_down (prop_on says how much of a response is off-policy).
TABLE2_KEYS = tuple(k for k in STAT_KEYS if k not in ("prop_up", "prop_down"))
WARM_START_LABEL = "warm start (no RL)"


def _mean_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample std) of the finite values; std is NaN with one value (no spread to measure), both with none."""
    values = [v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else float("nan")


def _fmt(mean: float, std: float, scale: float = 1.0, digits: int = 1) -> str:
    if not np.isfinite(mean):
        return "n/a"
    if not np.isfinite(std):  # one seed: "± 0.0" would claim a spread measured as zero
        return f"{scale * mean:.{digits}f} (1 seed)"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def reward_summary(rows: list[dict]) -> dict[str, float]:
    """first / peak / final reward (and first / final entropy) of a run's S logged steps, each a mean over the
    same window of ``w = max(smooth, final_frac * S)`` steps (at most S): first = the first w steps, final =
    the last w, peak = the highest w-step trailing mean. One window for all three: a peak taken over shorter
    windows than the final reward is raised by noise alone, so a noisy curve that still rises read as collapsed."""
    rewards = np.array([r["reward_mean"] for r in rows if r.get("reward_mean") is not None], dtype=float)
    if rewards.size == 0:
        return {"first": float("nan"), "peak": float("nan"), "final": float("nan")}
    w = min(max(CLAIM_RULES["smooth"], int(round(CLAIM_RULES["final_frac"] * rewards.size))), rewards.size)
    smoothed = np.convolve(rewards, np.ones(w) / w, mode="valid")  # [S - w + 1] trailing means
    return {
        "first": float(smoothed[0]),
        "peak": float(smoothed.max()),
        "final": float(smoothed[-1]),
        "entropy_first": float(np.mean([r["entropy"] for r in rows[:w]])),
        "entropy_final": float(np.mean([r["entropy"] for r in rows[-w:]])),
    }


def _load_eval(folder: Path) -> dict:
    """A model's held-out evaluation in ``folder``: macro metrics, problem count, per-problem correct counts
    (``eval.json``), and its outcome (:func:`kpo.compare.outcome.load_outcome`: what the claims read)."""
    from kpo.compare.outcome import EVAL_FILE, load_outcome

    results = json.loads((folder / EVAL_FILE).read_text())
    return {
        "eval": results["macro"],
        "n": results["params"]["n"],
        "problems": sum(b["problems"] for b in results["benchmarks"].values()),
        "counts": [p["correct"] for b in results["benchmarks"].values() for p in b["per_problem"]],
        "outcome": load_outcome(folder),
    }


def _load_run(run, out: Path) -> dict:
    """A finished run: its metrics rows, held-out results and reward summary."""
    folder = out / "runs" / run.name
    rows = load_metrics(folder / "metrics.jsonl")
    return {"run": run, "dir": folder, "rows": rows, "summary": reward_summary(rows), **_load_eval(folder)}


def _scores(entry: dict) -> tuple[list[float], float]:
    """(per-problem scores, out of) of the claims' metric: the model's outcome (kpo.compare.outcome), out of 1."""
    return entry["outcome"]["per_problem"], 1.0


def _table1(labels, groups, warm_by_seed: dict[int, dict], exact: bool) -> tuple[str, dict]:
    """Held-out accuracy per arm, the warm start first: mean ± std over seeds of the exact expected accuracy
    (where there is one), avg@n and pass@k, the 95% bootstrap interval (over seeds and problems) of avg@n, the
    runs that collapsed (below their seed's warm start) with the exact 95% bound of the rate, response length,
    training reward."""
    warm = list(warm_by_seed.values())
    eval_keys = [k for k in next(iter(groups[labels[0]]))["eval"] if "@" in k]
    avg_key = next(k for k in eval_keys if k.startswith("avg@"))
    header = [
        "arm",
        "seeds",
        *(["expected acc"] if exact else []),
        *eval_keys,
        f"{avg_key} 95% CI",
        "collapsed (≤ exact 95% bound)",
        "mean len (tok)",
        "train reward first",
        "train reward final",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    stats = {}
    rows = [(WARM_START_LABEL, warm)] if warm else []
    for label, entries in [*rows, *((m, groups[m]) for m in labels)]:
        row = {k: _mean_std([e["eval"][k] for e in entries]) for k in [*eval_keys, "mean_response_tokens"]}
        if exact:
            row["expected"] = _mean_std([e["outcome"]["mean"] for e in entries])
        trained = label != WARM_START_LABEL
        row["first"] = _mean_std([e["summary"]["first"] for e in entries]) if trained else (np.nan, np.nan)
        row["final"] = _mean_std([e["summary"]["final"] for e in entries]) if trained else (np.nan, np.nan)
        row["ci95"] = bootstrap_avg_ci([e["counts"] for e in entries], entries[0]["n"])
        row["seeds"] = len(entries)
        fell = [_collapsed(e, warm_by_seed.get(s)) for s, e in enumerate(entries)] if trained else []
        row["collapse"] = collapse_count(fell) if trained and None not in fell else None
        stats[label] = row
        cells = [
            label,
            str(len(entries)),
            *([_fmt(*row["expected"], scale=100)] if exact else []),
            *(_fmt(*row[k], scale=100) for k in eval_keys),
            f"[{100 * row['ci95'][0]:.1f}, {100 * row['ci95'][1]:.1f}]",
            "-" if row["collapse"] is None else f"{row['collapse']['k']}/{row['collapse']['n']} "
            f"(≤{100 * row['collapse']['upper95']:.0f}%)",
            _fmt(*row["mean_response_tokens"]),
            _fmt(*row["first"], digits=3) if trained else "-",
            _fmt(*row["final"], digits=3) if trained else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), {"eval_keys": eval_keys, "avg_key": avg_key, "rows": stats}


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


def _collapsed(entry: dict, warm: dict | None) -> bool | None:
    """Whether a run ended below its seed's warm start (None: the warm start is not evaluated)."""
    if warm is None:
        return None
    return float(np.mean(_scores(entry)[0])) < float(np.mean(_scores(warm)[0]))


def _contrast(
    a: list[dict], b: list[dict], warm: dict[int, dict], level: float = CLAIM_RULES["ci_level"]
) -> dict:
    """The paired difference of arms ``a`` and ``b`` (entries by seed) over the seeds both have, by
    :func:`kpo.compare.stats.paired_accuracy` (t where no run of a pair collapsed, else the sign test; one seed:
    the t-interval over problems), its interval at ``level``, with the McNemar test of their collapses (``warm``:
    seed -> its warm start's evaluation). Fractions; ``sd`` in points."""
    seeds = min(len(a), len(b))
    sa, sb = [_scores(e) for e in a[:seeds]], [_scores(e) for e in b[:seeds]]
    n = sa[0][1]
    per_seed = [float(np.mean(np.subtract(x, y)) / n) for (x, _), (y, _) in zip(sa, sb)]
    fell_a = [_collapsed(e, warm.get(s)) for s, e in enumerate(a[:seeds])]
    fell_b = [_collapsed(e, warm.get(s)) for s, e in enumerate(b[:seeds])]
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


def _looked(cfg, groups: dict, warm: dict[int, dict], taken: tuple[int, ...]) -> list[dict]:
    """The contrasts at each look ``taken`` (the key arms' seeds): per look, name -> {"kind", **_contrast}. One
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
                    **_contrast(groups[c.a][: c.seeds], groups[c.b][: c.seeds], warm),
                }
            elif c.kind == "key" or k == 0:
                share = shares[k] if c.kind == "key" else ALPHA
                pairs = _contrast(groups[c.a][: c.seeds], groups[c.b][: c.seeds], warm, 1 - share)
                found[c.name] = {"kind": c.kind, **pairs, "look": k + 1, "alpha": share}
        per_look.append(found)
    return per_look


def _centre(c: dict) -> float:
    """A contrast's estimate: the median where the sign test read it, else the mean."""
    return c["median"] if c["method"] == "sign" else c["mean"]


def _decide(per_look: list[dict], sequential: bool) -> tuple[dict, bool]:
    """The contrasts' verdicts from their looks (:func:`_looked`), and whether the compare stops (every key
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
                c["verdict"] = "better" if _centre(c) > 0 else "worse"
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


def _looks_section(results: dict, scheduled: tuple[int, ...], taken: tuple[int, ...], stopped: bool):
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


def _contrast_table(results: dict, predicted: dict, interval: str = "95% paired interval") -> str:
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
        centre = c["median"] if c["method"] == "sign" else c["mean"]
        interval = "-" if c["low"] is None else f"[{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
        half = "-" if c["half_width"] is None else f"{100 * c['half_width']:.1f}"
        p = "-" if c["p"] is None else f"{c['p']:.2g}"
        fell = "-" if c["collapses"] is None else f"{c['collapses']['a_only']} / {c['collapses']['b_only']}"
        lines.append(
            f"| {name} | {c['kind']} | {c['seeds']} | {100 * centre:+.1f}{' (median)' if c['method'] == 'sign' else ''} "
            f"| {c['method']} | {interval} | {p} | {half} | {plan} | {sd} | {fell} | {c['verdict']} |"
        )
    return "\n".join(lines)


def _plot_contrasts(results: dict, path: Path) -> Path:
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
        centre = c["median"] if c["method"] == "sign" else c["mean"]
        if c["low"] is None:  # the sign test below 6 pairs: no interval
            ax.plot(100 * centre, y, "o", color=color)
            continue
        ax.errorbar(
            100 * centre,
            y,
            xerr=[[100 * (centre - c["low"])], [100 * (c["high"] - centre)]],
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


def _note_row(method: str, note: str, columns: int) -> str:
    """A table row of ``columns`` cells that says, in place of numbers, why ``method`` has none."""
    return f"| {method} | {note} |" + " |" * (columns - 2)


def _table2(methods, groups, out: Path) -> tuple[str, dict]:
    from kpo.analysis import AnalyzeConfig, DumpError, compute, find_dumps, load_dump

    cfg = AnalyzeConfig(off_policy_only=True, sweep_q=())
    header = ["method", "filtering", *TABLE2_KEYS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    stats = {}
    for m in methods:
        dumps = [
            load_dump(p)
            for e in groups[m]
            if (e["dir"] / "ratios").is_dir()
            for p in find_dumps(e["dir"] / "ratios")
        ]
        if not dumps:
            lines.append(
                _note_row(m, "no ratio dump in its runs (runs/*/ratios is missing or empty)", len(header))
            )
            continue
        try:
            results = compute(dumps, cfg).results
        except DumpError:  # every dumped row is on-policy (or, in dumps without that flag, has all ratios 1)
            note = (
                "no off-policy token in the dumps (each dumped step is the first, on-policy step of its "
                "generation batch, e.g. with --minibatches=1)"
            )
            lines.append(_note_row(m, note, len(header)))
            continue
        stats[m] = {
            "before": results["before"],
            "after": results["after"],
            "samples": results["inputs"]["samples"],
        }
        for label, key in (("before (exact on)", "before"), (results["after_label"], "after")):
            cells = [m, label, *(f"{results[key][k]:.3g}" for k in TABLE2_KEYS)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), stats


def _claim(title: str, text: str) -> str:
    return f"- **{title}** — {text}"


def _missing_methods(methods, needed: tuple[str, ...]) -> str | None:
    """Why a claim needing the methods ``needed`` is not tested on ``methods``, or None when all are there."""
    missing = [m for m in needed if m not in methods]
    if not missing:
        return None
    it = "it" if len(missing) == 1 else "them"
    fixed = ",".join([*methods, *missing])
    return f"not tested: --methods has no {' and '.join(missing)} (add {it}: --methods {fixed})"


def _decision_claims(labels, subject: str, results: dict, baselines: list[str]) -> list[str]:
    """Table 1's claim (the subject "better" than every baseline), each ablation's and the A/A check."""

    def text(name):
        c = results[name]
        one = "; one seed: the interval covers the problems only" if c["seeds"] == 1 else ""
        interval = "" if c["low"] is None else f" [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
        sign = c["method"] == "sign"
        test = f"median; sign test p = {c['p']:.2g}; " if sign else ""
        return f"{name} {100 * (c['median'] if sign else c['mean']):+.1f}{interval} ({test}{c['verdict']}{one})"

    title = f"Table 1: {subject} has the best held-out accuracy"
    # sorted: the verdict and its text never depend on the order of --methods
    keys = sorted(f"{subject} - {b}" for b in baselines if f"{subject} - {b}" in results)
    if subject not in labels:
        claims = [_claim(title, _missing_methods(labels, (subject,)))]
    elif not keys:
        claims = [_claim(title, "not tested: no baseline without a filter beside it (add e.g. vanilla,gspo)")]
    else:
        ok = all(results[k]["verdict"] == "better" for k in keys)
        claims = [
            _claim(
                title,
                f"{'holds' if ok else 'does not hold'}: points, 95% interval paired by seed: "
                + "; ".join(text(k) for k in keys)
                + ".",
            )
        ]
    what = {
        "vanilla (clip_ratio_low=0.0003, clip_ratio_high=0.0004)": "the filter matters beyond KPO's clip band",
        "kpo (memory=matched, p0=steady)": "the filter's ramp from its prior matters (vs constant gains)",
        "kpo": "the length-matched memory beats the paper's Q/V",
        "kpo (memory=auto)": "the length-matched memory beats the memory fitted by maximum likelihood",
    }
    for name, c in results.items():
        if c["kind"] == "ablation":
            other = name.split(" - ", 1)[1]
            title = f"Ablation: {what.get(other, other)}"
            claims.append(
                _claim(title, f"{'holds' if c['verdict'] == 'better' else 'does not hold'}: {text(name)}.")
            )
        elif c["kind"] == "aa":
            inside = c["low"] is None or c["low"] <= 0 <= c["high"]
            width = (
                f"its half-width {100 * c['half_width']:.1f} points is what RL sampling alone moves a difference at "
                "this many seeds"
                if c["half_width"] is not None
                else "no interval: a run of a pair collapsed and there are fewer than 6 pairs"
            )
            claims.append(
                _claim(
                    "A/A: the noise floor is consistent with 0",
                    ("holds" if inside else "does not hold: the design's intervals are too narrow")
                    + f": {text(name)}; {width}.",
                )
            )
    return claims


def _figure3_claim(methods, groups, kpo: str) -> str:
    title = "Figure 3: GRPO collapses while KPO keeps rising"
    if (why := _missing_methods(methods, ("vanilla", kpo))) is not None:
        return _claim(title, why)

    def collapsed(entry):
        s = entry["summary"]
        return s["final"] <= s["peak"] - CLAIM_RULES["collapse_drop"]

    def rising(entry):
        s = entry["summary"]
        return s["final"] >= s["peak"] - CLAIM_RULES["rise_tolerance"] and s["final"] > s["first"]

    van = [collapsed(e) for e in groups["vanilla"]]
    rises = [rising(e) for e in groups[kpo]]
    detail = "; ".join(
        f"{m}: first {statistics.fmean(e['summary']['first'] for e in groups[m]):.3f}, peak "
        f"{statistics.fmean(e['summary']['peak'] for e in groups[m]):.3f}, final "
        f"{statistics.fmean(e['summary']['final'] for e in groups[m]):.3f}, entropy "
        f"{statistics.fmean(e['summary']['entropy_first'] for e in groups[m]):.3f} -> "
        f"{statistics.fmean(e['summary']['entropy_final'] for e in groups[m]):.3f}"
        for m in methods
    )
    holds = "holds" if all(van) and all(rises) else "does not hold"
    return _claim(
        title,
        f"{holds}: vanilla collapsed in {sum(van)}/{len(van)} seeds (final >= {CLAIM_RULES['collapse_drop']} "
        f"below peak), {kpo} still rising in {sum(rises)}/{len(rises)} seeds. Per arm (mean over seeds): "
        f"{detail}.",
    )


def _entropy_claim(methods, groups, kpo: str) -> str:
    title = "Figure 3: GRPO's entropy collapses while KPO's does not"
    if (why := _missing_methods(methods, ("vanilla", kpo))) is not None:
        return _claim(title, why)
    frac = CLAIM_RULES["entropy_collapse"]

    def collapsed(entry):
        s = entry["summary"]
        return s["entropy_final"] <= frac * s["entropy_first"]

    van = [collapsed(e) for e in groups["vanilla"]]
    kept = [not collapsed(e) for e in groups[kpo]]
    detail = "; ".join(
        f"{m}: {statistics.fmean(e['summary']['entropy_first'] for e in groups[m]):.4f} -> "
        f"{statistics.fmean(e['summary']['entropy_final'] for e in groups[m]):.4f}"
        for m in ("vanilla", kpo)
    )
    holds = "holds" if all(van) and all(kept) else "does not hold"
    return _claim(
        title,
        f"{holds}: vanilla's final entropy fell to at most {frac:g} of its first in {sum(van)}/{len(van)} seeds, "
        f"{kpo}'s stayed above that in {sum(kept)}/{len(kept)}. Entropy per token, first -> final (mean over "
        f"seeds): {detail}.",
    )


def _table2_claim(table2) -> str:
    title = "Table 2: filtering lengthens runs and removes switching"
    if not table2:
        return _claim(title, "not tested: no method has off-policy ratio dumps (Table 2 says why)")
    parts, ok = [], []
    runlen = ("runlen_up", "runlen_down", "runlen_on")
    for m, s in table2.items():
        # Mean over the states that occur: after filtering a state may have no run at all (NaN).
        run_before = float(np.nanmean([s["before"][k] for k in runlen]))
        run_after = float(np.nanmean([s["after"][k] for k in runlen]))
        ok.append(run_after > run_before and s["after"]["switch_freq"] < s["before"]["switch_freq"])
        parts.append(
            f"{m}: mean run length {run_before:.2f} -> {run_after:.2f}, switch frequency "
            f"{s['before']['switch_freq']:.3f} -> {s['after']['switch_freq']:.3f}"
        )
    return _claim(title, f"{'holds' if all(ok) else 'does not hold'}: {'; '.join(parts)}.")


def _figure4_claim(sweep) -> str:
    """``sweep``: point -> {"memory": tokens, "final": (mean, std), ...}."""
    title = "Figure 4: a longer filter memory (smaller Q/V) gives higher reward"
    if not sweep:
        return _claim(title, "not tested: no memory sweep (--sweep-memory '')")
    if len(sweep) == 1:
        return _claim(
            title, "not tested: --sweep-memory has one point (give two or more, e.g. 8,matched,paper)"
        )
    points = sorted(sweep, key=lambda p: sweep[p]["memory"])
    finals = [sweep[p]["final"][0] for p in points]
    # Non-decreasing in memory, and not flat: the longest memory must beat the shortest.
    monotone = all(a <= b for a, b in zip(finals, finals[1:])) and finals[-1] > finals[0]
    listing = ", ".join(f"memory {sweep[p]['memory']:.4g} ({p}): {f:.3f}" for p, f in zip(points, finals))
    return _claim(title, f"{'holds' if monotone else 'does not hold'}: final training reward {listing}.")


def _claims(labels, groups, results, baselines, table2, sweep, subject: str) -> list[str]:
    """One line per claim, in the order of the paper's sections: its verdict with numbers, or why it is not
    tested on this comparison (a method missing from --methods, no dumps, no sweep)."""
    return [
        *_decision_claims(labels, subject, results, baselines),
        _figure3_claim(labels, groups, subject),
        _entropy_claim(labels, groups, subject),
        _table2_claim(table2),
        _figure4_claim(sweep),
    ]


def _sweep_table(cfg, members, loaded, key) -> tuple[str, dict]:
    """The Figure 4 table: per sweep point its memory in tokens, Q/V, final training reward and held-out avg@n."""
    from kpo.filter.memory import filter_memory
    from kpo.losses.kpo import filter_settings
    from kpo.train.config import TrainConfig

    lines = [
        "| point | memory (tokens) | Q/V | seeds | train reward final | held-out " + key + " |",
        "|---|---|---|---|---|---|",
    ]
    sweep = {}
    for point, rs in members.items():
        entries = [loaded[r] for r in rs]
        config = TrainConfig.from_yaml(entries[0]["dir"] / "config.yaml")
        q = filter_settings("kpo", config.resolved_loss_kwargs())["q"]
        memory = filter_memory(q)
        sweep[point] = {
            "memory": memory,
            "q": q,
            "final": _mean_std([e["summary"]["final"] for e in entries]),
            key: _mean_std([e["eval"][key] for e in entries]),
        }
    for point in sorted(sweep, key=lambda p: sweep[p]["memory"]):
        row = sweep[point]
        lines.append(
            f"| {point} | {row['memory']:.4g} | {row['q']:.3g} | {len(members[point])} | "
            f"{_fmt(*row['final'], digits=3)} | {_fmt(*row[key], scale=100)} |"
        )
    return "\n".join(lines), sweep


def _load_groups(cfg, runs, out: Path) -> tuple[dict, dict, dict[int, dict]]:
    """(run -> its loaded entry, arm label -> its entries by seed, seed -> its warm start's evaluation) of the
    finished ``runs`` of comparison ``cfg`` in ``out``."""
    from kpo.compare.plan import arms, warm_start_dir

    loaded = {run: _load_run(run, out) for run in runs}
    groups = {a.label: [loaded[r] for r in runs if r.arm == a.label and r.seed < a.seeds] for a in arms(cfg)}
    warm_by_seed = {
        s: _load_eval(warm_start_dir(out, s))
        for s in range(cfg.seeds)
        if (warm_start_dir(out, s) / "eval.json").exists()
    }
    return loaded, groups, warm_by_seed


def looks_decided(cfg, runs, out: Path, taken: tuple[int, ...]) -> bool:
    """Whether a sequential compare stops after its looks ``taken`` (the key arms' seeds; ``runs``: those of the
    last, all finished): every key contrast decided (:func:`_decide`)."""
    from kpo.compare.plan import at_look, looks

    _, groups, warm = _load_groups(at_look(cfg, taken[-1]), runs, Path(out))
    return _decide(_looked(cfg, groups, warm, taken), len(looks(cfg)) > 1)[1]


def write_report(cfg, runs, out: Path, taken: tuple[int, ...] | None = None) -> Path:
    """Write ``report.md``, ``report.json`` and the figures into ``out``; returns the markdown path. ``taken``:
    the key arms' seeds at each look taken (``--max-seeds``; ``runs`` are those of the last), None for one
    look at ``cfg.seeds``."""
    from kpo.compare.plan import Run, arms, at_look, looks, subject, sweep_runs

    out = Path(out)
    scheduled = looks(cfg)
    taken = taken or scheduled[:1]
    full, cfg = cfg, at_look(cfg, taken[-1])
    loaded, groups, warm_by_seed = _load_groups(cfg, runs, out)
    plan = arms(cfg)
    labels = [a.label for a in plan]
    warm = list(warm_by_seed.values())
    exact = all(e["outcome"]["exact"] for e in [*loaded.values(), *warm])
    method, kwargs = subject(cfg)
    subject_label = Run(method, 0, kwargs).arm
    baselines = [a.label for a in plan if a.role == "key" and a.method not in KALMAN_LOSSES]
    results, stopped = _decide(_looked(full, groups, warm_by_seed, taken), len(scheduled) > 1)
    looks_md, looked = (
        _looks_section(results, scheduled, taken, stopped) if len(scheduled) > 1 else ([], None)
    )
    if len(warm) == cfg.seeds:
        for a in plan:
            if a.role == "key":
                results[f"{a.label} - warm start"] = {"kind": "warm", **_contrast(groups[a.label], warm, {})}
    planned = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else {}
    fig3 = plot_training_dynamics(
        {label: [e["rows"] for e in groups[label]] for label in labels},
        out / "figure3_dynamics.png",
        smooth=CLAIM_RULES["smooth"],
    )
    between_arms = any(c["kind"] != "warm" for c in results.values())
    fig_contrasts = _plot_contrasts(results, out / "contrasts.png") if between_arms else None
    table1_md, table1 = _table1(labels, groups, warm_by_seed, exact)
    sweep, fig4, sweep_md = {}, None, ""
    members = sweep_runs(cfg)
    if members:
        fig4 = plot_training_dynamics(
            {f"memory {p}": [loaded[r]["rows"] for r in rs] for p, rs in members.items()},
            out / "figure4_memory_sweep.png",
            smooth=CLAIM_RULES["smooth"],
        )
        sweep_md, sweep = _sweep_table(cfg, members, loaded, table1["avg_key"])
    table2_md, table2 = _table2(labels, groups, out)
    claims = _claims(labels, groups, results, baselines, table2, sweep, subject_label)

    first = groups[labels[0]][0]
    train_cfg = (first["dir"] / "config.yaml").read_text()
    metric = (
        "exact expected held-out accuracy (the probability that a sample is right: one teacher-forced forward, "
        "no sampling noise)"
        if exact
        else first["outcome"]["metric"]
    )
    interval_text, interval_column = "95% Student-t interval", "95% paired interval"
    if looked:  # a key contrast's interval is at the level of the look it was last read at
        interval_text = "paired intervals at 95%, a key contrast's at 1 - alpha_k of its last look (Looks, below)"
        interval_column = "paired interval"
    md = [
        "# kpo compare report",
        "",
        f"Arms: {', '.join(f'{a.label} ({a.seeds} seeds)' for a in plan)}; {cfg.steps} optimizer steps per run, "
        f"{cfg.minibatches} per generation batch; evaluation on {first['problems']} held-out problems x "
        f"{cfg.eval_n} samples. Every run uses its method's paper hyperparameters; nothing is tuned per method "
        f"(KPO's memory=matched is the paper's memory-to-length ratio at this task's length). The arms of a seed "
        f"share its warm start, its RL prompt stream (the A/A replica: another RL seed) and its evaluation "
        f"samples. Runs and logs: `runs/`.",
        "",
        "## Claims",
        "",
        *claims,
        "",
        f"## Paired contrasts ({metric}; {interval_text}{'' if looked else ' over seed pairs'})",
        "",
        "Planned half-widths are what `kpo compare` printed before the runs (`plan.json`, from a paired-difference "
        f"sd of {planned.get('diff_sd', float('nan')):.1f} points); per-seed sd is what this compare measured "
        "(pass this report.json as `--pilot` to plan the next one with it).",
        "",
        _contrast_table(results, planned.get("contrasts", {}), interval_column)
        if results
        else "No contrast: one arm only.",
        "",
        *([f"![paired contrasts]({fig_contrasts.name})", ""] if fig_contrasts else []),
        *looks_md,
        f"## Figure 3 analog: training dynamics ({CLAIM_RULES['smooth']}-step trailing means; mean over seeds, "
        "band = min-max)",
        "",
        f"![training dynamics]({fig3.name})",
        "",
        "## Table 1 analog: held-out accuracy (%, mean ± std over seeds; the interval is a 95% bootstrap over "
        "problems and seeds)",
        "",
        table1_md,
        "",
    ]
    if fig4 is not None:
        md += [
            f"## Figure 4 analog: KPO with different filter memories ({CLAIM_RULES['smooth']}-step trailing "
            "means; mean over seeds, band = min-max)",
            "",
            f"![memory sweep]({fig4.name})",
            "",
            sweep_md,
            "",
        ]
    md += [
        "## Table 2 analog: token dynamics of the off-policy mini-batches' ratios",
        "",
        "Rows pool every dumped off-policy mini-batch of a method's runs. Before filtering a token is 'on' only if "
        "its ratio is exactly 1; after filtering (the run's own filter for KPO, KPO's paper filter Q=1e-6, V=1 "
        "for the others) the 'on' band is [1-3e-4, 1+4e-4].",
        "",
        table2_md,
        "",
        "## Claim rules",
        "",
        *(f"- `{k}` = {v}" for k, v in CLAIM_RULES.items()),
        "",
        "## Training config of the first run",
        "",
        "```yaml",
        train_cfg.rstrip(),
        "```",
        "",
    ]
    path = out / "report.md"
    with replacing(path) as partial:
        partial.write_text("\n".join(md))
    with replacing(out / "report.json") as partial:  # --pilot reads it
        partial.write_text(
            json.dumps(
                {
                    "table1": table1,
                    "contrasts": results,
                    "table2": table2,
                    "sweep": sweep,
                    "claims": claims,
                    **({"looks": looked} if looked else {}),
                },
                indent=2,
                default=float,
            )
            + "\n"
        )
    return path
