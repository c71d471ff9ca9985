"""The report of ``kpo compare``: the design, the paired contrasts that decide, the paper's Figure 3, Table 1,
Figure 4 and Table 2 on the runs of one comparison, and a "claims" section that says plainly whether each of the
paper's claims holds here.

The rules it reads the claims by are :data:`kpo.compare.claims.CLAIM_RULES`; the paired contrasts are
:mod:`kpo.compare.contrasts`.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from kpo._files import replacing, write_json
from kpo.compare.claims import CLAIM_RULES, paper_claims
from kpo.compare.contrasts import collapsed, contrast, contrast_table, decide, plot_contrasts
from kpo.compare.outcome import EVAL_FILE, load_outcome, read_evaluation
from kpo.compare.plan import Arm, arms, contrasts, subject, sweep_runs, warm_start_dir
from kpo.compare.stats import collapse_count
from kpo.diagnostics import STAT_KEYS
from kpo.evaluation.metrics import bootstrap_avg_ci
from kpo.losses.kpo import KALMAN_LOSSES
from kpo.train.metrics import load_metrics
from kpo.train.plots import plot_training_dynamics

__all__ = ["reward_summary", "write_report"]

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
    results = read_evaluation(folder / EVAL_FILE)
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
        fell = [collapsed(e, warm_by_seed.get(s)) for s, e in enumerate(entries)] if trained else []
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


def _note_row(method: str, note: str, columns: int) -> str:
    """A table row of ``columns`` cells that says, in place of numbers, why ``method`` has none."""
    return f"| {method} | {note} |" + " |" * (columns - 2)


def _table2(methods, groups) -> tuple[str, dict]:
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


def _sweep_table(members, loaded, key) -> tuple[str, dict]:
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
    loaded = {run: _load_run(run, out) for run in runs}
    groups = {a.label: [loaded[r] for r in runs if r.arm == a.label and r.seed < a.seeds] for a in arms(cfg)}
    warm_by_seed = {
        s: _load_eval(warm_start_dir(out, s))
        for s in range(cfg.seeds)
        if (warm_start_dir(out, s) / EVAL_FILE).exists()
    }
    return loaded, groups, warm_by_seed


def write_report(cfg, runs, out: Path) -> Path:
    """Write ``report.md``, ``report.json`` and the figures into ``out``; returns the markdown path."""
    out = Path(out)
    loaded, groups, warm_by_seed = _load_groups(cfg, runs, out)
    plan = arms(cfg)
    labels = [a.label for a in plan]
    warm = list(warm_by_seed.values())
    exact = all(e["outcome"]["exact"] for e in [*loaded.values(), *warm])
    subject_label = Arm(*subject(cfg)).label
    baselines = [a.label for a in plan if a.role == "key" and a.method not in KALMAN_LOSSES]
    results = decide({
        c.name: {"kind": c.kind, **contrast(groups[c.a][: c.seeds], groups[c.b][: c.seeds], warm_by_seed)}
        for c in contrasts(cfg)
    })
    if len(warm) == cfg.seeds:
        for a in plan:
            if a.role == "key":
                results[f"{a.label} - warm start"] = {"kind": "warm", **contrast(groups[a.label], warm, {})}
    planned = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else {}
    fig3 = plot_training_dynamics(
        {label: [e["rows"] for e in groups[label]] for label in labels},
        out / "figure3_dynamics.png",
        smooth=CLAIM_RULES["smooth"],
    )
    between_arms = any(c["kind"] != "warm" for c in results.values())
    fig_contrasts = plot_contrasts(results, out / "contrasts.png") if between_arms else None
    table1_md, table1 = _table1(labels, groups, warm_by_seed, exact)
    sweep, fig4, sweep_md = {}, None, ""
    members = sweep_runs(cfg)
    if members:
        fig4 = plot_training_dynamics(
            {f"memory {p}": [loaded[r]["rows"] for r in rs] for p, rs in members.items()},
            out / "figure4_memory_sweep.png",
            smooth=CLAIM_RULES["smooth"],
        )
        sweep_md, sweep = _sweep_table(members, loaded, table1["avg_key"])
    table2_md, table2 = _table2(labels, groups)
    claims = paper_claims(labels, groups, results, baselines, table2, sweep, subject_label)

    first = groups[labels[0]][0]
    train_cfg = (first["dir"] / "config.yaml").read_text()
    metric = (
        "exact expected held-out accuracy (the probability that a sample is right: one teacher-forced forward, "
        "no sampling noise)"
        if exact
        else first["outcome"]["metric"]
    )
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
        f"## Paired contrasts ({metric}; 95% Student-t interval over seed pairs)",
        "",
        "Planned half-widths are what `kpo compare` printed before the runs (`plan.json`, from a paired-difference "
        f"sd of {planned.get('diff_sd', float('nan')):.1f} points); per-seed sd is what this compare measured "
        "(pass this report.json as `--pilot` to plan the next one with it).",
        "",
        contrast_table(results, planned.get("contrasts", {}))
        if results
        else "No contrast: one arm only.",
        "",
        *([f"![paired contrasts]({fig_contrasts.name})", ""] if fig_contrasts else []),
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
    found = {"table1": table1, "contrasts": results, "table2": table2, "sweep": sweep, "claims": claims}
    write_json(out / "report.json", found, indent=2, default=float)  # --pilot reads it
    return path
