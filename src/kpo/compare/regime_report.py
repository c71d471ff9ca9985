"""The regime map's report: ``report.md`` (one table row per cell and what the rules conclude), ``report.json``
(its cells in a list ``cells``, the plan and the rules) and ``regimes.png`` (each cell's paired differences of KPO
against GRPO, GSPO and the clip band, with their intervals and the collapses marked), from the cells that
:func:`kpo.compare.regimes.cell_entry` describes. Rewritten whole as each cell finishes."""

from __future__ import annotations

import json
from pathlib import Path

from kpo._files import replacing

__all__ = ["render_map"]

PANELS = ("KPO - GRPO", "KPO - GSPO", "KPO - clip band")
MARGIN = 5.0  # points: kpo compare's equivalence margin


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _accuracy(arm: dict | None) -> str:
    """mean ± sd of an arm's finished seeds (points), with how many of them."""
    if arm is None:
        return "-"
    done = [a for a in arm["accuracy"] if a is not None]
    if not done:
        return "pending"
    mean = sum(done) / len(done)
    sd = (sum((a - mean) ** 2 for a in done) / (len(done) - 1)) ** 0.5 if len(done) > 1 else None
    text = f"{100 * mean:.1f}" + (f" ± {100 * sd:.1f}" if sd is not None else "")
    return text if len(done) == len(arm["accuracy"]) else f"{text} ({len(done)}/{len(arm['accuracy'])})"


def _contrast(c: dict | None) -> str:
    if c is None:
        return "pending"
    return f"{100 * c['mean']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] {c['verdict']}"


def _collapsed(arm: dict | None) -> str:
    flags = (arm or {}).get("collapsed")
    if flags is None or None in flags:
        return "-"
    return f"{sum(flags)}/{len(flags)}"


def _table(out: Path, entries: list[dict], labels: dict) -> str:
    head = (
        "| cell | mismatch k3 | on-policy clip (KPO) | GRPO | GSPO | KPO (matched) | KPO - GRPO | KPO - GSPO | "
        "KPO - clip band | collapsed GRPO / GSPO / KPO / band | KPO | pick |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        arms = e["arms"]
        kpo = arms[labels["KPO"]]
        k3 = kpo["k3_kl"]
        band = arms.get(labels["clip band"])
        concl = e["conclusion"]
        pick = concl["pick"] or "-"
        # a finished cell links its own kpo compare report
        name = f"[{e['cell']}]({e['cell']}/report.md)" if (out / e["cell"] / "report.md").exists() else e["cell"]
        lines.append(
            f"| {name} | {'-' if k3 is None else f'{k3:.1e}'} | "
            f"{_pct(kpo['on_policy_clip_frac'])}% | {_accuracy(arms[labels['GRPO']])} | "
            f"{_accuracy(arms[labels['GSPO']])} | {_accuracy(kpo)} | {_contrast(e['contrasts'].get('KPO - GRPO'))} | "
            f"{_contrast(e['contrasts'].get('KPO - GSPO'))} | "
            f"{_contrast(e['contrasts']['KPO - clip band']) if e['clip_band_ran'] else 'not run'} | "
            f"{_collapsed(arms[labels['GRPO']])} / {_collapsed(arms[labels['GSPO']])} / {_collapsed(kpo)} / "
            f"{_collapsed(band) if band else '-'} | {concl['kpo']} | {pick} |"
        )
    return "\n".join(lines)


def _findings(entries: list[dict], labels: dict) -> list[str]:
    """The map read by the rules, one line per question."""
    done = [e for e in entries if e["done"]]
    if not done:
        return ["- No cell has finished yet."]
    by = {"wins": [], "ties": [], "loses": [], "undecided": []}
    for e in done:
        by.setdefault(e["conclusion"]["kpo"], []).append(e["cell"])
    lines = [f"- Cells finished: {len(done)} of {len(entries)}."]
    for key, text in (
        ("wins", "KPO wins (better than GRPO or GSPO, worse than neither)"),
        ("ties", "KPO ties (equivalent to both)"),
        ("loses", "KPO loses (worse than GRPO or GSPO)"),
        ("undecided", "undecided"),
    ):
        lines.append(f"- {text}: {', '.join(by[key]) or 'none'}.")
    broke = [e for e in done if any(_flags(e, labels["GRPO"]))]
    if not broke:
        lines.append("- GRPO collapsed in no cell (no run ended below its warm start).")
    for e in broke:
        surv = e["survivors"] or []
        saved = e["conclusion"]["saved_by"]
        lines.append(
            f"- {e['cell']}: GRPO collapsed in {sum(_flags(e, labels['GRPO']))} of {len(_flags(e, labels['GRPO']))} "
            f"seeds; survived it: {', '.join(surv) or 'neither GSPO nor KPO'}"
            + (f"; what saves KPO there: {saved}" if saved else "")
            + "."
        )
    only_kpo = [e["cell"] for e in broke if labels["KPO"] in (e["survivors"] or [])]
    lines.append(
        f"- GRPO collapses where KPO does not: {', '.join(only_kpo) if only_kpo else 'in no finished cell'}."
    )
    lines.append(
        "- Pick per cell (highest mean held-out accuracy): "
        + "; ".join(f"{e['cell']}: {e['conclusion']['pick']}" for e in done)
        + "."
    )
    return lines


def _curves_section(out: Path, entries: list[dict], labels: dict) -> list[str]:
    """The learning curves' section (cells run with --curve-every), or nothing."""
    with_curves = [e for e in entries if e.get("curve")]
    if not with_curves:
        return []
    figure = _plot_curves(with_curves, labels, out / "curves.png")
    return [
        "## Slower or worse? Learning curves",
        "",
        *(
            f"- {e['cell']}: KPO is **{e['curve']['pace']}** against {e['curve']['best_baseline']} (the baseline with "
            "the higher final accuracy)."
            for e in with_curves
        ),
        "",
        f"![learning curves]({figure.name})",
        "",
        _curve_table(with_curves),
        "",
    ]


def _flags(entry: dict, arm: str) -> list[bool]:
    return [bool(f) for f in (entry["arms"][arm]["collapsed"] or [])]


def _plot(entries: list[dict], labels: dict, path: Path) -> Path:
    """Each cell a row, each contrast a panel: the paired difference (points) with its 95% interval and its seeds
    as dots; a cell's collapses (seeds whose run ended below its warm start) written at the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(entries)
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.55 * rows + 1.8), sharey=True)
    colors = {"better": "C2", "worse": "C3", "equivalent": "C0", "undecided": "0.45"}
    for ax, panel in zip(axes, PANELS, strict=True):
        ax.axvspan(-MARGIN, MARGIN, color="0.93")
        ax.axvline(0, color="0.4", lw=0.8)
        for i, e in enumerate(entries):
            y = rows - 1 - i
            c = e["contrasts"].get(panel)
            if c is None:
                ax.text(
                    0,
                    y,
                    "not run" if panel == PANELS[2] and not e["clip_band_ran"] else "pending",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="0.5",
                )
                continue
            color = colors[c["verdict"]]
            ax.scatter(
                [100 * d for d in c["per_seed"]], [y] * len(c["per_seed"]), s=10, color=color, alpha=0.4
            )
            ax.errorbar(
                100 * c["mean"],
                y,
                xerr=[[100 * (c["mean"] - c["low"])], [100 * (c["high"] - c["mean"])]],
                fmt="o",
                color=color,
                capsize=3,
            )
        ax.set_title(f"{panel} (points)", fontsize=9)
        ax.set_xlabel("held-out accuracy difference; bar: 95% paired interval", fontsize=8)
    names = []
    for e in entries:
        marks = [
            f"{short}x{sum(_flags(e, labels[arm]))}"
            for short, arm in (("GRPO", "GRPO"), ("GSPO", "GSPO"), ("KPO", "KPO"))
            if any(_flags(e, labels[arm]))
        ]
        names.append(e["cell"] + (f"  [collapsed: {' '.join(marks)}]" if marks else ""))
    axes[0].set_yticks(range(rows), list(reversed(names)), fontsize=8)
    fig.suptitle(
        "Where does KPO help? Each cell's paired differences (green: better, red: worse, blue: "
        f"equivalent within +-{MARGIN:g}, grey: undecided)",
        fontsize=10,
    )
    fig.tight_layout()
    with replacing(path) as partial:
        fig.savefig(partial, dpi=110, format="png")
    plt.close(fig)
    return path


def _plot_curves(entries: list[dict], labels: dict, path: Path) -> Path:
    """One panel per cell with learning curves: each arm's mean held-out accuracy (over seeds) against generation
    batches, the map's length (20) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(entries), figsize=(5.5 * len(entries), 4), squeeze=False)
    for ax, e in zip(axes[0], entries, strict=True):
        curve = e["curve"]
        for name, color in (("GRPO", "C0"), ("GSPO", "C1"), ("KPO", "C2")):
            ax.plot(curve["batches"], [100 * m for m in curve["means"][labels[name]]], "o-", color=color, label=name)
        ax.axvline(20, color="0.6", ls=":", lw=1)
        ax.set_title(f"{e['cell']}: KPO {curve['pace'] or '-'}", fontsize=9)
        ax.set_xlabel("generation batches (dotted: the map's length)")
        ax.set_ylabel("held-out accuracy (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    with replacing(path) as partial:
        fig.savefig(partial, dpi=110, format="png")
    plt.close(fig)
    return path


def _curve_table(entries: list[dict]) -> str:
    lines = ["| cell | generation batches | KPO - GRPO | KPO - GSPO |", "|---|---|---|---|"]
    for e in entries:
        curve = e["curve"]
        for i, batches in enumerate(curve["batches"]):
            lines.append(
                f"| {e['cell']} | {batches} | {_contrast(curve['contrasts']['KPO - GRPO'][i])} | "
                f"{_contrast(curve['contrasts']['KPO - GSPO'][i])} |"
            )
    return "\n".join(lines)


def render_map(out: Path, entries: list[dict], plan: dict, labels: dict) -> Path:
    """Write report.md, report.json and regimes.png into ``out`` for ``entries`` (one per cell); returns report.md.
    ``labels``: the arm labels of "KPO", "GRPO", "GSPO" and "clip band" in the entries."""
    figure = _plot(entries, labels, out / "regimes.png")
    done = sum(e["done"] for e in entries)
    half = [c["half_width"] for c in plan.get("cells", [])]
    measured = [
        100 * c["half_width"]
        for e in entries
        for k, c in e["contrasts"].items()
        if c and k != "KPO - clip band"
    ]
    metric = next((e["metric"] for e in entries if e.get("metric")), "held-out accuracy")  # kpo.compare.outcome
    md = [
        "# kpo compare regimes: where does KPO help?",
        "",
        f"{len(entries)} cells ({done} finished): vanilla (GRPO), GSPO and KPO at the length-matched memory, "
        f"{plan.get('seeds', '?')} paired seeds each, {plan.get('batches', '?')} generation batches a run (16 prompts "
        f"x 8 responses), {metric}. Each cell links its own kpo compare "
        "report (Table 1, Figure 3, Table 2). The rules below were printed and written to plan.json before the "
        "runs.",
        "",
        _table(out, entries, labels),
        "",
        f"![regime map]({figure.name})",
        "",
        "## What the map says (by the rules)",
        "",
        *_findings(entries, labels),
        "",
        *_curves_section(out, entries, labels),
        "## Planned against measured",
        "",
        f"- Planned half-width of a cell's contrast: +-{half[0]:.1f} points (prior sd {plan.get('diff_sd', float('nan')):.1f})."
        if half
        else "- No plan.json.",
        f"- Measured half-widths (KPO - GRPO, KPO - GSPO): {min(measured):.1f} to {max(measured):.1f} points, "
        f"median {sorted(measured)[len(measured) // 2]:.1f}."
        if measured
        else "- No contrast measured yet.",
        "",
        "## Rules",
        "",
        *(f"- {k}: {v}" for k, v in plan.get("rules", {}).items()),
        "",
    ]
    with replacing(out / "report.md") as partial:
        partial.write_text("\n".join(md))
    with replacing(out / "report.json") as partial:
        partial.write_text(json.dumps({"cells": entries, "plan": plan}, indent=2) + "\n")
    return out / "report.md"
