"""``run_training(config) -> output_dir``: model, data, reward and TRL trainer wired from one TrainConfig."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from kpo import _distributed
from kpo._exit import INTERRUPTED
from kpo._files import complete_part, replacing, writing
from kpo.train import checkpoints
from kpo.train.card import write_run_card
from kpo.train.config import TRAJECTORY_FIELDS, ConfigError, TrainConfig
from kpo.train.interrupt import AbandonBatch, InterruptGuard, StopNow, TrainingInterrupted
from kpo.train.metrics import parse_rows
from kpo.train.settings import KPOSettings
from kpo.train.summary import EVAL_FILES

__all__ = ["last_checkpoint", "model_path", "notices", "run_training", "synthetic_reward", "math_reward_fn"]

# Files and folders a run writes into output_dir (the only things --overwrite removes).
_RUN_OUTPUTS = (
    "config.yaml",
    "metrics.jsonl",
    "final",
    "warm_start",
    "ratios",
    "runs",
    "training_dynamics.png",
    "README.md",
    "summary.json",
    # the evaluations kpo summary reads (make demo writes them here), with their tables and caches
    *(
        Path(name).with_suffix(ext).name
        for name in EVAL_FILES.values()
        for ext in (".json", ".md", ".generations.jsonl")
    ),
)


def synthetic_reward(completions: list[str], answer: list[str], **_) -> list[float]:
    """TRL reward function of the embedded task: :func:`kpo.testbed.task.grade`, 1.0 when every step of the
    chain keeps the sum and the last is the answer, else 0.0."""
    from kpo.testbed.task import grade

    return [grade(c, a) for c, a in zip(completions, answer)]


def math_reward_fn(completions: list, answer: list[str], **_) -> list[float]:
    """TRL reward function for math datasets: ``kpo.rewards.math_reward`` (math-verify) on the last turn.

    ``answer`` holds JSON-encoded answers (a string or a list of accepted alternatives)."""
    from kpo.rewards import math_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [math_reward(t, json.loads(a)) for t, a in zip(texts, answer)]


def last_checkpoint(out: Path) -> Path | None:
    """The checkpoint ``kpo train --resume`` continues from: the newest complete one (:mod:`kpo.train.checkpoints`)."""
    return checkpoints.last_complete(out)


def _prepare_output_dir(config: TrainConfig, out: Path, world: int) -> Path | None:
    """Create/clean output_dir; on resume check the config and the checkpoint (``world`` processes), then trim
    metrics to it.

    Returns the checkpoint to resume from, or None for a fresh run. A resume of a run whose last checkpoint is
    at max_steps returns that checkpoint before anything is written (:func:`run_training` then stops)."""
    if config.overwrite and out.is_dir():
        for name in _RUN_OUTPUTS:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        for ckpt in (*out.glob("checkpoint-*"), *out.glob(f"{checkpoints.SET_ASIDE_PREFIX}checkpoint-*")):
            shutil.rmtree(ckpt)
    if not config.resume:
        out.mkdir(parents=True, exist_ok=True)
        return None
    ckpt = _resume_checkpoint(config, out, world)
    step = checkpoints.step_of(ckpt)
    metrics = out / "metrics.jsonl"
    if step < config.max_steps:
        if metrics.exists():
            _trim_metrics(metrics, step)
        _say(f"resuming from {ckpt.name} (step {step} of {config.max_steps})")
    elif not _finished(ckpt, config):
        _say(
            f"{ckpt.name} is the run's last step but final/ is missing (cut while it was written): writing it"
        )
    return ckpt


def _say(line: str) -> None:
    print(f"kpo train: {line}", file=sys.stderr, flush=True)


def _trim_metrics(metrics: Path, step: int) -> None:
    """Keep the rows of metrics.jsonl up to ``step`` (the resumed run writes the later ones again), without the
    torn last line a kill or a full disk during an append leaves (said)."""
    data = metrics.read_bytes()
    whole = complete_part(data)
    if len(whole) < len(data):
        _say(
            f"dropped the torn last line of {metrics} ({len(data) - len(whole)} bytes, cut while it was written)"
        )
    try:
        rows = parse_rows(metrics, whole)
    except ValueError as e:
        raise ConfigError(
            [f"resume: {e}; delete that line (rows after step {step} are written again)"]
        ) from None
    with replacing(metrics) as partial:
        partial.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows if r["step"] <= step))


def _finished(ckpt: Path, config: TrainConfig) -> bool:
    """Whether the run whose last checkpoint is ``ckpt`` is done: trained to max_steps, its final/ written (a run cut
    while it wrote final/ has none: resuming it writes final/ without training)."""
    return checkpoints.step_of(ckpt) == config.max_steps and (Path(config.output_dir) / "final").is_dir()


def _resume_checkpoint(config: TrainConfig, out: Path, world: int) -> Path:
    """The checkpoint a resume continues from; ConfigError when the run cannot continue to max_steps on
    ``world`` processes."""
    saved = TrainConfig.from_yaml(out / "config.yaml") if (out / "config.yaml").exists() else None
    if saved is None:
        raise ConfigError([f"resume: {out} has no config.yaml; start the run without --resume"])
    changed = [
        f"{k}: {getattr(saved, k)!r} -> {getattr(config, k)!r}"
        for k in TRAJECTORY_FIELDS
        if getattr(saved, k) != getattr(config, k)
    ]
    if changed:
        raise ConfigError(
            [
                f"resume: the config differs from the run being resumed ({c}); resume with the "
                "same settings or start a new --output-dir"
                for c in changed
            ]
        )
    for line in checkpoints.set_aside_incomplete(out):
        _say(f"{line}; delete it once you no longer need it")
    ckpt = last_checkpoint(out)
    if ckpt is None:
        raise ConfigError(
            [
                f"resume: no complete checkpoint-* in {out}; start the run again with --overwrite (save_steps sets "
                "how often a run is checkpointed)"
            ]
        )
    step = checkpoints.step_of(ckpt)
    wrote = checkpoints.processes_of(ckpt)
    if wrote != world:
        # each process samples with its own generator and its share of the prompts: on another number of
        # processes the resumed run would leave the trajectory (transformers only warns of the missing states)
        raise ConfigError(
            [
                f"resume: {ckpt.name} was written by {wrote} process(es) and this run has {world}; resume it on "
                f"{wrote} (kpo launch --nproc-per-node {wrote} train ...), or start a new --output-dir"
            ]
        )
    if step > config.max_steps:
        raise ConfigError(
            [
                f"resume: {out} has already trained {step} steps ({ckpt.name}), past max_steps={config.max_steps}; "
                f"to train further raise --max-steps above {step}, or start a new --output-dir"
            ]
        )
    if step % config.minibatches:
        raise ConfigError(
            [
                f"resume: {ckpt.name} ends inside a generation batch (step {step} is not a multiple of "
                f"minibatches={config.minibatches}), whose unused mini-batches were not saved; a resume would "
                f"regenerate them and diverge. Delete {ckpt.name} to resume from an earlier checkpoint, or start anew"
            ]
        )
    return ckpt


def _load_data(config: TrainConfig, tokenizer):
    """(TRL dataset with prompt/answer columns, reward function)."""
    from datasets import Dataset

    if config.dataset is None:
        from kpo.testbed.task import load_split

        rows = load_split("train", seed=config.seed, task=config.task_config())
        return Dataset.from_list(
            [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]
        ), synthetic_reward
    from kpo.data.math import format_prompt, has_chat_template, load_problems
    from kpo.testbed.files import task_of_rows

    problems = load_problems(config.dataset, config.problem_key, config.answer_key)
    if task_of_rows(problems, config.dataset) is not None:  # the embedded task as a file: its prompts and grader
        return Dataset.from_list([{"prompt": p["problem"], "answer": p["answer"]} for p in problems]), synthetic_reward
    chat = has_chat_template(tokenizer)
    records = []
    for p in problems:
        text = format_prompt(p["problem"], config.instruction)
        records.append(
            {
                "prompt": [{"role": "user", "content": text}] if chat else text,
                "answer": json.dumps(p["answer"]),
            }
        )
    return Dataset.from_list(records), math_reward_fn


def notices(config: TrainConfig) -> list[str]:
    """Settings that are valid but easy to get wrong by accident, said once at the start of a run."""
    if config.model is not None and config.dataset is None:
        task = config.task_config()
        return [
            f"--model {config.model} without --dataset trains it on the embedded {task.kind} task "
            f"(n_terms={task.n_terms}, max_value={task.max_value}), whose prompts are digits; pass --dataset "
            "FILE to train on a math dataset"
        ]
    return []


def model_path(config: TrainConfig) -> Path:
    """The checkpoint a run starts from: ``config.model``, or the embedded tiny model's cached warm start
    (built on first use; ``kpo compare`` calls this once per seed before its parallel runs)."""
    if config.model is not None:
        return Path(config.model)
    from kpo.train.warm_start import warm_start

    return warm_start(
        config.task_config(),
        config.tiny_shape(),
        config.sft_settings(),
        seed=config.resolved_warm_start_seed(),
        cache_dir=Path(config.cache_dir) if config.cache_dir else None,
        progress=config.progress,
    )


def _load_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # float32 weights whatever the checkpoint's dtype: bf16 is autocast (GRPOConfig bf16=True), and the
    # optimizer must update float32 masters: at lr 1e-6 an AdamW step is below a bf16 weight's resolution
    # (most bf16 weights would not move at all)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def run_training(config: TrainConfig) -> Path:
    """Train as ``config`` says; returns the output directory (see the package docstring for its files).

    Launched as several processes (``kpo launch --nproc-per-node N train``, torchrun), each runs this:
    rank 0 prepares output_dir, builds the embedded warm start alone and writes every file; the others wait for
    it, then all train data-parallel. Where rank 0 raises (ConfigError, TrainingInterrupted) the others exit
    quietly with the status the command gives it (``SystemExit``), so the command says it once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    world, main = _distributed.world_size(), _distributed.is_main()
    try:
        config.validate(world_size=world)
    except ConfigError:
        if main:
            raise
        raise SystemExit(2) from None  # kpo train's status for a ConfigError, which rank 0 prints
    for line in notices(config) if main else ():
        print(f"kpo train: {line}", file=sys.stderr)
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    from kpo.train.progress import library_bars

    library_bars(config.progress)  # before the warm start's and the model loader's bars
    out = Path(config.output_dir)
    cuda = torch.cuda.is_available()
    ckpt, complete, failed = None, False, None
    if main:
        try:
            ckpt = _prepare_output_dir(config, out, world)
            complete = ckpt is not None and _finished(ckpt, config)
            if not complete:
                start = _write_run_start(config, out)
        except Exception as e:  # the others are waiting for rank 0: they learn of it below, then it is raised
            failed = e
    _distributed.join(cpu=not cuda)  # the others wait here for what rank 0 wrote
    # rank 0's failure, as the status the command gives it (2 for a ConfigError), told to every process
    status = _distributed.max_over_ranks(0 if failed is None else 2 if isinstance(failed, ConfigError) else 1)
    if failed is not None:
        raise failed
    if status:
        raise SystemExit(status)  # rank 0 says why
    if not main:
        ckpt = last_checkpoint(out) if config.resume else None
        complete = ckpt is not None and _finished(ckpt, config)
        start = model_path(config)  # rank 0 built and cached it
    if complete:
        # Training on would add a step past max_steps and replace final/: leave the finished run as it is.
        if main:
            print(
                f"kpo train: the run in {out} is already complete ({ckpt.name}, max_steps={config.max_steps}); "
                f"nothing to do. Raise --max-steps to train further.",
                file=sys.stderr,
            )
        return out

    from kpo.train.plots import plot_training_dynamics
    from kpo.train.progress import checkpointing_arg, use_quiet_progress
    from kpo.train.trainer import KPOTrainer
    from kpo.train.trainer_config import KPOConfig

    use_bf16 = bool(cuda and torch.cuda.is_bf16_supported()) if config.bf16 is None else config.bf16
    model, tokenizer = _load_model(start)
    dataset, reward_fn = _load_data(config, tokenizer)

    per_device = config.mini_batch // world
    micro = config.micro_batch_size or per_device
    accumulation = per_device // micro
    max_len = config.max_completion()
    args = KPOConfig(
        output_dir=str(out),
        seed=config.seed,
        max_steps=config.max_steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        # steps_per_generation counts micro-batches: minibatches optimizer steps per generation batch.
        steps_per_generation=accumulation * config.minibatches,
        num_generations=config.num_generations,
        num_iterations=1,
        max_completion_length=max_len,
        temperature=config.temperature,
        beta=0.0,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.save_steps or config.max_steps,
        save_total_limit=config.save_total_limit,
        report_to=[] if config.report_to == "none" else [config.report_to],
        use_cpu=not cuda,
        bf16=use_bf16,
        disable_tqdm=not config.progress,
        use_vllm=config.use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        vllm_importance_sampling_mode=config.vllm_importance_sampling_mode,
        vllm_importance_sampling_clip_max=config.vllm_importance_sampling_clip_max,
        dataloader_num_workers=0,
        # every parameter of a causal LM takes part in its loss: DDP need not search the graph for unused ones
        ddp_find_unused_parameters=False,
        # TRL's default trades a recomputed forward for memory; the embedded model needs no memory saved
        **checkpointing_arg(config.model is not None),
        shuffle_dataset=True,
        # the GPU filter kernel reads and writes 16-byte vectors only when rows are a multiple of 16 long
        pad_to_multiple_of=16 if cuda else None,
        # kpo's settings as they are, but memory=matched as its tokens at this run's response length (with the
        # embedded task its longest reference, not max_completion_length)
        **{f.name: getattr(config, f.name) for f in dataclasses.fields(KPOSettings)}
        | {"loss_kwargs": config.resolved_loss_kwargs()},
    )
    if world > 1 and not cuda:
        _plain_cpu_device(args)
    trainer = KPOTrainer(
        model=model,
        reward_funcs=[reward_fn],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        metrics_path=out / "metrics.jsonl",
        interrupts=InterruptGuard(processes=world),
        run_card=lambda: write_run_card(config, out),
    )
    use_quiet_progress(trainer, config.progress)
    with trainer.interrupts:
        _train(trainer, config, ckpt)
        with trainer.interrupts.deferred(), writing(out):
            if trainer.accelerator.is_main_process:
                with replacing(out / "final") as partial:  # whole or absent, as a checkpoint
                    trainer.save_model(str(partial))
                    tokenizer.save_pretrained(partial)
                write_run_card(config, out)
                plot_training_dynamics(
                    out / "metrics.jsonl",
                    out / "training_dynamics.png",
                    title=f"{config.loss} (seed {config.seed})",
                )
    return out


def _write_run_start(config: TrainConfig, out: Path) -> Path:
    """Rank 0's part of a run's start: config.yaml, the starting checkpoint (the embedded warm start built as one
    process) and its copy in warm_start/; returns the starting checkpoint."""
    # resume/overwrite say what this command does to output_dir, not what the run is: kept out of config.yaml so
    # that `kpo train --config RUN/config.yaml --resume` continues it
    with replacing(out / "config.yaml") as partial:
        dataclasses.replace(config, resume=False, overwrite=False).save_yaml(partial)
    with _distributed.single_process():
        start = model_path(config)
    if config.model is None and not (out / "warm_start").exists():
        # the embedded model's starting point beside the run (a few MB), so it can be evaluated like final/
        with replacing(out / "warm_start") as partial:
            shutil.copytree(start, partial)
    return start


def _plain_cpu_device(args) -> None:
    """Name the device of one of several CPU processes "cpu", not accelerate's indexed "cpu:RANK" (the same
    device): some transformers releases (5.10.4, the one verl 0.9.1's environment resolves; not 5.24) load a
    resumed optimizer state with map_location=args.device when there are several processes, and torch.load cannot
    restore to an indexed CPU device ("don't know how to restore data location ... (tagged with cpu:0)"), so a
    multi-process CPU run could not resume."""
    import torch

    if args.device.type == "cpu":  # reading it builds accelerate's state first, which is kept
        args.__dict__["_setup_devices"] = torch.device("cpu")  # the cached_property's value


def _train(trainer, config: TrainConfig, ckpt: Path | None) -> None:
    """``trainer.train()``, from ``ckpt`` if given. On SIGINT/SIGTERM (``kpo.train.interrupt``):
    :class:`TrainingInterrupted` whose message says where the run stopped and the command that resumes it."""
    out = Path(config.output_dir)
    world = trainer.accelerator.num_processes
    # the same number of processes, which a resume requires
    launch = "kpo train" if world == 1 else f"kpo launch --nproc-per-node {world} train"
    again = f"{launch} --config {shlex.quote(str(out / 'config.yaml'))}"
    try:
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        return
    except AbandonBatch:
        kept = trainer.checkpoint_abandoned_batch()
        if kept is None:
            line = (
                f"interrupted by {trainer.interrupts.received} in the first generation batch, before any "
                f"step: nothing to keep; start again with: {again}"
            )
        else:
            line = (
                f"interrupted by {trainer.interrupts.received} at step {trainer.state.global_step}/"
                f"{config.max_steps}, checkpoint saved in {kept}; resume with: {again} --resume"
            )
    except StopNow:
        kept = last_checkpoint(out)
        where = (
            f"resume from {kept.name} with: {again} --resume"
            if kept is not None
            else f"no checkpoint yet; start again with: {again} --overwrite"
        )
        line = (
            f"stopped by a second {trainer.interrupts.received} during step {trainer.state.global_step + 1}, "
            f"without a checkpoint of it; {where}"
        )
    # what the end of training does besides saving: close the progress bar (the line must not land on it) and
    # flush the loggers (TensorBoard)
    trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
    if not trainer.accelerator.is_main_process:
        raise SystemExit(INTERRUPTED)  # the status kpo gives an interrupt; rank 0 says where the run stopped
    write_run_card(config, out)
    raise TrainingInterrupted(line, kept)
