"""The one config of ``kpo train``: a flat dataclass, a YAML file and command-line overrides.

Convention (TRL's): ``kpo train --config run.yaml --max-steps 40 --loss gspo`` — values from the YAML file,
then command-line flags on top; every field is a flag (``--field-name`` or ``--field_name``). Loss
hyperparameters go in ``loss_kwargs`` (YAML mapping, or ``--loss-kwargs q=1e-4 clip_ratio_low=3e-4``) and are
checked against the hyperparameters the chosen loss accepts. :meth:`TrainConfig.validate` reports every
problem at once, each with its fix (the checks: :mod:`kpo.train.checks`; the command line:
:mod:`kpo.train.flags`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kpo.data.math import DEFAULT_INSTRUCTION
from kpo.train.checks import config_errors

__all__ = ["ConfigError", "TrainConfig", "TRAJECTORY_FIELDS", "parse_scalar"]

# Fields that may change between a run and its resumption without changing its trajectory: where and how
# often it writes (output_dir, cache_dir, checkpoints, ratio dumps, logs, progress bars), how far it goes, and
# CPU threads. The warm start only sets the weights a fresh run starts from (a resume loads the checkpoint's),
# and writing a checkpoint or a ratio dump draws no random numbers.
TRAJECTORY_FIELDS_EXEMPT = (
    "output_dir",
    "resume",
    "overwrite",
    "max_steps",
    "cache_dir",
    "save_steps",
    "save_total_limit",
    "dump_ratios_every",
    "report_to",
    "num_threads",
    "progress",
)


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("invalid training config:\n" + "\n".join(f"  - {e}" for e in self.errors))


def _option(default: Any, help: str, **kw) -> Any:
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class TrainConfig:
    """Every knob of a ``kpo train`` run (help text of each field below = its documentation)."""

    # --- run ---
    output_dir: str = _option(
        "runs/kpo-tiny", "Directory for config.yaml, metrics.jsonl, checkpoints, final/, plots."
    )
    seed: int = _option(0, "Seed of model init, data order, sampling and the synthetic task.")
    warm_start_seed: int | None = _option(
        None,
        "Seed of the embedded warm start (its init, SFT problems and teacher noise); None = seed. Two runs with "
        "one warm_start_seed and different seeds start from the same model and differ only in RL prompts and "
        "sampling (kpo compare's A/A arm).",
    )
    max_steps: int = _option(
        1000,
        "Optimizer steps, a multiple of minibatches (each generation batch gives `minibatches` of them).",
    )
    resume: bool = _option(
        False,
        "Continue from the last checkpoint in output_dir (same config required, except the fields that do not "
        "change the trajectory: output_dir, cache_dir, max_steps, checkpoint, dump, logging and thread settings).",
    )
    overwrite: bool = _option(
        False, "Allow starting a fresh run in a non-empty output_dir (its files are replaced)."
    )

    # --- loss ---
    loss: str = _option("kpo", "Policy loss, one of kpo.list_losses().")
    loss_kwargs: dict = _option(
        {},
        "Loss hyperparameters (verl names); unset ones take the method's default. On the command line NAME=VALUE "
        "pairs (--loss-kwargs q=1e-4 v=1), in a YAML file a mapping (loss_kwargs: {q: 1.0e-4, v: 1}). KPO's "
        "memory=TOKENS sets q from the filter's memory; memory=matched keeps the paper's memory-to-length ratio "
        "(1000 of 4096 tokens) at this run's response length (the embedded task's longest response, or "
        "max_completion_length); memory=auto fits one q per optimizer step by maximum likelihood, to the "
        "previous step's log-ratios over all its micro-batches and processes (bounds q_min, q_max; logged as "
        "kpo/q and kpo/memory_tokens).",
    )
    loss_agg_mode: str | None = _option(
        None,
        "Loss aggregation; None = the protocol's seq-mean-token-mean where the loss allows it, else the "
        "loss's own (GMPO/HolderPO: seq-mean).",
    )
    advantage: str = _option(
        "grpo", "Advantage estimator for kpo.compute_advantages: grpo, drgrpo, rloo, krpo."
    )

    # --- protocol (paper: 32 prompts x 8, 4 optimizer steps per generation batch) ---
    prompts_per_step: int = _option(
        16,
        "Prompts per generation batch (the paper: 32; 16 keeps the embedded testbed within its CPU budget).",
    )
    num_generations: int = _option(8, "Responses per prompt (the GRPO group).")
    minibatches: int = _option(
        4, "Optimizer steps per generation batch; all but the first are off-policy (ratios != 1)."
    )
    micro_batch_size: int | None = _option(
        None, "Sequences per forward/backward per device; None = a whole mini-batch (no accumulation)."
    )
    learning_rate: float = _option(1e-4, "AdamW learning rate (constant, no warm-up).")
    weight_decay: float = _option(0.0, "AdamW weight decay.")
    max_grad_norm: float = _option(1.0, "Gradient clipping by global norm.")
    temperature: float = _option(1.0, "Sampling temperature (also used for log-probs and entropy).")
    max_completion_length: int | None = _option(
        None,
        "Longest response in tokens; None = the synthetic task's longest solution + 4, or 1024 with --model.",
    )

    # --- train-inference mismatch (kpo's sampler: kpo.train.sampler) ---
    rollout_dtype: str = _option(
        "float32",
        "Precision of the model rollouts are sampled from, refreshed from the trainer's weights before every "
        "generation batch: float32 (the policy itself), bfloat16 (a bf16 copy, as a bf16 inference engine beside a "
        "float32 trainer) or float8 (bf16 with the decoder blocks' linear weights on the FP8 e4m3 grid, one scale "
        "per output channel, and their input activations (one scale per token) and the KV cache (one scale per "
        "token and head) rounded to e4m3 too: W8A8 with an FP8 cache, as vLLM's quantization=fp8 with "
        "kv_cache_dtype=fp8). The sampler's per-token log-probs are kept; their mismatch with "
        "the trainer's is logged as rollout_corr/* every generation batch.",
    )
    rollout_lag: int = _option(
        0,
        "Generation batches the sampler's weights lag the trainer's by, as in an async trainer (samples drawn by "
        "the weights of k batches ago; the first k batches by the starting weights); 0 = none. With "
        "ratio_anchor=rollout the staleness reaches the ratio; with the trainer's anchor, rollout_is corrects it. "
        "Less than the run's generation batches (max_steps / minibatches); the sampler keeps lag + 1 float32 copies "
        "of the weights, in memory and in every checkpoint.",
    )
    ratio_anchor: str = _option(
        "trainer",
        "The PPO ratio's denominator (old_log_prob): trainer (the trainer's log-probs recomputed after "
        "generation, verl's default: the first step of a batch has ratio 1) or rollout (the sampler's, verl's "
        "bypass mode and an async trainer's usual choice: the mismatch reaches every ratio).",
    )
    rollout_is: str | None = _option(
        None,
        "Rollout correction, truncated importance sampling (TIS, verl's rollout_is): token or sequence weights "
        "min(pi_trainer / pi_sampler, rollout_is_threshold) on the loss; none = off. Needs ratio_anchor=trainer "
        "(with the sampler's anchor the PPO ratio itself is the correction, as in verl's bypass mode).",
    )
    rollout_is_threshold: float = _option(
        2.0,
        "TIS truncation threshold (verl's default 2.0), with rollout_is; >= 1 (a cap below 1 would scale down every "
        "token whose sampler and trainer agree).",
    )
    rollout_rs: str | None = _option(
        None,
        "Rollout correction, rejection (verl's rollout_rs): token or sequence (MIS: drop a token or row whose ratio "
        "leaves the bounds) or verl's divergence options (token_k1, seq_mean_k3, ...; comma-separated); none = "
        "off. The ratio is pi_trainer / pi_sampler, or pi_theta / pi_sampler with ratio_anchor=rollout (verl's "
        "bypass). A rejected token leaves the loss's mask.",
    )
    rollout_rs_threshold: str | None = _option(
        None,
        "Rejection bounds in verl's spec: an upper ratio bound for token/sequence (none = 2.0), 'lower_upper' for "
        "k1 options (IcePop: rollout_rs=token_k1 rollout_rs_threshold=0.5_2.0), an upper bound for k2/k3; with "
        "rollout_rs. Ratio bounds must keep a ratio of 1 (else every token whose sampler and trainer agree is "
        "rejected).",
    )
    rollout_rs_threshold_lower: float | None = _option(
        None, "Rejection lower ratio bound for rollout_rs=token/sequence, <= 1; none = no lower bound."
    )

    # --- embedded task and tiny model (refused with --dataset: task fields; with --model: the others) ---
    task: str = _option(
        "running",
        "Embedded task: running (running sum mod 10 of n_terms digits, one response token per digit: 128-token "
        "responses by default) or chain (chained additions, ~3-token responses by default).",
    )
    n_terms: int | None = _option(
        None, "Embedded task: terms per problem; none = the task's (running 128, chain 2)."
    )
    max_value: int | None = _option(
        None, "Embedded task: largest term; none = the task's (running 9, at most 9; chain 19)."
    )
    tiny_hidden_size: int = _option(128, "Tiny model width.")
    tiny_layers: int | None = _option(
        None, "Tiny model decoder layers; none = the task's (running 2, chain 4)."
    )
    tiny_heads: int = _option(4, "Tiny model attention heads.")
    sft_examples: int | None = _option(
        None, "Warm start: distinct training problems per SFT round; none = the task's (running 12800, chain 200).",
    )
    sft_epochs: int | None = _option(
        None,
        "Warm start: passes over them, fresh teacher noise each pass; none = the task's (running 1, chain 40).",
    )
    sft_noise: float | None = _option(
        None,
        "Warm start: per-step error rate of the imitated teacher, which sets the start reward; none = the task's "
        "(running 0.01, chain 0.3).",
    )
    sft_learning_rate: float = _option(3e-3, "Warm start: learning rate.")
    cache_dir: str | None = _option(
        None, "Warm-start cache (the embedded model's); None = $KPO_CACHE or ~/.cache/kpo."
    )

    # --- real runs ---
    model: str | None = _option(None, "Hugging Face checkpoint directory; None = the embedded tiny model.")
    dataset: str | None = _option(
        None, "Training problems: DAPO-Math-17k parquet, or jsonl/json/parquet with problem/answer fields."
    )
    problem_key: str | None = _option(None, "With dataset: field holding the problem (default: detected).")
    answer_key: str | None = _option(None, "With dataset: field holding the answer (default: detected).")
    instruction: str = _option(
        DEFAULT_INSTRUCTION,
        "With dataset: follows each problem on a new line (user turn of the chat template); "
        "kpo.data.math.format_prompt builds the text, as kpo eval does.",
    )
    use_vllm: bool = _option(
        False, "Generate with vLLM (TRL use_vllm, colocate mode); needs vllm and a CUDA GPU."
    )
    vllm_gpu_memory_utilization: float = _option(
        0.3, "With use_vllm: share of GPU memory vLLM takes (TRL's)."
    )
    vllm_importance_sampling_mode: str = _option(
        "sequence_mask",
        "With use_vllm: TRL's train/inference mismatch correction, token_truncate, token_mask, sequence_truncate "
        "or sequence_mask (TRL's default: a response whose ratio exceeds the cap gets weight 0); logged as "
        "sampling/importance_sampling_ratio/* in metrics.jsonl.",
    )
    vllm_importance_sampling_clip_max: float = _option(
        3.0, "With use_vllm: the correction's cap C_max (TRL's)."
    )
    bf16: bool | None = _option(
        None,
        "bfloat16 mixed precision (autocast; weights and optimizer stay float32); None = on when CUDA supports "
        "it, off on CPU.",
    )

    # --- outputs ---
    save_steps: int = _option(
        0, "Checkpoint every N optimizer steps (a multiple of minibatches); 0 = one checkpoint at the end."
    )
    save_total_limit: int = _option(2, "Checkpoints kept.")
    dump_ratios_every: int = _option(
        0,
        "Every N optimizer steps save ratios/step_000012.safetensors (the step, 6 digits; log-ratio, "
        "filtered, mask); 0 = never.",
    )
    report_to: str = _option(
        "tensorboard",
        "TRL/transformers report_to: none, all (every installed one) or one integration (wandb, ...).",
    )
    num_threads: int | None = _option(
        1, "torch CPU threads; 1 is fastest for the tiny model on a shared CPU; None = torch's default."
    )
    progress: bool = _option(True, "Show progress bars.")

    # ------------------------------------------------------------------ derived: the protocol's batch sizes
    @property
    def generation_batch(self) -> int:
        """Sequences generated per generation batch."""
        return self.prompts_per_step * self.num_generations

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step (all devices)."""
        return self.generation_batch // self.minibatches

    # ------------------------------------------------------------------ derived: the embedded testbed
    def task_config(self):
        """The embedded task (task, n_terms, max_value; unset: the task's own)."""
        from kpo.testbed.task import TaskConfig

        return TaskConfig(kind=self.task, n_terms=self.n_terms, max_value=self.max_value)

    def tiny_shape(self):
        """The embedded model's shape: the tiny_* fields (tiny_layers unset: the task's), and a context that
        holds the task's longest prompt and response (``kpo.testbed.tiny.context_length``)."""
        from kpo.testbed.tiny import TINY_LAYERS, TinyModelConfig, context_length

        return TinyModelConfig(
            hidden_size=self.tiny_hidden_size,
            num_layers=self.tiny_layers or TINY_LAYERS[self.task],
            num_heads=self.tiny_heads,
            intermediate_size=3 * self.tiny_hidden_size,
            max_position_embeddings=context_length(self.task_config()),
        )

    def sft_settings(self):
        """The warm start's settings: the task's preset (``kpo.train.warm_start.SFT_PRESETS``) with the sft_* fields
        that are set on top."""
        from kpo.train.warm_start import SFT_PRESETS

        given = {
            "n_examples": self.sft_examples,
            "epochs": self.sft_epochs,
            "noise": self.sft_noise,
            "learning_rate": self.sft_learning_rate,
        }
        return dataclasses.replace(
            SFT_PRESETS[self.task], **{k: v for k, v in given.items() if v is not None}
        )

    def resolved_warm_start_seed(self) -> int:
        """The warm start's seed: warm_start_seed, or seed when unset."""
        return self.seed if self.warm_start_seed is None else self.warm_start_seed

    def max_completion(self) -> int:
        """Longest response in tokens: max_completion_length, or the embedded task's longest reference +
        kpo.testbed.tiny.COMPLETION_SLACK, or 1024 with --model."""
        from kpo.testbed.tiny import COMPLETION_SLACK

        if self.max_completion_length is not None:
            return self.max_completion_length
        return self.task_config().max_response_chars() + COMPLETION_SLACK if self.dataset is None else 1024

    def response_length(self) -> int:
        """The response length KPO's memory=matched scales the paper's memory to: the embedded task's longest
        reference response, or the response budget with --dataset."""
        return self.task_config().max_response_chars() if self.dataset is None else self.max_completion()

    # ------------------------------------------------------------------ derived: the loss
    def resolved_agg_mode(self) -> str:
        from kpo.losses import get_loss_spec

        spec = get_loss_spec(self.loss)
        if self.loss_agg_mode is not None:
            return self.loss_agg_mode
        return "seq-mean-token-mean" if "seq-mean-token-mean" in spec.agg_modes else spec.default_agg

    def resolved_loss_kwargs(self) -> dict:
        """loss_kwargs as the loss receives them: memory=matched replaced by its number of tokens
        (``kpo.filter.memory.matched_memory`` of :meth:`response_length`)."""
        from kpo.filter.memory import matched_memory

        kwargs = dict(self.loss_kwargs)
        if kwargs.get("memory") == "matched":
            kwargs["memory"] = matched_memory(self.response_length())
        return kwargs

    def rollout_correction(self) -> dict:
        """The rollout correction as ``policy_loss``'s keywords (``kpo.losses.mismatch``); empty when off."""
        if self.rollout_is is None and self.rollout_rs is None:
            return {}
        kw = {"rollout_is": self.rollout_is}
        if self.rollout_is is not None:
            kw["rollout_is_threshold"] = self.rollout_is_threshold
        if self.rollout_rs is not None:
            kw |= {
                "rollout_rs": self.rollout_rs,
                "rollout_rs_threshold": None
                if self.rollout_rs_threshold is None
                else parse_scalar(self.rollout_rs_threshold),
                "rollout_rs_threshold_lower": self.rollout_rs_threshold_lower,
            }
        return kw

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ validation
    def validate(self, *, world_size: int = 1) -> TrainConfig:
        """Check every field (:func:`kpo.train.checks.config_errors`, for a run on ``world_size`` processes); raise
        :class:`ConfigError` listing all problems. Returns self.

        A field of the wrong type or out of range gets one error, and the checks that combine it with other
        fields are skipped (their message would be about a value that is already reported)."""
        errors = config_errors(self, world_size=world_size)
        if errors:
            raise ConfigError(errors)
        return self

    # ------------------------------------------------------------------ IO
    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> TrainConfig:
        if not Path(path).is_file():
            raise ConfigError(
                [f"config file {str(path)!r} not found: give the path of a YAML file of config fields"]
            )
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError([f"{path}: not valid YAML ({e})"]) from None
        if not isinstance(data, dict):
            raise ConfigError([f"{path}: expected a mapping of config fields, got {type(data).__name__}"])
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "config") -> TrainConfig:
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(types))
        if unknown:
            raise ConfigError([f"{source}: unknown field(s) {unknown}; valid fields: {sorted(types)}"])
        data = dict(data)
        errors = []
        for key, value in data.items():
            # YAML 1.1 reads 1e-4 (no dot) as a string: coerce numbers by the field's type.
            if isinstance(value, str) and types[key].startswith(("float", "int")):
                try:
                    data[key] = (float if types[key].startswith("float") else int)(value)
                except ValueError:
                    errors.append(f"{source}: {key}={value!r} is not a number")
            # and a number for a text field is its text (rollout_rs_threshold: 2.0 or '0.5_2.0')
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and types[key].startswith("str"):
                data[key] = str(value)
        if isinstance(data.get("loss_kwargs"), dict):
            data["loss_kwargs"] = {k: parse_scalar(v) for k, v in data["loss_kwargs"].items()}
        if errors:
            raise ConfigError(errors)
        return cls(**data)

    def save_yaml(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


TRAJECTORY_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if f.name not in TRAJECTORY_FIELDS_EXEMPT
)


def parse_scalar(value: Any) -> Any:
    """A YAML/CLI scalar with numbers as numbers: '4e-4' -> 0.0004, 'true' -> True, 'skip' -> 'skip'."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return yaml.safe_load(value) if value.strip() else value
