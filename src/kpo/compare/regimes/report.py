"""The regime map's report: ``report.md`` (the questions and their answers first, then one table row per cell),
``report.json`` (``cells``, ``questions``, the plan), ``regimes.png`` (each cell's paired differences
with their seeds and collapses) and ``memory.png`` (KPO (auto)'s fitted memory over training in every cell), from
the cells :func:`kpo.compare.regimes.cell_entry` describes and the questions of
:func:`kpo.compare.regimes.answers`. Rewritten whole as each cell finishes."""

from __future__ import annotations

import statistics
from pathlib import Path

from kpo._files import replacing, write_json
from kpo.compare.contrasts import pyplot, save_figure
from kpo.compare.stats import MARGIN
from kpo.compare.study.report import look_detail

__all__ = ["answer_line", "contrast_text", "memory_labels", "render_map"]

PANELS = ("KPO (matched) - GRPO", "KPO (matched) - GSPO", "KPO (auto) - KPO (matched)", "KPO (matched) - clip band")


def _pct(x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"


def _accuracy(arm: dict | None) -> str:
    """mean ± sd of an arm's finished seeds (points), with how many when some are missing."""
    if arm is None:
        return "-"
    done = [a for a in arm["accuracy"] if a is not None]
    if not done:
        return "pending"
    text = f"{100 * statistics.fmean(done):.1f}"
    text += f" ± {100 * statistics.stdev(done):.1f}" if len(done) > 1 else ""
    return text if len(done) == len(arm["accuracy"]) else f"{text} ({len(done)}/{len(arm['accuracy'])})"


def _collapses(arm: dict | None) -> str:
    """k/n collapsed, with the exact 95% upper bound of the rate."""
    if arm is None or not arm["collapse"]["n"]:
        return "-"
    c = arm["collapse"]
    return f"{c['k']}/{c['n']} (≤{100 * c['upper95']:.0f}%)"


def contrast_text(c: dict | None) -> str:
    """A per-cell contrast: the mean (t) or median (sign test) difference in points, its interval where there is
    one, and its test."""
    if c is None:
        return "pending"
    if c["method"] == "t":
        if c["low"] is None:
            return f"{_pct(c['mean'], True)} (t)"
        return f"{_pct(c['mean'], True)} [{_pct(c['low'], True)}, {_pct(c['high'], True)}] (t)"
    interval = f" [{_pct(c['low'], True)}, {_pct(c['high'], True)}]" if c["low"] is not None else ""
    ties = f", {plural(c['ties'], 'pair')} both collapsed: ties" if c.get("ties") else ""
    return f"median {_pct(c['median'], True)}{interval} (sign p={c['p']:.2g}{ties})"


def plural(n: int, noun: str) -> str:
    """'1 pair', '2 pairs'."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def answer_line(a: dict) -> str:
    """One question: its lead (estimate, interval, unadjusted p) or why it has none."""
    if a["verdict"] != "lead":
        return f"- **{a['text']}** {a['verdict']}."
    look = a["look"]
    return f"- **{a['text']}** {look['test']}: {look_detail(a, look)}; p = {look['p']:.2g} (unadjusted: a lead)."


def _table(out: Path, entries: list[dict]) -> str:
    head = (
        "| cell | seeds | mismatch k3 | GRPO | GSPO | KPO (matched) | KPO (auto) | clip band | collapsed GRPO / GSPO / "
        "KPO / auto / band (≤ exact 95% bound) | KPO - GRPO | KPO - GSPO | auto - KPO | pick (not beaten) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        arms = {a["label"]: a for a in e["arms"].values()}
        kpo = arms.get("KPO (matched)", {})
        k3 = kpo.get("k3_kl")
        name = f"[{e['cell']}]({e['cell']}/report.md)" if (out / e["cell"] / "report.md").exists() else e["cell"]
        labels = ("GRPO", "GSPO", "KPO (matched)", "KPO (auto)", "clip band")
        c = e["contrasts"]
        pick = ", ".join(e["arms"][a]["label"] for a in e.get("pick", [])) or "-"
        lines.append(
            f"| {name} | {e['finished_seeds']}/{e['seeds']} | {'-' if k3 is None else f'{k3:.1e}'} | "
            + " | ".join(_accuracy(arms.get(label)) for label in labels)
            + " | "
            + " / ".join(_collapses(arms.get(label)) for label in labels)
            + f" | {contrast_text(c.get('KPO (matched) - GRPO'))} | {contrast_text(c.get('KPO (matched) - GSPO'))} | "
            f"{contrast_text(c.get('KPO (auto) - KPO (matched)'))} | {pick} |"
        )
    return "\n".join(lines)


def _plot(entries: list[dict], path: Path) -> Path:
    """Each cell a row, each contrast a panel: every seed's paired difference (points; hollow where a run of the
    pair collapsed) and the cell's estimate with its 95% interval where it has one."""
    plt = pyplot()

    rows = len(entries)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 0.55 * rows + 1.8), sharey=True)
    for ax, panel in zip(axes, PANELS, strict=True):
        ax.axvspan(-100 * MARGIN, 100 * MARGIN, color="0.93")
        ax.axvline(0, color="0.4", lw=0.8)
        for i, e in enumerate(entries):
            y = rows - 1 - i
            c = e["contrasts"].get(panel)
            if c is None:
                ax.text(0, y, "not run" if e["finished_seeds"] >= 2 else "pending", ha="center", va="center",
                        fontsize=7, color="0.5")
                continue
            color = "C0" if c["method"] == "t" else "C1"
            ax.scatter([100 * d for d in c["per_seed"]], [y] * len(c["per_seed"]), s=12, color=color, alpha=0.5)
            centre = c["mean"] if c["method"] == "t" else c["median"]
            if c["low"] is not None:
                ax.errorbar(100 * centre, y, xerr=[[100 * (centre - c["low"])], [100 * (c["high"] - centre)]],
                            fmt="o", color=color, capsize=3)
            else:
                ax.plot(100 * centre, y, "o", color=color)
        ax.set_title(f"{panel} (points)", fontsize=9)
        ax.set_xlabel("held-out accuracy difference; dots: seeds", fontsize=8)
    names = []
    for e in entries:
        marks = [f"{a['label']}x{a['collapse']['k']}" for a in e["arms"].values() if a["collapse"]["k"]]
        names.append(e["cell"] + (f"  [collapsed: {' '.join(marks)}]" if marks else ""))
    axes[0].set_yticks(range(rows), list(reversed(names)), fontsize=7)
    fig.suptitle(
        "Each cell's paired differences (blue: t-interval, no run of the pair collapsed; orange: median and its "
        f"order-statistic interval where runs collapsed; grey band: +-{100 * MARGIN:g} points). Descriptive: the "
        "claims are the questions'",
        fontsize=9,
    )
    return save_figure(fig, path)


def memory_labels(memory: dict) -> tuple[str, str, float | None]:
    """(the top panel's y label, the figure's title, the matched memory in tokens or None) of KPO (auto)'s memory
    figure, from a cell arm's ``memory_tokens``: a verl row is a generation batch's mean over its steps, not a
    step; the matched memory is the paper's ratio at the runs' response budget."""
    from kpo.filter.memory import matched_memory

    longest, budget = memory["longest"], memory.get("response_tokens")
    if memory.get("rows") == "generation batch":
        share = f"% of generation batches whose mean\nmemory is the longest ({longest:.0f} tokens)"
    else:
        share = f"% of off-policy steps at the\nlongest memory ({longest:.0f} tokens)"
    responses = f"responses: up to {budget} tokens; " if budget else ""
    title = (f"KPO (auto): the memory the likelihood picks, batch by batch ({responses}solid: stable rate, "
             "dashed: stress)")  # fmt: skip
    return share, title, matched_memory(budget) if budget else None


def _plot_memory(entries: list[dict], path: Path) -> Path | None:
    """KPO (auto)'s fitted memory per generation batch, one line per cell: the share of its off-policy steps (a
    verl run: of its batches' means) at the longest memory allowed (q at its bound: no drift seen), and the
    median memory of the others (:func:`memory_labels`)."""
    lines = {
        e["cell"]: a["memory_tokens"]
        for e in entries
        for a in e["arms"].values()
        if a["label"] == "KPO (auto)" and a.get("memory_tokens")
    }
    if not lines:
        return None
    plt = pyplot()

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for i, (cell, memory) in enumerate(lines.items()):
        batches = sorted(memory["by_batch"], key=int)
        x = [int(b) for b in batches]
        style = dict(color=f"C{i}", ls="-" if "lr0.0001" in cell else "--", marker="o" if "depth4" in cell else "s", ms=3)
        top.plot(x, [100 * memory["by_batch"][b]["at_bound"] for b in batches], label=cell, **style)
        below = [memory["by_batch"][b]["median_below_bound"] for b in batches]
        bottom.plot([b for b, m in zip(x, below) if m], [m for m in below if m], **style)
    share, title, matched = memory_labels(next(iter(lines.values())))
    top.set_ylabel(share)
    top.set_title(title, fontsize=9)
    top.legend(fontsize=7, ncol=2)
    bottom.set_yscale("log")
    bottom.set_ylabel("median fitted memory of the\nother steps (tokens)")
    if matched is not None:
        bottom.axhline(matched, color="0.5", ls=":", lw=1)
        bottom.text(1, matched, f" matched memory ({matched:.4g})", fontsize=7, va="bottom", color="0.4")
    bottom.set_xlabel("generation batch")
    return save_figure(fig, path)


def _curves_section(out: Path, entries: list[dict]) -> list[str]:
    """The learning curves' section (cells run with --curve-every), or nothing."""
    with_curves = [e for e in entries if e.get("curve")]
    if not with_curves:
        return []
    figure = _plot_curves(with_curves, out / "curves.png")
    table = ["| cell | generation batches | KPO (matched) - GRPO | KPO (matched) - GSPO |", "|---|---|---|---|"]
    for e in with_curves:
        curve = e["curve"]
        for i, batches in enumerate(curve["batches"]):
            table.append(
                f"| {e['cell']} | {batches} | {contrast_text(curve['contrasts']['KPO (matched) - GRPO'][i])} | "
                f"{contrast_text(curve['contrasts']['KPO (matched) - GSPO'][i])} |"
            )
    return [
        "## Slower or worse? Learning curves",
        "",
        *(
            f"- {e['cell']}: KPO (matched) is **{e['curve']['pace']}** against {e['curve']['best_baseline']} (the "
            "baseline with the higher final mean; per cell, descriptive)."
            for e in with_curves
        ),
        "",
        f"![learning curves]({figure.name})",
        "",
        *table,
        "",
    ]


def _plot_curves(entries: list[dict], path: Path) -> Path:
    """One panel per cell: every seed's learning curve (thin) and each arm's mean (thick) against generation
    batches, the map's length (20) marked."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(entries), figsize=(5.5 * len(entries), 4), squeeze=False)
    for ax, e in zip(axes[0], entries, strict=True):
        curve = e["curve"]
        for i, (arm, means) in enumerate(curve["means"].items()):
            label = e["arms"][arm]["label"]
            for seed in zip(*curve["per_seed"][arm]):
                ax.plot(curve["batches"], [100 * m for m in seed], color=f"C{i}", lw=0.6, alpha=0.4)
            ax.plot(curve["batches"], [100 * m for m in means], "o-", color=f"C{i}", label=label)
        ax.axvline(20, color="0.6", ls=":", lw=1)
        ax.set_title(f"{e['cell']}: KPO {curve['pace'] or '-'}", fontsize=9)
        ax.set_xlabel("generation batches (dotted: the map's length)")
        ax.set_ylabel("held-out accuracy (%)")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def _planned(plan: dict) -> str:
    """The plan's line of "Planned against measured"."""
    if not plan.get("cells"):
        return "- No plan.json."
    half = plan["cells"][0]["half_width"]
    if half is None:
        return "- Planned half-width of a cell's contrast: none (one seed a cell: no interval)."
    return (
        f"- Planned half-width of a cell's contrast at the first look: +-{half:.1f} points (prior sd "
        f"{plan.get('diff_sd', float('nan')):.1f})."
    )


def render_map(out: Path, entries: list[dict], answers: list[dict], plan: dict) -> Path:
    """Write report.md, report.json, regimes.png and memory.png into ``out``; returns report.md. report.json holds
    what report.md states: ``runs`` (finished runs), ``cells_finished``, ``measured_half_width`` (points: min,
    median, max over the cells' t-intervals), ``exploratory`` (why the map is one), ``questions``, ``cells``,
    ``plan``."""
    figure = _plot(entries, out / "regimes.png")
    memory = _plot_memory(entries, out / "memory.png")
    done = sum(e["done"] for e in entries)
    runs = sum(sum(x is not None for x in a["accuracy"]) for e in entries for a in e["arms"].values())
    measured = [
        100 * (c["high"] - c["low"]) / 2
        for e in entries
        for c in e["contrasts"].values()
        if c and c["method"] == "t" and c["low"] is not None
    ]
    widths = (
        {"min": min(measured), "median": statistics.median(measured), "max": max(measured), "intervals": len(measured)}
        if measured
        else None
    )
    exploratory = {"why": "its questions are tested once, at the seeds every cell has, unadjusted: each answer is a "
                          "lead for a study whose questions and size are fixed before its first run (kpo compare "
                          "study, which can size itself from this map's report.json), not a finding"}
    batches = plan.get("batches", "?")
    settings = plan.get("settings", {})
    metric = next((e["metric"] for e in entries if e.get("metric")), "held-out accuracy")  # kpo.compare.outcome
    md = [
        "# kpo compare regimes: where does KPO help? (exploratory)",
        "",
        f"**Exploratory**: {exploratory['why']}.",
        "",
        f"{len(entries)} cells ({done} finished at their current seeds), {runs} finished runs: GRPO, GSPO, KPO at "
        "the length-matched memory and KPO with its memory fitted by maximum likelihood (auto) in every cell, the "
        "clip band without the filter in the stress cells; paired by seed, "
        f"{batches} generation batches a run ({settings.get('engine', 'kpo')} engine), {metric}. The questions and "
        "their tests were printed and written to plan.json before the runs. Each cell links its own kpo compare "
        "report (Table 1, Figure 3, Table 2).",
        "",
        "## The questions (leads)",
        "",
        "Each question pools its cells into one difference per seed (the seed is the unit) and is tested by the "
        "exact sign-flip test, as a study's question is; nothing is adjusted for the map's many questions.",
        "",
        *(answer_line(a) for a in answers),
        "",
        "## The cells (descriptive: not adjusted for the map's multiplicity)",
        "",
        _table(out, entries),
        "",
        f"![regime map]({figure.name})",
        "",
        *(
            [f"![KPO (auto)'s fitted memory]({memory.name})", ""]
            if memory
            else []
        ),
        *(
            f"- {e['cell']}, filter or band: " + "; ".join(e["filter_or_band"].values()) + "."
            for e in entries
            if e.get("filter_or_band")
        ),
        *(f"- {e['cell']}, pick: {e['pick_note']}." for e in entries if e.get("pick_note")),
        "",
        *_curves_section(out, entries),
        "## Planned against measured",
        "",
        _planned(plan),
        f"- Measured 95% half-widths of the cells' t-intervals (pairs without a collapse): {widths['min']:.1f} to "
        f"{widths['max']:.1f} points, median {widths['median']:.1f} ({widths['intervals']} intervals)."
        if widths
        else "- No t-interval measured yet.",
        "",
        "## Rules",
        "",
        *(f"- {k}: {v}" for k, v in plan.get("rules", {}).items()),
        "",
    ]
    with replacing(out / "report.md") as partial:
        partial.write_text("\n".join(md))
    found = {"runs": runs, "exploratory": exploratory, "cells_finished": done, "measured_half_width": widths,
             "questions": answers, "cells": entries, "plan": plan}
    write_json(out / "report.json", found, indent=2)
    return out / "report.md"
