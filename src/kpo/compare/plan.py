"""The plan of ``kpo compare``: its settings (:class:`CompareConfig`, every one checked before anything trains),
the arms and runs they give, and the `kpo train` command line of each run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_METHODS = ("vanilla", "gspo", "gmpo", "kpo", "kpo_unclipped")
PAPER, MATCHED = "paper", "matched"  # KPO at the paper's Q/V; at the length-matched memory
# Figure 4's points as filter memories in tokens (kpo.filter.memory); paper = Q/V 1e-6 = 1000 tokens
SWEEP_MEMORY = ("8", MATCHED, "125", PAPER)
STEPS = 200  # optimizer steps per run
EVAL_N = 8  # samples per held-out problem
QUICK = {"steps": 40, "eval_n": 4}  # what --quick sets where the option is not given
WARM_START = "warm_start"  # the Table 1 row of the models every run starts from
# `kpo train` fields that kpo compare sets from its own options (or its run plan); a `--` flag for one of them
# would override compare's value after compare.json recorded it.
COMPARE_OWNED = {
    "loss": "--methods",
    "seed": "--seeds",
    "output_dir": "--out",
    "max_steps": "--steps",
    "minibatches": "--minibatches",
    "dump_ratios_every": "--dump-every",
    "loss_kwargs": "nothing (each method runs its paper hyperparameters; --sweep-memory sets KPO's memory)",
    "resume": "nothing (finished runs are reused)",
    "overwrite": "nothing (unfinished runs restart)",
}


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
    seeds: int = 3
    steps: int | None = None  # optimizer steps per run; None = STEPS (quick: QUICK)
    minibatches: int = 4  # optimizer steps per generation batch (3 of 4 off-policy in the paper)
    matched: bool = True  # also KPO at the length-matched memory, every seed (needs kpo in methods)
    sweep_memory: tuple[str, ...] = SWEEP_MEMORY  # KPO's memory sweep (Figure 4); empty = no sweep
    sweep_seeds: int | None = 1  # seeds of the sweep's extra runs; None = all seeds
    eval_n: int | None = None  # samples per held-out problem; None = EVAL_N (quick: QUICK)
    eval_limit: int | None = None  # held-out problems; None = the task's default test split
    dump_every: int = 5  # ratio dumps every N optimizer steps (analysis input)
    jobs: int | None = None  # parallel runs; None = CPU count
    train_args: tuple[str, ...] = ()  # extra `kpo train` flags shared by every run, e.g. ("--n-terms", "4")
    quick: bool = False

    def __post_init__(self) -> None:
        if self.quick:
            for name, value in QUICK.items():
                if getattr(self, name) is None:
                    setattr(self, name, value)
        if self.eval_n is None:
            self.eval_n = EVAL_N
        if self.steps is None:
            self.steps = STEPS

    def validate(self) -> CompareConfig:
        """Check every setting before anything trains, and name each loss by its canonical name (``grpo`` ->
        ``vanilla``). Raises :class:`CompareError` listing the problems found. Returns self."""
        methods, errors = _canonical_methods(self.methods)
        errors = _range_errors(self) + errors + _sweep_name_errors(self) + _owned_flag_errors(self.train_args)
        if errors:
            raise CompareError(errors)
        self.methods = methods
        # The run configs and the task are only built from settings that passed the checks above.
        errors = _train_config_errors(self) or _eval_limit_errors(self)
        if errors:
            raise CompareError(errors)
        return self


@dataclass(frozen=True)
class Run:
    """One training run: a method (registry name) at a seed, with optional loss overrides (KPO's memory)."""

    method: str
    seed: int
    loss_kwargs: tuple[tuple[str, float | str], ...] = ()

    @property
    def arm(self) -> str:
        """What the run tests, the label of its Table 1 row: the method, with its overrides."""
        extra = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.loss_kwargs)
        return f"{self.method} ({extra})" if extra else self.method

    @property
    def name(self) -> str:
        extra = "".join(f"-{k}{v:g}" if isinstance(v, float) else f"-{k}{v}" for k, v in self.loss_kwargs)
        return f"{self.method}{extra}-seed{self.seed}"


def _memory_kwargs(point: str) -> tuple[tuple[str, float | str], ...]:
    """KPO's loss overrides at a sweep point: none (paper), memory=matched, or memory=N tokens."""
    if point == PAPER:
        return ()
    return (("memory", MATCHED if point == MATCHED else float(point)),)


def arms(cfg: CompareConfig) -> list[tuple[str, tuple]]:
    """(method, loss overrides) per compared arm, each a Table 1 row (``Run.arm`` its label): each method, then
    KPO at the matched memory."""
    out = [(m, ()) for m in cfg.methods]
    if cfg.matched and "kpo" in cfg.methods:
        out.append(("kpo", _memory_kwargs(MATCHED)))
    return out


def sweep_runs(cfg: CompareConfig) -> dict[str, list[Run]]:
    """KPO's memory sweep: point -> its runs (``--sweep-seeds`` seeds; the paper and matched points reuse the
    Table 1 runs at those seeds)."""
    seeds = range(cfg.seeds if cfg.sweep_seeds is None else cfg.sweep_seeds)
    return {p: [Run("kpo", s, _memory_kwargs(p)) for s in seeds] for p in cfg.sweep_memory}


def plan_runs(cfg: CompareConfig) -> list[Run]:
    """Every run of the comparison once: the arms at every seed, then the sweep's extra runs."""
    runs = [Run(method, s, kw) for s in range(cfg.seeds) for method, kw in arms(cfg)]
    for members in sweep_runs(cfg).values():
        runs += [r for r in members if r not in runs]
    return runs


def _canonical_methods(names: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """(canonical loss names in the given order, errors): unknown names and losses listed twice (aliases too)."""
    from kpo.losses import get_loss_spec

    if not names:
        return (), ["--methods: give at least one loss name"]
    given: dict[str, list[str]] = {}  # canonical name -> the names that asked for it
    errors = []
    for name in names:
        try:
            given.setdefault(get_loss_spec(name).name, []).append(name)
        except ValueError as e:
            errors.append(f"--methods: {e}")
    for canonical, asked in given.items():
        if len(asked) > 1:
            errors.append(
                f"--methods: {', '.join(asked)} all name the loss {canonical!r}; list each loss once"
            )
    return tuple(given), errors


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


def _range_errors(cfg: CompareConfig) -> list[str]:
    """Integer settings outside their allowed range (None = the default, always allowed)."""
    upper = {"sweep_seeds": max(cfg.seeds, 1)}
    default = {
        "steps": f"{STEPS} steps",
        "eval_limit": "the whole test split",
        "jobs": "one per CPU",
        "sweep_seeds": "all seeds",
    }
    errors = []
    names = ("seeds", "steps", "minibatches", "sweep_seeds", "eval_n", "eval_limit", "dump_every", "jobs")
    for name in names:
        value, hi = getattr(cfg, name), upper.get(name)
        if value is None or (value >= 1 and (hi is None or value <= hi)):
            continue
        allowed = f"an integer in 1..{hi}" if hi is not None else "an integer >= 1"
        omit = f" (or omit it for {default[name]})" if name in default else ""
        errors.append(f"--{name.replace('_', '-')}={value}: must be {allowed}{omit}")
    if not {e.split("=")[0] for e in errors} & {"--steps", "--minibatches", "--dump-every"}:
        errors += _dump_period_errors(cfg)
    return errors


def _has_analyzed_dump(steps: int, every: int, minibatches: int) -> bool:
    """Whether dumping every ``every`` optimizer steps of a ``steps``-step run dumps a step Table 2 analyzes: an
    off-policy one (not the first step of a generation batch of ``minibatches`` steps), or any step when
    ``minibatches`` = 1 (no step is off-policy; Table 2 then says so)."""
    from kpo.train.config import on_policy_step

    return any(minibatches == 1 or not on_policy_step(s, minibatches) for s in range(every, steps + 1, every))


def _dump_period_errors(cfg: CompareConfig) -> list[str]:
    """--dump-every that dumps no step Table 2 can analyze within --steps (its settings are in range)."""
    steps, every, m = cfg.steps, cfg.dump_every, cfg.minibatches
    # steps < minibatches: no off-policy step at all, and kpo train's check (steps a multiple of it) says so
    if steps < m or _has_analyzed_dump(steps, every, m):
        return []
    # the longest period up to the asked one that works (p = minibatches always does, as steps >= it)
    fix = next(p for p in range(min(every, steps), 0, -1) if _has_analyzed_dump(steps, p, m))
    steps_text = f"--steps={steps}"
    if every > steps:
        problem = f"is longer than {steps_text}: no ratio dump would be written, so Table 2 would be empty"
    else:  # one dump only: steps s and 2s are not both 1 more than a multiple of m > 1, so 2s would be analyzed
        problem = (
            f"with {steps_text} dumps only step {every}, the first (on-policy) step of a generation batch of "
            f"--minibatches={m}; Table 2 analyzes off-policy steps"
        )
    return [f"--dump-every={every} {problem}: use --dump-every={fix} (or more --steps)"]


def _owned_flag_errors(train_args: tuple[str, ...]) -> list[str]:
    """`--` flags that would override a setting kpo compare makes itself."""
    from kpo.train.config import build_parser

    # kpo train's parser leaves unset fields out of the namespace, so its keys are exactly the flags given
    # (and --config, None when not given).
    given = vars(build_parser("kpo compare -- (kpo train flags)").parse_args(list(train_args)))
    errors = [
        f"-- --{key.replace('_', '-')}: kpo compare sets it for every run; use {COMPARE_OWNED[key]} instead"
        for key in given
        if key in COMPARE_OWNED
    ]
    if given.get("config") is not None:
        errors.append(
            "-- --config: a YAML file could set what kpo compare sets itself (loss_kwargs, max_steps, resume, "
            "...) unseen; give its settings as -- flags"
        )
    return errors


def _train_config_errors(cfg: CompareConfig) -> list[str]:
    """What `kpo train` would reject in each distinct run config (a method, or a sweep point)."""
    from kpo.train.config import ConfigError, parse_args

    # (method, loss overrides) -> its first run: a seed never makes a config invalid
    distinct: dict[tuple, Run] = {}
    for run in plan_runs(cfg):
        distinct.setdefault((run.method, run.loss_kwargs), run)
    first_run: dict[str, str] = {}  # error -> the first run with it (a bad `--` flag fails every run alike)
    for run in distinct.values():
        try:
            parse_args(train_argv(cfg, run, Path(cfg.out) / "runs" / run.name)).validate()
        except ConfigError as e:
            for err in e.errors:
                first_run.setdefault(err, run.name)
    return [f"run {name}: {err}" for err, name in first_run.items()]


def held_out_problems(cfg: CompareConfig, limit: int | None) -> int:
    """Problems of the task's test split that evaluation uses (``limit`` or the default split); ValueError
    when the split cannot supply ``limit``."""
    from kpo.data.synthetic import load_split
    from kpo.train.config import parse_args

    return len(load_split("test", n=limit, task=parse_args(list(cfg.train_args)).task_config()))


def _eval_limit_errors(cfg: CompareConfig) -> list[str]:
    try:
        size = held_out_problems(cfg, None)
    except ValueError as err:  # a task too small for any test split
        return [f"held-out evaluation: {err}"]
    if cfg.eval_limit is None:
        return []
    try:
        held_out_problems(cfg, cfg.eval_limit)
    except ValueError:
        return [
            f"--eval-limit={cfg.eval_limit}: more problems than the task's test split can supply; use "
            f"1..{size} (the default split) or omit it"
        ]
    return []


def train_argv(cfg: CompareConfig, run: Run, out: Path) -> list[str]:
    argv = [
        "--loss",
        run.method,
        "--seed",
        str(run.seed),
        "--output-dir",
        str(out),
        "--minibatches",
        str(cfg.minibatches),
        "--dump-ratios-every",
        str(cfg.dump_every),
        "--report-to",
        "none",
        "--progress",
        "false",
        "--num-threads",
        "1",
        "--overwrite",
        "--max-steps",
        str(cfg.steps),
    ]
    if run.loss_kwargs:
        argv += [
            "--loss-kwargs",
            *(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in run.loss_kwargs),
        ]
    return argv + list(cfg.train_args)


def warm_start_dir(out: Path, seed: int) -> Path:
    """Where seed ``seed``'s warm-start evaluation goes (``eval.json``)."""
    return out / "runs" / f"{WARM_START}-seed{seed}"
