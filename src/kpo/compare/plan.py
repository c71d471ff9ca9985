"""The plan of ``kpo compare``: its settings (:class:`CompareConfig`, every one checked before anything trains:
:mod:`kpo.compare.checks` and the engine's own checks), the arms and runs they give, the contrasts the report
decides on, and what the comparison costs and can resolve (:func:`estimate`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from kpo.compare.defaults import (
    AA_SEEDS,
    ABLATION_SEEDS,
    ABLATIONS,
    DEFAULT_ABLATIONS,
    DEFAULT_METHODS,
    EVAL_N,
    MATCHED,
    MATCHED_KWARGS,
    PAPER,
    QUICK,
    REPLICA_SEED,
    SEEDS,
    STEPS,
    SWEEP_MEMORY,
)
from kpo.compare.engines import Engine, engine_of

WARM_START = "warm_start"  # the Table 1 row of the models every run starts from
TIMING_FILE = "timing.json"  # a finished run's wall-clock seconds, training and evaluation (for the plan)


class CompareError(ValueError):
    """Settings that cannot give a valid comparison; the message lists every problem with its fix."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("kpo compare:\n" + "\n".join(f"  - {e}" for e in self.errors))


@dataclass
class CompareConfig:
    """Settings of one comparison; each field is the command-line option of the same name."""

    out: str = "runs/compare"
    methods: tuple[str, ...] = DEFAULT_METHODS
    seeds: int | None = None  # seeds of the methods and KPO (matched); None = SEEDS (quick: QUICK)
    steps: int | None = None  # optimizer steps per run; None = STEPS (quick: QUICK)
    minibatches: int = 4  # optimizer steps per generation batch (3 of 4 off-policy in the paper)
    matched: bool = True  # KPO at the length-matched memory, every seed: the arm the claims are about
    ablations: bool = True  # the ABLATIONS named in ablation_arms at ablation_seeds seeds (needs matched)
    ablation_arms: tuple[str, ...] = DEFAULT_ABLATIONS
    ablation_seeds: int | None = None  # None = ABLATION_SEEDS (quick: QUICK)
    aa_seeds: int | None = None  # seeds of the A/A arm; 0 = none; None = AA_SEEDS (quick: QUICK)
    sweep_memory: tuple[str, ...] = SWEEP_MEMORY  # KPO's memory sweep (Figure 4); empty = no sweep
    sweep_seeds: int | None = 1  # seeds of the sweep's extra runs; None = all seeds
    eval_n: int | None = None  # samples per held-out problem; None = EVAL_N (quick: QUICK)
    eval_limit: int | None = None  # held-out problems; None = the task's default test split
    dump_every: int = 5  # ratio dumps every N optimizer steps (analysis input)
    jobs: int | None = None  # parallel runs; None = CPU count
    train_args: tuple[str, ...] = ()  # extra `kpo train` flags shared by every run, e.g. ("--n-terms", "4")
    quick: bool = False
    engine: str = "kpo"  # what trains each run: "kpo" (kpo train), "verl" (verl's main_ppo): kpo.compare.engines
    model: str | None = None  # Hugging Face causal LM every run starts from; None = the embedded warm start
    dataset: str | None = None  # training problems (kpo train --dataset's formats); None = the embedded task
    # held-out benchmark files (the formats kpo eval reads), scored by avg@eval_n; () = the embedded task's test
    # split (the running task: by its exact expected accuracy)
    eval_data: tuple[str, ...] = ()
    verl_config: str | None = None  # --engine verl: the user's verl YAML (its overrides go after `--`)
    keep: str = "hf"  # what stays of a run once scored (kpo.compare.engines.KEEP): its final HF weights
    # --engine verl: the Ray cluster whose jobs the runs are (its dashboard's address; None: RAY_ADDRESS, else
    # main_ppo as a child process) and their runtime environment (Ray's runtime_env, a YAML or JSON file)
    ray_address: str | None = None
    ray_runtime_env: str | None = None

    def __post_init__(self) -> None:
        for name, value in {"eval_n": EVAL_N, "steps": STEPS, "seeds": SEEDS, **(QUICK if self.quick else {})}.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        # fewer seeds than the default asks for fewer ablation and A/A seeds too
        for name, value in {"ablation_seeds": ABLATION_SEEDS, "aa_seeds": AA_SEEDS}.items():
            if getattr(self, name) is None:
                setattr(self, name, min(value, self.seeds))

    def validate(self) -> CompareConfig:
        """Check every setting before anything trains, and name each loss by its canonical name (``grpo`` ->
        ``vanilla``). Raises :class:`CompareError` listing the problems found. Returns self."""
        from kpo.compare.checks import settings_errors

        engine = checked_engine(self)
        methods, errors = settings_errors(self)
        errors += _sweep_name_errors(self)
        errors += engine.flag_errors(self)
        if errors:
            raise CompareError(errors)
        self.methods = methods
        # The run configs and the task are only built from settings that passed the checks above.
        errors = engine.config_errors(self, plan_runs(self)) or _eval_limit_errors(self)
        if errors:
            raise CompareError(errors)
        return self


def checked_engine(cfg) -> Engine:
    """The engine ``cfg.engine`` names (:func:`kpo.compare.engines.engine_of`); CompareError naming the known
    engines where none has that name."""
    try:
        return engine_of(cfg)
    except ValueError as e:
        raise CompareError([str(e)]) from None


@dataclass(frozen=True)
class Run:
    """One training run: a method (registry name) at a seed, with optional loss overrides (KPO's memory), and
    its replica (0; 1 for the A/A arm: the same warm start, another RL seed)."""

    method: str
    seed: int
    loss_kwargs: tuple[tuple[str, float | str], ...] = ()
    replica: int = 0

    @property
    def arm(self) -> str:
        """What the run tests, the label of its Table 1 row: the method, with its overrides and replica."""
        extra = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.loss_kwargs)
        label = f"{self.method} ({extra})" if extra else self.method
        return f"{label} A/A replica {self.replica}" if self.replica else label

    @property
    def name(self) -> str:
        extra = "".join(f"-{k}{v:g}" if isinstance(v, float) else f"-{k}{v}" for k, v in self.loss_kwargs)
        replica = f"-replica{self.replica}" if self.replica else ""
        return f"{self.method}{extra}-seed{self.seed}{replica}"

    @property
    def rl_seed(self) -> int:
        """`kpo train --seed`: RL prompts and sampling (the warm start is always the seed's own)."""
        return self.seed + REPLICA_SEED * self.replica


@dataclass(frozen=True)
class Arm:
    """A Table 1 row: a method with its overrides (and replica), run at seeds 0..seeds-1. role: "key" (the
    methods and KPO at the matched memory), "ablation" or "aa" (the A/A replica of ``subject``)."""

    method: str
    loss_kwargs: tuple = ()
    replica: int = 0
    seeds: int = 1
    role: str = "key"

    @property
    def label(self) -> str:
        return Run(self.method, 0, self.loss_kwargs, self.replica).arm


def _memory_kwargs(point: str) -> tuple[tuple[str, float | str], ...]:
    """KPO's loss overrides at a sweep point: none (paper), memory=matched, or memory=N tokens."""
    if point == PAPER:
        return ()
    return (("memory", MATCHED if point == MATCHED else float(point)),)


def subject(cfg: CompareConfig) -> tuple[str, tuple]:
    """(method, overrides) the claims are about and the A/A arm repeats: KPO at the matched memory; without it
    KPO at the paper's Q/V when --methods has kpo, else the first method."""
    if cfg.matched:
        return ("kpo", MATCHED_KWARGS)
    return ("kpo" if "kpo" in cfg.methods else cfg.methods[0], ())


def arms(cfg: CompareConfig) -> list[Arm]:
    """Every arm once, in report order: the methods, KPO at the matched memory, the ablations, the A/A arm."""
    out = [Arm(m, (), 0, cfg.seeds, "key") for m in cfg.methods]
    if cfg.matched:
        out.append(Arm("kpo", MATCHED_KWARGS, 0, cfg.seeds, "key"))
    if cfg.ablations and cfg.matched:
        have = {(a.method, a.loss_kwargs) for a in out}
        chosen = [ABLATIONS[name] for name in cfg.ablation_arms]
        out += [Arm(m, kw, 0, cfg.ablation_seeds, "ablation") for m, kw in chosen if (m, kw) not in have]
    if cfg.aa_seeds:
        out.append(Arm(*subject(cfg), 1, cfg.aa_seeds, "aa"))
    return out


def sweep_runs(cfg: CompareConfig) -> dict[str, list[Run]]:
    """KPO's memory sweep: point -> its runs (``--sweep-seeds`` seeds; points that are arms reuse their runs)."""
    seeds = range(cfg.seeds if cfg.sweep_seeds is None else cfg.sweep_seeds)
    return {p: [Run("kpo", s, _memory_kwargs(p)) for s in seeds] for p in cfg.sweep_memory}


def plan_runs(cfg: CompareConfig) -> list[Run]:
    """Every run of the comparison once, seed by seed (a seed's arms finish together, so a partial compare
    already holds whole pairs), then the sweep's extra runs."""
    runs = [
        Run(a.method, s, a.loss_kwargs, a.replica) for s in range(cfg.seeds) for a in arms(cfg) if s < a.seeds
    ]
    for members in sweep_runs(cfg).values():
        runs += [r for r in members if r not in runs]
    return runs


def held_out_problems(cfg: CompareConfig, limit: int | None) -> int:
    """Held-out problems evaluation uses: the first ``limit`` (None: all) of each ``--eval-data`` file, or of the
    embedded task's test split (``limit`` or its default size); ValueError when the split cannot supply
    ``limit``."""
    if cfg.eval_data:
        from kpo.data.math import load_problems

        return sum(len(load_problems(path)[:limit]) for path in cfg.eval_data)
    from kpo.testbed.task import load_split

    return len(load_split("test", n=limit, task=engine_of(cfg).embedded_task(cfg)))


def warm_start_dir(out: Path, seed: int) -> Path:
    """Where seed ``seed``'s warm-start evaluation goes (``eval.json``)."""
    return out / "runs" / f"{WARM_START}-seed{seed}"


def shared_start_dir(root: Path, seed: int) -> Path:
    """The warm start of seed ``seed`` that every cell of a map or study under ``root`` shares."""
    return root / f"{WARM_START}-seed{seed}"


def share_warm_starts(root: Path, cells, seeds) -> None:
    """Every cell's warm-start folder of each of ``seeds`` is a link to :func:`shared_start_dir`: one model a seed,
    built and evaluated once for all the cells (``root/CELL``) of a map or study."""
    for seed in seeds:
        target = shared_start_dir(root, seed)
        target.mkdir(parents=True, exist_ok=True)
        for cell in cells:
            link = warm_start_dir(root / cell, seed)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(Path("..", "..", target.name))


# The plan's cost model, measured on this project's 2-core CPU machine with kpo compare's 2 workers of one
# torch thread each (so each figure includes the other worker's load), at 6613ad4 (kpo's decoder for rollouts
# and evaluation): one optimizer step of one run (two 40-step runs side by side: 0.97 s; 1.33 s on TRL's
# generate); one held-out sample (a 128-token response; two 1024-sample evaluations side by side: 9 ms; 12 ms
# before); a run's fixed cost (start-up, the exact evaluation, writing); one seed's warm start (one 400-step SFT
# round and its check: 236 s, two side by side). A generation batch costs its 4 steps' time at any depth: the
# rollouts dominate (the first regime map measured 1.50-1.53 min a run of 20 batches at depth 16, 16 steps each).
STEP_SECONDS = 0.97
SAMPLE_SECONDS = 0.009
RUN_SECONDS = 20.0
WARM_START_SECONDS = 240.0


def run_seconds(cfg: CompareConfig, problems: int) -> float:
    """One run of ``cfg`` on the embedded setup by the cost model above: its generation batches, its samples of the
    ``problems`` held-out problems, its fixed cost."""
    batches = cfg.steps / cfg.minibatches
    return batches * 4 * STEP_SECONDS + problems * cfg.eval_n * SAMPLE_SECONDS + RUN_SECONDS


# The prior for the plan's half-widths: the sd over seeds of a paired difference in held-out accuracy between
# two arms, in points. The default compare at 080621e (docs/results/compare: 80 steps, warm starts in their band,
# exact expected accuracy) measured 1.1-3.4 over its six contrasts between arms, 2.4 as their root mean square;
# it had planned with 7.0 from the 3-seed compare before it, whose warm starts ranged from 2.6% to 18.9%.
# `--pilot` replaces it with the sds another finished compare measured.
DIFF_SD = 2.4


@dataclass(frozen=True)
class Contrast:
    """A difference the report decides on: arm ``a`` minus arm ``b`` (labels) over their first ``seeds`` seeds.
    kind: "key" (the question: KPO against the baselines), "ablation" or "aa" (the noise floor)."""

    a: str
    b: str
    seeds: int
    kind: str

    @property
    def name(self) -> str:
        return f"{self.a} - {self.b}"


def contrasts(cfg: CompareConfig) -> list[Contrast]:
    """The subject (KPO at the matched memory) against each baseline, each ablation, and its A/A replica."""
    plan = arms(cfg)
    main = next(a for a in plan if (a.method, a.loss_kwargs) == subject(cfg) and not a.replica)  # arms() has it
    out = []
    for other in plan:
        if other is main:
            continue
        seeds = min(main.seeds, other.seeds)
        if other.role == "aa":
            out.append(Contrast(other.label, main.label, seeds, "aa"))
        else:
            out.append(Contrast(main.label, other.label, seeds, other.role))
    return out


def measured_run_seconds(folders) -> float | None:
    """Mean wall-clock seconds (training and evaluation) of the finished runs in ``folders`` (their
    :data:`TIMING_FILE`), None when none has one."""
    found = [json.loads((f / TIMING_FILE).read_text())["seconds"] for f in folders if (f / TIMING_FILE).exists()]
    return sum(found) / len(found) if found else None


def parallel_runs(cfg: CompareConfig) -> int:
    """Runs side by side: --jobs, else the engine's default (kpo: one per CPU; verl: 1)."""
    return cfg.jobs or engine_of(cfg).workers(cfg) or os.cpu_count() or 1


def estimate(
    cfg: CompareConfig, diff_sd: float = DIFF_SD, done: int = 0, measured: float | None = None
) -> dict:
    """What the comparison costs and can resolve, before anything trains: ``runs``, ``seconds`` (wall clock on
    :func:`workers` workers, runs already ``done`` left out; from ``measured`` seconds a run, else on the
    embedded setup from :func:`run_seconds`; None when neither applies: ``seconds_per_run`` None) and per
    contrast the expected half-width of its 95% paired interval, t_{S-1} x diff_sd / sqrt(S) in points (S
    seeds)."""
    from kpo.evaluation.metrics import t_quantile

    runs = plan_runs(cfg)
    jobs = parallel_runs(cfg)
    per_run, seconds = measured, None
    if per_run is None and engine_of(cfg).embedded(cfg):
        per_run = run_seconds(cfg, held_out_problems(cfg, cfg.eval_limit))
    if per_run is not None:
        warm = cfg.seeds * WARM_START_SECONDS / jobs if engine_of(cfg).embedded(cfg) and len(runs) > done else 0
        seconds = (len(runs) - done) * per_run / jobs + warm
    return {
        "runs": len(runs),
        "seconds": seconds,
        "seconds_per_run": per_run,
        "jobs": jobs,
        "diff_sd": diff_sd,
        "contrasts": {
            c.name: {
                "seeds": c.seeds,
                "kind": c.kind,
                "half_width": t_quantile(0.975, c.seeds - 1) * diff_sd / c.seeds**0.5
                if c.seeds > 1
                else None,
            }
            for c in contrasts(cfg)
        },
    }


def format_plan(cfg: CompareConfig, est: dict) -> str:
    """The plan as kpo compare prints it before anything trains."""
    time = (
        f"about {est['seconds'] / 60:.0f} min on {est['jobs']} worker(s)"
        if est["seconds"] is not None
        else "time not estimated: no run of this setup has been measured yet (the first one is; or plan with "
        "--pilot and a finished compare of this setup)"
    )
    lines = [
        f"plan: {est['runs']} runs of {cfg.steps} steps (" + ", ".join(f"{a.label} x {a.seeds}" for a in arms(cfg))
        + f"), {time}",
        f"expected 95% half-widths (points), from a paired-difference sd of {est['diff_sd']:.1f} points:",
    ]
    for name, c in est["contrasts"].items():
        width = "n/a (one seed)" if c["half_width"] is None else f"+-{c['half_width']:.1f}"
        lines.append(f"  {name} ({c['kind']}, {c['seeds']} seeds): {width}")
    return "\n".join(lines)


def pilot_sd(report_json: Path) -> float:
    """The paired-difference sd (points) a finished compare measured, for the plan of the next one: the root mean
    square of the per-seed sds of its contrasts between arms (``report.json``'s ``contrasts``, not those against
    the warm start). CompareError naming the file and what it should be when it is missing or not such a report."""
    where = f"--pilot {report_json}"
    want = "give the report.json of a finished kpo compare"
    path = Path(report_json)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise CompareError([f"{where}: {e.strerror.lower()}; {want}"]) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CompareError([f"{where}: not one JSON document ({e}); {want}"]) from None
    if not isinstance(data, dict) or not isinstance(data.get("contrasts"), dict):
        raise CompareError([f"{where}: a JSON {type(data).__name__} without 'contrasts'; {want}"])
    sds = [
        c["sd"]
        for c in data["contrasts"].values()
        if isinstance(c, dict)
        and isinstance(c.get("sd"), (int, float))
        and math.isfinite(c["sd"])
        and c["sd"] > 0
        and c.get("kind") != "warm"
    ]
    if not sds:
        raise CompareError([f"{where}: no contrast with a finite measured sd > 0 (a compare with 2+ seeds); {want}"])
    return (sum(s * s for s in sds) / len(sds)) ** 0.5


def _sweep_name_errors(cfg: CompareConfig) -> list[str]:
    """--sweep-memory points whose runs would share a directory (a run's name spells the memory with 6
    significant digits, so that the runs of ordinary values keep their names and finished ones are reused)."""
    points_of: dict[str, list[str]] = {}  # run name at seed 0 -> the points that give it
    for point, members in sweep_runs(replace(cfg, seeds=1, sweep_seeds=1)).items():
        points_of.setdefault(members[0].name, []).append(point)
    return [
        f"--sweep-memory: {', '.join(points)} would share the run directories {name} (and the other seeds'); give "
        "memories that differ within 6 significant digits"
        for name, points in points_of.items()
        if len(points) > 1
    ]


def _eval_limit_errors(cfg: CompareConfig) -> list[str]:
    if cfg.eval_data:  # kpo eval's --limit: the first N problems of each file, any N >= 1
        return []
    try:
        held_out_problems(cfg, cfg.eval_limit)
    except ValueError as err:  # the data module's own words: a task too small, or the most problems it can supply
        where = "held-out evaluation" if cfg.eval_limit is None else f"--eval-limit={cfg.eval_limit}"
        return [f"{where}: {err}"]
    return []
