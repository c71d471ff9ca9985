"""Restate a regime map from the per-seed final accuracies its report.json kept, with the statistics of
kpo.compare.stats and the questions of kpo.compare.regimes (its runs are gone, or not on this machine).

- A map made before issue 38 (docs/results/regimes-first: 4 seeds; docs/results/horizon: 3 seeds, 100 generation
  batches): writes restated.md and restated.json beside it (`kpo compare regimes --cells
  none-depth4-lr0.0001,none-depth4-lr0.0005 --seeds 4 --max-seeds 4 --batches 100 --curve-every 10 --out
  runs/horizon` reruns the horizon with them).
- A map of `kpo compare regimes` (its report.json has ``looks``: docs/results/regimes): rewrites its report.md,
  report.json and figures in place, its looks replayed on the per-seed numbers, the per-run statistics its runs
  logged (mismatch, clip fractions, fitted memory) kept as they were; ``--ended TEXT`` says why it ended before
  its cap (kept from its report.json when not given).

    python scripts/restate_map.py docs/results/horizon          # writes restated.md and restated.json there
    python scripts/restate_map.py docs/results/regimes-first
    python scripts/restate_map.py docs/results/regimes --ended "..."   # rewrites the map's report in place
"""

from __future__ import annotations

import json
from pathlib import Path

from kpo._files import replacing
from kpo.compare.questions import LOOKS, decide, describe
from kpo.compare.regime_report import contrast_text
from kpo.compare.regimes import QUESTIONS, Cell
from kpo.compare.stats import collapse_count, mcnemar_exact, paired_accuracy

LABELS = {
    "vanilla": "GRPO",
    "gspo": "GSPO",
    "kpo (memory=matched)": "KPO (matched)",
    "vanilla (clip_ratio_low=0.0003, clip_ratio_high=0.0004)": "clip band",
}


def restate(cell: dict) -> dict:
    """One cell of the old report: each arm's collapses (exact bound) and KPO (matched)'s contrasts by the rule
    that fits them (t where no run of a pair collapsed, else the sign test), and McNemar on the collapses."""
    warm = cell["warm_start"]
    arms = {LABELS[a]: v["accuracy"] for a, v in cell["arms"].items()}
    fell = {a: [x < w for x, w in zip(acc, warm)] for a, acc in arms.items()}
    out = {"cell": cell["cell"], "warm_start": warm, "accuracy": arms, "collapse": {}, "contrasts": {}}
    for arm in arms:
        out["collapse"][arm] = collapse_count(fell[arm])
    for other in (a for a in arms if a != "KPO (matched)"):
        d = [x - y for x, y in zip(arms["KPO (matched)"], arms[other])]
        pairs = [x or y for x, y in zip(fell["KPO (matched)"], fell[other])]
        out["contrasts"][f"KPO (matched) - {other}"] = {
            **paired_accuracy(d, pairs),
            "collapses": mcnemar_exact(fell["KPO (matched)"], fell[other]),
        }
    return out


def questions(old: dict) -> list[dict]:
    """The map's questions on the old map's data, at its first look (its arms only: KPO (auto)'s are pending)."""
    cells = [Cell(c["mismatch"], c["depth"], c["lr"]) for c in old["cells"]]
    data = {
        cell.name: {arm: [(a, a < w) for a, w in zip(v["accuracy"], c["warm_start"])] for arm, v in c["arms"].items()}
        for cell, c in zip(cells, old["cells"])
    }
    seeds = min(len(c["warm_start"]) for c in old["cells"])
    answers = decide(QUESTIONS, data, cells, {"stable": seeds, "stress": seeds})
    describe(QUESTIONS, answers)
    return answers


def restate_regimes(folder: Path, ended: str | None) -> Path:
    """Rewrite the map in ``folder`` from its report.json: every look of its ``looks`` replayed with
    :func:`kpo.compare.questions.decide` on the per-seed (accuracy, collapsed) of its cells, each cell's
    descriptive statistics recomputed (:func:`kpo.compare.regimes.describe_cell`), the rest of each cell's entry
    kept; returns report.md."""
    from kpo.compare.regime_report import render_map
    from kpo.compare.regimes import describe_cell

    old = json.loads((folder / "report.json").read_text())
    ended = ended or (old.get("exploratory") or {}).get("ended")
    cells = [Cell(c["mismatch"], c["depth"], c["lr"]) for c in old["cells"]]
    data = {
        c["cell"]: {
            arm: [None if acc is None else (acc, fell) for acc, fell in zip(v["accuracy"], v["collapsed"])]
            for arm, v in c["arms"].items()
        }
        for c in old["cells"]
    }
    memo: dict = {}
    looks = []
    for look in old["looks"]:
        answers = decide(QUESTIONS, data, cells, look["seeds"], memo=memo)
        looks.append({"seeds": look["seeds"], "answers": {a["name"]: a["verdict"] for a in answers}})
    describe(QUESTIONS, answers)
    entries = []
    for c in old["cells"]:
        kept = {k: v for k, v in c.items() if k not in ("contrasts", "pick", "pick_note", "filter_or_band")}
        entries.append(kept | describe_cell(data[c["cell"]]))
    return render_map(folder, entries, answers, looks, old["plan"], ended)


def main(folder: Path) -> None:
    from kpo.compare.regime_report import answer_line

    old = json.loads((folder / "report.json").read_text())
    cells = [restate(c) for c in old["cells"]]
    seeds = min(len(c["warm_start"]) for c in old["cells"])
    answers = questions(old) if seeds >= LOOKS[0] else []
    md = [
        "# The map, restated with the statistics of issue 38",
        "",
        f"From the per-seed final accuracies of [report.json](report.json) ({seeds} seeds): each arm's collapses "
        "(final below its seed's warm start) with the exact 95% bound of the rate; KPO (matched)'s contrasts by the "
        "rule that fits them (the paired t-interval where no run of a pair collapsed, else the exact sign test, "
        "with no interval below 6 pairs) and the exact McNemar test of the collapses, per cell and unadjusted: "
        "descriptive"
        + (
            "; and the questions of `kpo compare regimes`, at its first look (KPO (auto) did not run here)."
            if answers
            else f"; the map's questions need {LOOKS[0]} seeds."
        )
        + " Made by `python scripts/restate_map.py`.",
        "",
        *(["## The questions at the first look", "", *(answer_line(a) for a in answers), ""] if answers else []),
        "| cell | arm | final accuracy per seed (%) | collapsed (≤ exact 95% bound) |",
        "|---|---|---|---|",
    ]
    for c in cells:
        for arm, acc in c["accuracy"].items():
            k = c["collapse"][arm]
            md.append(
                f"| {c['cell']} | {arm} | {', '.join(f'{100 * x:.1f}' for x in acc)} | {k['k']}/{k['n']} "
                f"(≤{100 * k['upper95']:.0f}%) |"
            )
    md += ["", "| cell | contrast | difference (points) | per seed | collapsed KPO only / other only (McNemar p) |"]
    md.append("|---|---|---|---|---|")
    for c in cells:
        for name, x in c["contrasts"].items():
            m = x["collapses"]
            md.append(
                f"| {c['cell']} | {name} | {contrast_text(x)} | {', '.join(f'{100 * d:+.1f}' for d in x['per_seed'])} "
                f"| {m['a_only']} / {m['b_only']} (p = {m['p']:.2g}) |"
            )
    with replacing(folder / "restated.md") as partial:
        partial.write_text("\n".join(md) + "\n")
    with replacing(folder / "restated.json") as partial:
        partial.write_text(json.dumps({"questions": answers, "cells": cells}, indent=2) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument(
        "--ended", default=None, help="a kpo compare regimes map: why it ended before its cap (default: as it said)"
    )
    args = parser.parse_args()
    if "looks" in json.loads((args.folder / "report.json").read_text()):
        print(restate_regimes(args.folder, args.ended))
    else:
        main(args.folder)
