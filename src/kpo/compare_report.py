"""The report of ``kpo compare``: the paper's Figure 3, Table 1, Figure 4 and Table 2 on the runs of one
comparison, and a "claims" section that tests each of the paper's claims on them and says plainly whether it
holds here.

Claim tests (fixed before looking at any run; the thresholds are in ``CLAIM_RULES``):
- Table 1: KPO (clipped) has the highest mean held-out avg@n of all methods.
- Figure 3: vanilla GRPO collapses (its final reward ends ``collapse_drop`` or more below its peak) while KPO keeps
  rising (its final reward is within ``rise_tolerance`` of its peak and above its first steps' reward).
- Table 2: filtering lengthens runs (mean run length of the three states) and removes switching (switch frequency).
- Figure 4: a smaller Q/V gives a higher final training reward (monotone over the sweep).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from kpo.diagnostics import STAT_KEYS
from kpo.plots import load_metrics, plot_training_dynamics

__all__ = ["CLAIM_RULES", "write_report", "reward_summary"]

CLAIM_RULES = {
    "smooth": 5,  # steps of the trailing mean of the figures' curves, and the least window of first/peak/final
    "final_frac": 0.1,  # first/peak/final reward: means over windows of 10% of the steps (at least `smooth`)
    "collapse_drop": 0.1,  # collapse: final reward at least this far below the smoothed peak
    "rise_tolerance": 0.02,  # still rising: final within this of the smoothed peak
}
# Table 2 statistics less prop_up/prop_down (prop_on says how much of a response is off-policy).
TABLE2_KEYS = tuple(k for k in STAT_KEYS if k not in ("prop_up", "prop_down"))


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


def _load_run(run, out: Path) -> dict:
    """A finished run: its metrics rows, held-out results (macro) and reward summary."""
    folder = out / "runs" / run.name
    rows = load_metrics(folder / "metrics.jsonl")
    results = json.loads((folder / "eval.json").read_text())
    return {
        "run": run,
        "dir": folder,
        "rows": rows,
        "eval": results["macro"],
        "problems": sum(b["problems"] for b in results["benchmarks"].values()),
        "summary": reward_summary(rows),
    }


def _table1(methods, groups) -> tuple[str, dict]:
    eval_keys = [k for k in next(iter(groups[methods[0]]))["eval"] if "@" in k]
    header = ["method", "seeds", *eval_keys, "mean len (tok)", "train reward first", "train reward final"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    stats = {}
    for m in methods:
        entries = groups[m]
        row = {k: _mean_std([e["eval"][k] for e in entries]) for k in [*eval_keys, "mean_response_tokens"]}
        row["first"] = _mean_std([e["summary"]["first"] for e in entries])
        row["final"] = _mean_std([e["summary"]["final"] for e in entries])
        stats[m] = row
        cells = [
            m,
            str(len(entries)),
            *(_fmt(*row[k], scale=100) for k in eval_keys),
            _fmt(*row["mean_response_tokens"]),
            _fmt(*row["first"], digits=3),
            _fmt(*row["final"], digits=3),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), {"eval_keys": eval_keys, "rows": stats}


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


def _table1_claim(methods, table1) -> str:
    key = next((k for k in table1["eval_keys"] if k.startswith("avg@")), table1["eval_keys"][0])
    title = f"Table 1: KPO has the best held-out {key}"
    if (why := _missing_methods(methods, ("kpo",))) is not None:
        return _claim(title, why)
    if len(methods) == 1:
        return _claim(title, "not tested: kpo is the only method (add another, e.g. --methods kpo,vanilla)")
    means = {m: table1["rows"][m][key][0] for m in methods}
    # Ties are broken by name, never by the order of --methods; "holds" needs KPO strictly above the rest.
    rival = max(sorted(m for m in methods if m != "kpo"), key=means.get)
    kpo_m, kpo_s = table1["rows"]["kpo"][key]
    riv_m, riv_s = table1["rows"][rival][key]
    best = ", ".join(sorted(m for m in methods if means[m] == max(means.values())))
    tied = sorted(m for m in methods if m != "kpo" and means[m] == kpo_m)
    verdict = (
        "holds"
        if kpo_m > riv_m
        else f"does not hold (kpo ties with {', '.join(tied)})"
        if kpo_m == riv_m
        else "does not hold"
    )
    if not (np.isfinite(kpo_s) and np.isfinite(riv_s)):
        noise = " (this rests on one seed: the spread across seeds is unknown; use --seeds 2 or more)"
    elif abs(kpo_m - riv_m) <= max(kpo_s, riv_s):
        noise = " (the gap is within one standard deviation across seeds)"
    else:
        noise = ""
    return _claim(
        title,
        f"{verdict}: kpo {100 * kpo_m:.1f}, best other ({rival}) {100 * riv_m:.1f}; best overall: {best}{noise}.",
    )


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
    title = "Figure 4: smaller Q/V gives higher reward"
    if not sweep:
        return _claim(title, "not tested: no Q/V sweep (--sweep-q '')")
    if len(sweep) == 1:
        return _claim(
            title, "not tested: --sweep-q has one Q value (give two or more, e.g. --sweep-q 1e-6,1e-2)"
        )
    qs = sorted(sweep)
    finals = [sweep[q]["final"][0] for q in qs]
    # Non-increasing in Q, and not flat: the smallest Q must beat the largest.
    monotone = all(a >= b for a, b in zip(finals, finals[1:])) and finals[0] > finals[-1]
    listing = ", ".join(f"Q/V={q:g}: {f:.3f}" for q, f in zip(qs, finals))
    return _claim(title, f"{'holds' if monotone else 'does not hold'}: final training reward {listing}.")


def _claims(methods, groups, table1, table2, sweep) -> list[str]:
    """One line per claim, in the order of the paper's sections: its verdict with numbers, or why it is not
    tested on this comparison (a method missing from --methods, no dumps, no sweep)."""
    return [
        _table1_claim(methods, table1),
        _figure3_claim(methods, groups),
        _table2_claim(table2),
        _figure4_claim(sweep),
    ]


def write_report(cfg, runs, out: Path) -> Path:
    """Write ``report.md``, ``report.json`` and the figures into ``out``; returns the markdown path."""
    from kpo.compare import sweep_runs

    out = Path(out)
    loaded = {run: _load_run(run, out) for run in runs}
    methods = list(cfg.methods)
    groups = {m: [loaded[r] for r in runs if r.method == m and not r.loss_kwargs] for m in methods}
    fig3 = plot_training_dynamics(
        {m: [e["rows"] for e in groups[m]] for m in methods},
        out / "figure3_dynamics.png",
        smooth=CLAIM_RULES["smooth"],
    )
    table1_md, table1 = _table1(methods, groups)
    sweep, fig4, sweep_md = {}, None, ""
    members = sweep_runs(cfg)
    if members:
        fig4 = plot_training_dynamics(
            {f"Q/V={q:g}": [loaded[r]["rows"] for r in rs] for q, rs in members.items()},
            out / "figure4_qv_sweep.png",
            smooth=CLAIM_RULES["smooth"],
        )
        key = table1["eval_keys"][0]
        lines = ["| Q/V | seeds | train reward final | held-out " + key + " |", "|---|---|---|---|"]
        for q, rs in sorted(members.items()):
            entries = [loaded[r] for r in rs]
            sweep[q] = {
                "final": _mean_std([e["summary"]["final"] for e in entries]),
                key: _mean_std([e["eval"][key] for e in entries]),
            }
            lines.append(
                f"| {q:g} | {len(entries)} | {_fmt(*sweep[q]['final'], digits=3)} | {_fmt(*sweep[q][key], scale=100)} |"
            )
        sweep_md = "\n".join(lines)
    table2_md, table2 = _table2(methods, groups, out)
    claims = _claims(methods, groups, table1, table2, sweep)

    first = groups[methods[0]][0]
    train_cfg = (first["dir"] / "config.yaml").read_text()
    md = [
        "# kpo compare report",
        "",
        f"Methods {', '.join(methods)}; {cfg.seeds} seed(s); {cfg.minibatches} optimizer steps per generation "
        f"batch; evaluation on {first['problems']} held-out problems x {cfg.eval_n} samples. Every run uses its "
        "method's paper hyperparameters; nothing is tuned per method. Runs and logs: `runs/`.",
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
        "## Table 1 analog: held-out accuracy (%, mean ± std over seeds)",
        "",
        table1_md,
        "",
    ]
    if fig4 is not None:
        md += [
            f"## Figure 4 analog: KPO with different Q/V ({CLAIM_RULES['smooth']}-step trailing means; mean over "
            "seeds, band = min-max)",
            "",
            f"![Q/V sweep]({fig4.name})",
            "",
            sweep_md,
            "",
        ]
    md += [
        "## Table 2 analog: token dynamics of the off-policy mini-batches' ratios",
        "",
        "Rows pool every dumped off-policy mini-batch of a method's runs. Before filtering a token is 'on' only if "
        "its ratio is exactly 1; after filtering (kpo's filter at Q=1e-6, V=1 unless the run used other values) "
        "the 'on' band is [1-3e-4, 1+4e-4].",
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
    (out / "report.json").write_text(json.dumps(
        {"table1": table1, "table2": table2, "sweep": {str(q): v for q, v in sweep.items()}, "claims": claims},
        indent=2, default=float) + "\n")  # fmt: skip
    return path
