"""The files ``kpo analyze`` writes: tables (markdown and JSON), figures and ``report.md``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from kpo.analysis.compute import PAPER_TABLE2, AnalyzeConfig, compute
from kpo.analysis.dumps import Dump
from kpo.diagnostics import run_lengths, window_stats

COLUMNS = {
    "prop_up": "prop up",
    "prop_down": "prop down",
    "prop_on": "prop on",
    "runlen_up": "run-len up",
    "runlen_down": "run-len down",
    "runlen_on": "run-len on",
    "switch_freq": "switch freq",
    "lfr": "LFR",
    "global_var": "glob. var",
    "local_var": "win. loc. var",
}


def analyze(dumps: list[Dump], cfg: AnalyzeConfig, out: str | Path) -> dict:
    """Run the whole analysis on ``dumps`` and write every output into ``out``; returns the results dict."""
    from kpo.analysis import plots

    a = compute(dumps, cfg)
    results, z, m, filt = a.results, a.z, a.m, a.filt
    before, after, after_label = results["before"], results["after"], results["after_label"]
    sweep, v_sweep = results["sweep"]["rows"], results["sweep"]["v"]
    n = m.sum(axis=1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(
        [
            ("Before KF (exact on, r = 1)", before),
            (f"{after_label}, on band [1-{cfg.eps_low:g}, 1+{cfg.eps_high:g}]", after),
            ("Paper before KF (Qwen3-4B, GRPO step 100)", PAPER_TABLE2["before"]),
            ("Paper after KF", PAPER_TABLE2["after"]),
        ]
    )
    (out / "table2.md").write_text(table)
    table2 = {k: v for k, v in results.items() if k != "sweep"}
    (out / "table2.json").write_text(json.dumps(jsonable(table2), indent=2) + "\n")
    sweep_rows = [("Before KF (exact on)", before)] + [
        (f"Q/V = {plots.qv_label(r['q_over_v'])} (Q={r['q']:g}, V={v_sweep:g})", r) for r in sweep
    ]
    (out / "sweep.md").write_text(markdown_table(sweep_rows))
    sweep_json = {
        **results["sweep"],
        "eps_low": cfg.eps_low,
        "eps_high": cfg.eps_high,
        "before": before,
    }
    (out / "sweep.json").write_text(json.dumps(jsonable(sweep_json), indent=2) + "\n")

    examples = np.lexsort((np.arange(len(n)), -n))[: cfg.examples]
    examples = examples[n[examples] > 0]
    figures = {
        "figure1_traces.png": plots.traces(
            z[examples],
            filt[examples],
            m[examples],
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            title=after_label,
        ),
        "figure1_dynamics.png": plots.dynamics(
            window_before=window_stats(z, m, window=cfg.window, max_windows=cfg.max_windows),
            window_after=window_stats(
                filt,
                m,
                eps_low=cfg.eps_low,
                eps_high=cfg.eps_high,
                window=cfg.window,
                max_windows=cfg.max_windows,
            ),
            runs_before=run_lengths(z, m),
            runs_after=run_lengths(filt, m, eps_low=cfg.eps_low, eps_high=cfg.eps_high),
            switch_before=a.per_before["switch_freq"],
            switch_after=a.per_after["switch_freq"],
            window=cfg.window,
        ),
        "figure4_sweep.png": plots.sweep(before, sweep),
    }
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=110)
    (out / "report.md").write_text(_report(results, table, markdown_table(sweep_rows), figures, cfg))
    return results


def _fmt(key: str, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if key.endswith("_var"):
        return f"{value:.2e}"
    if key.startswith("runlen"):
        return f"{value:.2f}"
    return f"{value:.3f}"


def markdown_table(rows: list[tuple[str, dict]]) -> str:
    head = "| | " + " | ".join(COLUMNS.values()) + " |\n"
    head += "|---|" + "---:|" * len(COLUMNS) + "\n"
    body = "".join(f"| {label} | " + " | ".join(_fmt(k, s[k]) for k in COLUMNS) + " |\n" for label, s in rows)
    return head + body


def jsonable(obj):
    """NaN -> None (strict JSON), numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _report(results: dict, table: str, sweep_table: str, figures: dict, cfg: AnalyzeConfig) -> str:
    inp = results["inputs"]
    lines = [
        "# Token dynamics of importance ratios (kpo analyze)",
        "",
        f"{inp['samples']} samples, {inp['valid_tokens']} valid tokens from {len(inp['files'])} dump(s):",
        "",
    ]
    for r in inp["files"]:
        lines.append(
            f"- `{r['file']}` (step {r['step']}): {r['rows_used']}/{r['rows']} rows used, {r['empty_rows']} empty, "
            f"{r['on_policy_rows']} on-policy; filtered: {r['filtered']} "
            f"(Q={r['q']:g}, V={r['v']:g}, mask_mode {r['mask_mode']})"
            + (f"; loss {r['loss']}" if r["loss"] else "")
        )
    if inp["on_policy_rows"] and not cfg.off_policy_only:
        lines += [
            "",
            f"Note: {inp['on_policy_rows']} on-policy rows are included; the paper uses off-policy samples only "
            "(rerun with `--off-policy-only`).",
        ]
    lines += [
        "",
        "## Table 2: before and after Kalman filtering",
        "",
        f"Window {cfg.window}, k_c = floor({cfg.lf_cutoff:g} n), LFR and variances of the {cfg.signal}. "
        "Every value is a per-sample statistic averaged over samples (definitions: `kpo.diagnostics`).",
        "",
        table,
    ]
    if results["per_dump"]:
        lines += [
            "### Per dump",
            "",
            "| file | step | samples | "
            + " | ".join(f"{COLUMNS[k]} before / after" for k in ("prop_on", "switch_freq", "lfr"))
            + " |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in results["per_dump"]:
            cells = " | ".join(
                f"{_fmt(k, r['before'][k])} / {_fmt(k, r['after'][k])}"
                for k in ("prop_on", "switch_freq", "lfr")
            )
            lines.append(f"| `{Path(r['file']).name}` | {r['step']} | {r['rows_used']} | {cells} |")
        lines.append("")
    lines += [
        "## Figure 4 (offline): the same statistics after filtering at each Q/V",
        "",
        f"mask_mode {results['sweep']['mask_mode']}, on band [1-{cfg.eps_low:g}, 1+{cfg.eps_high:g}].",
        "",
        sweep_table,
        "![Q/V sweep](figure4_sweep.png)",
        "",
        "## Figure 1",
        "",
        "![traces](figure1_traces.png)",
        "",
        "![dynamics](figure1_dynamics.png)",
        "",
        "Files: "
        + ", ".join(f"`{f}`" for f in ["table2.md", "table2.json", "sweep.md", "sweep.json", *figures]),
        "",
    ]
    return "\n".join(lines)
