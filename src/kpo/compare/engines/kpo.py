"""``kpo compare --engine kpo`` (the default): every run is ``kpo train`` (TRL) in the worker process, one torch
thread per run, on the embedded task or on ``--model``/``--dataset``; the ``--`` flags are kpo train's, shared
by every run, and kpo compare sets the rest (:data:`COMPARE_OWNED`, :func:`train_argv`). A regime cell's sampler
and learning rate are kpo train flags too (:data:`MISMATCH_FLAGS`, :data:`CELL_OWNED`). A run's folder is kpo
train's output directory: ``config.yaml`` (what a rerun compares), ``metrics.jsonl`` (a row per optimizer step,
:data:`kpo.compare.contract.STEP_ROWS`), ``checkpoint-*``, ``final/``, ``ratios/``.
"""

from __future__ import annotations

from pathlib import Path

from kpo.compare.contract import STEP_ROWS, first_run_errors

__all__ = ["CELL_OWNED", "COMPARE_OWNED", "MISMATCH_FLAGS", "KpoEngine", "train_argv"]

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
    "save_steps": "nothing (an interrupt checkpoints every running run)",
    "save_total_limit": "nothing (a run keeps what --keep says)",
    "overwrite": "nothing (unfinished runs restart)",
    "model": "--model",
    "dataset": "--dataset",
}
# The sampler of each mismatch level of the regime map (kpo.compare.cell.MISMATCH), as kpo train flags.
MISMATCH_FLAGS = {
    "none": (),
    "bf16": ("--rollout-dtype", "bfloat16", "--ratio-anchor", "rollout"),
    "fp8": ("--rollout-dtype", "float8", "--ratio-anchor", "rollout"),
}
# kpo train flags a regime cell fixes: a `--` flag for one of them would train another regime under the cell's
# name.
CELL_OWNED = {
    "learning_rate": "--lr (or --cells)",
    "rollout_dtype": "--mismatch (or --cells)",
    "ratio_anchor": "--mismatch (or --cells)",
    "minibatches": "--depth (or --cells)",
}


class KpoEngine:
    """``kpo train`` in the worker process (TRL), one torch thread per run; see :mod:`kpo.compare.run`."""

    rows = STEP_ROWS

    def flag_errors(self, cfg) -> list[str]:
        """The Ray flags (verl's), and `--` flags that would override a setting kpo compare makes itself."""
        from kpo.train.flags import build_parser

        errors = [
            f"{flag} {value}: runs are Ray jobs with --engine verl only; drop it (kpo train runs here)"
            for flag, value in (("--ray-address", cfg.ray_address), ("--ray-runtime-env", cfg.ray_runtime_env))
            if value
        ]
        # kpo train's parser without defaults leaves unset fields out of the namespace, so its keys are exactly the
        # flags given (and config, with --config).
        given = vars(build_parser("kpo compare -- (kpo train flags)", defaults=False).parse_args(list(cfg.train_args)))
        errors += [
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

    def data_errors(self, cfg) -> list[str]:
        """``--dataset`` in a format kpo train reads; a ``--verl-config`` is verl's alone."""
        from kpo._checks import PROBLEM_FILES, file_errors

        errors = []
        if cfg.dataset is not None:
            errors += file_errors("--dataset", cfg.dataset, PROBLEM_FILES, "training problems")
        if cfg.verl_config is not None:
            errors.append(f"--verl-config {cfg.verl_config}: a verl configuration needs --engine verl")
        return errors

    def config_errors(self, cfg, runs) -> list[str]:
        """What `kpo train` would reject in each distinct run config (a method, or a sweep point) of ``runs``."""
        from kpo.train.config import ConfigError
        from kpo.train.flags import parse_args

        def errors_of(run) -> list[str]:
            try:
                parse_args(train_argv(cfg, run, Path(cfg.out) / "runs" / run.name)).validate()
            except ConfigError as e:  # kpo train's advice names its own flag; kpo compare puts every run under --out
                return [err.replace("another --output-dir", "another --out") for err in e.errors]
            return []

        return first_run_errors(runs, errors_of)

    def plan_lines(self, cfg) -> list[str]:
        return []

    def cell_settings(self, cell) -> tuple[str, ...]:
        return ("--learning-rate", repr(cell.lr), *MISMATCH_FLAGS[cell.mismatch])

    def cell_errors(self, cell, train_args) -> list[str]:
        """`--` flags that would override what a cell fixes (its learning rate, sampler, anchor, depth): every
        mismatch level is kpo train's."""
        from kpo.train.flags import build_parser

        try:
            parser = build_parser("kpo compare regimes -- (kpo train flags)", defaults=False)
            given = vars(parser.parse_args(list(train_args)))
        except SystemExit:  # argparse printed its own line; kpo compare's validation reports the rest
            return []
        return [
            f"-- --{key.replace('_', '-')}: every cell sets it (its name says which); use {CELL_OWNED[key]} instead"
            for key in given
            if key in CELL_OWNED
        ]

    def workers(self, cfg) -> int | None:
        return None

    def embedded(self, cfg) -> bool:
        return cfg.model is None and cfg.dataset is None and not cfg.eval_data

    def embedded_task(self, cfg):
        """The task kpo train's flags name (the embedded running-sum task by default)."""
        from kpo.train.flags import parse_args

        return parse_args(list(cfg.train_args)).task_config()

    def shared_start(self, cfg) -> bool:
        return cfg.model is not None

    def start_model(self, cfg, seed: int) -> Path:
        from kpo.train.flags import parse_args
        from kpo.train.run import model_path

        model = ["--model", cfg.model] if cfg.model is not None else []
        return model_path(parse_args(["--seed", str(seed), "--progress", "false", *model, *cfg.train_args]))

    def train(self, cfg, run, out: Path, resume: bool) -> Path:
        from kpo.train.flags import parse_args
        from kpo.train.run import run_training

        argv = train_argv(cfg, run, out)
        if resume:  # the argv's --overwrite would delete the checkpoint
            argv = ["--resume" if arg == "--overwrite" else arg for arg in argv]
        run_training(parse_args(argv))
        return out / "final"

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

    def run_settings(self, cfg, run) -> dict:
        """kpo train's settings of ``run`` that shape its trajectory, and its length (``max_steps``): two runs
        with equal settings train the same model."""
        from kpo.train.config import TRAJECTORY_FIELDS
        from kpo.train.flags import parse_args

        config = parse_args(train_argv(cfg, run, Path(cfg.out) / "runs" / run.name))
        return {k: getattr(config, k) for k in (*TRAJECTORY_FIELDS, "max_steps")}

    def changed(self, cfg, run, out: Path) -> list[str]:
        """Against the run's ``config.yaml``: every setting that shapes its trajectory, its length and the period
        of its ratio dumps."""
        from kpo.train.config import TrainConfig

        saved, now = TrainConfig.from_yaml(out / "config.yaml").to_dict(), self.run_settings(cfg, run)
        # dump_ratios_every changes no trajectory, but the report analyzes the dumps at the period it records
        now["dump_ratios_every"] = cfg.dump_every
        return [f"{k}: {saved[k]!r} -> {v!r}" for k, v in now.items() if saved[k] != v]

    def steps_done(self, cfg, out: Path) -> int:
        path = out / "metrics.jsonl"
        return sum(1 for _ in path.open()) if path.exists() else 0

    def eval_settings(self, cfg) -> dict:
        """The prompt kpo train built (:func:`kpo.data.math.format_prompt` with its instruction), its response
        budget where one was given, and the transformers backend."""
        from kpo.data.math import format_prompt
        from kpo.train.flags import parse_args

        config = parse_args(list(cfg.train_args))
        return {
            "prompt_template": format_prompt("{problem}", config.instruction),
            "max_new_tokens": config.max_completion_length,
            # transformers, not "auto": on a GPU machine with vLLM installed, "auto" would start one vLLM engine
            # per parallel worker, each claiming most of the GPU's memory
            "backend": "transformers",
        }


def train_argv(cfg, run, out: Path) -> list[str]:
    """The `kpo train` command line of ``run`` (a :class:`kpo.compare.Run`) of comparison ``cfg``, into ``out``."""
    # every seed of a user's --model starts from that model; the embedded one from the seed's own warm start
    warm = ["--warm-start-seed", str(run.seed)] if cfg.model is None else []
    argv = ["--loss", run.method, "--seed", str(run.rl_seed), *warm, "--output-dir", str(out),
            "--minibatches", str(cfg.minibatches), "--dump-ratios-every", str(cfg.dump_every), "--report-to", "none",
            "--progress", "false", "--num-threads", "1", "--overwrite", "--max-steps", str(cfg.steps)]  # fmt: skip
    for flag, value in (("--model", cfg.model), ("--dataset", cfg.dataset)):
        if value is not None:
            argv += [flag, value]
    if run.loss_kwargs:
        argv += ["--loss-kwargs", *(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in run.loss_kwargs)]
    return argv + list(cfg.train_args)

