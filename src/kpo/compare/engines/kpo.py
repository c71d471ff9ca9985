"""What trains the runs of ``kpo compare``: an engine, one seam (:class:`Engine`) between the comparison and a
trainer. The plan, the evaluation, the statistics and the reports never branch on which engine ran: an engine
checks its settings before anything trains, trains one run into its folder (or resumes it), and hands back its
final model (a Hugging Face directory that ``kpo eval`` scores), its metrics (``metrics.jsonl``: rows with at
least ``step``, ``reward_mean``, ``entropy``, ``clip_frac``, each covering what :attr:`Engine.rows` declares) and
its ratio dumps (``ratios/``, :mod:`kpo.analysis.dumps`); once the run is scored, it removes what ``--keep``
(:data:`KEEP`) does not keep.

- ``kpo`` (:class:`KpoEngine`, the default): ``kpo train`` (TRL) in the worker process, on the embedded task or on
  ``--model``/``--dataset``; the ``--`` flags are kpo train's.
- ``verl`` (:class:`kpo.compare.verl_engine.VerlEngine`): verl's ``main_ppo`` as a subprocess on the user's verl
  configuration; the ``--`` flags are its Hydra overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kpo.compare.contract import BATCH_ROWS, KEEP, STEP_ROWS, keep_errors  # noqa: F401 - the protocol's names

__all__ = [
    "BATCH_ROWS",
    "COMPARE_OWNED",
    "KEEP",
    "STEP_ROWS",
    "Engine",
    "KpoEngine",
    "engine_of",
    "train_argv",
]

# `kpo train` fields that kpo compare sets from its own options (or its run plan); a `--` flag for one of them
# would override compare's value after compare.json recorded it.
COMPARE_OWNED = {
    "loss": "--methods",
    "seed": "--seeds",
    "warm_start_seed": "--seeds (each seed's runs share its warm start)",
    "output_dir": "--out",
    "max_steps": "--steps",
    "minibatches": "--minibatches",
    "dump_ratios_every": "--dump-every",
    "loss_kwargs": "nothing (each method runs its paper hyperparameters; --sweep-memory sets KPO's memory)",
    "resume": "nothing (finished runs are reused)",
    "save_steps": "--curve-every (or nothing: an interrupt checkpoints every running run)",
    "save_total_limit": "--curve-every",
    "overwrite": "nothing (unfinished runs restart)",
    "model": "--model",
    "dataset": "--dataset",
}


class Engine(Protocol):
    """One trainer behind ``kpo compare``. ``cfg`` is the :class:`kpo.compare.CompareConfig`, ``run`` a
    :class:`kpo.compare.Run`, ``out`` the run's folder. Methods marked "worker" run in a worker process."""

    rows: str  # what one metrics.jsonl row covers: STEP_ROWS or BATCH_ROWS

    def flag_errors(self, cfg) -> list[str]:
        """What is wrong with the settings alone (the ``--`` flags setting what the comparison owns, files the
        engine needs): checked before :meth:`config_errors`."""

    def config_errors(self, cfg, runs) -> list[str]:
        """What the trainer would reject in the configuration of each distinct run of ``runs`` (the plan's),
        before anything trains."""

    def workers(self, cfg) -> int | None:
        """Parallel runs when ``--jobs`` is not given; None = one per CPU."""

    def shared_start(self, cfg) -> bool:
        """Whether every seed starts from one model (evaluated once), not from a warm start of its own."""

    def start_model(self, cfg, seed: int) -> Path:
        """Worker: the model seed ``seed``'s runs start from (built first where it has to be)."""

    def train(self, cfg, run, out: Path, resume: bool) -> Path:
        """Worker: train ``run`` into ``out`` (``resume``: continue what an interrupt left, else afresh); returns
        its final model's folder."""

    def checkpoint(self, cfg, out: Path, step: int) -> Path:
        """The model folder of the run's checkpoint after optimizer step ``step`` (learning curves)."""

    def prune(self, cfg, out: Path) -> None:
        """Worker, once the run is scored: remove what ``cfg.keep`` (:data:`KEEP`) does not keep; the run stays
        done (:meth:`trained`) and is no longer resumable."""

    def trained(self, cfg, out: Path) -> bool:
        """Whether the run in ``out`` finished training (its metrics and final model are there)."""

    def resumable(self, cfg, run, out: Path) -> bool:
        """Whether the unfinished run in ``out`` can continue with this comparison's settings."""

    def changed(self, cfg, run, out: Path) -> list[str]:
        """``"setting: was -> now"`` for each training setting of the run in ``out`` that differs from now's."""

    def steps_done(self, cfg, out: Path) -> int:
        """Optimizer steps the run in ``out`` has logged (the progress bar's count)."""

    def eval_settings(self, cfg) -> dict:
        """``kpo eval`` settings that make its prompts the ones the runs trained on (``prompt_template``,
        ``max_new_tokens``) and its ``backend``."""


class KpoEngine:
    """``kpo train`` in the worker process (TRL), one torch thread per run; see :mod:`kpo.compare.run`."""

    rows = STEP_ROWS

    def flag_errors(self, cfg) -> list[str]:
        return _owned_flag_errors(cfg.train_args) + keep_errors(cfg)

    def config_errors(self, cfg, runs) -> list[str]:
        return _train_config_errors(cfg, runs)

    def workers(self, cfg) -> int | None:
        return None

    def shared_start(self, cfg) -> bool:
        return cfg.model is not None

    def start_model(self, cfg, seed: int) -> Path:
        from kpo.train.config import parse_args
        from kpo.train.run import model_path

        return model_path(
            parse_args(["--seed", str(seed), "--progress", "false", *_model_args(cfg), *cfg.train_args])
        )

    def train(self, cfg, run, out: Path, resume: bool) -> Path:
        from kpo.train.config import parse_args
        from kpo.train.run import run_training

        argv = train_argv(cfg, run, out)
        if resume:  # the argv's --overwrite would delete the checkpoint
            argv = ["--resume" if arg == "--overwrite" else arg for arg in argv]
        run_training(parse_args(argv))
        return out / "final"

    def checkpoint(self, cfg, out: Path, step: int) -> Path:
        return out / f"checkpoint-{step}"

    def prune(self, cfg, out: Path) -> None:
        """``checkpoint-*`` (kpo train's, with their optimizer states: resume points and learning-curve models)
        go unless ``all``; ``final/`` goes with ``none``."""
        import shutil

        from kpo.train.checkpoints import SET_ASIDE_PREFIX

        if cfg.keep == "all":
            return
        doomed = [*out.glob("checkpoint-*"), *out.glob(f"{SET_ASIDE_PREFIX}checkpoint-*")]
        for path in doomed + ([out / "final"] if cfg.keep == "none" else []):
            shutil.rmtree(path, ignore_errors=True)

    def trained(self, cfg, out: Path) -> bool:
        return (out / "config.yaml").exists() and (out / "metrics.jsonl").exists()

    def resumable(self, cfg, run, out: Path) -> bool:
        """A checkpoint an interrupt left, made with this comparison's settings (``kpo train --resume`` continues
        it); otherwise the run starts over."""
        from kpo.train.run import last_checkpoint  # the checkpoint kpo train --resume would take

        has_checkpoint = last_checkpoint(out) is not None
        return has_checkpoint and (out / "config.yaml").exists() and not self.changed(cfg, run, out)

    def changed(self, cfg, run, out: Path) -> list[str]:
        """Against the run's ``config.yaml``: every setting that shapes its trajectory, its length and the period
        of its ratio dumps."""
        from kpo.train.config import TRAJECTORY_FIELDS, TrainConfig, parse_args

        saved, now = TrainConfig.from_yaml(out / "config.yaml"), parse_args(train_argv(cfg, run, out))
        # output_dir says where the run is (spelled as --out was), not how it ran; max_steps ends its trajectory.
        # dump_ratios_every changes no trajectory, but the report analyzes the dumps at the period it records.
        fields = [k for k in TRAJECTORY_FIELDS if k != "output_dir"] + ["max_steps", "dump_ratios_every"]
        return [
            f"{k}: {getattr(saved, k)!r} -> {getattr(now, k)!r}"
            for k in fields
            if getattr(saved, k) != getattr(now, k)
        ]

    def steps_done(self, cfg, out: Path) -> int:
        path = out / "metrics.jsonl"
        return sum(1 for _ in path.open()) if path.exists() else 0

    def eval_settings(self, cfg) -> dict:
        """The prompt kpo train built (:func:`kpo.data.math.format_prompt` with its instruction), its response
        budget where one was given, and the transformers backend."""
        from kpo.data.math import format_prompt
        from kpo.train.config import parse_args

        config = parse_args(list(cfg.train_args))
        return {
            "prompt_template": format_prompt("{problem}", config.instruction),
            "max_new_tokens": config.max_completion_length,
            # transformers, not "auto": on a GPU machine with vLLM installed, "auto" would start one vLLM engine
            # per parallel worker, each claiming most of the GPU's memory
            "backend": "transformers",
        }


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


def _train_config_errors(cfg, runs) -> list[str]:
    """What `kpo train` would reject in each distinct run config (a method, or a sweep point) of ``runs``."""
    from kpo.train.config import ConfigError, parse_args

    # (method, loss overrides) -> its first run: a seed never makes a config invalid
    distinct: dict[tuple, object] = {}
    for run in runs:
        distinct.setdefault((run.method, run.loss_kwargs), run)
    first_run: dict[str, str] = {}  # error -> the first run with it (a bad `--` flag fails every run alike)
    for run in distinct.values():
        try:
            parse_args(train_argv(cfg, run, Path(cfg.out) / "runs" / run.name)).validate()
        except ConfigError as e:
            for err in e.errors:
                # kpo train's advice names its own flag; kpo compare puts every run under --out
                first_run.setdefault(err.replace("another --output-dir", "another --out"), run.name)
    return [f"run {name}: {err}" for err, name in first_run.items()]


def train_argv(cfg, run, out: Path) -> list[str]:
    """The `kpo train` command line of ``run`` (a :class:`kpo.compare.Run`) of comparison ``cfg``, into ``out``."""
    # every seed of a user's --model starts from that model; the embedded one from the seed's own warm start
    warm = ["--warm-start-seed", str(run.seed)] if cfg.model is None else []
    argv = [
        "--loss",
        run.method,
        "--seed",
        str(run.rl_seed),
        *warm,
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
    if cfg.curve_every:  # every curve checkpoint kept, and the final one
        argv += [
            "--save-steps",
            str(cfg.curve_every),
            "--save-total-limit",
            str(cfg.steps // cfg.curve_every + 1),
        ]
    for flag, value in (("--model", cfg.model), ("--dataset", cfg.dataset)):
        if value is not None:
            argv += [flag, value]
    if run.loss_kwargs:
        argv += [
            "--loss-kwargs",
            *(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in run.loss_kwargs),
        ]
    return argv + list(cfg.train_args)


def _model_args(cfg) -> list[str]:
    return ["--model", cfg.model] if cfg.model is not None else []


def engine_of(cfg) -> Engine:
    """The engine ``cfg.engine`` names (validated by :meth:`kpo.compare.CompareConfig.validate`)."""
    if cfg.engine == "verl":
        from kpo.compare.verl_engine import VerlEngine

        return VerlEngine()
    return KpoEngine()
