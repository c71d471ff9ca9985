"""The regime map's design (:mod:`kpo.compare.regimes`): its settings, cells, arms, questions and rules, and what a
cell of it says (:func:`cell_entry`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from kpo.compare.cell import MISMATCH, Cell, parse_cell
from kpo.compare.checks import out_errors
from kpo.compare.engines import engine_of
from kpo.compare.outcome import load_outcome
from kpo.compare.plan import (
    ABLATIONS,
    MATCHED_KWARGS,
    CompareConfig,
    CompareError,
    Run,
    cell_compare,
    checked_engine,
    plan_runs,
    shared_start_dir,
)
from kpo.compare.regimes.report import plural
from kpo.compare.stats import ALPHA
from kpo.compare.study.looks import nest, test_look
from kpo.compare.study.plan import collapsed
from kpo.compare.study.simulate import map_rows

__all__ = [
    "QUESTIONS",
    "REGIME_RULES",
    "Cell",
    "RegimeConfig",
    "answers",
    "cell_entry",
    "cell_runs",
    "describe_cell",
    "groups",
    "map_questions",
    "outcomes",
]

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

SEEDS = 6  # paired seeds a cell (the committed map's): the least at which a two-sided sign-flip p reaches 0.031
# The questions (issues 38 and 40, asked of every map since; read as leads, tested at the seed level since issue 53):
# (key, text, outcome, a, b, group); an outcome "bf16" asks whether the bf16 cells' a - b differs from the float32
# cells' of the same depth.
QUESTIONS = [
    ("grpo_collapses", "At the stress rate, does GRPO collapse more often than KPO (matched)?", "collapse", GRPO, KPO,
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
COLLAPSE = {"rule": "below_fraction_of_warm", "value": 1.0}  # below its seed's warm start (the study's rule format)

REGIME_RULES = {
    "metric": "exact expected held-out accuracy, as kpo compare",
    "collapse": "a run collapsed when its final held-out accuracy is below its seed's warm start's (RL lost all it "
    "gained and more); each arm's collapses with their exact (Clopper-Pearson) 95% interval",
    "arms": "every cell: GRPO, GSPO, KPO (matched), KPO (auto); the stress cells also the clip band (vanilla at "
    "KPO's 3e-4/4e-4 band, no filter)",
    "questions": "pooled over the stable cells (the map's lowest learning rate) or the stress cells (its highest), "
    "the seed as the unit: each seed's cells pooled into one a - b (collapsed runs, or mean accuracy over all pairs; "
    "for the bf16 question, a - b in the bf16 cells less a - b in the float32 cells of the same depths), the exact "
    "two-sided sign-flip test and a BCa bootstrap interval of the mean (a study's test, "
    "kpo.compare.study.looks.test_look), once, at the map's seeds",
    "multiplicity": "none: the p-values are unadjusted, each question a lead for a confirmatory study (kpo compare "
    "study), not a finding",
    "cells (descriptive)": "per cell, each contrast: the paired t-interval where no run of the pair collapsed, "
    "else the exact sign test and, from 6 seeds, the median's order-statistic interval; not adjusted",
    "pick": "per cell, the set of arms no other arm beats (one-sided paired tests, Bonferroni over the arms: "
    "multiple comparisons with the best), each with its collapse bound",
    "slower or worse": "with learning curves (--curve-every), against the baseline (GRPO or GSPO) with the higher "
    "final mean: KPO is slower where its paired contrast is worse at 20 generation batches (the map's length) and "
    "not worse at the last checkpoint, worse where it is worse at both, not behind where it is not worse at 20",
}


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
    keep: str = CompareConfig.keep
    ray_address: str | None = None
    ray_runtime_env: str | None = None
    cells: list[Cell] = field(init=False)

    def __post_init__(self) -> None:
        self.cells = []

    def validate(self) -> RegimeConfig:
        """Check every setting and every cell's compare before anything trains (CompareError lists them)."""
        engine = checked_engine(self)
        # each cell's folder sits under --out, so the cells' own checks would not see an empty one
        errors = out_errors(self.out) if not str(self.out).strip() else []
        unknown = sorted(set(self.mismatch) - set(MISMATCH))
        if unknown:
            errors.append(f"--mismatch {unknown}: unknown; use {', '.join(MISMATCH)}")
        if any(d < 1 for d in self.depth) or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lr):
            errors.append("--depth must be integers >= 1 and --lr finite numbers > 0")
        if self.seeds < 1:
            errors.append(f"--seeds={self.seeds}: give >= 1 (the questions need {SEEDS} for a two-sided p below 0.05)")
        for name, value, low in (("batches", self.batches, 1), ("curve-every", self.curve_every, 0)):
            if value < low:
                errors.append(f"--{name}={value}: must be >= {low}")
        if self.curve_every and self.batches % self.curve_every:
            errors.append(f"--curve-every={self.curve_every} must divide --batches={self.batches}")
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
        bad = [c for c in self.cells if c.mismatch not in MISMATCH or c.depth < 1 or not c.lr > 0]
        if bad:
            raise CompareError(
                [
                    f"--cells {c.name}: mismatch must be one of {', '.join(MISMATCH)}, depth an integer >= 1 and lr "
                    "a number > 0"
                    for c in bad
                ]
            )
        errors = engine.cell_errors(self)
        if errors:
            raise CompareError(errors)
        first_error = {}
        for cell in self.cells:
            try:
                self.cell_config(cell, self.seeds).validate()
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
        setup = ("eval_n", "eval_limit", "jobs", "engine", "model", "dataset", "eval_data", "verl_config", "keep",
                 "ray_address", "ray_runtime_env")
        return cell_compare(
            cell, self.batches, Path(self.out) / cell.name, self.train_args, methods=METHODS, seeds=seeds,
            matched=True, ablations=True, ablation_seeds=seeds, aa_seeds=0,
            curve_every=self.curve_every * cell.depth,
            ablation_arms=("auto_memory", "clip_band") if self.stress(cell) else ("auto_memory",),
            **{k: getattr(self, k) for k in setup},
        )


def cell_runs(cfg: RegimeConfig, cell: Cell, seeds: int) -> list[Run]:
    return plan_runs(cfg.cell_config(cell, seeds))

# ------------------------------------------------------------------ outcomes
def _expected(folder: Path) -> float | None:
    """The mean outcome of the model in ``folder`` (kpo.compare.outcome), None when it is not scored yet."""
    found = load_outcome(folder)
    return None if found is None else found["mean"]


def _warm(cfg: RegimeConfig, seed: int) -> float | None:
    return _expected(shared_start_dir(Path(cfg.out), seed))


def outcomes(cfg: RegimeConfig, cell: Cell, seeds: int) -> dict[str, list[tuple[float, bool] | None]]:
    """Per arm, per seed: (final accuracy, collapsed) of the cell's run, None where it has not finished (or its
    seed's warm start is not evaluated yet)."""
    found: dict[str, list] = {}
    for run in cell_runs(cfg, cell, seeds):
        final, warm = _expected(Path(cfg.out) / cell.name / "runs" / run.name), _warm(cfg, run.seed)
        done = final is not None and warm is not None
        found.setdefault(run.arm, [None] * seeds)[run.seed] = (final, collapsed(final, warm, COLLAPSE)) if done else None
    return found


def map_questions(cfg: RegimeConfig) -> list[dict]:
    """:data:`QUESTIONS` on this map's cells, as a study's questions (arms by label): a question whose group has no
    cell (or, for bf16, no bf16 cell with a float32 one of its depth) has none."""
    by_group = groups(cfg.cells)
    found = []
    for key, text, outcome, a, b, group in QUESTIONS:
        cells, versus = by_group[group], []
        if outcome == "bf16":
            base = {(c.depth, c.lr): c for c in cells if c.mismatch == "none"}
            pairs = [(c, base[c.depth, c.lr]) for c in cells if c.mismatch == "bf16" and (c.depth, c.lr) in base]
            cells, versus = [c for c, _ in pairs], [v.name for _, v in pairs]
        found.append({"key": key, "text": text, "outcome": "collapse" if outcome == "collapse" else "accuracy",
                      "metric": None, "a": LABELS[a], "b": LABELS[b], "group": group,
                      "cells": [c.name for c in cells], **({"versus": versus} if versus else {}),
                      "alternative": "two-sided", "margin": 0.0, "role": "descriptive", "test": "sign-flip"})
    return found


def answers(cfg: RegimeConfig, entries: list[dict]) -> list[dict]:
    """Each question of :func:`map_questions` on the map's cells (``entries``: :func:`cell_entry` of each, at the
    map's seeds): with ``look`` (its test, unadjusted) and verdict "lead" once every run it reads has finished,
    "pending" before, "not asked" where it has no cell, "one seed: no test" in a smoke map."""
    data = {e["cell"]: {} for e in entries} | nest(map_rows(entries))
    seeds = cfg.seeds
    found = []
    for q in map_questions(cfg):
        cells = q["cells"] + q.get("versus", [])
        done = all(s in data[c].get(q[side], {}) for c in cells for side in ("a", "b") for s in range(seeds))
        if not cells:
            found.append(q | {"verdict": "not asked"})
        elif seeds < 2:
            found.append(q | {"verdict": "one seed: no test"})
        elif not done:
            found.append(q | {"verdict": "pending"})
        else:
            found.append(q | {"verdict": "lead", "look": test_look(q, data, list(range(seeds)), COLLAPSE)})
    return found


# ------------------------------------------------------------------ a cell of the map
def _arm_stats(cfg: RegimeConfig, cell: Cell, runs: list[Run], response_tokens: int | None = None) -> dict:
    """One arm of a cell, from metrics.jsonl: the mean mismatch (rollout_corr/k3_kl), the clip fraction of every
    step, of the batches' first (on-policy) steps and of the others, and for KPO (auto) its fitted memory per
    generation batch over the arm's finished seeds (:func:`_memory_by_batch`). Rows of one optimizer step (kpo
    train's) are classified by their step; rows of a generation batch (verl's: each metric the mean over the
    batch's steps, :data:`kpo.compare.contract.BATCH_ROWS`) hold both kinds together, so the on-policy and
    off-policy figures are None unless every step is on-policy (depth 1), and the memory is each batch's mean
    (a row's ``batch`` where it has one: a verl batch is --minibatches x ppo_epochs steps). ``response_tokens``:
    the runs' response budget, which the memory figure's matched memory is of."""
    from kpo.compare.engines import BATCH_ROWS
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
                memory.setdefault(r.get("batch") or -(-r["step"] // cell.depth), []).append(r["kpo/memory_tokens"])
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "k3_kl": mean(k3),
        "clip_frac": mean(every),
        "on_policy_clip_frac": mean(first),
        "off_policy_clip_frac": mean(rest),
        "memory_tokens": (
            {**_memory_by_batch(memory), "rows": engine_of(cfg).rows, "response_tokens": response_tokens}
            if memory
            else None
        ),
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
    response = engine_of(cfg).eval_settings(cfg.cell_config(cell, seeds)).get("max_new_tokens")
    arms = {}
    for arm, per_seed in found.items():
        flags = [None if x is None else x[1] for x in per_seed]
        done = [f for f in flags if f is not None]
        arms[arm] = {
            "label": LABELS[arm],
            "accuracy": [None if x is None else x[0] for x in per_seed],
            "collapsed": flags,
            "collapse": collapse_count(done),
            **_arm_stats(cfg, cell, [r for r in runs if r.arm == arm], response),
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
    scored = [load_outcome(Path(cfg.out) / cell.name / "runs" / r.name) for r in runs]
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
    from kpo.compare.contrasts import verdict
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
            points.append(found_i | {"verdict": verdict(found_i["low"], found_i["high"], "within +-5 points")})
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

