"""``kpo compare``: train, evaluate and analyze several methods and seeds into one report.

Every (method, seed) run trains on the embedded task (by default the long-response running-sum task: 128-token
responses) under the paper's off-policy protocol with the method's paper hyperparameters (nothing tuned per
method: every run shares one set of protocol flags, and the seed fixes the warm start and the data order), then
its final model is evaluated on the held-out split (avg@n, pass@k) and its dumped ratios are analyzed. KPO runs
twice per seed: at the paper's Q/V (a memory of 1000 tokens) and at the memory that keeps the paper's
memory-to-length ratio at this task's response length (``memory=matched``); a memory sweep adds the Figure 4
analog. Each seed's warm start is evaluated on the same problems, as the Table 1 baseline every method starts
from. The report (``report.md`` + PNGs) holds the analogs of the paper's Figure 3, Table 1, Figure 4 and
Table 2, and a "claims" section that says, with numbers and intervals, whether each claim holds.

Runs execute in parallel worker processes (one torch thread each); a run with ``config.yaml``, ``metrics.jsonl``
and ``eval.json`` is done and is not rerun, so an interrupted compare resumes where it stopped. A done run made
with other settings (its ``config.yaml`` or ``eval.json`` differs from what this compare would use) is an error,
never silently reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path

__all__ = ["CompareConfig", "CompareError", "Run", "arms", "plan_runs", "sweep_runs", "run_compare", "main",
           "WARM_START"]

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
COMPARE_OWNED = {"loss": "--methods", "seed": "--seeds", "output_dir": "--out", "max_steps": "--steps",
                 "minibatches": "--minibatches", "dump_ratios_every": "--dump-every",
                 "loss_kwargs": "nothing (each method runs its paper hyperparameters; --sweep-memory sets KPO's memory)",
                 "resume": "nothing (finished runs are reused)", "overwrite": "nothing (unfinished runs restart)"}  # fmt: skip


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
    default = {"steps": f"{STEPS} steps", "eval_limit": "the whole test split", "jobs": "one per CPU",
               "sweep_seeds": "all seeds"}  # fmt: skip
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
    return any(minibatches == 1 or (s - 1) % minibatches for s in range(every, steps + 1, every))


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
            parse_args(_train_argv(cfg, run, Path(cfg.out) / "runs" / run.name)).validate()
        except ConfigError as e:
            for err in e.errors:
                first_run.setdefault(err, run.name)
    return [f"run {name}: {err}" for err, name in first_run.items()]


def _held_out_problems(cfg: CompareConfig, limit: int | None) -> int:
    """Problems of the task's test split that evaluation uses (``limit`` or the default split); ValueError
    when the split cannot supply ``limit``."""
    from kpo.data.synthetic import load_split
    from kpo.train.config import parse_args

    return len(load_split("test", n=limit, task=parse_args(list(cfg.train_args)).task_config()))


def _eval_limit_errors(cfg: CompareConfig) -> list[str]:
    try:
        size = _held_out_problems(cfg, None)
    except ValueError as err:  # a task too small for any test split
        return [f"held-out evaluation: {err}"]
    if cfg.eval_limit is None:
        return []
    try:
        _held_out_problems(cfg, cfg.eval_limit)
    except ValueError:
        return [f"--eval-limit={cfg.eval_limit}: more problems than the task's test split can supply; use "
                f"1..{size} (the default split) or omit it"]  # fmt: skip
    return []


def _train_argv(cfg: CompareConfig, run: Run, out: Path) -> list[str]:
    argv = ["--loss", run.method, "--seed", str(run.seed), "--output-dir", str(out), "--minibatches",
            str(cfg.minibatches), "--dump-ratios-every", str(cfg.dump_every), "--report-to", "none",
            "--progress", "false", "--num-threads", "1", "--overwrite", "--max-steps", str(cfg.steps)]  # fmt: skip
    if run.loss_kwargs:
        argv += ["--loss-kwargs", *(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in run.loss_kwargs)]
    return argv + list(cfg.train_args)


def _log_to(out: Path) -> None:
    """Worker: send this process's output (fds 1 and 2) to ``out/log.txt``, after a line that starts the run
    there (a rerun appends to the log of the failed attempt), and train on one torch thread."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    # Workers are reused across runs: flush what belongs to the previous run's log, then point fds 1 and 2 here.
    sys.stdout.flush()
    sys.stderr.flush()
    with open(out / "log.txt", "a") as log:
        log.write(f"=== kpo compare: {out.name} started {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
        log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    torch.set_num_threads(1)


def _execute(cfg: CompareConfig, run: Run, out: Path) -> dict:
    """Worker: train one run, then evaluate its final model. Output goes to ``out/log.txt``, and so does the
    traceback of an error (SystemExit included) before it reaches kpo compare, which prints one line of it."""
    from kpo.train.config import parse_args
    from kpo.train.run import run_training

    _log_to(out)
    start = time.time()
    try:
        config = parse_args(_train_argv(cfg, run, out))
        run_training(config)
        # transformers, not "auto": on a GPU machine with vLLM installed, "auto" would start one vLLM engine per
        # parallel worker, each claiming most of the GPU's memory, for a tiny model.
        results = _evaluate(cfg, config, out / "final", out / "eval.json")
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        with open(out / "log.txt", "a") as log:
            traceback.print_exc(file=log)
        raise
    return {"run": run.name, "seconds": time.time() - start, "macro": results["macro"]}


def _evaluate(cfg: CompareConfig, config, model: Path, output: Path) -> dict:
    """Held-out avg@n / pass@k of ``model`` on the run config's task; the sample seeds depend on the problem and
    sample only, so every model of the comparison answers the same problems with the same seeds."""
    from kpo.evaluation import evaluate

    task = config.task_config()
    # transformers, not "auto": on a GPU machine with vLLM installed, "auto" would start one vLLM engine per
    # parallel worker, each claiming most of the GPU's memory, for a tiny model.
    return evaluate(
        model, "synthetic", n=cfg.eval_n, ks=sorted({1, cfg.eval_n}), limit=cfg.eval_limit, output=output,
        show_progress=False, backend="transformers", batch_size=64,
        synthetic_kw={"kind": task.kind, "n_terms": task.n_terms, "max_value": task.max_value},
    )  # fmt: skip


def warm_start_dir(out: Path, seed: int) -> Path:
    """Where seed ``seed``'s warm-start evaluation goes (``eval.json``)."""
    return out / "runs" / f"{WARM_START}-seed{seed}"


def _done(out: Path) -> bool:
    return all((out / name).exists() for name in ("config.yaml", "metrics.jsonl", "eval.json"))


def _changed_settings(cfg: CompareConfig, run: Run, out: Path, problems: int) -> list[str]:
    """``"field: was -> now"`` for every setting of a done run that differs from what this compare would use."""
    from kpo.train.config import TRAJECTORY_FIELDS, TrainConfig, parse_args

    saved, now = TrainConfig.from_yaml(out / "config.yaml"), parse_args(_train_argv(cfg, run, out))
    # output_dir says where the run is (spelled as --out was), not how it ran; max_steps ends its trajectory.
    # dump_ratios_every changes no trajectory, but the report analyzes the dumps at the period it records.
    fields = [k for k in TRAJECTORY_FIELDS if k != "output_dir"] + ["max_steps", "dump_ratios_every"]
    changed = [
        f"{k}: {getattr(saved, k)!r} -> {getattr(now, k)!r}"
        for k in fields
        if getattr(saved, k) != getattr(now, k)
    ]
    results = json.loads((out / "eval.json").read_text())
    evaluated = sum(b["problems"] for b in results["benchmarks"].values())
    if results["params"]["n"] != cfg.eval_n:
        changed.append(f"eval_n: {results['params']['n']} -> {cfg.eval_n}")
    if evaluated != problems:
        changed.append(f"held-out problems: {evaluated} -> {problems} (--eval-limit)")
    return changed


def _stale_run_errors(cfg: CompareConfig, runs: list[Run], out: Path) -> list[str]:
    """One error per done run whose settings differ from this compare's, then how to proceed."""
    problems = _held_out_problems(cfg, cfg.eval_limit)
    errors = []
    for run in runs:
        folder = out / "runs" / run.name
        if _done(folder) and (changed := _changed_settings(cfg, run, folder, problems)):
            errors.append(f"run {run.name} ({folder}) was made with other settings: {'; '.join(changed)}")
    if errors:
        errors.append(
            f"a compare reuses finished runs only with the same settings: use a new --out, or delete the run "
            f"directories above (under {out / 'runs'}) to retrain them, or rerun with their settings"
        )
    return errors


def _steps_logged(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum(1 for _ in path.open()) if path.exists() else 0


def _warm_start(cfg: CompareConfig, seed: int) -> None:
    """Worker: build one seed's cached warm start, before that seed's parallel runs could race to build it, and
    evaluate it (the Table 1 row every run starts from) unless that is done."""
    import torch

    from kpo.train.config import parse_args
    from kpo.train.run import model_path

    torch.set_num_threads(1)
    config = parse_args(["--seed", str(seed), "--progress", "false", *cfg.train_args])
    path = model_path(config)
    folder = warm_start_dir(Path(cfg.out), seed)
    if not (folder / "eval.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        _evaluate(cfg, config, path, folder / "eval.json")


def _clear_unfinished(folder: Path) -> None:
    """Remove what an unfinished run left that would outlive its retraining: its partial metrics.jsonl (the
    progress bar would count its steps until the worker's --overwrite removed it) and an eval.json of an
    older model (with the new run's metrics it would make a run that fails after training look done)."""
    for name in ("metrics.jsonl", "eval.json"):
        (folder / name).unlink(missing_ok=True)


def _log_size(folder: Path) -> int:
    path = folder / "log.txt"
    return path.stat().st_size if path.exists() else -1


def _failure(run: Run, err: BaseException, log: Path) -> str:
    return f"{run.name}: {type(err).__name__}: {err} (traceback in its log: {log})"


def _broken_pool_failures(broken: list[Run], started: list[Run], out: Path) -> list[str]:
    """What to say about the runs whose futures ended with BrokenProcessPool: a worker process died without an
    exception (a signal, out of memory, os._exit), and the pool stopped every other run with it. ``started``:
    those of them that had begun (their worker wrote to their log)."""
    lines = []
    if started:
        logs = ", ".join(str(out / "runs" / r.name / "log.txt") for r in started)
        who = (
            f"{started[0].name}: its worker process died"
            if len(started) == 1
            else f"{', '.join(r.name for r in started)}: the worker process of one of them died and the pool "
            "stopped the others"
        )
        lines.append(f"{who} (killed by a signal, out of memory, or os._exit; logs: {logs})")
    not_run = [r.name for r in broken if r not in started]
    if not_run:
        lines.append(
            f"not run, as the pool stopped when that worker died: {', '.join(not_run)} (rerun kpo compare to "
            "run them; finished runs are reused)"
        )
    return lines


def _train_runs(cfg: CompareConfig, todo: list[Run], out: Path) -> None:
    """Train and evaluate the runs ``todo`` in parallel worker processes with a progress bar; RuntimeError
    listing every failed run (after the others ended) when any failed."""
    from concurrent.futures.process import BrokenProcessPool

    from tqdm.auto import tqdm

    folders = {r: out / "runs" / r.name for r in todo}
    for folder in folders.values():
        _clear_unfinished(folder)
    log_sizes = {r: _log_size(f) for r, f in folders.items()}  # a run's worker adds a line to its log at start
    jobs = cfg.jobs if cfg.jobs is not None else os.cpu_count() or 1
    steps = cfg.steps
    failures, broken = [], []
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=get_context("spawn")) as pool:
        seeds = sorted({r.seed for r in todo})
        print(f"warm starts of seeds {seeds} (cached after the first compare) and their evaluation", flush=True)
        for fut in [pool.submit(_warm_start, cfg, s) for s in seeds]:
            fut.result()
        bar = tqdm(total=steps * len(todo), desc="compare (optimizer steps)", unit="step")
        pending = {pool.submit(_execute, cfg, r, folders[r]): r for r in todo}
        while pending:
            finished, _ = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
            bar.n = sum(min(_steps_logged(f), steps) for f in folders.values())
            bar.refresh()
            for fut in finished:
                run = pending.pop(fut)
                try:
                    info = fut.result()
                except BrokenProcessPool:
                    broken.append(run)
                    continue
                # SystemExit too: a run calling sys.exit is a failed run, not the end of kpo compare.
                except (Exception, SystemExit) as e:  # noqa: BLE001 - report every failed run, then stop
                    failures.append(_failure(run, e, folders[run] / "log.txt"))
                    continue
                macro = ", ".join(f"{k} {v:.3f}" for k, v in info["macro"].items() if "@" in k)
                bar.write(f"done {run.name} in {info['seconds'] / 60:.1f} min: {macro}")
    bar.close()
    broken.sort(key=todo.index)  # in plan order, not in the order the pool gave up on them
    started = [r for r in broken if _log_size(folders[r]) > log_sizes[r]]
    failures += _broken_pool_failures(broken, started, out)
    if failures:
        raise RuntimeError("kpo compare: runs failed:\n  " + "\n  ".join(failures))


def run_compare(cfg: CompareConfig) -> Path:
    """Run every missing (method, seed), then write the report; returns the report's path.

    Raises :class:`CompareError` before anything trains when a setting is invalid or a done run in ``cfg.out``
    was made with other settings.
    """
    cfg.validate()
    out = Path(cfg.out)
    runs = plan_runs(cfg)
    stale = _stale_run_errors(cfg, runs, out)
    if stale:
        raise CompareError(stale)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    todo = [r for r in runs if not _done(out / "runs" / r.name)]
    print(f"kpo compare: {len(runs)} runs, {len(runs) - len(todo)} already done; report in {out}", flush=True)
    if todo:
        _train_runs(cfg, todo, out)
    from kpo.compare_report import write_report

    return write_report(cfg, runs, out)


def _sweep_memory(text: str) -> tuple[str, ...]:
    """``--sweep-memory``: comma-separated filter memories in tokens (> 0), ``matched`` or ``paper``; ``''`` for
    no sweep."""
    points = tuple(x.strip() for x in text.split(",") if x.strip())
    for point in points:
        if point in (PAPER, MATCHED):
            continue
        try:
            ok = float(point) > 0 and float(point) != float("inf")
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(
                f"{point!r}: give memories in tokens (> 0), '{MATCHED}' or '{PAPER}', comma-separated"
            )
    return tuple(dict.fromkeys(points))


def build_parser() -> argparse.ArgumentParser:
    """The command line; each option's help states its default once (settings left unset are resolved by
    :class:`CompareConfig`, so their help says what they resolve to)."""
    d = CompareConfig()
    p = argparse.ArgumentParser(
        prog="kpo compare",
        description="Train every method with every seed on the embedded task under the paper's off-policy "
        "protocol, evaluate, analyze, and write one report. Finished runs are reused.",
    )
    p.add_argument("--out", default=d.out, help="Report and run directory (default: %(default)s).")
    p.add_argument(
        "--methods", default=",".join(d.methods), help="Comma-separated loss names (default: %(default)s)."
    )
    p.add_argument("--seeds", type=int, default=d.seeds, help="Seeds per method (default: %(default)s).")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"Optimizer steps per run (default: {STEPS}; --quick: {QUICK['steps']}).",
    )
    p.add_argument(
        "--minibatches",
        type=int,
        default=d.minibatches,
        help="Optimizer steps per generation batch: more = more off-policy updates (default: %(default)s).",
    )
    p.add_argument(
        "--no-matched",
        action="store_true",
        help="Leave out KPO at the length-matched memory (by default run at every seed beside the paper's Q/V).",
    )
    p.add_argument(
        "--sweep-memory",
        type=_sweep_memory,
        default=d.sweep_memory,
        help="KPO filter memories in tokens for the Figure 4 analog, 'matched' (the paper's memory-to-length "
        f"ratio at this task's length) and 'paper' (Q/V = 1e-6); '' = no sweep (default: {','.join(d.sweep_memory)}).",
    )
    p.add_argument(
        "--sweep-seeds",
        type=int,
        default=d.sweep_seeds,
        help="Seeds of the sweep's extra runs (default: %(default)s).",
    )
    p.add_argument(
        "--eval-n",
        type=int,
        default=None,
        help=f"Samples per held-out problem (default: {EVAL_N}; --quick: {QUICK['eval_n']}).",
    )
    p.add_argument(
        "--eval-limit", type=int, default=None, help="Held-out problems (default: the whole test split)."
    )
    p.add_argument(
        "--dump-every",
        type=int,
        default=d.dump_every,
        help="Ratio dump period in optimizer steps (default: %(default)s).",
    )
    p.add_argument("--jobs", type=int, default=None, help="Parallel runs (default: one per CPU).")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['steps']} steps per run, {QUICK['eval_n']} samples per problem, where those options are "
        "not given: a smoke test in minutes instead of the comparison in 90.",
    )
    p.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="After `--`: extra `kpo train` flags for every run (e.g. -- --task chain --learning-rate 1e-4).",
    )
    return p


def config_from_args(argv: list[str] | None = None) -> CompareConfig:
    """The comparison the command line asks for (not yet validated: :meth:`CompareConfig.validate`)."""
    args = build_parser().parse_args(argv)
    extra = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    return CompareConfig(
        out=args.out, methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), seeds=args.seeds,
        steps=args.steps, minibatches=args.minibatches, matched=not args.no_matched, sweep_memory=args.sweep_memory,
        sweep_seeds=args.sweep_seeds,
        eval_n=args.eval_n, eval_limit=args.eval_limit, dump_every=args.dump_every, jobs=args.jobs,
        train_args=tuple(extra), quick=args.quick,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    try:
        report = run_compare(config_from_args(argv))  # validates every setting before anything trains
    except CompareError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"report: {report}\nfigures: {', '.join(str(p) for p in sorted(report.parent.glob('*.png')))}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
