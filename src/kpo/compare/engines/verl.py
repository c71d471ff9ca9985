"""``kpo compare --engine verl``: every run is verl's ``python -m verl.trainer.main_ppo`` (its default v1 trainer) as
a child process, or with ``--ray-address`` as a job of the user's Ray cluster
(:mod:`kpo.compare.engines.verl_cluster`), on the user's own verl configuration (``--verl-config`` and/or Hydra
overrides after ``--``) passed through untouched. kpo adds only what the comparison owns per run (:data:`OWNED`,
set by :meth:`VerlEngine.overrides`); such a key set by the user anywhere is refused before anything trains. The
rules, the plan's checks, resume and ``--keep``: docs/compare.md, "Your model, your data, your trainer".

A run's folder: ``run.json`` (the overrides kpo composed and the YAML's text, written before training: what a
rerun compares), ``config.yaml`` (verl's composed configuration), ``checkpoints/`` (verl's),
``verl_metrics-K.jsonl`` (verl's file logger, one file per attempt K), ``metrics.jsonl`` (kpo's rows:
:mod:`kpo.compare.engines.verl_metrics`, one per generation batch, :data:`kpo.compare.contract.BATCH_ROWS`),
``ratios/``, ``log.txt``; on a cluster ``ray-jobs.json`` (its jobs) and ``ray-lease``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from kpo._files import replacing, write_json
from kpo.compare.contract import BATCH_ROWS, first_run_errors
from kpo.compare.engines.verl_child import run_child
from kpo.compare.engines.verl_cluster import (
    JOBS_FILE,
    LIVE,
    PYTHON,
    RunJob,
    cluster_address,
    cluster_errors,
    run_resources,
    runtime_env,
    runtime_env_errors,
)
from kpo.compare.engines.verl_config import (
    ABSENT,
    ACTOR,
    compose,
    hydra_free,
    keys_set,
    megatron_errors,
    one_line,
    override_key,
    select,
    type_errors,
    unresolved,
    value_errors,
    verl_check,
    verl_config_errors,
)
from kpo.compare.engines.verl_disk import disk_line
from kpo.compare.engines.verl_metrics import attempt_files, attempt_rows, merge_rows, metrics_rows
from kpo.integrations.verl_fields import DUMP_FIELDS, STEPS_FIELD, loss_field_types

__all__ = ["CELL_SAMPLER", "OWNED", "PAPER_CLIP", "VerlEngine"]

# kpo compare's methods on verl -> verl's loss_mode (kpo's own losses are registered under their names by kpo's
# plugin; vanilla and GSPO are verl's own, the same methods: kpo.integrations.verl.VERL_EQUIVALENTS)
VERL_LOSS = {"vanilla": "vanilla", "gspo": "gspo", "kpo": "kpo", "kpo_unclipped": "kpo_unclipped"}
# Each method's paper clip range (clip_ratio_low, clip_ratio_high), which kpo.losses defaults to; verl's actor
# config defaults every loss to 0.2/0.2, so kpo sets them (tests/compare/test_compare_setup.py checks them against
# kpo.losses). kpo_unclipped has none.
PAPER_CLIP = {"vanilla": (0.2, 0.2), "gspo": (3e-4, 4e-4), "kpo": (3e-4, 4e-4)}
# Hydra keys kpo compare sets for every run -> what sets them instead (docs/compare.md). kpo's actor-config fields
# come from the loss registry (kpo.integrations.verl_fields), as the plugin's KPOActorConfig builds them.
OWNED = {
    f"{ACTOR}.policy_loss.loss_mode": "--methods",
    f"{ACTOR}._target_": "--methods (kpo's losses run with kpo's actor config)",
    f"{ACTOR}.clip_ratio": "--methods (each method runs its paper clip range)",
    f"{ACTOR}.clip_ratio_low": "--methods (each method runs its paper clip range)",
    f"{ACTOR}.clip_ratio_high": "--methods (each method runs its paper clip range)",
    f"{ACTOR}.loss_agg_mode": "--methods (each method runs its own aggregation)",
    **{
        f"{ACTOR}.{k}": "--methods / --sweep-memory (kpo's parameters are each method's paper ones)"
        for k in loss_field_types()
    },
    **{f"{ACTOR}.{k}": "--dump-every" for k in DUMP_FIELDS},
    f"{ACTOR}.{STEPS_FIELD}": "--minibatches (a generation batch is --minibatches x ppo_epochs optimizer steps)",
    "data.seed": "--seeds",
    "actor_rollout_ref.rollout.seed": "--seeds",
    f"{ACTOR}.data_loader_seed": "--seeds",
    "trainer.total_training_steps": "--steps (optimizer steps; verl's training steps = steps / minibatches)",
    "trainer.total_epochs": "--steps (a run ends at its step count)",
    f"{ACTOR}.ppo_mini_batch_size": "--minibatches (data.train_batch_size / minibatches)",
    "trainer.default_local_dir": "--out",
    "trainer.resume_mode": "nothing (an interrupted run resumes from its checkpoints)",
    "trainer.max_actor_ckpt_to_keep": "--keep (all: every checkpoint; else the last one while a run trains)",
    "trainer.max_critic_ckpt_to_keep": "--keep (all: every checkpoint; else the last one while a run trains)",
    "hydra.run.dir": "--out",
}
# Output folders a user may set: each run writes in its own subfolder of the user's (named as the run).
USER_DIRS = ("trainer.rollout_data_dir", "trainer.validation_data_dir", "trainer.default_hdfs_dir")
TENSORBOARD_ENV = "TENSORBOARD_DIR"  # verl's TensorBoard logger's folder, from the environment
# What --model / --dataset set, when given.
MODEL_KEY, DATA_KEY = "actor_rollout_ref.model.path", "data.train_files"
RUN_FILE = "run.json"
# A regime cell's sampler on verl (kpo.compare.regimes), by the map's mismatch level: none = a float32 sampler
# whose log-probs the trainer recomputes (verl's default, decoupled mode: each batch's first mini-batch has ratio
# 1), bf16 = a bfloat16 sampler whose own log-probs anchor the ratio (verl's bypass mode). fp8 is not mapped.
CELL_SAMPLER = {
    "none": ("actor_rollout_ref.rollout.dtype=float32", "algorithm.rollout_correction.bypass_mode=false"),
    "bf16": ("actor_rollout_ref.rollout.dtype=bfloat16", "algorithm.rollout_correction.bypass_mode=true"),
}
CELL_LR = f"{ACTOR}.optim.lr"  # a regime cell's learning rate


class VerlEngine:
    """verl's ``main_ppo`` as a child process, one run at a time by default, or as jobs of the user's Ray cluster."""

    rows = BATCH_ROWS

    # ------------------------------------------------------------------ settings
    def _base(self, cfg) -> tuple[str, ...]:
        """The user's overrides with --model / --dataset."""
        extra = [f"{MODEL_KEY}={_absolute(cfg.model, output=False)}"] if cfg.model is not None else []
        extra += [f"{DATA_KEY}={_absolute(cfg.dataset, output=False)}"] if cfg.dataset is not None else []
        return (*cfg.train_args, *extra)

    def _composed(self, cfg):
        return compose(cfg.verl_config, self._base(cfg))

    def _steps_per_batch(self, cfg) -> int:
        return cfg.minibatches * int(self._composed(cfg).actor_rollout_ref.actor.ppo_epochs)

    def flag_errors(self, cfg) -> list[str]:
        import importlib.util

        given = {override_key(o) for o in cfg.train_args}
        errors = [
            f"-- {key}=...: kpo compare sets it for every run; use {OWNED[key]} instead"
            for key in sorted(given & set(OWNED))
        ]
        # an owned key set inside a mapping given to one of its parents (`data={seed:3}`)
        for override in cfg.train_args:
            inside = sorted(k for k in keys_set(override) if k in OWNED and k != override_key(override))
            errors += [
                f"-- {override}: sets {key}, which kpo compare sets for every run; use {OWNED[key]} instead"
                for key in inside
            ]
        for key, flag, value in ((MODEL_KEY, "--model", cfg.model), (DATA_KEY, "--dataset", cfg.dataset)):
            if value is not None and key in given:
                errors.append(f"-- {key}=... and {flag}: both set the same thing; give it once")
        unknown = sorted(set(cfg.methods) - set(VERL_LOSS))
        if unknown:
            errors.append(
                f"--methods {','.join(unknown)}: not mapped to verl by kpo compare; use {', '.join(VERL_LOSS)}"
            )
        if cfg.sweep_memory:
            errors.append("--sweep-memory: not run on verl yet; use --engine kpo, or --sweep-memory ''")
        # --verl-config, --model and --dataset themselves: kpo.compare.plan checks them for every engine
        if importlib.util.find_spec("verl") is None:
            errors.append("--engine verl: verl is not installed here; pip install 'kpo[verl]' (verl 0.9.1)")
        if not cfg.eval_data:
            errors.append(
                "--engine verl: give the held-out benchmarks with --eval-data FILE... (kpo eval scores each run)"
            )
        errors += runtime_env_errors(cfg, ("VERL_FILE_LOGGER_PATH", "KPO_COMPARE_RUN", TENSORBOARD_ENV))
        return errors

    def data_errors(self, cfg) -> list[str]:
        """``--dataset`` as verl's training parquet; ``--verl-config`` a YAML building on verl's trainer
        configuration (:func:`kpo.compare.engines.verl_config.verl_config_errors`)."""
        from kpo._checks import file_errors

        errors = []
        if cfg.dataset is not None:
            kinds = {".parquet": "verl's RL schema"}
            errors += file_errors("--dataset", cfg.dataset, kinds, "verl's training parquet", "verl")
        if cfg.verl_config is not None:
            errors += verl_config_errors(cfg.verl_config)
        return errors

    def config_errors(self, cfg, runs) -> list[str]:
        """The user's configuration composed as main_ppo composes it, then: a Megatron actor, a key kpo owns set
        by it (:meth:`_owned_in_config`), a value of the wrong type for verl's config classes, what the
        comparison's arithmetic needs; then every distinct arm's composed configuration through main_ppo's own
        check (``validate_config``, kpo's actor config). Each error in full."""
        try:
            composed = self._composed(cfg)
        except Exception as e:  # noqa: BLE001 - Hydra's and OmegaConf's many errors, each shown in full
            return [f"verl configuration: {one_line(e)}"]
        errors = megatron_errors(composed) or self._owned_in_config(cfg) + type_errors(composed)
        errors = errors or value_errors(composed)
        if errors:
            return errors
        batch, epochs = int(composed.data.train_batch_size), int(composed.actor_rollout_ref.actor.ppo_epochs)
        if batch < cfg.minibatches or batch % cfg.minibatches:
            errors.append(
                f"--minibatches={cfg.minibatches}: must divide data.train_batch_size={batch} (equal mini-batches "
                "of at least one prompt)"
            )
        if cfg.steps % (cfg.minibatches * epochs):
            errors.append(
                f"--steps={cfg.steps}: must be a multiple of --minibatches x ppo_epochs = "
                f"{cfg.minibatches * epochs} (a verl training step is one generation batch)"
            )
        for key in (MODEL_KEY, DATA_KEY):
            value = str(select(composed, key))
            if value.startswith(("/", ".")) and not Path(value).exists():
                errors.append(f"{key}={value}: no such file or folder; check the path")
        if errors:
            return errors
        errors = first_run_errors(
            runs, lambda run: verl_check(cfg.verl_config, self.overrides(cfg, run, Path(cfg.out) / "runs" / run.name))
        )
        if not errors and cluster_address(cfg):
            errors = cluster_errors(cfg, composed, Path(cfg.out))
        return errors

    def _owned_in_config(self, cfg) -> list[str]:
        """The keys kpo owns (:data:`OWNED`) that the user's YAML sets: written in the file, or composed (from a
        file it includes) to a value other than verl's ``ppo_trainer`` default. The same rule as for ``--``
        overrides (:meth:`flag_errors`): refused, naming the key."""
        if cfg.verl_config is None:
            return []
        from omegaconf import OmegaConf

        written, mine, verl = OmegaConf.load(cfg.verl_config), compose(cfg.verl_config, ()), compose(None, ())
        errors = []
        for key, instead in OWNED.items():
            value = unresolved(written, key)
            if value is ABSENT and not key.startswith("hydra."):
                value = unresolved(mine, key)
                if value == unresolved(verl, key):
                    continue
            if value is not ABSENT:
                errors.append(
                    f"--verl-config {cfg.verl_config}: sets {key} ({value}); kpo compare sets it for every run: "
                    f"remove it there and use {instead}"
                )
        return errors

    def overrides(self, cfg, run, out: Path, start_step: int = 0) -> tuple[str, ...]:
        """Every override of one run: the user's (with --model/--dataset), then what kpo owns (:data:`OWNED`)."""
        from kpo.filter.memory import matched_memory
        from kpo.losses import get_loss_spec

        composed = self._composed(cfg)
        per_batch = self._steps_per_batch(cfg)
        seed = run.rl_seed
        out = out.resolve()  # the workers may run anywhere: on a cluster, in another working directory
        trainer = composed.trainer
        loggers = list(trainer.logger) if not isinstance(trainer.logger, str) else [trainer.logger]
        contents = list(composed.actor_rollout_ref.actor.checkpoint.save_contents)
        owned = [
            f"{ACTOR}.policy_loss.loss_mode={VERL_LOSS[run.method]}",
            f"{ACTOR}.loss_agg_mode={get_loss_spec(run.method).default_agg}",
            f"data.seed={seed}",
            f"actor_rollout_ref.rollout.seed={seed}",
            f"{ACTOR}.data_loader_seed={seed}",
            f"trainer.total_training_steps={cfg.steps // per_batch}",
            # as many epochs as steps: the run ends at its step count, never at the end of its epochs
            f"trainer.total_epochs={cfg.steps // per_batch}",
            f"{ACTOR}.ppo_mini_batch_size={int(composed.data.train_batch_size) // cfg.minibatches}",
            f"trainer.default_local_dir={out / 'checkpoints'}",
            f"trainer.experiment_name={trainer.experiment_name}-{run.name}",
            f"trainer.logger=[{','.join(dict.fromkeys([*loggers, 'file']))}]",
            f"{ACTOR}.checkpoint.save_contents=[{','.join(dict.fromkeys([*contents, 'hf_model']))}]",
            "trainer.resume_mode=auto",
            f"hydra.run.dir={out / 'hydra'}",
        ]
        # the user's output folders, one subfolder per run
        owned += [
            f"{key}={Path(_absolute(folder, output=True)) / run.name}"
            for key in USER_DIRS
            if (folder := select(composed, key))
        ]
        # verl saves nothing by default; any positive period also saves the last step
        if int(trainer.save_freq) <= 0:
            owned.append(f"trainer.save_freq={cfg.steps // per_batch}")
        if cfg.keep != "all":  # the disk a run takes while it trains: its last checkpoint, and the next as it is written
            owned += ["trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=1"]
        if cluster_address(cfg):  # the sizes of a Ray main_ppo would start: the cluster's nodes have their own
            owned += ["ray_kwargs.ray_init.num_cpus=null", "ray_kwargs.ray_init.num_gpus=null"]
        kwargs = dict(run.loss_kwargs)
        low, high = PAPER_CLIP.get(run.method, (None, None))
        low, high = kwargs.pop("clip_ratio_low", low), kwargs.pop("clip_ratio_high", high)
        if low is not None:
            owned += [f"{ACTOR}.clip_ratio_low={low!r}", f"{ACTOR}.clip_ratio_high={high!r}"]
        if run.method in ("kpo", "kpo_unclipped"):
            if kwargs.get("memory") == "matched":  # the paper's memory-to-length ratio at this budget
                kwargs["memory"] = matched_memory(int(composed.data.max_response_length))
            kwargs |= {
                "dump_ratios_every": cfg.dump_every,
                "dump_ratios_dir": str(out / "ratios"),
                STEPS_FIELD: per_batch,  # memory=auto: each batch's first (on-policy) step is not fitted
            }
            if start_step:
                kwargs["dump_ratios_start"] = start_step
            owned.append(f"{ACTOR}._target_=kpo.integrations.verl.KPOActorConfig")
            owned += [f"+{ACTOR}.{k}={v!r}" if isinstance(v, float) else f"+{ACTOR}.{k}={v}" for k, v in kwargs.items()]
        return (*self._base(cfg), *owned)

    def cell_settings(self, cell) -> tuple[str, ...]:
        """The cell's sampler (:data:`CELL_SAMPLER`: its dtype and verl's bypass mode) and learning rate."""
        return (*CELL_SAMPLER[cell.mismatch], f"{CELL_LR}={cell.lr!r}")

    def cell_errors(self, cell, train_args) -> list[str]:
        """A cell whose mismatch verl has no sampler for (fp8), or a `--` override of what each cell sets."""
        errors = []
        if cell.mismatch not in CELL_SAMPLER:
            errors.append(f"--mismatch {cell.mismatch}: not mapped to verl; use {', '.join(CELL_SAMPLER)}")
        owned = {override_key(o) for sampler in CELL_SAMPLER.values() for o in sampler} | {CELL_LR}
        errors += [
            f"-- {key}=...: each cell sets it (--mismatch, --lr); drop it"
            for key in sorted({override_key(o) for o in train_args} & owned)
        ]
        return errors

    def plan_lines(self, cfg) -> list[str]:
        """The disk a run takes at most while it trains and once scored (:mod:`kpo.compare.engines.verl_disk`) and,
        on a cluster, what each run's job asks it for."""
        composed = self._composed(cfg)
        batches = cfg.steps // self._steps_per_batch(cfg)
        lines = [disk_line(self.start_model(cfg, 0), batches, int(composed.trainer.save_freq), cfg.keep)]
        if address := cluster_address(cfg):
            need = run_resources(composed)
            lines.append(
                f"each run a job of the Ray cluster at {address}, asking for {need['gpus']} GPU(s) on {need['nodes']} "
                f"node(s) and {need['cpus']} logical CPUs; {cfg.jobs or self.workers(cfg)} at once (--jobs), the cluster's "
                "scheduler queues the rest; each job's log in its run's log.txt"
            )
        return lines

    # ------------------------------------------------------------------ runs
    def workers(self, cfg) -> int | None:
        return 1

    def embedded(self, cfg) -> bool:
        return False

    def embedded_task(self, cfg):
        """None: verl trains on the user's parquet, and the runs are scored on ``--eval-data``."""
        return None

    def shared_start(self, cfg) -> bool:
        return True

    def start_model(self, cfg, seed: int) -> Path:
        return Path(os.path.expanduser(str(select(self._composed(cfg), MODEL_KEY))))

    def train(self, cfg, run, out: Path, resume: bool) -> Path:
        """Run main_ppo for ``run`` into ``out``: as a child process, or as a job of the user's Ray cluster
        (:mod:`kpo.compare.engines.verl_cluster`; a job of this run still running is followed again, one that
        finished is reused). An interrupt (KeyboardInterrupt: kpo compare passes its SIGINT on) stops it, and with
        it every process it started."""
        from kpo.compare.guards import LOCK_FILE, PID_FILE

        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        address = cluster_address(cfg)
        jobs = RunJob(address, out) if address else None
        if jobs is not None:
            if self._continued(cfg, run, out, jobs):
                return self._finish(cfg, out)
            jobs.stop_live()  # a job of other settings (or of a run that starts over) must not write here
        # the run starts over: what an earlier attempt left would be resumed or read as its own
        if not resume:
            for path in out.iterdir():
                # the log keeps every attempt, the lock is held, and the jobs' ids go on
                if path.name not in ("log.txt", LOCK_FILE, PID_FILE, JOBS_FILE):
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        elif cfg.keep != "all":  # verl removes only what its own process saved: an earlier attempt's would stay
            _prune_older(out)
        done = _checkpointed_step(out) * self._steps_per_batch(cfg) if resume else 0
        overrides = self.overrides(cfg, run, out, start_step=done)
        # what a rerun compares (and resumes with)
        write_json(out / RUN_FILE, {"verl_config": _yaml(cfg), "overrides": overrides}, indent=1)
        from omegaconf import OmegaConf

        with replacing(out / "config.yaml") as partial:
            partial.write_text(OmegaConf.to_yaml(compose(cfg.verl_config, hydra_free(overrides))))
        where = []
        if cfg.verl_config:
            path = Path(cfg.verl_config).resolve()
            where = ["--config-path", str(path.parent), "--config-name", path.stem]
        command = ["-m", "verl.trainer.main_ppo", *where, *overrides]
        sys.stdout.flush()
        if jobs is None:
            run_child([sys.executable, *command], _run_env(out, run, len(attempt_files(out))), out)
        else:
            env = runtime_env(cfg, Path(cfg.out), _run_env(out, run, len(jobs.ids())))
            jobs.follow(jobs.submit([PYTHON, *command], env))
        return self._finish(cfg, out)

    def _continued(self, cfg, run, out: Path, jobs: RunJob) -> bool:
        """Whether the run's last Ray job, of this run's settings, trained it: one still running is followed to
        its end (a compare killed meanwhile, rerun before the job's lease ran out), one that succeeded with the
        final weights there is reused."""
        last = jobs.last()
        if last is None or not (out / RUN_FILE).exists() or self.changed(cfg, run, out):
            return False
        job, status = last
        if status in LIVE:
            print(f"kpo compare: {run.name}: following its Ray job {job} ({status})", flush=True)
            jobs.follow(job)
            return True
        if status == "SUCCEEDED" and _has_weights(self._final(cfg, out)):
            print(f"kpo compare: {run.name}: its Ray job {job} finished; reading what it wrote", flush=True)
            return True
        return False

    def _finish(self, cfg, out: Path) -> Path:
        """The trained run's final model, once its metrics (every attempt's rows, merged) are in metrics.jsonl."""
        final = self._final(cfg, out)
        if not _has_weights(final):
            raise RuntimeError(
                f"verl's main_ppo finished without the final checkpoint's Hugging Face weights in {final} "
                "(*.safetensors or pytorch_model*.bin): kpo eval has no model to score"
            )
        per_batch = self._steps_per_batch(cfg)
        rows = []
        for path in attempt_files(out):
            found, torn = attempt_rows(path)
            rows += found
            if torn:  # a kill (or a poll) mid-write: verl redid that step in a later attempt, or it is lost below
                print(f"kpo compare: {path}: its last line is cut short ({torn[:60]!r}...); skipped", flush=True)
        merged = merge_rows(rows)
        lost = sorted(set(range(1, cfg.steps // per_batch + 1)) - {r["step"] for r in merged})
        if lost:  # verl saves a step's checkpoint before it logs the step: a kill between the two loses the row
            print(f"kpo compare: verl logged no training row for its step(s) {lost} (killed between a checkpoint "
                  "and its row?): metrics.jsonl has none for them", flush=True)  # fmt: skip
        with replacing(out / "metrics.jsonl") as partial:  # the run is trained once this is there
            partial.write_text("".join(json.dumps(r) + "\n" for r in metrics_rows(merged, per_batch)))
        return final

    def _final(self, cfg, out: Path) -> Path:
        """The Hugging Face folder of the run's final checkpoint."""
        batch = cfg.steps // self._steps_per_batch(cfg)
        return out / "checkpoints" / f"global_step_{batch}" / "actor" / "huggingface"

    def trained(self, cfg, out: Path) -> bool:
        return (out / RUN_FILE).exists() and (out / "metrics.jsonl").exists()

    def prune(self, cfg, out: Path) -> None:
        """``hf``: of ``checkpoints/`` only the final checkpoint's Hugging Face folder stays (verl's tracker file
        goes with the rest: nothing is left to resume); ``none``: ``checkpoints/`` goes."""
        folder = out / "checkpoints"
        if cfg.keep == "all" or not folder.is_dir():
            return
        if cfg.keep == "none":
            shutil.rmtree(folder)
        else:
            _prune_to(folder, self._final(cfg, out))

    def resumable(self, cfg, run, out: Path) -> bool:
        return (out / RUN_FILE).exists() and _checkpointed_step(out) > 0 and not self.changed(cfg, run, out)

    def run_settings(self, cfg, run) -> dict:
        """The run's overrides by key, but where it writes (:data:`WHERE`), and the verl configuration's text: two
        runs with equal settings train the same model."""
        return {"overrides": _keyed(self.overrides(cfg, run, Path(cfg.out) / "runs" / run.name)),
                "verl_config": _yaml(cfg)}

    def changed(self, cfg, run, out: Path) -> list[str]:
        """The overrides of the run in ``out`` (``run.json``) against now's, by key, leaving out what does not change
        what it trains."""
        saved = json.loads((out / RUN_FILE).read_text())
        was, now = _keyed(saved["overrides"]), _keyed(self.overrides(cfg, run, out))
        changed = [
            f"{k}: {was.get(k, '(unset)')} -> {now.get(k, '(unset)')}"
            for k in sorted(set(was) | set(now))
            if was.get(k) != now.get(k)
        ]
        if saved["verl_config"] != _yaml(cfg):
            changed.append(f"--verl-config {cfg.verl_config}: its text (or the file given) differs")
        return changed

    def steps_done(self, cfg, out: Path) -> int:
        files = attempt_files(out)
        rows = attempt_rows(files[-1])[0] if files else []
        return (rows[-1]["step"] if rows else 0) * self._steps_per_batch(cfg)

    def eval_settings(self, cfg) -> dict:
        """verl feeds each prompt of its parquet as it is (the instruction is in it, as
        examples/verl/prepare_data.py writes it), so kpo eval adds none; a response gets the budget it trained
        with (``data.max_response_length``); runs go one at a time, so kpo eval may take vLLM where it is
        installed (on a GPU)."""
        budget = int(self._composed(cfg).data.max_response_length)
        return {"prompt_template": "{problem}", "max_new_tokens": budget, "backend": "auto"}


# Overrides that say where a run writes, where a resumed run's dumps start, and how big a Ray main_ppo would start (a
# run of a cluster's job and one of a child process are the same run): not what it trains
WHERE = ("trainer.default_local_dir", "hydra.run.dir", f"{ACTOR}.dump_ratios_dir", f"{ACTOR}.dump_ratios_start",
         "ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus")  # fmt: skip


def _keyed(overrides) -> dict[str, str]:
    """Overrides as key -> value, without :data:`WHERE`."""
    pairs = (o.split("=", 1) if "=" in o else (o, "") for o in overrides)
    return {k.lstrip("+~"): v for k, v in pairs if k.lstrip("+~") not in WHERE}


def _yaml(cfg) -> str | None:
    """The text of the user's verl YAML (what a rerun compares: the file may have been edited), None without one."""
    return None if cfg.verl_config is None else Path(cfg.verl_config).read_text()


def _run_env(out: Path, run, attempt: int) -> dict[str, str]:
    """What kpo adds to main_ppo's environment (on a cluster, to its job's runtime environment, which reaches every
    actor of the job): verl's file logger writing the attempt's own file, the run's folder (``KPO_COMPARE_RUN``),
    and the user's TensorBoard folder (``TENSORBOARD_DIR``), where set, a subfolder per run."""
    env = {"VERL_FILE_LOGGER_PATH": str(out / f"verl_metrics-{attempt}.jsonl"), "KPO_COMPARE_RUN": str(out)}
    if os.environ.get(TENSORBOARD_ENV):
        env[TENSORBOARD_ENV] = str(Path(_absolute(os.environ[TENSORBOARD_ENV], output=True)) / run.name)
    return env


def _absolute(path, *, output: bool) -> str:
    """A path the user gave, as every node is to read it: relative to the folder kpo compare runs in, made
    absolute where it is there (or is an ``output`` folder, made by the run); ``~`` is left to each node, as the
    user's configuration leaves it; anything else (a Hugging Face model id) as it is."""
    text = str(path)
    if text.startswith("~") or os.path.isabs(text) or not (output or Path(text).exists()):
        return text
    return str(Path(text).resolve())


def _has_weights(folder: Path) -> bool:
    """Whether the Hugging Face folder holds model weights (verl writes its config.json and tokenizer there
    even when ``hf_model`` is not saved)."""
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def _prune_to(root: Path, keep: Path) -> None:
    """Remove everything under ``root`` except ``keep`` (a path under it) and the folders leading to it."""
    for path in root.iterdir():
        if path == keep:
            continue
        if keep.is_relative_to(path):
            _prune_to(path, keep)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _prune_older(out: Path) -> None:
    """Remove the run's verl checkpoints other than its last complete one (the one verl resumes from); without
    verl's tracker file nothing is known complete, and nothing is removed."""
    last = _checkpointed_step(out)
    if last == 0:
        return
    for folder in (out / "checkpoints").glob("global_step_*"):
        if folder.is_dir() and folder.name != f"global_step_{last}":
            shutil.rmtree(folder)


def _checkpointed_step(out: Path) -> int:
    """The training step of the run's last complete verl checkpoint (verl's tracker file), 0 when none."""
    tracker = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    return int(tracker.read_text().strip() or 0) if tracker.exists() else 0
