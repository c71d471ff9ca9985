"""``kpo compare regimes``: where does KPO help? A grid of regimes (cells), the same arms paired by seed in each,
and a few pre-registered questions pooled over cells, answered with seeds added until they are decided.

The paper's argument is about token ratios made noisy by train-inference mismatch, staleness and high learning
rates, where GRPO collapses. A cell fixes one point of that space:

- mismatch: ``none`` (the sampler is the trainer's float32 policy, the ratio's anchor the trainer's recomputed
  log-probs: every batch's first step has ratio 1), ``bf16`` or ``fp8`` (the sampler a bf16 or FP8 copy of the
  policy and the anchor the sampler's log-probs, verl's bypass mode: the mismatch reaches every ratio;
  :mod:`kpo.train.sampler`);
- depth: optimizer steps per generation batch (``--minibatches``), every cell drawing the same number of
  generation batches (``batches``), so the same number of samples: depth 16 takes 4 times the steps of depth 4 on
  mini-batches a quarter the size, 15 of every 16 of them off-policy;
- learning rate: the map's lowest is its **stable** rate, its highest its **stress** rate.

Every cell runs vanilla (GRPO), GSPO, KPO at the length-matched memory and KPO with its memory fitted to each
mini-batch (``memory=auto``); the stress cells also run the token ratio clipped at KPO's band without the filter
(filter or band?). The arms of a seed share its warm start, prompt stream and evaluation problems; each cell is a
full ``kpo compare`` report of its own in ``OUT/CELL/``, and every cell's seeds share one warm start per seed
(``OUT/warm_start-seedN`` holds its evaluation).

A run **collapsed** when its final held-out accuracy is below its seed's warm start's. The claims are the
answers to the questions in :data:`QUESTIONS` (:mod:`kpo.compare.questions`: their tests, Holm over the family,
the error spent over looks at 4, 6 and 8 seeds); the cells' own contrasts and picks are descriptive. The rules
and the questions are printed and written to ``plan.json`` before anything trains. The map (``report.md``,
``report.json`` with ``cells``, ``questions`` and ``looks``, ``regimes.png``, ``memory.png``) is rewritten as
each cell finishes, so a partial map is readable while the rest runs (a question whose look is unfinished is
pending, and claims nothing its complete looks would not), and a rerun resumes (finished runs are reused, the looks
replayed). plan.json is written once, before the first run: a later command with other flags stops, and
``--report`` only reads it. The map is exploratory (its report says why): its questions are many equal members of
one family.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kpo._files import replacing
from kpo.compare.outcome import load_outcome
from kpo.compare.plan import (
    ABLATIONS,
    MATCHED_KWARGS,
    RUN_SECONDS,
    SAMPLE_SECONDS,
    STEP_SECONDS,
    WARM_START_SECONDS,
    CompareConfig,
    CompareError,
    Run,
    plan_runs,
    warm_start_dir,
)
from kpo.compare.questions import (
    LOOKS,
    Question,
    decide,
    describe,
    groups,
    groups_to_extend,
    next_look,
    rules_text,
)
from kpo.compare.regime_report import plural

__all__ = [
    "QUESTIONS",
    "REGIME_RULES",
    "Cell",
    "RegimeConfig",
    "cell_runs",
    "estimate_regimes",
    "format_regime_plan",
    "run_regimes",
]

# The sampler of each mismatch level, as kpo train flags.
MISMATCH = {
    "none": (),
    "bf16": ("--rollout-dtype", "bfloat16", "--ratio-anchor", "rollout"),
    "fp8": ("--rollout-dtype", "float8", "--ratio-anchor", "rollout"),
}
METHODS = ("vanilla", "gspo")  # the baselines; KPO at the matched and at the fitted memory are the subjects
KPO = Run("kpo", 0, MATCHED_KWARGS).arm
AUTO = Run(ABLATIONS["auto_memory"][0], 0, ABLATIONS["auto_memory"][1]).arm
CLIP_BAND = Run(ABLATIONS["clip_band"][0], 0, ABLATIONS["clip_band"][1]).arm
GRPO, GSPO = "vanilla", "gspo"
LABELS = {GRPO: "GRPO", GSPO: "GSPO", KPO: "KPO (matched)", AUTO: "KPO (auto)", CLIP_BAND: "clip band"}
# The default grid: 2 x 2 x 2 cells. The stress learning rate is where vanilla started to fail in a one-seed pilot
# (issue 32: at 5e-4 vanilla broke down on seeds 0 and 1, not on seed 2; at 1e-3 every method fell to 0).
GRID = {"mismatch": ("none", "bf16"), "depth": (4, 16), "lr": (1e-4, 5e-4)}
BATCHES = 20  # generation batches per run: 80 steps at depth 4, as kpo compare's default
# The plan's prior for the sd over seeds of a paired difference, in points: cautious (the first map measured
# 2.9-10.7 where no run collapsed).
DIFF_SD = 5.0
# Cost of a generation batch beside the float32 sampler's. The first map measured bf16 runs at 1.28-1.46 min
# against 1.50-1.53 for float32 at depth 16 (2 workers, idle machine): no dearer. FP8 (rounding of activations,
# keys and values at every step) is not measured in a map: 4-step runs took about 1.3 times float32's first step.
SAMPLER_COST = {"none": 1.0, "bf16": 1.0, "fp8": 1.3}
# kpo train flags a cell fixes: a `--` flag for one of them would train another regime under the cell's name.
CELL_OWNED = {
    "learning_rate": "--lr (or --cells)",
    "rollout_dtype": "--mismatch (or --cells)",
    "ratio_anchor": "--mismatch (or --cells)",
    "minibatches": "--depth (or --cells)",
}

# The questions, fixed before any run (issue 38; the KPO (auto) ones, issue 40, before any KPO (auto) run).
QUESTIONS = [
    Question("grpo_collapses", "At the stress rate, does GRPO collapse where KPO (matched) does not?",
             "collapse", GRPO, KPO, "stress"),
    Question("kpo_vs_grpo", "At the stable rate, is KPO (matched) worse than GRPO?", "accuracy", KPO, GRPO, "stable"),
    Question("kpo_vs_gspo", "At the stable rate, is KPO (matched) worse than GSPO?", "accuracy", KPO, GSPO, "stable"),
    Question("band_collapses", "Filter or band: at the stress rate, does the clip band without the filter collapse "
             "where KPO (matched) does not?", "collapse", CLIP_BAND, KPO, "stress"),
    Question("band_vs_kpo", "Filter or band: at the stress rate, where both survive, is the clip band worse than "
             "KPO (matched)?", "accuracy", CLIP_BAND, KPO, "stress"),
    Question("bf16_changes_kpo", "At the stable rate, does the bf16 mismatch change KPO (matched) - GRPO?",
             "interaction", KPO, GRPO, "stable"),
    Question("auto_vs_grpo", "At the stable rate, is KPO (auto) worse than GRPO?", "accuracy", AUTO, GRPO, "stable"),
    Question("auto_vs_gspo", "At the stable rate, is KPO (auto) worse than GSPO?", "accuracy", AUTO, GSPO, "stable"),
    Question("matched_vs_auto", "At the stable rate, is KPO (matched) worse than KPO (auto)?", "accuracy", KPO,
             AUTO, "stable"),
    Question("auto_collapses", "At the stress rate, does KPO (auto) collapse more often than KPO (matched)?",
             "collapse", AUTO, KPO, "stress"),
    Question("band_collapses_auto", "Filter or band for KPO (auto): at the stress rate, does the clip band collapse "
             "where KPO (auto) does not?", "collapse", CLIP_BAND, AUTO, "stress"),
    Question("band_vs_auto", "Filter or band for KPO (auto): at the stress rate, where both survive, is the clip "
             "band worse than KPO (auto)?", "accuracy", CLIP_BAND, AUTO, "stress"),
]

REGIME_RULES = {
    "metric": "exact expected held-out accuracy, as kpo compare",
    "collapse": "a run collapsed when its final held-out accuracy is below its seed's warm start's (RL lost all it "
    "gained and more); each arm's collapses with their exact (Clopper-Pearson) 95% interval",
    "arms": "every cell: GRPO, GSPO, KPO (matched), KPO (auto); the stress cells also the clip band (vanilla at "
    "KPO's 3e-4/4e-4 band, no filter)",
    **rules_text(),
    "cells (descriptive)": "per cell, each contrast: the paired t-interval where no run of the pair collapsed, "
    "else the exact sign test and, from 6 seeds, the median's order-statistic interval; not adjusted for the "
    "map's multiplicity: the claims are the questions'",
    "pick": "per cell, the set of arms no other arm beats (one-sided paired tests, Bonferroni over the arms: "
    "multiple comparisons with the best), each with its collapse bound",
    "slower or worse": "with learning curves (--curve-every), against the baseline (GRPO or GSPO) with the higher "
    "final mean: KPO is slower where its paired contrast is worse at 20 generation batches (the map's length) and "
    "not worse at the last checkpoint, worse where it is worse at both, not behind where it is not worse at 20",
}


@dataclass(frozen=True)
class Cell:
    """One regime: the sampler's mismatch, the off-policy depth and the learning rate."""

    mismatch: str
    depth: int
    lr: float

    @functools.cached_property
    def name(self) -> str:
        return f"{self.mismatch}-depth{self.depth}-lr{self.lr:g}"

    def train_args(self, engine: str = "kpo") -> tuple[str, ...]:
        """The cell's settings as the engine's `--` flags: kpo train's, or verl's overrides (rollout dtype and bypass
        mode, learning rate: :func:`kpo.compare.verl_engine.cell_overrides`)."""
        if engine == "verl":
            from kpo.compare.verl_engine import cell_overrides

            return cell_overrides(self.mismatch, self.lr)
        return ("--learning-rate", repr(self.lr), *MISMATCH[self.mismatch])


def _parse_cell(text: str) -> Cell:
    """``none-depth4-lr0.0001`` (a cell's name) -> Cell; ValueError saying what is wrong with it otherwise (a part
    missing, or which part is not a mismatch level, an integer depth >= 1 or a finite learning rate > 0)."""
    mismatch, has_depth, rest = text.partition("-depth")
    depth, has_lr, lr = rest.partition("-lr")
    if not has_depth or not has_lr:
        problem = f"no '-{'depth' if not has_depth else 'lr'}' part"
    elif mismatch not in MISMATCH:
        problem = f"mismatch {mismatch!r} is not one of {', '.join(MISMATCH)}"
    elif not (depth.isdigit() and int(depth) >= 1):
        problem = f"depth {depth!r} is not an integer >= 1"
    else:
        try:
            rate = float(lr)
        except ValueError:
            rate = math.nan
        if rate > 0 and math.isfinite(rate):
            return Cell(mismatch, int(depth), rate)
        problem = f"lr {lr!r} is not a finite number > 0"
    raise ValueError(f"cell {text!r}: {problem}; write MISMATCH-depthN-lrX, e.g. none-depth4-lr0.0001")


@dataclass
class RegimeConfig:
    """Settings of one regime map; each field is the command-line option of the same name."""

    out: str = "runs/regimes"
    mismatch: tuple[str, ...] = GRID["mismatch"]
    depth: tuple[int, ...] = GRID["depth"]
    lr: tuple[float, ...] = GRID["lr"]
    cells_only: tuple[str, ...] | None = None  # cell names (MISMATCH-depthN-lrX): these alone instead of the grid
    seeds: int = LOOKS[0]  # seeds of every cell before the first look (more are added until decided)
    max_seeds: int = LOOKS[-1]  # the cap: seeds a cell reaches at most (the last look)
    batches: int = BATCHES  # generation batches per run, equal in every cell
    curve_every: int = 0  # generation batches between learning-curve checkpoints; 0 = none
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
    cells: list[Cell] = field(init=False)

    def __post_init__(self) -> None:
        self.cells = []

    def validate(self) -> RegimeConfig:
        """Check every setting and every cell's compare before anything trains (CompareError lists them)."""
        errors = []
        unknown = sorted(set(self.mismatch) - set(MISMATCH))
        if unknown:
            errors.append(f"--mismatch {unknown}: unknown; use {', '.join(MISMATCH)}")
        if any(d < 1 for d in self.depth) or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lr):
            errors.append("--depth must be integers >= 1 and --lr finite numbers > 0")
        if self.seeds < 1 or self.max_seeds < self.seeds:
            errors.append(
                f"--seeds={self.seeds} --max-seeds={self.max_seeds}: give --seeds >= 1 and --max-seeds >= --seeds (the "
                f"questions are answered at {', '.join(map(str, LOOKS))} seeds a cell: a map of fewer has its cells "
                "only)"
            )
        elif self.max_seeds > self.seeds and self.max_seeds not in LOOKS:
            # seeds are added a look at a time: a cap between looks would be passed by the next look
            errors.append(
                f"--max-seeds={self.max_seeds}: the cap is a look ({', '.join(map(str, LOOKS))} seeds a cell) or "
                "--seeds itself (no look added); give one of "
                + ", ".join(str(k) for k in (*(k for k in LOOKS if k > self.seeds), self.seeds))
            )
        for name, value, low in (("batches", self.batches, 1), ("curve-every", self.curve_every, 0)):
            if value < low:
                errors.append(f"--{name}={value}: must be >= {low}")
        if self.curve_every and self.batches % self.curve_every:
            errors.append(f"--curve-every={self.curve_every} must divide --batches={self.batches}")
        errors += _owned_by_cells(self.train_args) if self.engine == "kpo" else []
        cells = []
        if self.cells_only is not None:
            if not self.cells_only:
                errors.append("--cells: no cell named; give cell names (e.g. none-depth4-lr0.0001) or omit it")
            try:
                cells = [_parse_cell(c) for c in self.cells_only]
            except ValueError as e:
                errors.append(f"--cells: {e}")
            twice = sorted({c.name for c in cells if cells.count(c) > 1})
            if twice:
                errors.append(f"--cells names {', '.join(twice)} more than once (one cell, one set of runs)")
        if errors:
            raise CompareError(errors)
        self.cells = cells or [Cell(m, d, lr) for m in self.mismatch for d in self.depth for lr in self.lr]
        bad = [c for c in self.cells if c.mismatch not in MISMATCH or c.depth < 1 or not c.lr > 0]
        if bad:
            raise CompareError(
                [
                    f"--cells {c.name}: mismatch must be one of {', '.join(MISMATCH)}, depth an integer >= 1 and lr "
                    "a number > 0"
                    for c in bad
                ]
            )
        if self.engine == "verl":
            _verl_cell_errors(self)
        first_error = {}
        for cell in self.cells:
            try:
                self.cell_config(cell, self.max_seeds).validate()
            except CompareError as e:
                for err in e.errors:
                    first_error.setdefault(err, cell.name)
        if first_error:
            raise CompareError([f"cell {cell}: {err}" for err, cell in first_error.items()])
        return self

    def stress(self, cell: Cell) -> bool:
        return cell in groups(self.cells)["stress"]

    def group(self, cell: Cell) -> str:
        return "stress" if self.stress(cell) else "stable"

    def cell_config(self, cell: Cell, seeds: int) -> CompareConfig:
        """The cell as a ``kpo compare`` at ``seeds`` seeds: GRPO, GSPO, KPO (matched) and, as its ablations, KPO
        (auto) and (stress cells) the clip band, every seed."""
        steps = self.batches * cell.depth
        return CompareConfig(
            out=str(Path(self.out) / cell.name),
            methods=METHODS,
            seeds=seeds,
            steps=steps,
            minibatches=cell.depth,
            matched=True,
            ablations=True,
            ablation_arms=("auto_memory", "clip_band") if self.stress(cell) else ("auto_memory",),
            ablation_seeds=seeds,
            aa_seeds=0,
            eval_n=self.eval_n,
            eval_limit=self.eval_limit,
            # 16 ratio dumps a run whatever the depth (steps 5k at depth 4: off-policy for k not = 1 mod 4)
            dump_every=max(1, steps // 16),
            jobs=self.jobs,
            train_args=(*cell.train_args(self.engine), *self.train_args),
            curve_every=self.curve_every * cell.depth,
            engine=self.engine,
            model=self.model,
            dataset=self.dataset,
            eval_data=self.eval_data,
            verl_config=self.verl_config,
        )


def _owned_by_cells(train_args: tuple[str, ...]) -> list[str]:
    """`--` flags that would override what a cell fixes (its learning rate, sampler, anchor, depth)."""
    from kpo.train.flags import build_parser

    try:
        given = vars(build_parser("kpo compare regimes -- (kpo train flags)").parse_args(list(train_args)))
    except SystemExit:  # argparse printed its own line; kpo compare's validation reports the rest
        return []
    return [
        f"-- --{key.replace('_', '-')}: every cell sets it (its name says which); use {CELL_OWNED[key]} instead"
        for key in given
        if key in CELL_OWNED
    ]


def cell_runs(cfg: RegimeConfig, cell: Cell, seeds: int) -> list[Run]:
    return plan_runs(cfg.cell_config(cell, seeds))


def _verl_cell_errors(cfg: RegimeConfig) -> None:
    """CompareError for what verl cannot run of the grid, or a `--` override of what each cell sets."""
    from kpo.compare.verl_engine import CELL_MISMATCH, cell_overrides, override_key

    errors = [
        f"--mismatch {m}: not mapped to verl; use {', '.join(CELL_MISMATCH)}"
        for m in sorted({c.mismatch for c in cfg.cells} - set(CELL_MISMATCH))
    ]
    owned = {override_key(o) for m in CELL_MISMATCH for o in cell_overrides(m, 1.0)}
    errors += [
        f"-- {key}=...: each cell sets it (--mismatch, --lr); drop it"
        for key in sorted({override_key(o) for o in cfg.train_args} & owned)
    ]
    if errors:
        raise CompareError(errors)


# ------------------------------------------------------------------ plan
def estimate_regimes(cfg: RegimeConfig, diff_sd: float = DIFF_SD, pilot: Path | None = None) -> dict:
    """The plan: per cell its runs and minutes at the first look and at the cap (wall clock on the engine's
    parallel runs; the time per run from the embedded setup's constants, else measured on the map's finished runs
    or ``pilot``'s, else not estimated: None), the expected half-width of a cell's contrast at the first look,
    t_{S-1} x diff_sd / sqrt(S) points, the seeds a pooled accuracy question needs to decide a 5-point difference
    at the family's final-look level; the questions and the rules."""
    from kpo.compare.plan import embedded, held_out_problems, measured_run_seconds, parallel_runs
    from kpo.compare.questions import LOOK_SHARES
    from kpo.compare.stats import ALPHA, seeds_for_effect
    from kpo.evaluation.metrics import t_quantile

    first_cfg = cfg.cell_config(cfg.cells[0], cfg.seeds)
    jobs = parallel_runs(first_cfg)
    problems = held_out_problems(first_cfg, cfg.eval_limit)
    half = t_quantile(0.975, cfg.seeds - 1) * diff_sd / cfg.seeds**0.5 if cfg.seeds > 1 else None
    folders = [Path(cfg.out) / cell.name / "runs" / r.name for cell in cfg.cells for r in cell_runs(cfg, cell, cfg.seeds)]
    folders += [] if pilot is None else sorted(Path(pilot).parent.glob("*/runs/*"))
    measured = measured_run_seconds(folders)
    cells = []
    for cell in cfg.cells:
        if embedded(first_cfg):
            per_run = (
                cfg.batches * cell.depth * STEP_SECONDS * 4 / cell.depth * SAMPLER_COST[cell.mismatch]
                + problems * cfg.eval_n * SAMPLE_SECONDS
                + RUN_SECONDS
            )
        else:
            per_run = measured
        first, cap = len(cell_runs(cfg, cell, cfg.seeds)), len(cell_runs(cfg, cell, cfg.max_seeds))
        minutes = lambda runs, per=per_run: None if per is None else runs * per / jobs / 60  # noqa: E731
        cells.append(
            {
                "cell": cell.name,
                "group": cfg.group(cell),
                "runs": first,
                "runs_at_cap": cap,
                "minutes": minutes(first),
                "minutes_at_cap": minutes(cap),
                "half_width": half,
            }
        )
    hypotheses = sum(len(q.hypotheses()) for q in QUESTIONS)
    per_group = {g: len(members) for g, members in groups(cfg.cells).items() if members}
    # a seed's mean difference over the group's cells: sd diff_sd / sqrt(cells) when the cells' errors are
    # independent (the seed's shared warm start adds to it)
    needed = {
        g: seeds_for_effect(diff_sd / 100 / n**0.5, 0.05, ALPHA * LOOK_SHARES[-1] / hypotheses)
        for g, n in per_group.items()
    }
    warm = cfg.max_seeds * WARM_START_SECONDS / jobs / 60 if embedded(first_cfg) else 0.0
    timed = all(c["minutes"] is not None for c in cells)
    return {
        "cells": cells,
        "runs": sum(c["runs"] for c in cells),
        "runs_at_cap": sum(c["runs_at_cap"] for c in cells),
        "minutes": warm * cfg.seeds / cfg.max_seeds + sum(c["minutes"] for c in cells) if timed else None,
        "minutes_at_cap": warm + sum(c["minutes_at_cap"] for c in cells) if timed else None,
        "jobs": jobs,
        "diff_sd": diff_sd,
        "seeds": cfg.seeds,
        "max_seeds": cfg.max_seeds,
        "looks": [look for look in LOOKS if cfg.seeds <= look <= cfg.max_seeds],
        "seeds_for_5_points": needed,
        "batches": cfg.batches,
        "questions": [{"name": q.key, "question": q.text, "kind": q.kind, "group": q.group} for q in QUESTIONS],
        "rules": REGIME_RULES,
        "settings": {k: v for k, v in asdict(cfg).items() if k != "cells"},
    }


def format_regime_plan(cfg: RegimeConfig, est: dict) -> str:
    arms = ", ".join(LABELS[a] for a in (GRPO, GSPO, KPO, AUTO))
    if est["minutes"] is None:
        time, cap_time = "time not estimated: no run of this setup has been measured yet (or give --pilot)", ""
    else:
        time = f"about {est['minutes']:.0f} min on {est['jobs']} worker(s)"
        cap_time = f" ({est['minutes_at_cap']:.0f} min)"
    half = est["cells"][0]["half_width"]
    lines = [
        f"regime map: {len(cfg.cells)} cells x ({arms}; the stress cells also the clip band) x {cfg.seeds} seeds "
        f"= {est['runs']} runs of {cfg.batches} generation batches, {time}; up to {est['runs_at_cap']} runs"
        f"{cap_time} if every question stays undecided to {cfg.max_seeds} seeds",
        f"expected 95% half-width of a cell's contrast at {cfg.seeds} seeds: "
        + (f"+-{half:.1f} points" if half is not None else "none (one seed)")
        + f" (prior sd {est['diff_sd']:.1f} points)",
        "seeds a pooled accuracy question needs to decide a 5-point difference (80% power): "
        + ", ".join(f"{g} {n if n else 'more than the cap'}" for g, n in est["seeds_for_5_points"].items()),
    ]
    lines += [
        f"  {c['cell']} ({c['group']}): {c['runs']} runs" + ("" if c["minutes"] is None else f", ~{c['minutes']:.0f} min")
        for c in est["cells"]
    ]
    lines.append("questions (fixed before the runs):")
    lines += [f"  {q['name']}: {q['question']} [{q['kind']}, {q['group']} cells]" for q in est["questions"]]
    lines.append("rules (fixed before the runs):")
    lines += [f"  {k}: {v}" for k, v in REGIME_RULES.items()]
    return "\n".join(lines)


# ------------------------------------------------------------------ outcomes
def _outcome(folder: Path) -> dict | None:
    """:func:`kpo.compare.outcome.load_outcome` of ``folder``; CompareError (one line) where its file is torn."""
    try:
        return load_outcome(folder)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        raise CompareError([f"{folder}: its expected.json or eval.json is not a finished evaluation "
                            f"({type(e).__name__}: {e}); delete the folder to redo it"]) from None


def _expected(folder: Path) -> float | None:
    """The mean outcome of the model in ``folder`` (kpo.compare.outcome), None when it is not scored yet."""
    found = _outcome(folder)
    return None if found is None else found["mean"]


def _warm(cfg: RegimeConfig, seed: int) -> float | None:
    return _expected(Path(cfg.out) / f"warm_start-seed{seed}")


def outcomes(cfg: RegimeConfig, cell: Cell, seeds: int) -> dict[str, list[tuple[float, bool] | None]]:
    """Per arm label, per seed: (final accuracy, collapsed) of the cell's run, None where it has not finished (or
    its seed's warm start is not evaluated yet)."""
    found: dict[str, list] = {}
    for run in cell_runs(cfg, cell, seeds):
        final, warm = _expected(Path(cfg.out) / cell.name / "runs" / run.name), _warm(cfg, run.seed)
        done = final is not None and warm is not None
        found.setdefault(run.arm, [None] * seeds)[run.seed] = (final, final < warm) if done else None
    return found


# ------------------------------------------------------------------ running
def _share_warm_starts(cfg: RegimeConfig, seeds: int) -> None:
    """Every cell's warm-start folder of a seed is a link to the map's one (they are one model, evaluated once)."""
    out = Path(cfg.out)
    for cell in cfg.cells:
        for seed in range(seeds):
            link = warm_start_dir(out / cell.name, seed)
            link.parent.mkdir(parents=True, exist_ok=True)
            target = out / f"warm_start-seed{seed}"
            target.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(Path("..", "..", target.name))


def run_regimes(
    cfg: RegimeConfig, *, plan_only: bool = False, report_only: bool = False, pilot: Path | None = None
) -> Path | None:
    """Print the plan, the questions and the rules; then, look by look, train every missing run of every cell at
    its group's seeds (rewriting the map as each cell finishes), answer the questions, and give the cells of the
    undecided ones the next block of seeds, until every question is decided or at the cap. Returns report.md
    (None with ``plan_only``). ``report_only`` trains nothing: the looks are replayed up to the first one with a
    missing run, and the map is written as it stood after the last complete one."""
    from kpo.compare.plan import parallel_runs, pilot_sd
    from kpo.compare.run import Job, _done, _stale_run_errors, train_jobs

    if plan_only and report_only:
        raise CompareError(["--plan and --report: --plan prints the plan and stops, --report writes the map; give one"])
    cfg.validate()
    out = Path(cfg.out)
    on_disk = _read_plan(out / "plan.json")
    if report_only and on_disk is None:
        raise CompareError([f"{out}: no map here (no plan.json); --report rewrites a map: give its --out, or run "
                            "without --report to start one"])
    est = estimate_regimes(cfg, pilot_sd(pilot) if pilot is not None else DIFF_SD, pilot)
    print(format_regime_plan(cfg, est), flush=True)
    if on_disk is not None:
        _check_plan(out / "plan.json", on_disk, est)
    if plan_only:
        return None
    errors = _torn_files(cfg)
    for cell in cfg.cells if not errors else ():
        cell_cfg = cfg.cell_config(cell, cfg.max_seeds)
        errors += _stale_run_errors(cell_cfg, plan_runs(cell_cfg), Path(cell_cfg.out))
    if errors:
        raise CompareError(errors)
    if on_disk is None:
        out.mkdir(parents=True, exist_ok=True)
        with replacing(out / "plan.json") as partial:
            partial.write_text(json.dumps(est, indent=2) + "\n")
    seeds_of = {g: cfg.seeds for g, members in groups(cfg.cells).items() if members}
    looks: list[dict] = []

    def cell_seeds(cell: Cell) -> int:
        return seeds_of[cfg.group(cell)]

    def missing(cell: Cell) -> list[Job]:
        cell_cfg = cfg.cell_config(cell, cell_seeds(cell))
        folder = Path(cell_cfg.out) / "runs"
        return [
            Job(cell_cfg, r, folder / r.name, f"{cell.name}/{r.name}")
            for r in plan_runs(cell_cfg)
            if not _done(cell_cfg, folder / r.name)
        ]

    by_name = {cell.name: cell for cell in cfg.cells}

    def on_done(job: Job) -> list:
        cell = by_name[Path(job.cfg.out).name]
        if not missing(cell):
            write_cell_report(cfg, cell, cell_seeds(cell))
            write_regime_report(cfg, seeds_of, looks)
        return []

    while True:
        todo = [job for cell in cfg.cells for job in missing(cell)]
        if report_only and todo:
            if not looks:
                raise CompareError([f"{out}: no look has finished yet ({len(todo)} runs of the first to train)"])
            seeds_of.update(looks[-1]["seeds"])
            for cell in cfg.cells:
                write_cell_report(cfg, cell, cell_seeds(cell))
            return write_regime_report(cfg, seeds_of, looks)
        _share_warm_starts(cfg, max(seeds_of.values()))
        print(
            f"kpo compare regimes: look at {', '.join(f'{g} {n}' for g, n in seeds_of.items())} seeds a cell; "
            f"{len(todo)} runs to train; map in {out}",
            flush=True,
        )
        if todo:
            train_jobs(todo, parallel_runs(cfg.cell_config(cfg.cells[0], cfg.seeds)), on_done)
        for cell in cfg.cells:
            if not (out / cell.name / "report.md").exists() or todo:
                write_cell_report(cfg, cell, cell_seeds(cell))
        answers = decide(QUESTIONS, _data(cfg, seeds_of), cfg.cells, seeds_of)
        looks.append({"seeds": dict(seeds_of), "answers": {a["name"]: a["verdict"] for a in answers}})
        extend = [g for g in groups_to_extend(answers, QUESTIONS, seeds_of) if seeds_of[g] < cfg.max_seeds]
        if not extend:
            return write_regime_report(cfg, seeds_of, looks)
        write_regime_report(cfg, seeds_of, looks)
        for g in extend:
            seeds_of[g] = next_look(seeds_of[g])
        print(f"undecided questions: {', '.join(extend)} cells get seeds up to {seeds_of}", flush=True)


def _torn_files(cfg: RegimeConfig) -> list[str]:
    """One line per file of the map's models (runs up to the cap, warm starts) that a stop mid-write left torn:
    an evaluation that is not JSON (or not a finished one), a kpo train config.yaml that is not one."""
    from kpo.compare.outcome import EVAL_FILE, EXPECTED_FILE
    from kpo.train.config import ConfigError, TrainConfig

    out = Path(cfg.out)
    folders = [out / f"warm_start-seed{s}" for s in range(cfg.max_seeds)]
    folders += [out / c.name / "runs" / r.name for c in cfg.cells for r in cell_runs(cfg, c, cfg.max_seeds)]
    errors = []
    for folder in (f for f in folders if f.is_dir()):
        fix = f"delete {folder} to redo it"
        torn = []
        for name in (EVAL_FILE, EXPECTED_FILE):
            try:
                if (folder / name).exists():
                    json.loads((folder / name).read_text())
            except (OSError, UnicodeDecodeError, ValueError) as e:
                torn.append(f"{folder / name}: not readable as JSON ({e}); {fix}")
        try:
            if not torn:
                _outcome(folder)
        except CompareError as e:
            torn = e.errors
        if cfg.engine == "kpo" and (folder / "config.yaml").exists():
            try:
                TrainConfig.from_yaml(folder / "config.yaml")
            except ConfigError as e:
                torn.append(" ".join(f"{'; '.join(e.errors)}; {fix}".split()))  # YAML's message spans lines
        errors += torn
    return errors


def _data(cfg: RegimeConfig, seeds_of: dict[str, int]) -> dict:
    """The map's outcomes as the questions read them: cell name -> arm -> per seed (accuracy, collapsed)."""
    return {cell.name: outcomes(cfg, cell, seeds_of[cfg.group(cell)]) for cell in cfg.cells}


# What a plan fixes: a command whose flags give another value of one of these is another map.
PLAN_DESIGN = {
    "cells": "the cells (--mismatch, --depth, --lr, --cells)",
    "seeds": "--seeds",
    "max_seeds": "--max-seeds",
    "batches": "--batches",
    "questions": "the questions (kpo.compare.regimes.QUESTIONS)",
}
PLAN_SETTINGS = ("curve_every", "eval_n", "eval_limit", "train_args", "engine", "model", "dataset", "eval_data",
                 "verl_config")


def _read_plan(path: Path) -> dict | None:
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
        if "max_seeds" in plan:
            found["max_seeds"] = plan["max_seeds"]
        if "questions" in plan:
            found["questions"] = [q["name"] for q in plan["questions"]]
        settings = plan.get("settings", {})
        found |= {k: settings[k] for k in PLAN_SETTINGS if k in settings}
    except (KeyError, TypeError, AttributeError):
        return {"cells": "unreadable"}
    return json.loads(json.dumps(found))


def _check_plan(path: Path, on_disk: dict, est: dict) -> None:
    """CompareError naming every setting of this command that differs from the plan on disk: a plan written before
    the runs is never rewritten, and a command with other flags would be another map under its name."""
    was, now = _design(on_disk), _design(est)
    differ = [k for k in now if k in was and was[k] != now[k]]
    if differ:
        named = "; ".join(f"{PLAN_DESIGN.get(k, '--' + k.replace('_', '-'))}: plan {was[k]}, flags {now[k]}"
                          for k in differ)
        raise CompareError([f"{path} fixes another design than these flags ({named}): give the plan's flags, or a "
                            "new --out for a new map"])


def write_cell_report(cfg: RegimeConfig, cell: Cell, seeds: int) -> Path | None:
    """The cell's own ``kpo compare`` report (its Table 1, contrasts, Figure 3, Table 2) in ``OUT/CELL/``, over
    the seeds every run of it finished; None before two seeds have."""
    from kpo.compare.report import write_report
    from kpo.compare.run import _done

    finished = 0
    while finished < seeds:
        cell_cfg = cfg.cell_config(cell, finished + 1)
        folder = Path(cell_cfg.out) / "runs"
        if not all(_done(cell_cfg, folder / r.name) for r in plan_runs(cell_cfg) if r.seed == finished):
            break
        finished += 1
    if finished < 2:
        return None
    cell_cfg = cfg.cell_config(cell, finished)
    folder = Path(cell_cfg.out)
    with replacing(folder / "compare.json") as partial:
        partial.write_text(json.dumps(asdict(cell_cfg), indent=2) + "\n")
    return write_report(cell_cfg, plan_runs(cell_cfg), folder)


# ------------------------------------------------------------------ a cell of the map
def _arm_stats(cfg: RegimeConfig, cell: Cell, runs: list[Run]) -> dict:
    """One arm of a cell, from metrics.jsonl: the mean mismatch (rollout_corr/k3_kl), the clip fraction of every
    step, of the batches' first (on-policy) steps and of the others, and for KPO (auto) its fitted memory per
    generation batch over the arm's finished seeds (:func:`_memory_by_batch`). Rows of one optimizer step (kpo
    train's) are classified by their step; rows of a generation batch (verl's: each metric the mean over the
    batch's steps, :data:`kpo.compare.contract.BATCH_ROWS`) hold both kinds together, so the on-policy and
    off-policy figures are None unless every step is on-policy (depth 1), and the memory is each batch's mean."""
    from kpo.compare.engines import BATCH_ROWS, engine_of
    from kpo.protocol import on_policy_step
    from kpo.train.metrics import load_metrics

    per_batch = engine_of(cfg).rows == BATCH_ROWS
    k3, every, first, rest, memory = [], [], [], [], {}
    for run in runs:
        folder = Path(cfg.out) / cell.name / "runs" / run.name
        if _expected(folder) is None:
            continue
        for r in load_metrics(folder):
            on_policy = cell.depth == 1 if per_batch else on_policy_step(r["step"], cell.depth)
            if r.get("rollout_corr/k3_kl") is not None:
                k3.append(r["rollout_corr/k3_kl"])
            if r.get("clip_frac") is not None:
                every.append(r["clip_frac"])
                if on_policy:
                    first.append(r["clip_frac"])
                elif not per_batch:
                    rest.append(r["clip_frac"])
            if r.get("kpo/memory_tokens") is not None and (per_batch or not on_policy):
                memory.setdefault(-(-r["step"] // cell.depth), []).append(r["kpo/memory_tokens"])
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "k3_kl": mean(k3),
        "clip_frac": mean(every),
        "on_policy_clip_frac": mean(first),
        "off_policy_clip_frac": mean(rest),
        "memory_tokens": _memory_by_batch(memory) if memory else None,
    }


def _memory_by_batch(memory: dict[int, list[float]]) -> dict:
    """KPO (auto)'s fitted memories (tokens) of the off-policy steps, per generation batch: the share at the
    longest memory the fit allows (q at its lower bound: the likelihood sees no drift at all) and the median of
    the others. The two are apart because the fit is: a mean of both would describe no step."""
    import statistics

    from kpo.filter.fit import Q_BOUNDS
    from kpo.filter.memory import filter_memory

    longest = filter_memory(Q_BOUNDS[0])
    out = {}
    for batch, values in sorted(memory.items()):
        interior = [v for v in values if v < 0.999 * longest]
        out[batch] = {
            "at_bound": 1 - len(interior) / len(values),
            "median_below_bound": statistics.median(interior) if interior else None,
            "steps": len(values),
        }
    return {"longest": longest, "by_batch": out}


CONTRASTS = ((KPO, GRPO), (KPO, GSPO), (KPO, CLIP_BAND), (AUTO, GRPO), (AUTO, GSPO), (AUTO, KPO), (AUTO, CLIP_BAND))


def contrast_name(a: str, b: str) -> str:
    return f"{LABELS[a]} - {LABELS[b]}"


def cell_entry(cfg: RegimeConfig, cell: Cell, seeds: int) -> dict:
    """A cell of the map at ``seeds`` seeds: its settings, the warm starts, each arm's per-seed accuracy and
    collapses (count and exact bound) and what its runs logged, with :func:`describe_cell`'s contrasts, pick and
    filter or band."""
    from kpo.compare.stats import collapse_count

    runs = cell_runs(cfg, cell, seeds)
    found = outcomes(cfg, cell, seeds)
    arms = {}
    for arm, per_seed in found.items():
        flags = [None if x is None else x[1] for x in per_seed]
        done = [f for f in flags if f is not None]
        arms[arm] = {
            "label": LABELS[arm],
            "accuracy": [None if x is None else x[0] for x in per_seed],
            "collapsed": flags,
            "collapse": collapse_count(done),
            **_arm_stats(cfg, cell, [r for r in runs if r.arm == arm]),
        }
    finished = [s for s in range(seeds) if all(found[arm][s] is not None for arm in found)]
    entry = {
        "cell": cell.name,
        "group": cfg.group(cell),
        "mismatch": cell.mismatch,
        "depth": cell.depth,
        "lr": cell.lr,
        "steps": cfg.batches * cell.depth,
        "seeds": seeds,
        "finished_seeds": len(finished),
        "warm_start": [_warm(cfg, s) for s in range(seeds)],
        "arms": arms,
        "done": len(finished) == seeds,
        **describe_cell(found),
    }
    scored = [_outcome(Path(cfg.out) / cell.name / "runs" / r.name) for r in runs]
    entry["metric"] = next((o["metric"] for o in scored if o is not None), None)  # what "accuracy" is
    if cfg.curve_every and entry["done"]:
        entry["curve"] = _curve(cfg, cell, runs)
    return entry


def describe_cell(found: dict[str, list[tuple[float, bool] | None]]) -> dict:
    """A cell's descriptive statistics over the seeds every arm finished, from ``found`` (arm -> per seed
    (accuracy, collapsed), None unfinished): ``contrasts`` (t where no run of the pair collapsed, else the sign
    test, a seed where both collapsed a tie), from 2 seeds the ``pick`` set, ``pick_note`` where the pick cannot
    exclude any arm (:func:`_pick_note`), and ``filter_or_band`` where the clip band ran."""
    from kpo.compare.stats import mcnemar_exact, paired_accuracy, pick_set

    seeds = len(next(iter(found.values()), []))
    finished = [s for s in range(seeds) if all(found[arm][s] is not None for arm in found)]
    contrasts = {}
    for a, b in CONTRASTS:
        if a in found and b in found and len(finished) >= 2:
            d = [found[a][s][0] - found[b][s][0] for s in finished]
            fell = [found[a][s][1] or found[b][s][1] for s in finished]
            both = [found[a][s][1] and found[b][s][1] for s in finished]
            contrasts[contrast_name(a, b)] = paired_accuracy(d, fell, both=both)
    entry: dict = {"contrasts": contrasts}
    if len(finished) >= 2:
        per_arm = {arm: [found[arm][s][0] for s in finished] for arm in found}
        flags = {arm: [found[arm][s][1] for s in finished] for arm in found}
        entry["pick"] = pick_set(per_arm, flags)
        entry["pick_note"] = _pick_note(flags)
        if CLIP_BAND in found:
            entry["filter_or_band"] = {
                subject: _filter_or_band(mcnemar_exact(flags[CLIP_BAND], flags[subject]), LABELS[subject])
                for subject in (KPO, AUTO)
            }
    return entry


def _pick_note(flags: dict[str, list[bool]]) -> str | None:
    """Why the pick cannot exclude any arm, or None where it can: every pair of arms has a collapse (so the sign
    test compares them) and even a sign in every untied seed, p = 1 / 2^seeds, stays above the pick's level."""
    from kpo.compare.stats import ALPHA

    arms = list(flags)
    level = ALPHA / max(len(arms) - 1, 1)
    floors = []
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            pairs = list(zip(flags[a], flags[b]))
            if not any(x or y for x, y in pairs):
                return None  # a t-test compares these two: it can reach any level
            floors.append(0.5 ** sum(not (x and y) for x, y in pairs))
    if not floors or min(floors) <= level:
        return None
    untied = round(-math.log2(min(floors)))
    return (
        f"cannot exclude any arm: every pair of arms has a collapse, so the one-sided sign test compares them, and "
        f"its least p-value at {plural(untied, 'untied seed')}, 1/{2**untied} = {min(floors):.3g}, is above the "
        f"pick's level {ALPHA:g} / {len(arms) - 1} = {level:.3g}"
    )


def _filter_or_band(test: dict, subject: str) -> str:
    """What this cell's collapses say of filter or band: nothing when neither collapsed alone in any seed."""
    if test["a_only"] == test["b_only"] == 0:
        return f"no seed where only one of the clip band and {subject} collapsed: collapses cannot tell them apart"
    return (
        f"the clip band alone collapsed in {plural(test['a_only'], 'seed')}, {subject} alone in {test['b_only']} "
        f"(exact McNemar p = {test['p']:.2g}, this cell only)"
    )


def _curve(cfg: RegimeConfig, cell: Cell, runs: list[Run]) -> dict:
    """The cell's learning curves (curve.json of its runs): each arm's mean held-out accuracy at every checkpoint,
    KPO's paired contrast with GRPO and GSPO there, and the "slower or worse" verdict (:data:`REGIME_RULES`)."""
    from kpo.compare.plan import CURVE_FILE
    from kpo.compare.stats import paired_accuracy

    folder = Path(cfg.out) / cell.name / "runs"
    found: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        if run.arm != CLIP_BAND:
            found.setdefault(run.arm, []).append(json.loads((folder / run.name / CURVE_FILE).read_text())["steps"])
    steps = sorted(int(k) for k in found[KPO][0])
    batches = [step // cell.depth for step in steps]
    per_seed = {arm: [[c[str(step)]["mean"] for c in curves] for step in steps] for arm, curves in found.items()}
    means = {arm: [sum(v) / len(v) for v in values] for arm, values in per_seed.items()}
    warm = [_warm(cfg, s) for s in range(len(found[KPO]))]
    contrasts = {}
    for arm in (GRPO, GSPO):
        points = []
        for i in range(len(steps)):
            a, b = per_seed[KPO][i], per_seed[arm][i]
            fell = [x < w or y < w for x, y, w in zip(a, b, warm)]
            both = [x < w and y < w for x, y, w in zip(a, b, warm)]
            found_i = paired_accuracy([x - y for x, y in zip(a, b)], fell, both=both)
            points.append(found_i | {"verdict": _interval_verdict(found_i)})
        contrasts[contrast_name(KPO, arm)] = points
    best = max((GRPO, GSPO), key=lambda arm: means[arm][-1])
    line = contrasts[contrast_name(KPO, best)]
    at_map = line[batches.index(BATCHES)]["verdict"] if BATCHES in batches else None
    if at_map is None:
        pace = None
    elif at_map != "worse":
        pace = "not behind"
    else:
        pace = "worse" if line[-1]["verdict"] == "worse" else "slower"
    return {
        "batches": batches,
        "means": means,
        "per_seed": per_seed,
        "contrasts": contrasts,
        "best_baseline": best,
        "pace": pace,
    }


def _interval_verdict(c: dict) -> str:
    """A descriptive contrast's word from its 95% interval: worse / better / within +-5 points / undecided (no
    interval: undecided)."""
    from kpo.compare.stats import MARGIN

    low, high = c.get("low"), c.get("high")
    if low is None or high is None:
        return "undecided"
    if high < 0:
        return "worse"
    if low > 0:
        return "better"
    if -MARGIN <= low and high <= MARGIN:
        return "within +-5 points"
    return "undecided"


def write_regime_report(cfg: RegimeConfig, seeds_of: dict[str, int], looks: list[dict]) -> Path:
    """The map as it stands: ``report.md``, ``report.json`` (``cells``: :func:`cell_entry` of each; ``questions``:
    the answers of :func:`kpo.compare.questions.decide`; ``looks``), ``regimes.png`` and ``memory.png`` in
    ``cfg.out``; returns report.md."""
    from kpo.compare.regime_report import render_map

    out = Path(cfg.out)
    plan = _read_plan(out / "plan.json") or {}
    entries = [cell_entry(cfg, cell, seeds_of[cfg.group(cell)]) for cell in cfg.cells]
    answers = decide(QUESTIONS, _data(cfg, seeds_of), cfg.cells, seeds_of)
    describe(QUESTIONS, answers)
    return render_map(out, entries, answers, looks, plan)
