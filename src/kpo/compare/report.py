"""The report of ``kpo compare``: the paper's Figure 3, Table 1, Figure 4 and Table 2 on the runs of one
comparison, and a "claims" section that tests each of the paper's claims on them and says plainly whether it
holds here.

Claim tests (fixed before looking at any run; the thresholds are in ``CLAIM_RULES``):
- Table 1: KPO (clipped; at the paper's Q/V, and at the length-matched memory, each tested on its own) is best:
  the 95% interval of its held-out avg@n minus each baseline's (vanilla, GSPO, GMPO: every method without a
  filter) lies above 0 for every baseline. The interval is a percentile bootstrap over the problems (shared by
  both sides) and the seeds (``kpo.evaluation.metrics.bootstrap_diff_ci``); which mean is highest decides nothing.
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

from kpo.diagnostics import STAT_KEYS
from kpo.evaluation.metrics import bootstrap_avg_ci, bootstrap_diff_ci
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
    "ci_level": 0.95,  # Table 1: the bootstrap interval of the avg@n difference must lie above 0
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


def _load_eval(path: Path) -> dict:
    """A held-out evaluation: macro metrics, problem count and per-problem correct counts (all benchmarks)."""
    results = json.loads(path.read_text())
    return {
        "eval": results["macro"],
        "n": results["params"]["n"],
        "problems": sum(b["problems"] for b in results["benchmarks"].values()),
        "counts": [p["correct"] for b in results["benchmarks"].values() for p in b["per_problem"]],
    }


def _load_run(run, out: Path) -> dict:
    """A finished run: its metrics rows, held-out results and reward summary."""
    folder = out / "runs" / run.name
    rows = load_metrics(folder / "metrics.jsonl")
    return {
        "run": run,
        "dir": folder,
        "rows": rows,
        "summary": reward_summary(rows),
        **_load_eval(folder / "eval.json"),
    }


def _table1(labels, groups, warm: list[dict]) -> tuple[str, dict]:
    """Held-out accuracy per arm, the warm start first: mean ± std over seeds and the 95% bootstrap interval
    (over seeds and problems) of avg@n, pass@k, response length, training reward."""
    eval_keys = [k for k in next(iter(groups[labels[0]]))["eval"] if "@" in k]
    avg_key = next(k for k in eval_keys if k.startswith("avg@"))
    header = [
        "method",
        "seeds",
        *eval_keys,
        f"{avg_key} 95% CI",
        "mean len (tok)",
        "train reward first",
        "train reward final",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    stats = {}
    rows = [(WARM_START_LABEL, warm)] if warm else []
    for label, entries in [*rows, *((m, groups[m]) for m in labels)]:
        row = {k: _mean_std([e["eval"][k] for e in entries]) for k in [*eval_keys, "mean_response_tokens"]}
        trained = label != WARM_START_LABEL
        row["first"] = _mean_std([e["summary"]["first"] for e in entries]) if trained else (np.nan, np.nan)
        row["final"] = _mean_std([e["summary"]["final"] for e in entries]) if trained else (np.nan, np.nan)
        row["ci95"] = bootstrap_avg_ci([e["counts"] for e in entries], entries[0]["n"])
        stats[label] = row
        cells = [
            label,
            str(len(entries)),
            *(_fmt(*row[k], scale=100) for k in eval_keys),
            f"[{100 * row['ci95'][0]:.1f}, {100 * row['ci95'][1]:.1f}]",
            _fmt(*row["mean_response_tokens"]),
            _fmt(*row["first"], digits=3) if trained else "-",
            _fmt(*row["final"], digits=3) if trained else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), {"eval_keys": eval_keys, "avg_key": avg_key, "rows": stats}


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


def _table1_claims(labels, groups, table1, warm: list[dict]) -> list[str]:
    """One claim per KPO-clipped arm: the bootstrap interval of its avg@n minus each baseline's lies above 0."""
    key = table1["avg_key"]
    title = f"Table 1: KPO has the best held-out {key}"
    # sorted: the verdict and its text never depend on the order of --methods
    kpo_arms = sorted(label for label in labels if label.split(" ")[0] == "kpo")
    baselines = sorted(label for label in labels if label.split(" ")[0] not in KALMAN_LOSSES)
    if not kpo_arms:
        return [_claim(title, _missing_methods(labels, ("kpo",)))]
    if not baselines:
        return [
            _claim(
                title, "not tested: no baseline without a filter in --methods (add e.g. vanilla,gspo,gmpo)"
            )
        ]
    level = CLAIM_RULES["ci_level"]
    claims = []
    for arm in kpo_arms:
        parts, above = [], []
        # the baselines decide; the other filtered arms are listed beside them
        for base in [
            *baselines,
            *sorted(label for label in labels if label not in baselines and label != arm),
        ]:
            mean, low, high = bootstrap_diff_ci(
                [e["counts"] for e in groups[arm]],
                [e["counts"] for e in groups[base]],
                groups[arm][0]["n"],
                level=level,
            )
            if base in baselines:
                above.append(low > 0)
            parts.append(f"{base} {100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
        if warm:
            mean, low, high = bootstrap_diff_ci(
                [e["counts"] for e in groups[arm]], [e["counts"] for e in warm], warm[0]["n"], level=level
            )
            parts.append(f"warm start {100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
        seeds = len(groups[arm])
        verdict = "holds" if all(above) else "does not hold"
        one = " (one seed: the interval covers the problems only)" if seeds == 1 else ""
        claims.append(
            _claim(
                f"{title}: {arm}",
                f"{verdict}: {arm} minus each, avg@n points with {int(100 * level)}% bootstrap interval over problems "
                f"and seeds: {'; '.join(parts)}; above 0 for {sum(above)}/{len(above)} baselines{one}.",
            )
        )
    return claims


def _figure3_claim(methods, groups) -> str:
    title = "Figure 3: GRPO collapses while KPO keeps rising"
    if (why := _missing_methods(methods, ("vanilla", "kpo"))) is not None:
        return _claim(title, why)

    def collapsed(entry):
        s = entry["summary"]
        return s["final"] <= s["peak"] - CLAIM_RULES["collapse_drop"]

    def rising(entry):
        s = entry["summary"]
        return s["final"] >= s["peak"] - CLAIM_RULES["rise_tolerance"] and s["final"] > s["first"]

    van = [collapsed(e) for e in groups["vanilla"]]
    kpo = [rising(e) for e in groups["kpo"]]
    detail = "; ".join(
        f"{m}: first {statistics.fmean(e['summary']['first'] for e in groups[m]):.3f}, peak "
        f"{statistics.fmean(e['summary']['peak'] for e in groups[m]):.3f}, final "
        f"{statistics.fmean(e['summary']['final'] for e in groups[m]):.3f}, entropy "
        f"{statistics.fmean(e['summary']['entropy_first'] for e in groups[m]):.3f} -> "
        f"{statistics.fmean(e['summary']['entropy_final'] for e in groups[m]):.3f}"
        for m in methods
    )
    verdict = "holds" if all(van) and all(kpo) else "does not hold"
    return _claim(
        title,
        f"{verdict}: vanilla collapsed in {sum(van)}/{len(van)} seeds (final >= {CLAIM_RULES['collapse_drop']} "
        f"below peak), kpo still rising in {sum(kpo)}/{len(kpo)} seeds. Per method (mean over seeds): {detail}.",
    )


def _entropy_claim(methods, groups) -> str:
    title = "Figure 3: GRPO's entropy collapses while KPO's does not"
    if (why := _missing_methods(methods, ("vanilla", "kpo"))) is not None:
        return _claim(title, why)
    frac = CLAIM_RULES["entropy_collapse"]

    def collapsed(entry):
        s = entry["summary"]
        return s["entropy_final"] <= frac * s["entropy_first"]

    van = [collapsed(e) for e in groups["vanilla"]]
    kpo = [not collapsed(e) for e in groups["kpo"]]
    detail = "; ".join(
        f"{m}: {statistics.fmean(e['summary']['entropy_first'] for e in groups[m]):.4f} -> "
        f"{statistics.fmean(e['summary']['entropy_final'] for e in groups[m]):.4f}"
        for m in ("vanilla", "kpo")
    )
    verdict = "holds" if all(van) and all(kpo) else "does not hold"
    return _claim(
        title,
        f"{verdict}: vanilla's final entropy fell to at most {frac:g} of its first in {sum(van)}/{len(van)} seeds, "
        f"kpo's stayed above that in {sum(kpo)}/{len(kpo)}. Entropy per token, first -> final (mean over seeds): "
        f"{detail}.",
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


def _claims(labels, groups, table1, table2, sweep, warm) -> list[str]:
    """One line per claim, in the order of the paper's sections: its verdict with numbers, or why it is not
    tested on this comparison (a method missing from --methods, no dumps, no sweep)."""
    return [
        *_table1_claims(labels, groups, table1, warm),
        _figure3_claim(labels, groups),
        _entropy_claim(labels, groups),
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


def write_report(cfg, runs, out: Path) -> Path:
    """Write ``report.md``, ``report.json`` and the figures into ``out``; returns the markdown path."""
    from kpo.compare.plan import Run, arms, sweep_runs, warm_start_dir

    out = Path(out)
    loaded = {run: _load_run(run, out) for run in runs}
    labels = [Run(method, 0, kw).arm for method, kw in arms(cfg)]
    groups = {label: [loaded[r] for r in runs if r.arm == label and r.seed < cfg.seeds] for label in labels}
    warm = [
        _load_eval(warm_start_dir(out, s) / "eval.json")
        for s in range(cfg.seeds)
        if (warm_start_dir(out, s) / "eval.json").exists()
    ]
    fig3 = plot_training_dynamics(
        {label: [e["rows"] for e in groups[label]] for label in labels},
        out / "figure3_dynamics.png",
        smooth=CLAIM_RULES["smooth"],
    )
    table1_md, table1 = _table1(labels, groups, warm)
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
    claims = _claims(labels, groups, table1, table2, sweep, warm)

    first = groups[labels[0]][0]
    train_cfg = (first["dir"] / "config.yaml").read_text()
    warm_text = (
        " The warm-start row is each seed's starting model on the same problems and sample seeds."
        if warm
        else ""
    )
    md = [
        "# kpo compare report",
        "",
        f"Methods {', '.join(labels)}; {cfg.seeds} seed(s); {cfg.steps} optimizer steps per run, "
        f"{cfg.minibatches} per generation batch; evaluation on {first['problems']} held-out problems x "
        f"{cfg.eval_n} samples. Every run uses its method's paper hyperparameters; nothing is tuned per method "
        f"(KPO's memory=matched is the paper's memory-to-length ratio at this task's length). Runs and logs: "
        f"`runs/`.{warm_text}",
        "",
        "## Claims",
        "",
        *claims,
        "",
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
    path.write_text("\n".join(md))
    (out / "report.json").write_text(
        json.dumps(
            {"table1": table1, "table2": table2, "sweep": sweep, "claims": claims}, indent=2, default=float
        )
        + "\n"
    )
    return path
