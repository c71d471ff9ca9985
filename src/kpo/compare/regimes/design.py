"""The regime map as a study (:mod:`kpo.compare.regimes`): its grid, arms and questions, the plan they make
(:func:`map_plan`), and running it (:func:`run_regimes`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kpo.compare.cell import MISMATCH, Cell, parse_cell
from kpo.compare.checks import out_errors
from kpo.compare.defaults import ABLATIONS, MATCHED_KWARGS
from kpo.compare.plan import CompareConfig, CompareError, checked_engine
from kpo.compare.stats import ALPHA
from kpo.compare.study.plan import (
    REGISTERED,
    SETUP,
    cell_arms,
    cell_config,
    group_arms,
    normalize,
    plan_errors,
    plan_from,
    read_data_file,
    rule_text,
)

__all__ = ["ARMS", "GRID", "QUESTIONS", "RegimeConfig", "groups", "map_plan", "run_regimes"]

# The map's arms: label -> (loss, its keywords). KPO at the length-matched memory and at the memory fitted to each
# optimizer step; the clip band is the token ratio clipped at KPO's 3e-4/4e-4 band without the filter.
ARMS = {
    "GRPO": ("vanilla", ()),
    "GSPO": ("gspo", ()),
    "KPO (matched)": ("kpo", MATCHED_KWARGS),
    "KPO (auto)": ABLATIONS["auto_memory"],
    "clip band": ABLATIONS["clip_band"],
}
GRPO, GSPO, KPO, AUTO, CLIP_BAND = ARMS
# The default grid: 2 x 2 x 2 cells. The stress learning rate is where vanilla started to fail in a one-seed pilot
# (issue 32: at 5e-4 vanilla broke down on seeds 0 and 1, not on seed 2; at 1e-3 every method fell to 0).
GRID = {"mismatch": ("none", "bf16"), "depth": (4, 16), "lr": (1e-4, 5e-4)}
BATCHES = 20  # generation batches per run: 80 steps at depth 4, as kpo compare's default
SEEDS = 6  # paired seeds a cell (the committed map's): the least at which a two-sided sign-flip p reaches 0.031
# The questions (issues 38 and 40, asked of every map since): (key, text, outcome, a, b, group), the group "stable"
# (the map's lowest learning rate) or "stress" (its highest); an outcome "bf16" asks whether a - b in the bf16 cells
# differs from a - b in the float32 cells of the same depth (a study question with ``versus`` cells).
QUESTIONS = [
    ("grpo_collapses", "At the stress rate, does GRPO collapse more often than KPO (matched)?", "collapse", GRPO, KPO,
     "stress"),
    ("gspo_collapses", "At the stress rate, does GSPO collapse more often than KPO (matched)?", "collapse", GSPO, KPO,
     "stress"),
    ("kpo_vs_grpo", "At the stable rate, does KPO (matched)'s accuracy differ from GRPO's?", "accuracy", KPO, GRPO,
     "stable"),
    ("kpo_vs_gspo", "At the stable rate, does KPO (matched)'s accuracy differ from GSPO's?", "accuracy", KPO, GSPO,
     "stable"),
    ("band_collapses", "Filter or band: at the stress rate, does the clip band without the filter collapse more often "
     "than KPO (matched)?", "collapse", CLIP_BAND, KPO, "stress"),
    ("band_vs_kpo", "Filter or band: at the stress rate, does the clip band's accuracy differ from KPO (matched)'s?",
     "accuracy", CLIP_BAND, KPO, "stress"),
    ("bf16_changes_kpo", "At the stable rate, does the bf16 mismatch change KPO (matched) - GRPO?", "bf16", KPO, GRPO,
     "stable"),
    ("auto_vs_grpo", "At the stable rate, does KPO (auto)'s accuracy differ from GRPO's?", "accuracy", AUTO, GRPO,
     "stable"),
    ("auto_vs_gspo", "At the stable rate, does KPO (auto)'s accuracy differ from GSPO's?", "accuracy", AUTO, GSPO,
     "stable"),
    ("matched_vs_auto", "At the stable rate, does KPO (matched)'s accuracy differ from KPO (auto)'s?", "accuracy", KPO,
     AUTO, "stable"),
    ("auto_collapses", "At the stress rate, does KPO (auto) collapse more often than KPO (matched)?", "collapse", AUTO,
     KPO, "stress"),
    ("band_collapses_auto", "Filter or band for KPO (auto): at the stress rate, does the clip band collapse more often "
     "than KPO (auto)?", "collapse", CLIP_BAND, AUTO, "stress"),
    ("band_vs_auto", "Filter or band for KPO (auto): at the stress rate, does the clip band's accuracy differ from KPO "
     "(auto)'s?", "accuracy", CLIP_BAND, AUTO, "stress"),
]
COLLAPSE = {"rule": "below_fraction_of_warm", "value": 1.0}  # RL lost all it gained and more
TITLE = "Regime map: where does KPO help?"


def groups(cells) -> dict[str, list]:
    """{"stable": cells at the lowest learning rate, "stress": at the highest} (stress empty with one rate)."""
    rates = sorted({c.lr for c in cells})
    return {
        "stable": [c for c in cells if c.lr == rates[0]],
        "stress": [c for c in cells if len(rates) > 1 and c.lr == rates[-1]],
    }


@dataclass
class RegimeConfig:
    """Settings of one regime map; each field is the command-line option of the same name."""

    out: str = "runs/regimes"
    mismatch: tuple[str, ...] = GRID["mismatch"]
    depth: tuple[int, ...] = GRID["depth"]
    lr: tuple[float, ...] = GRID["lr"]
    cells_only: tuple[str, ...] | None = None  # cell names (MISMATCH-depthN-lrX): these alone instead of the grid
    seeds: int = SEEDS  # paired seeds of every cell
    batches: int = BATCHES  # generation batches per run, equal in every cell
    eval_n: int = 4
    eval_limit: int | None = None
    jobs: int | None = None
    train_args: tuple[str, ...] = ()
    # the user's setup, as kpo compare's (kpo.compare.CompareConfig documents each)
    engine: str = "kpo"
    model: str | None = None
    dataset: str | None = None
    eval_data: tuple[str, ...] = ()
    verl_config: str | None = None
    keep: str = CompareConfig.keep
    ray_address: str | None = None
    ray_runtime_env: str | None = None
    cells: list[Cell] = field(init=False, default_factory=list)  # the grid's, or --cells', once validated

    def validate(self) -> RegimeConfig:
        """Check the grid's settings before anything trains (CompareError lists them); the plan they make is checked
        by :func:`map_plan`."""
        checked_engine(self)
        errors = out_errors(self.out)
        unknown = sorted(set(self.mismatch) - set(MISMATCH))
        if unknown:
            errors.append(f"--mismatch {unknown}: unknown; use {', '.join(MISMATCH)}")
        if any(d < 1 for d in self.depth) or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lr):
            errors.append("--depth must be integers >= 1 and --lr finite numbers > 0")
        if self.seeds < 1:
            errors.append(f"--seeds={self.seeds}: give >= 1 (the questions need {SEEDS} for a two-sided p below 0.05)")
        if self.batches < 1:
            errors.append(f"--batches={self.batches}: must be >= 1")
        cells = []
        if self.cells_only is not None:
            if not self.cells_only:
                errors.append("--cells: no cell named; give cell names (e.g. none-depth4-lr0.0001) or omit it")
            try:
                cells = [parse_cell(c) for c in self.cells_only]
            except ValueError as e:
                errors.append(f"--cells: {e}")
            twice = sorted({c.name for c in cells if cells.count(c) > 1})
            if twice:
                errors.append(f"--cells names {', '.join(twice)} more than once (one cell, one set of runs)")
        if errors:
            raise CompareError(errors)
        self.cells = cells or [Cell(m, d, lr) for m in self.mismatch for d in self.depth for lr in self.lr]
        return self


def _questions(cells) -> list[dict]:
    """:data:`QUESTIONS` on these cells, as a study's: a question whose group has no cell (or, for bf16, no bf16 cell
    with a float32 one of its depth) is not asked."""
    by_group, found = groups(cells), []
    for key, text, outcome, a, b, group in QUESTIONS:
        mine, versus = by_group[group], []
        if outcome == "bf16":
            base = {(c.depth, c.lr): c for c in mine if c.mismatch == "none"}
            pairs = [(c, base[c.depth, c.lr]) for c in mine if c.mismatch == "bf16" and (c.depth, c.lr) in base]
            mine, versus = [c for c, _ in pairs], [v.name for _, v in pairs]
        if mine:
            found.append({"key": key, "text": text, "outcome": "collapse" if outcome == "collapse" else "accuracy",
                          "a": a, "b": b, "group": group, "cells": [c.name for c in mine],
                          **({"versus": versus} if versus else {})})
    return found


def map_plan(cfg: RegimeConfig) -> dict:
    """The map as a study's plan (plan.json's form): its cells in the groups "stable" and "stress", one look at
    ``cfg.seeds`` seeds each, the arms its questions read, every question in the Holm family at alpha 0.05, seeds
    from 0. CompareError naming every problem, where the engine rejects a run of it."""
    from kpo.compare.study.registration import engine_errors, runs_at_most

    questions = _questions(cfg.cells)
    named = {q[side] for q in questions for side in ("a", "b")}
    by_group = {g: [c.name for c in cells] for g, cells in groups(cfg.cells).items()}
    raw = {
        "title": TITLE,
        "alpha": ALPHA,
        "setup": {k: list(v) if isinstance(v := getattr(cfg, k), tuple) else v for k in SETUP},
        "seeds": {"first": 0},
        "collapse": COLLAPSE,
        "arms": {label: {"loss": loss, "loss_kwargs": dict(kw)} for label, (loss, kw) in ARMS.items() if label in named},
        "cells": {c.name: {"mismatch": c.mismatch, "depth": c.depth, "lr": c.lr} for c in cfg.cells},
        "groups": {g: {"cells": cells, "looks": [cfg.seeds]} for g, cells in by_group.items()
                   if any(q["group"] == g for q in questions)},
        "questions": questions,
    }
    errors = plan_errors(raw)
    if not errors:
        plan = normalize(raw)
        errors = engine_errors(plan)
    if errors:
        raise CompareError(errors)
    return plan | {"runs_at_most": runs_at_most(plan), "source": "kpo compare regimes"}


def format_map_plan(plan: dict, path: Path, jobs: int | None) -> str:
    """The map's plan as ``kpo compare regimes`` prints it before anything trains, with its time at most on the
    embedded setup by kpo compare's cost model (:func:`kpo.compare.plan.run_seconds`) on ``jobs`` workers."""
    from kpo.compare.engines import engine_of
    from kpo.compare.plan import WARM_START_SECONDS, held_out_problems, parallel_runs, run_seconds

    seeds = next(iter(plan["groups"].values()))["looks"][-1]
    cfgs = [cell_config(plan, cell, arm, path.parent) for cell, arm in cell_arms(plan)]
    time = ""
    if engine_of(cfgs[0]).embedded(cfgs[0]):
        problems, workers = held_out_problems(cfgs[0], cfgs[0].eval_limit), jobs or parallel_runs(cfgs[0])
        seconds = seeds * (sum(run_seconds(c, problems) for c in cfgs) + WARM_START_SECONDS) / workers
        time = f", about {seconds / 60:.0f} min on {workers} worker(s)"
    lines = [f"regime map: {len(plan['cells'])} cells x {seeds} seeds, at most {plan['runs_at_most']} runs of "
             f"{plan['setup']['batches']} generation batches{time}; its plan: {path}"]
    lines += [f"  {group} cells ({', '.join(group_arms(plan, group))}): {', '.join(g['cells'])}"
              for group, g in plan["groups"].items()]
    lines.append("questions (each seed's cells pooled, the exact sign-flip test, Holm over them at alpha "
                 f"{plan['alpha']:g}; exploratory unless plan.json is committed before the first run):")
    lines += [f"  {q['key']}: {q['text']} [{q['outcome']}, {q['group']} cells]" for q in plan["questions"]]
    lines.append(f"collapse: {rule_text(plan['collapse'])}")
    return "\n".join(lines)


def _same_map(path: Path, plan: dict) -> None:
    """CompareError unless the map planned in ``path`` is ``plan``: one line naming the settings that differ, or the
    old map format."""
    on_disk = read_data_file(path, "the plan")
    if isinstance(on_disk, dict) and "rules" in on_disk:
        raise CompareError([f"{path}: a map planned before maps were studies (issue 53); this kpo does not continue "
                            "it (its report stays as written): give a new --out for a new map"])
    on_disk = plan_from(on_disk, str(path))
    differ = [k for k, v in plan.items() if k not in REGISTERED and on_disk.get(k) != v]
    if differ:
        raise CompareError([f"{path} is another map ({', '.join(differ)} differ from these flags'): give its flags, "
                            "or a new --out for a new map"])


def run_regimes(cfg: RegimeConfig, *, plan_only: bool = False, report_only: bool = False) -> Path | None:
    """Print the map's plan; write it to ``OUT/plan.json`` once (a later command with other flags is another map and
    stops); then run it as a study (:func:`kpo.compare.study.run.run_study`, from an uncommitted plan: exploratory
    unless it was committed before the first run). Returns report.md (None with ``plan_only``); ``report_only``
    trains nothing."""
    from kpo._files import write_json
    from kpo.compare.run import holding
    from kpo.compare.study.run import CLUSTER, Study, run_study

    if plan_only and report_only:
        raise CompareError(["--plan and --report: --plan prints the plan and stops, --report writes the map; give one"])
    out = Path(cfg.validate().out)
    plan, path = map_plan(cfg), out / "plan.json"
    print(format_map_plan(plan, path, cfg.jobs), flush=True)
    if path.exists():
        _same_map(path, plan)
    elif report_only:
        raise CompareError([f"{out}: no map here (no plan.json); --report rewrites a map: give its --out, or run without "
                            "--report to start one"])
    if plan_only:
        return None
    if not path.exists():
        with holding(out, "kpo compare regimes"):
            if path.exists():  # another command started a map here since: this one runs only if it is the same
                _same_map(path, plan)
            else:
                write_json(path, plan, indent=2)
    study = Study(out, out, jobs=cfg.jobs, cluster={k: getattr(cfg, k) for k in CLUSTER})
    return run_study(study, report_only=report_only, allow_uncommitted=True)
