"""A run's ``README.md``: what was trained and how, its final metrics, and the commands that come next.

It replaces TRL's model card ("fine-tuned version of [None]", "trained with GRPO"), which says neither the loss
nor the task. :class:`~kpo.train.trainer.KPOTrainer` writes it wherever TRL would write its card (at every
checkpoint), and ``run_training`` once more at the end, so it always describes the steps in ``metrics.jsonl``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from kpo.train.checkpoints import continue_command
from kpo.train.config import TrainConfig
from kpo.train.metrics import load_metrics, window_mean
from kpo.train.summary import eval_command

__all__ = ["CARD_METRICS", "run_card", "write_run_card"]

# metrics.jsonl columns the card reports over the last 10% of steps: (column, how the card names it)
CARD_METRICS = (
    ("reward_mean", "reward (mean over responses)"),
    ("clip_frac", "clip fraction (tokens)"),
    ("entropy", "entropy (nats/token)"),
    ("response_length", "response length (tokens)"),
    ("grad_norm", "gradient norm (before clipping)"),
)


def write_run_card(config: TrainConfig, out: Path) -> Path:
    """Write :func:`run_card` to ``out/README.md``; returns its path."""
    path = Path(out) / "README.md"
    path.write_text(run_card(config, Path(out)))
    return path


def run_card(config: TrainConfig, out: Path) -> str:
    """The card's Markdown for the run ``config`` in ``out`` (its metrics read from ``out/metrics.jsonl``)."""
    rows = load_metrics(out) if (out / "metrics.jsonl").exists() else []
    source = config.dataset if config.dataset is not None else f"the embedded {config.task} task"
    lines = [
        f"# {out.name}: {config.loss} on {source}",
        "",
        f"Trained with `kpo train` (kpo's RL trainer on TRL's GRPOTrainer), seed {config.seed}, "
        f"{len(rows)} of {config.max_steps} optimizer steps.",
        "",
        "## What was trained",
        "",
        "| | |",
        "|---|---|",
        f"| model | {_model(config)} |",
        f"| task | {_task(config)} |",
        f"| loss | {_loss(config)} |",
        f"| advantages | {config.advantage} |",
        "",
        "## Protocol",
        "",
        *_protocol(config),
        "",
        *_metrics(rows, config.max_steps),
        "",
        "## Next",
        "",
        *_unfinished(config, out, len(rows)),
        *_commands(config, out),
        "",
    ]
    return "\n".join(lines)


def _model(config: TrainConfig) -> str:
    if config.model is not None:
        return f"`{config.model}`"
    shape, sft = config.tiny_shape(), config.sft_settings()
    return (
        f"the embedded tiny Qwen3 (hidden size {shape.hidden_size}, {shape.num_layers} layers, "
        f"{shape.num_heads} heads, context {shape.max_position_embeddings} tokens), warm-started by supervised "
        f"fine-tuning ({sft.n_examples} problems, epochs={sft.epochs}, a teacher erring in {sft.noise:g} of "
        f"steps, seed {config.resolved_warm_start_seed()}; `warm_start/`)"
    )


def _task(config: TrainConfig) -> str:
    if config.dataset is not None:
        keys = "".join(
            f", {name} `{value}`"
            for name, value in (("problem key", config.problem_key), ("answer key", config.answer_key))
            if value
        )
        return f"`{config.dataset}`{keys}, graded by math-verify; instruction: {config.instruction!r}"
    task = config.task_config()
    return (
        f"embedded `{task.kind}` task, n_terms={task.n_terms}, max_value={task.max_value}, "
        f"responses up to {task.max_response_chars()} tokens, reward 1 for an exact answer"
    )


def _loss(config: TrainConfig) -> str:
    """The loss with its hyperparameters as the run used them: given values (memory in tokens), and for a Kalman
    loss the filter's resolved q, v, p0, x0, mask_mode; the rest at the method's defaults."""
    from kpo.losses.kpo import KALMAN_LOSSES, filter_settings, fits_memory

    kwargs = config.resolved_loss_kwargs()
    given = dict(config.loss_kwargs)
    # memory=matched resolves to a number of tokens; every other value is as given
    parts = [
        f"{k}={given[k]} ({_value(v)} tokens)" if given[k] != v else f"{k}={_value(v)}"
        for k, v in kwargs.items()
    ]
    if fits_memory(config.loss, kwargs):
        parts.append("filter q fitted by maximum likelihood, one per optimizer step from the step before (kpo/q in metrics.jsonl)")
    elif config.loss in KALMAN_LOSSES:
        settings = filter_settings(config.loss, kwargs)
        settings = {"q": settings.pop("q"), **settings}  # the setting memory resolves to, first
        parts.append("filter " + ", ".join(f"{k}={_value(v)}" for k, v in settings.items()))
    hparams = "; ".join(parts) if parts else "none given"
    return (
        f"`{config.loss}`, aggregation {config.resolved_agg_mode()}; hyperparameters: {hparams} "
        f"(the others at the method's defaults)"
    )


def _value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _protocol(config: TrainConfig) -> list[str]:
    mini = config.mini_batch
    return [
        f"- {config.prompts_per_step} prompts x {config.num_generations} generations = {config.generation_batch} "
        f"responses per generation batch, {config.minibatches} optimizer steps of {mini} responses each "
        f"({config.minibatches - 1} off-policy)",
        f"- learning rate {config.learning_rate:g} (AdamW, constant), weight decay {config.weight_decay:g}, "
        f"gradient clipping {config.max_grad_norm:g}, no KL term",
        f"- completion length up to {config.max_completion()} tokens, temperature {config.temperature:g}"
        + (", vLLM generation" if config.use_vllm else ""),
        f"- {config.max_steps} steps, seed {config.seed}",
        _sampler(config),
    ]


def _sampler(config: TrainConfig) -> str:
    """The rollout sampler, the PPO anchor and the rollout correction (kpo.train.sampler)."""
    lag = f", {config.rollout_lag} generation batch(es) behind the trainer" if config.rollout_lag else ""
    anchor = "the sampler's log-probs (bypass)" if config.ratio_anchor == "rollout" else "the trainer's log-probs"
    given = {k: v for k, v in config.rollout_correction().items() if v is not None}
    correction = ", ".join(f"{k}={_value(v)}" for k, v in given.items())
    return (
        f"- rollouts sampled in {config.rollout_dtype}{lag}; the ratio's anchor: {anchor}; rollout correction: "
        f"{correction or 'none'}"
    )


def _metrics(rows: list[dict], max_steps: int) -> list[str]:
    """Means over the last 10% of the steps (those of a stopped run: "so far"), and the reward's first 10%."""
    heading = "Final metrics" if len(rows) >= max_steps else "Metrics so far"
    if not rows:
        return [f"## {heading}", "", "No step finished yet."]
    width = max(1, len(rows) // 10)
    lines = [
        f"## {heading} (mean over the last {width} of {len(rows)} steps)",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key, name in CARD_METRICS:
        value = window_mean([r.get(key) for r in rows], last=True)
        lines.append(f"| {name} | {'n/a' if value is None else f'{value:.4g}'} |")
    first = window_mean([r.get("reward_mean") for r in rows], last=False)
    if first is not None:
        lines.append(f"| reward over the first {width} steps | {first:.4g} |")
    return lines + ["", "Every step: `metrics.jsonl`; plotted: `training_dynamics.png`."]


def _unfinished(config: TrainConfig, out: Path, steps: int) -> list[str]:
    if steps >= config.max_steps:
        return []
    return [
        f"The run stopped at step {steps} of {config.max_steps}; `{continue_command(out)}` carries it on (from its "
        "last checkpoint, on the processes that wrote it) and writes `final/` at the end.",
        "",
    ]


def _commands(config: TrainConfig, out: Path) -> list[str]:
    run = shlex.quote(str(out))
    lines = [
        "```bash",
        eval_command(config, out, "final"),
        f"{eval_command(config, out, 'warm_start')}   # the model it started from",
        f"kpo summary {run}   # final vs start with 95% intervals",
    ]
    if config.dump_ratios_every:
        lines.append(f"kpo analyze {run} --out {run}/analysis   # token dynamics of the ratio dumps")
    lines.append("```")
    if not config.dump_ratios_every:
        lines.append("`kpo analyze` reads ratio dumps: train with `--dump-ratios-every N` to write them.")
    return lines
