"""The plan of ``kpo compare regimes`` (:mod:`kpo.compare.regimes`), fixed before anything trains: per cell its
runs and minutes, the expected half-widths, the questions and the rules (:func:`estimate_regimes`, printed by
:func:`format_regime_plan`); and ``plan.json``, written once before the first run, which a later command with
other flags may not change (:func:`check_plan`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kpo.compare.engines import engine_of
from kpo.compare.plan import WARM_START_SECONDS, CompareError
from kpo.compare.regimes.design import (
    AUTO,
    DIFF_SD,
    GRPO,
    GSPO,
    KPO,
    LABELS,
    REGIME_RULES,
    SAMPLER_COST,
    RegimeConfig,
    cell_runs,
    map_questions,
)

__all__ = ["PLAN_DESIGN", "check_plan", "estimate_regimes", "format_regime_plan", "read_plan"]


def estimate_regimes(cfg: RegimeConfig, diff_sd: float = DIFF_SD, pilot: Path | None = None) -> dict:
    """The plan: per cell its runs and minutes (wall clock on the engine's parallel runs; the time per run from
    the embedded setup's constants, else measured on the map's finished runs or ``pilot``'s, else not estimated:
    None) and the expected half-width of a cell's contrast, t_{S-1} x diff_sd / sqrt(S) points; the questions and
    the rules."""
    from kpo.compare.plan import held_out_problems, measured_run_seconds, parallel_runs, run_seconds
    from kpo.evaluation.metrics import t_quantile

    first_cfg = cfg.cell_config(cfg.cells[0], cfg.seeds)
    jobs = parallel_runs(first_cfg)
    problems = held_out_problems(first_cfg, cfg.eval_limit)  # the same in every cell: read once
    half = t_quantile(0.975, cfg.seeds - 1) * diff_sd / cfg.seeds**0.5 if cfg.seeds > 1 else None
    folders = [Path(cfg.out) / cell.name / "runs" / r.name for cell in cfg.cells for r in cell_runs(cfg, cell, cfg.seeds)]
    folders += [] if pilot is None else sorted(Path(pilot).parent.glob("*/runs/*"))
    measured = measured_run_seconds(folders)
    embedded = engine_of(first_cfg).embedded(first_cfg)
    cells = []
    for cell in cfg.cells:
        per_run = (run_seconds(cfg.cell_config(cell, cfg.seeds), problems, SAMPLER_COST[cell.mismatch]) if embedded
                   else measured)
        runs = len(cell_runs(cfg, cell, cfg.seeds))
        cells.append({"cell": cell.name, "group": cfg.group(cell), "runs": runs,
                      "minutes": None if per_run is None else runs * per_run / jobs / 60, "half_width": half})
    warm = cfg.seeds * WARM_START_SECONDS / jobs / 60 if embedded else 0.0
    return {
        "cells": cells,
        "runs": sum(c["runs"] for c in cells),
        "minutes": warm + sum(c["minutes"] for c in cells) if all(c["minutes"] is not None for c in cells) else None,
        "jobs": jobs,
        "diff_sd": diff_sd,
        "seeds": cfg.seeds,
        "batches": cfg.batches,
        "questions": [{"name": q["key"], "question": q["text"], "outcome": q["outcome"], "group": q["group"]}
                      for q in map_questions(cfg) if q["cells"]],
        "rules": REGIME_RULES,
        "settings": {k: v for k, v in asdict(cfg).items() if k != "cells"},
    }


def format_regime_plan(cfg: RegimeConfig, est: dict) -> str:
    arms = ", ".join(LABELS[a] for a in (GRPO, GSPO, KPO, AUTO))
    if est["minutes"] is None:
        time = "time not estimated: no run of this setup has been measured yet (or give --pilot)"
    else:
        time = f"about {est['minutes']:.0f} min on {est['jobs']} worker(s)"
    half = est["cells"][0]["half_width"]
    lines = [
        f"regime map: {len(cfg.cells)} cells x ({arms}; the stress cells also the clip band) x {cfg.seeds} seeds "
        f"= {est['runs']} runs of {cfg.batches} generation batches, {time}",
        f"expected 95% half-width of a cell's contrast at {cfg.seeds} seeds: "
        + (f"+-{half:.1f} points" if half is not None else "none (one seed)")
        + f" (prior sd {est['diff_sd']:.1f} points)",
    ]
    lines += [
        f"  {c['cell']} ({c['group']}): {c['runs']} runs" + ("" if c["minutes"] is None else f", ~{c['minutes']:.0f} min")
        for c in est["cells"]
    ]
    lines.append("questions (leads, fixed before the runs):")
    lines += [f"  {q['name']}: {q['question']} [{q['outcome']}, {q['group']} cells]" for q in est["questions"]]
    lines.append("rules (fixed before the runs):")
    lines += [f"  {k}: {v}" for k, v in REGIME_RULES.items()]
    return "\n".join(lines)


# What a plan fixes: a command whose flags give another value of one of these is another map.
PLAN_DESIGN = {
    "cells": "the cells (--mismatch, --depth, --lr, --cells)",
    "seeds": "--seeds",
    "batches": "--batches",
    "questions": "the questions (kpo.compare.regimes.QUESTIONS)",
    "rules": "the rules (a map planned by another kpo: its report is as committed)",
}
PLAN_SETTINGS = ("curve_every", "eval_n", "eval_limit", "train_args", "engine", "model", "dataset", "eval_data",
                 "verl_config")


def read_plan(path: Path) -> dict | None:
    """The plan on disk, None where there is none; CompareError (one line) where it is torn or not a plan."""
    if not path.exists():
        return None
    try:
        plan = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CompareError([f"{path}: not readable as JSON ({e}); restore it from where the map was committed "
                            "(docs/results/...) or from its report.json's 'plan'"]) from None
    needed = ("cells", "seeds", "batches")
    missing = [k for k in needed if k not in plan] if isinstance(plan, dict) else list(needed)
    if missing or "unreadable" in _design(plan).values():
        raise CompareError([f"{path}: not a regime map's plan (its {', '.join(missing) or 'cells or questions'} "
                            "missing or malformed); restore it from where the map was committed or from its "
                            "report.json's 'plan'"])
    return plan


def _design(plan: dict) -> dict:
    """What ``plan`` fixes (:data:`PLAN_DESIGN`, the settings of :data:`PLAN_SETTINGS` it records), as JSON
    values."""
    try:
        found = {"cells": [c["cell"] for c in plan["cells"]], "seeds": plan["seeds"], "batches": plan["batches"]}
        if "questions" in plan:
            found["questions"] = [q["name"] for q in plan["questions"]]
        if "rules" in plan:
            found["rules"] = {str(k): str(v) for k, v in plan["rules"].items()}
        settings = plan.get("settings", {})
        found |= {k: settings[k] for k in PLAN_SETTINGS if k in settings}
    except (KeyError, TypeError, AttributeError):
        return {"cells": "unreadable"}
    return json.loads(json.dumps(found))


def check_plan(path: Path, on_disk: dict, est: dict) -> None:
    """CompareError naming every setting of this command that differs from the plan on disk: a plan written before
    the runs is never rewritten, and a command with other flags would be another map under its name."""
    was, now = _design(on_disk), _design(est)
    differ = [k for k in now if k in was and was[k] != now[k]]
    if differ:
        def differs(k: str) -> str:
            if k == "rules":  # whole paragraphs: name the rules that differ
                keys = sorted(r for r in {*was[k], *now[k]} if was[k].get(r) != now[k].get(r))
                return f"{PLAN_DESIGN[k]}: {', '.join(keys)} differ"
            return f"{PLAN_DESIGN.get(k, '--' + k.replace('_', '-'))}: plan {was[k]}, flags {now[k]}"

        named = "; ".join(differs(k) for k in differ)
        fix = ("this kpo cannot continue or rewrite it, so it stays as it was written; give a new --out for a new map"
               if "rules" in differ else "give the plan's flags, or a new --out for a new map")
        raise CompareError([f"{path} fixes another design than these flags ({named}): {fix}"])
