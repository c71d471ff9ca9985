"""The one config of ``kpo train``: a flat dataclass, a YAML file and command-line overrides.

Convention (TRL's, on TRL's own parser: :mod:`kpo.train.flags`): ``kpo train --config run.yaml --max-steps 40
--loss gspo`` — values from the YAML file, then command-line flags on top; every field is a flag
(``--field-name`` or ``--field_name``). Loss hyperparameters go in ``loss_kwargs`` (YAML mapping, or
``--loss-kwargs q=1e-4 clip_ratio_low=3e-4``) and are checked against the hyperparameters the chosen loss
accepts. kpo's own settings (loss, advantage, sampler, dumps) are :class:`~kpo.train.settings.KPOSettings`, which
the API's ``KPOConfig`` shares. :meth:`TrainConfig.validate` reports every problem at once, each with its fix (the
checks: :mod:`kpo.train.checks`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from kpo.data.math import DEFAULT_INSTRUCTION
from kpo.train.checks import config_errors, field_kinds
from kpo.train.settings import ConfigError, KPOSettings, loss_kwargs_of, option

__all__ = ["ConfigError", "TrainConfig", "TRAJECTORY_FIELDS"]

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


@dataclass
class TrainConfig(KPOSettings):
    """Every knob of a ``kpo train`` run (help text of each field below = its documentation): kpo's settings
    (:class:`~kpo.train.settings.KPOSettings`: loss, advantage, sampler, dumps) and the run's."""

    # --- run ---
    output_dir: str = option(
        "runs/kpo-tiny", "Directory for config.yaml, metrics.jsonl, checkpoints, final/, plots."
    )
    seed: int = option(0, "Seed of model init, data order, sampling and the synthetic task.")
    warm_start_seed: int | None = option(
        None,
        "Seed of the embedded warm start (its init, SFT problems and teacher noise); None = seed. Two runs with "
        "one warm_start_seed and different seeds start from the same model and differ only in RL prompts and "
        "sampling (kpo compare's A/A arm).",
    )
    max_steps: int = option(
        1000,
        "Optimizer steps, a multiple of minibatches (each generation batch gives `minibatches` of them).",
    )
    resume: bool = option(
        False,
        "Continue from the last checkpoint in output_dir (same config required, except the fields that do not "
        "change the trajectory: output_dir, cache_dir, max_steps, checkpoint, dump, logging and thread settings).",
    )
    overwrite: bool = option(
        False, "Allow starting a fresh run in a non-empty output_dir (its files are replaced)."
    )

    # --- protocol (paper: 32 prompts x 8, 4 optimizer steps per generation batch) ---
    prompts_per_step: int = option(
        16,
        "Prompts per generation batch (the paper: 32; 16 keeps the embedded testbed within its CPU budget).",
    )
    num_generations: int = option(8, "Responses per prompt (the GRPO group).")
    minibatches: int = option(
        4, "Optimizer steps per generation batch; all but the first are off-policy (ratios != 1)."
    )
    micro_batch_size: int | None = option(
        None, "Sequences per forward/backward per device; None = a whole mini-batch (no accumulation)."
    )
    learning_rate: float = option(1e-4, "AdamW learning rate (constant, no warm-up).")
    weight_decay: float = option(0.0, "AdamW weight decay.")
    max_grad_norm: float = option(1.0, "Gradient clipping by global norm.")
    temperature: float = option(1.0, "Sampling temperature (also used for log-probs and entropy).")
    max_completion_length: int | None = option(
        None,
        "Longest response in tokens; None = the synthetic task's longest solution + 4, or 1024 with --model.",
    )

    # --- embedded task and tiny model (refused with --dataset: task fields; with --model: the others) ---
    task: str = option(
        "running",
        "Embedded task: running (running sum mod 10 of n_terms digits, one response token per digit: 128-token "
        "responses by default) or chain (chained additions, ~3-token responses by default).",
    )
    n_terms: int | None = option(
        None, "Embedded task: terms per problem; none = the task's (running 128, chain 2)."
    )
    max_value: int | None = option(
        None, "Embedded task: largest term; none = the task's (running 9, at most 9; chain 19)."
    )
    tiny_hidden_size: int = option(128, "Tiny model width.")
    tiny_layers: int | None = option(
        None, "Tiny model decoder layers; none = the task's (running 2, chain 4)."
    )
    tiny_heads: int = option(4, "Tiny model attention heads.")
    sft_examples: int | None = option(
        None, "Warm start: distinct training problems per SFT round; none = the task's (running 12800, chain 200).",
    )
    sft_epochs: int | None = option(
        None,
        "Warm start: passes over them, fresh teacher noise each pass; none = the task's (running 1, chain 40).",
    )
    sft_noise: float | None = option(
        None,
        "Warm start: per-step error rate of the imitated teacher, which sets the start reward; none = the task's "
        "(running 0.01, chain 0.3).",
    )
    sft_learning_rate: float = option(3e-3, "Warm start: learning rate.")
    cache_dir: str | None = option(
        None, "Warm-start cache (the embedded model's); None = $KPO_CACHE or ~/.cache/kpo."
    )

    # --- real runs ---
    model: str | None = option(None, "Hugging Face checkpoint directory; None = the embedded tiny model.")
    dataset: str | None = option(
        None, "Training problems: DAPO-Math-17k parquet, or jsonl/json/parquet with problem/answer fields."
    )
    problem_key: str | None = option(None, "With dataset: field holding the problem (default: detected).")
    answer_key: str | None = option(None, "With dataset: field holding the answer (default: detected).")
    instruction: str = option(
        DEFAULT_INSTRUCTION,
        "With dataset: follows each problem on a new line (user turn of the chat template); "
        "kpo.data.math.format_prompt builds the text, as kpo eval does.",
    )
    use_vllm: bool = option(
        False, "Generate with vLLM (TRL use_vllm, colocate mode); needs vllm and a CUDA GPU."
    )
    vllm_gpu_memory_utilization: float = option(
        0.3, "With use_vllm: share of GPU memory vLLM takes (TRL's)."
    )
    vllm_importance_sampling_mode: str = option(
        "sequence_mask",
        "With use_vllm: TRL's train/inference mismatch correction, token_truncate, token_mask, sequence_truncate "
        "or sequence_mask (TRL's default: a response whose ratio exceeds the cap gets weight 0); logged as "
        "sampling/importance_sampling_ratio/* in metrics.jsonl.",
    )
    vllm_importance_sampling_clip_max: float = option(
        3.0, "With use_vllm: the correction's cap C_max (TRL's)."
    )
    bf16: bool | None = option(
        None,
        "bfloat16 mixed precision (autocast; weights and optimizer stay float32); None = on when CUDA supports "
        "it, off on CPU.",
    )

    # --- outputs ---
    save_steps: int = option(
        0, "Checkpoint every N optimizer steps (a multiple of minibatches); 0 = one checkpoint at the end."
    )
    save_total_limit: int = option(2, "Checkpoints kept.")
    report_to: str = option(
        "tensorboard",
        "TRL/transformers report_to: none, all (every installed one) or one integration (wandb, ...).",
    )
    num_threads: int | None = option(
        1, "torch CPU threads; 1 is fastest for the tiny model on a shared CPU; None = torch's default."
    )
    progress: bool = option(True, "Show progress bars.")

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
        return cls(**cls.coerce(data, source=source))

    @classmethod
    def coerce(cls, data: dict, *, source: str = "config") -> dict:
        """A mapping of config fields (a YAML file's) with its text read as the fields' types: YAML 1.1 reads 1e-4
        (no dot) as text, so a number field's text is its number (``none`` for an optional one), a bool field's
        text true/false (yes/no, 1/0), a text field's number its text (rollout_rs_threshold: 2.0 or '0.5_2.0'),
        and loss_kwargs' values scalars. ConfigError naming unknown fields, or every text that is none of those;
        values of another wrong type are left for :meth:`validate`."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError([f"{source}: unknown field(s) {unknown}; valid fields: {sorted(names)}"])
        data, errors = dict(data), []
        for key, value in data.items():
            kinds = field_kinds(cls, key)
            if isinstance(value, str) and str not in kinds and {bool, int, float} & set(kinds):
                try:
                    data[key] = _read_text(value, kinds)
                except ValueError as e:
                    errors.append(f"{source}: {key}={value!r} is not {e}")
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and str in kinds:
                data[key] = str(value)
        if errors:
            raise ConfigError(errors)
        if isinstance(data.get("loss_kwargs"), dict):
            data["loss_kwargs"] = loss_kwargs_of(data["loss_kwargs"])
        return data

    def save_yaml(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


TRAJECTORY_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if f.name not in TRAJECTORY_FIELDS_EXEMPT
)


_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def _read_text(text: str, kinds: tuple[type, ...]):
    """``text`` as a value of a bool or number field of ``kinds``; ValueError saying what it should be."""
    if type(None) in kinds and text.lower() in ("none", "null"):
        return None
    if bool in kinds:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError("true or false")
    number = int if int in kinds else float
    try:
        return number(text)
    except ValueError:
        raise ValueError("a number") from None

