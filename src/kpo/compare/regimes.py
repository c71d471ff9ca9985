"""``kpo compare regimes``: where does KPO help? A grid of regimes (cells), each decided as ``kpo compare`` decides.

The paper's argument is about token ratios made noisy by train-inference mismatch, staleness and high learning
rates, where GRPO collapses. A cell fixes one point of that space:

- mismatch: ``none`` (the sampler is the trainer's float32 policy, the ratio's anchor the trainer's recomputed
  log-probs: every batch's first step has ratio 1), ``bf16`` or ``fp8`` (the sampler a bf16 or FP8 copy of the
  policy and the anchor the sampler's log-probs, verl's bypass mode: the mismatch reaches every ratio;
  :mod:`kpo.train.sampler`);
- depth: optimizer steps per generation batch (``--minibatches``), every cell drawing the same number of
  generation batches (``batches``), so the same number of samples: depth 16 takes 4 times the steps of depth 4 on
  mini-batches a quarter the size, 15 of every 16 of them off-policy;
- learning rate.

Each cell runs vanilla (GRPO), GSPO and KPO at the length-matched memory, paired by seed (the arms of a seed share
its warm start, prompt stream and evaluation problems) into a full ``kpo compare`` report of its own in
``OUT/CELL/``. Where KPO or GSPO survives what breaks vanilla, the cell also runs the token ratio clipped at KPO's
band without the filter, so the map says whether the filter or the tight band saves it. Every cell's seeds share
one warm start per seed (``OUT/warm_start-seedN`` holds its evaluation). The map (``report.md``, ``report.json``
with its cells in a list ``cells``, ``regimes.png``) is rewritten as each cell finishes, so a partial map is
readable while the rest runs, and a rerun resumes (finished runs are reused).

The claim rules (:data:`REGIME_RULES`) are printed and written to ``plan.json`` before anything trains.
"""

from __future__ import annotations

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

__all__ = [
    "REGIME_RULES",
    "Cell",
    "RegimeConfig",
    "cell_runs",
    "collapses",
    "estimate_regimes",
    "format_regime_plan",
    "needs_clip_band",
    "run_regimes",
    "survivors",
]

# The sampler of each mismatch level, as kpo train flags.
MISMATCH = {
    "none": (),
    "bf16": ("--rollout-dtype", "bfloat16", "--ratio-anchor", "rollout"),
    "fp8": ("--rollout-dtype", "float8", "--ratio-anchor", "rollout"),
}
METHODS = ("vanilla", "gspo")  # the baselines; KPO at the matched memory is every cell's subject
KPO = Run("kpo", 0, MATCHED_KWARGS).arm
CLIP_BAND = Run(ABLATIONS["clip_band"][0], 0, ABLATIONS["clip_band"][1]).arm
GRPO, GSPO = "vanilla", "gspo"
# The default grid: 2 x 2 x 2 cells. The stress learning rate is where vanilla started to fail in a one-seed pilot
# (issue 32: at 5e-4 vanilla broke down on seeds 0 and 1, not on seed 2; at 1e-3 every method fell to 0).
GRID = {"mismatch": ("none", "bf16"), "depth": (4, 16), "lr": (1e-4, 5e-4)}
BATCHES = 20  # generation batches per run: 80 steps at depth 4, as kpo compare's default
SEEDS = 4
# The plan's prior for the sd over seeds of a paired difference, in points: cautious. The default compare
# measured 2.4 at one operating point; another 2-core machine gave that compare's key contrast -1.1 and -10.4 on
# two seeds (ours: -4.2, -5.1), and a collapse moves one seed by tens of points.
DIFF_SD = 5.0
# Cost of a generation batch beside the float32 sampler's. The default map measured bf16 runs at 1.28-1.46 min
# against 1.50-1.53 for float32 at depth 16 (2 workers, idle machine): no dearer. FP8 (rounding of activations,
# keys and values at every step) is not measured in a map: 4-step runs took about 1.3 times float32's first step.
SAMPLER_COST = {"none": 1.0, "bf16": 1.0, "fp8": 1.3}

REGIME_RULES = {
    "metric": "exact expected held-out accuracy (256 problems), as kpo compare",
    "contrasts": "in each cell, KPO (matched) - vanilla (GRPO) and KPO (matched) - GSPO, paired by seed (Student-t "
    "95% interval over seed pairs); verdict as kpo compare: better (interval above 0), worse (below 0), "
    "equivalent (inside +-5 points), else undecided",
    "collapse": "a run collapsed when its final held-out accuracy is below its seed's warm start's (RL lost all it "
    "gained and more)",
    "survives": "a method survives what breaks vanilla in a cell when vanilla collapsed in at least one seed "
    "where that method did not",
    "clip_band": "where KPO or GSPO survives what breaks vanilla, the cell also runs vanilla at KPO's clip band "
    "(3e-4/4e-4) without the filter at every seed; the filter saves KPO where the clip band collapses in a seed "
    "where KPO does not, the band saves it where the clip band survives too",
    "KPO helps": "a cell where KPO (matched) is better than GRPO or GSPO and worse than neither",
    "pick": "per cell, the arm with the highest mean held-out accuracy over its seeds",
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

    @property
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
    """``none-depth4-lr0.0001`` (a cell's name) -> Cell; ValueError naming the form otherwise."""
    try:
        mismatch, depth, lr = text.split("-depth")[0], *text.split("-depth")[1].split("-lr")
        return Cell(mismatch, int(depth), float(lr))
    except (IndexError, ValueError):
        raise ValueError(f"cell {text!r}: write MISMATCH-depthN-lrX, e.g. none-depth4-lr0.0001") from None


@dataclass
class RegimeConfig:
    """Settings of one regime map; each field is the command-line option of the same name."""

    out: str = "runs/regimes"
    mismatch: tuple[str, ...] = GRID["mismatch"]
    depth: tuple[int, ...] = GRID["depth"]
    lr: tuple[float, ...] = GRID["lr"]
    cells_only: tuple[str, ...] = ()  # cell names (MISMATCH-depthN-lrX): these alone instead of the grid
    seeds: int = SEEDS
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
        for name, value, low in (
            ("seeds", self.seeds, 2),
            ("batches", self.batches, 1),
            ("curve-every", self.curve_every, 0),
        ):
            if value < low:
                errors.append(
                    f"--{name}={value}: must be >= {low}"
                    + (" (a paired interval needs 2 seeds)" if name == "seeds" else "")
                )
        if self.curve_every and self.batches % self.curve_every:
            errors.append(f"--curve-every={self.curve_every} must divide --batches={self.batches}")
        cells = []
        try:
            cells = [_parse_cell(c) for c in self.cells_only]
        except ValueError as e:
            errors.append(f"--cells: {e}")
        if errors:
            raise CompareError(errors)
        self.cells = cells or [Cell(m, d, lr) for m in self.mismatch for d in self.depth for lr in self.lr]
        if any(c.mismatch not in MISMATCH for c in self.cells):
            raise CompareError([f"--cells: mismatch must be one of {', '.join(MISMATCH)}"])
        if self.engine == "verl":
            _verl_cell_errors(self)
        first_error = {}
        for cell in self.cells:
            for clip_band in (False, True):
                try:
                    self.cell_config(cell, clip_band).validate()
                except CompareError as e:
                    for err in e.errors:
                        first_error.setdefault(err, cell.name)
        if first_error:
            raise CompareError([f"cell {cell}: {err}" for err, cell in first_error.items()])
        return self

    def cell_config(self, cell: Cell, clip_band: bool = False) -> CompareConfig:
        """The cell as a ``kpo compare``: vanilla, GSPO and KPO (matched), and the clip-band arm when asked."""
        steps = self.batches * cell.depth
        return CompareConfig(
            out=str(Path(self.out) / cell.name),
            methods=METHODS,
            seeds=self.seeds,
            steps=steps,
            minibatches=cell.depth,
            matched=True,
            ablations=clip_band,
            ablation_arms=("clip_band",),
            ablation_seeds=self.seeds,
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
def estimate_regimes(cfg: RegimeConfig, diff_sd: float = DIFF_SD) -> dict:
    """The plan: per cell its runs and minutes (and the clip-band runs it may add), the expected half-width of
    each contrast, t_{S-1} x diff_sd / sqrt(S) points; and the totals (wall clock on ``cfg.jobs`` workers)."""
    import os

    from kpo.compare.plan import held_out_problems
    from kpo.evaluation.metrics import t_quantile

    jobs = cfg.jobs if cfg.jobs is not None else os.cpu_count() or 1
    problems = held_out_problems(cfg.cell_config(cfg.cells[0]), cfg.eval_limit)
    half = t_quantile(0.975, cfg.seeds - 1) * diff_sd / cfg.seeds**0.5
    cells = []
    for cell in cfg.cells:
        runs = len(plan_runs(cfg.cell_config(cell)))
        per_run = (
            cfg.batches * cell.depth * STEP_SECONDS * 4 / cell.depth * SAMPLER_COST[cell.mismatch]
            + problems * cfg.eval_n * SAMPLE_SECONDS
            + RUN_SECONDS
        )
        cells.append(
            {
                "cell": cell.name,
                "runs": runs,
                "conditional_runs": cfg.seeds,
                "minutes": runs * per_run / jobs / 60,
                "conditional_minutes": cfg.seeds * per_run / jobs / 60,
                "half_width": half,
            }
        )
    warm = cfg.seeds * WARM_START_SECONDS / jobs / 60
    return {
        "cells": cells,
        "runs": sum(c["runs"] for c in cells),
        "minutes": warm + sum(c["minutes"] for c in cells),
        "conditional_minutes": sum(c["conditional_minutes"] for c in cells),
        "diff_sd": diff_sd,
        "seeds": cfg.seeds,
        "batches": cfg.batches,
        "rules": REGIME_RULES,
        "settings": {k: v for k, v in asdict(cfg).items() if k != "cells"},
    }


def format_regime_plan(cfg: RegimeConfig, est: dict) -> str:
    lines = [
        f"regime map: {len(cfg.cells)} cells x (vanilla, GSPO, KPO matched) x {cfg.seeds} seeds = {est['runs']} runs "
        f"of {cfg.batches} generation batches, about {est['minutes']:.0f} min on {cfg.jobs or 'all'} worker(s) "
        f"(warm starts included); where KPO or GSPO survives what breaks vanilla, {cfg.seeds} clip-band runs more "
        f"(up to {est['conditional_minutes']:.0f} min in all)",
        f"expected 95% half-width of each cell's contrasts: +-{est['cells'][0]['half_width']:.1f} points "
        f"({cfg.seeds} paired seeds, prior sd {est['diff_sd']:.1f} points)",
    ]
    lines += [f"  {c['cell']}: {c['runs']} runs, ~{c['minutes']:.0f} min" for c in est["cells"]]
    lines.append("claim rules (fixed before the runs):")
    lines += [f"  {k}: {v}" for k, v in REGIME_RULES.items()]
    return "\n".join(lines)


# ------------------------------------------------------------------ decisions
def _expected(folder: Path) -> float | None:
    """The mean outcome of the model in ``folder`` (kpo.compare.outcome), None when it is not scored yet."""
    found = load_outcome(folder)
    return None if found is None else found["mean"]


def cell_runs(cfg: RegimeConfig, cell: Cell, clip_band: bool) -> list[Run]:
    return plan_runs(cfg.cell_config(cell, clip_band))


def collapses(cfg: RegimeConfig, cell: Cell) -> dict[str, list[bool | None]] | None:
    """Per arm label, per seed: whether the run collapsed (:data:`REGIME_RULES`), None where it has not finished;
    None when a warm start's accuracy is missing."""
    out = Path(cfg.out)
    warm = [_expected(out / f"warm_start-seed{s}") for s in range(cfg.seeds)]
    if any(w is None for w in warm):
        return None
    found: dict[str, list[bool | None]] = {}
    for run in cell_runs(cfg, cell, clip_band=True):
        final = _expected(out / cell.name / "runs" / run.name)
        found.setdefault(run.arm, [None] * cfg.seeds)[run.seed] = (
            None if final is None else final < warm[run.seed]
        )
    return found


def survivors(flags: dict[str, list[bool | None]]) -> list[str]:
    """The arms (GSPO, KPO) that did not collapse in a seed where vanilla did."""
    vanilla = flags[GRPO]
    return [arm for arm in (GSPO, KPO) if any(v and flags[arm][s] is False for s, v in enumerate(vanilla))]


def _key_arms_done(flags: dict | None) -> bool:
    return flags is not None and all(v is not None for arm in (GRPO, GSPO, KPO) for v in flags[arm])


def needs_clip_band(cfg: RegimeConfig, cell: Cell) -> bool:
    flags = collapses(cfg, cell)
    return _key_arms_done(flags) and bool(survivors(flags))


# ------------------------------------------------------------------ running
def _share_warm_starts(cfg: RegimeConfig) -> None:
    """Every cell's warm-start folder of a seed is a link to the map's one (they are one model, evaluated once)."""
    out = Path(cfg.out)
    for cell in cfg.cells:
        for seed in range(cfg.seeds):
            link = warm_start_dir(out / cell.name, seed)
            link.parent.mkdir(parents=True, exist_ok=True)
            target = out / f"warm_start-seed{seed}"
            target.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(Path("..", "..", target.name))


def run_regimes(cfg: RegimeConfig, *, plan_only: bool = False, pilot: Path | None = None) -> Path | None:
    """Print the plan and the claim rules, then run every missing run of every cell (the clip-band arm of a cell
    as soon as its key arms call for it) and rewrite the map as each cell finishes; returns report.md (None with
    ``plan_only``)."""
    from kpo.compare.plan import parallel_runs, pilot_sd
    from kpo.compare.run import Job, _done, _stale_run_errors, train_jobs

    cfg.validate()
    est = estimate_regimes(cfg, pilot_sd(pilot) if pilot is not None else DIFF_SD)
    print(format_regime_plan(cfg, est), flush=True)
    if plan_only:
        return None
    out = Path(cfg.out)
    errors = []
    for cell in cfg.cells:
        cell_cfg = cfg.cell_config(cell, clip_band=True)
        errors += _stale_run_errors(cell_cfg, plan_runs(cell_cfg), Path(cell_cfg.out))
    if errors:
        raise CompareError(errors)
    out.mkdir(parents=True, exist_ok=True)
    _write_plan(out / "plan.json", est)
    _share_warm_starts(cfg)

    def jobs_of(cell: Cell, clip_band: bool) -> list[Job]:
        cell_cfg = cfg.cell_config(cell, clip_band)
        runs = cell_runs(cfg, cell, clip_band)
        if clip_band:
            runs = [r for r in runs if r.arm == CLIP_BAND]
        return [
            Job(cell_cfg, r, Path(cell_cfg.out) / "runs" / r.name, f"{cell.name}/{r.name}")
            for r in runs
            if not _done(cell_cfg, Path(cell_cfg.out) / "runs" / r.name)
        ]

    clip_cells = {cell for cell in cfg.cells if needs_clip_band(cfg, cell)}
    todo = [job for cell in cfg.cells for job in jobs_of(cell, clip_band=cell in clip_cells)]
    print(f"kpo compare regimes: {len(todo)} runs to train; map in {out}", flush=True)
    by_cell = {cell.name: cell for cell in cfg.cells}

    def on_done(job: Job) -> list[Job]:
        """A cell's clip-band runs once its key arms call for them; the cell's report and the map once it is done."""
        cell = by_cell[Path(job.cfg.out).name]
        new = []
        if cell not in clip_cells and needs_clip_band(cfg, cell):
            clip_cells.add(cell)
            new = jobs_of(cell, clip_band=True)
        if not new and cell_done(cfg, cell):
            write_cell_report(cfg, cell)
            write_regime_report(cfg)
        return new

    if todo:
        train_jobs(todo, parallel_runs(cfg.cell_config(cfg.cells[0])), on_done)
    for cell in cfg.cells:
        if cell_done(cfg, cell) and not (Path(cfg.out) / cell.name / "report.md").exists():
            write_cell_report(cfg, cell)
    return write_regime_report(cfg)


def _write_plan(path: Path, est: dict) -> None:
    """Write the plan unless ``path`` holds one of the same design (cells, seeds, batches): what was fixed before
    the runs stays when the map resumes."""

    def design(plan: dict) -> tuple:
        return [c["cell"] for c in plan["cells"]], plan["seeds"], plan["batches"]

    if path.exists() and design(json.loads(path.read_text())) == design(est):
        return
    with replacing(path) as partial:
        partial.write_text(json.dumps(est, indent=2) + "\n")


def cell_done(cfg: RegimeConfig, cell: Cell) -> bool:
    """Whether every run the cell calls for (its key arms, and its clip-band arm where they call for it) is done."""
    from kpo.compare.run import _done

    cell_cfg = cfg.cell_config(cell, needs_clip_band(cfg, cell))
    return all(_done(cell_cfg, Path(cell_cfg.out) / "runs" / r.name) for r in plan_runs(cell_cfg))


def write_cell_report(cfg: RegimeConfig, cell: Cell) -> Path:
    """The cell's own ``kpo compare`` report (its Table 1, contrasts, Figure 3, Table 2) in ``OUT/CELL/``."""
    from kpo.compare.report import write_report

    cell_cfg = cfg.cell_config(cell, needs_clip_band(cfg, cell))
    folder = Path(cell_cfg.out)
    with replacing(folder / "compare.json") as partial:
        partial.write_text(json.dumps(asdict(cell_cfg), indent=2) + "\n")
    return write_report(cell_cfg, plan_runs(cell_cfg), folder)


def _arm_stats(cfg: RegimeConfig, cell: Cell, arm: str, runs: list[Run]) -> dict:
    """One arm of a cell: per seed its final accuracy (None: not done) and, from metrics.jsonl, the mean
    mismatch (rollout_corr/k3_kl), clip fraction of the batches' first (on-policy) steps and of the others."""
    from kpo.train.config import on_policy_step
    from kpo.train.metrics import load_metrics

    acc, k3, first, rest = [None] * cfg.seeds, [], [], []
    for run in runs:
        folder = Path(cfg.out) / cell.name / "runs" / run.name
        acc[run.seed] = _expected(folder)
        if acc[run.seed] is None:
            continue
        rows = load_metrics(folder)
        k3 += [r["rollout_corr/k3_kl"] for r in rows if r.get("rollout_corr/k3_kl") is not None]
        first += [
            r["clip_frac"]
            for r in rows
            if on_policy_step(r["step"], cell.depth) and r.get("clip_frac") is not None
        ]
        rest += [
            r["clip_frac"]
            for r in rows
            if not on_policy_step(r["step"], cell.depth) and r.get("clip_frac") is not None
        ]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "accuracy": acc,
        "k3_kl": mean(k3),
        "on_policy_clip_frac": mean(first),
        "off_policy_clip_frac": mean(rest),
    }


def _paired(cfg: RegimeConfig, cell: Cell, a: list[Run], b: list[Run]) -> dict | None:
    """Arm ``a`` minus arm ``b`` over the seeds both finished (kpo compare's paired contrast); None below 2."""
    from kpo.compare.report import _contrast, _load_eval

    folder = Path(cfg.out) / cell.name / "runs"
    seeds = [s for s in range(cfg.seeds) if all(_expected(folder / r.name) is not None for r in (a[s], b[s]))]
    if len(seeds) < 2:
        return None
    found = _contrast(
        [_load_eval(folder / a[s].name) for s in seeds], [_load_eval(folder / b[s].name) for s in seeds]
    )
    return {k: found[k] for k in ("seeds", "mean", "low", "high", "half_width", "per_seed", "sd", "verdict")}


def cell_entry(cfg: RegimeConfig, cell: Cell) -> dict:
    """A cell of the map: its settings, each arm's accuracies and collapses, the warm starts, the paired contrasts
    of KPO (matched) against GRPO, GSPO and (where it ran) the clip band, and what the rules conclude."""
    runs = cell_runs(cfg, cell, clip_band=True)
    by_arm = {
        arm: sorted((r for r in runs if r.arm == arm), key=lambda r: r.seed)
        for arm in (GRPO, GSPO, KPO, CLIP_BAND)
    }
    flags = collapses(cfg, cell) or {}
    clip = needs_clip_band(cfg, cell)
    arms = {
        arm: {**_arm_stats(cfg, cell, arm, rs), "collapsed": flags.get(arm)}
        for arm, rs in by_arm.items()
        if arm != CLIP_BAND or clip
    }
    contrasts = {
        f"KPO - {name}": _paired(cfg, cell, by_arm[KPO], by_arm[arm])
        for name, arm in (("GRPO", GRPO), ("GSPO", GSPO), ("clip band", CLIP_BAND))
        if arm != CLIP_BAND or clip
    }
    entry = {
        "cell": cell.name,
        "mismatch": cell.mismatch,
        "depth": cell.depth,
        "lr": cell.lr,
        "steps": cfg.batches * cell.depth,
        "warm_start": [_expected(Path(cfg.out) / f"warm_start-seed{s}") for s in range(cfg.seeds)],
        "arms": arms,
        "contrasts": contrasts,
        "survivors": survivors(flags) if _key_arms_done(flags) else None,
        "clip_band_ran": clip,
    }
    entry["done"] = all(v is not None for a in arms.values() for v in a["accuracy"])
    scored = [load_outcome(Path(cfg.out) / cell.name / "runs" / r.name) for r in runs]
    entry["metric"] = next((o["metric"] for o in scored if o is not None), None)  # what "accuracy" is
    entry["conclusion"] = _conclude(entry)
    if cfg.curve_every and entry["done"]:
        entry["curve"] = _curve(cfg, cell, by_arm)
    return entry


def _curve(cfg: RegimeConfig, cell: Cell, by_arm: dict[str, list[Run]]) -> dict:
    """The cell's learning curves (curve.json of its runs): each arm's mean held-out accuracy at every checkpoint,
    KPO's paired contrast with GRPO and GSPO there, and the "slower or worse" verdict (:data:`REGIME_RULES`)."""
    from kpo.compare.plan import CURVE_FILE
    from kpo.compare.report import verdict
    from kpo.evaluation.metrics import paired_diff_ci

    folder = Path(cfg.out) / cell.name / "runs"
    found = {
        arm: [json.loads((folder / r.name / CURVE_FILE).read_text())["steps"] for r in runs]
        for arm, runs in by_arm.items()
        if arm != CLIP_BAND
    }
    steps = sorted(int(k) for k in found[KPO][0])
    batches = [step // cell.depth for step in steps]
    means = {
        arm: [sum(c[str(step)]["mean"] for c in curves) / len(curves) for step in steps] for arm, curves in found.items()
    }
    contrasts = {}
    for name, arm in (("GRPO", GRPO), ("GSPO", GSPO)):
        points = []
        for step in steps:
            a = [c[str(step)]["per_problem"] for c in found[KPO]]
            b = [c[str(step)]["per_problem"] for c in found[arm]]
            mean, low, high = paired_diff_ci(a, b, 1.0)
            points.append({"mean": mean, "low": low, "high": high, "verdict": verdict(low, high)})
        contrasts[f"KPO - {name}"] = points
    best = max((GRPO, GSPO), key=lambda arm: means[arm][-1])
    line = contrasts[f"KPO - {'GRPO' if best == GRPO else 'GSPO'}"]
    at_map = line[batches.index(BATCHES)]["verdict"] if BATCHES in batches else None
    if at_map is None:
        pace = None
    elif at_map != "worse":
        pace = "not behind"
    else:
        pace = "worse" if line[-1]["verdict"] == "worse" else "slower"
    return {"batches": batches, "means": means, "contrasts": contrasts, "best_baseline": best, "pace": pace}


def _conclude(entry: dict) -> dict:
    """What the rules say of a cell: KPO wins / ties / loses, what saves it where vanilla collapses, the pick."""
    verdicts = {k: (c or {}).get("verdict") for k, c in entry["contrasts"].items()}
    baseline = [verdicts.get("KPO - GRPO"), verdicts.get("KPO - GSPO")]
    if None in baseline:
        kpo = "pending"
    elif "worse" in baseline:
        kpo = "loses"
    elif "better" in baseline:
        kpo = "wins"
    elif all(v == "equivalent" for v in baseline):
        kpo = "ties"
    else:
        kpo = "undecided"
    saved_by = None
    if entry["clip_band_ran"] and entry["arms"].get(CLIP_BAND, {}).get("collapsed") is not None:
        band, kpo_flags = entry["arms"][CLIP_BAND]["collapsed"], entry["arms"][KPO]["collapsed"]
        if None not in band:
            filter_saves = any(b and k is False for b, k in zip(band, kpo_flags))
            saved_by = "the filter" if filter_saves else "the tight band"
    means = {
        arm: sum(a["accuracy"]) / len(a["accuracy"])
        for arm, a in entry["arms"].items()
        if None not in a["accuracy"]
    }
    pick = max(means, key=means.get) if means else None
    return {"kpo": kpo, "saved_by": saved_by, "pick": pick, "means": means}


def write_regime_report(cfg: RegimeConfig) -> Path:
    """The map as it stands: ``report.md``, ``report.json`` (``cells``: :func:`cell_entry` of each) and
    ``regimes.png`` in ``cfg.out``; returns report.md."""
    from kpo.compare.regime_report import render_map

    out = Path(cfg.out)
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else {}
    return render_map(
        out,
        [cell_entry(cfg, cell) for cell in cfg.cells],
        plan,
        labels={"KPO": KPO, "GRPO": GRPO, "GSPO": GSPO, "clip band": CLIP_BAND},
    )
