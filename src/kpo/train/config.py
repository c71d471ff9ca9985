"""The one config of ``kpo train``: a flat dataclass, a YAML file and command-line overrides.

Convention (TRL's): ``kpo train --config run.yaml --max-steps 40 --loss gspo`` — values from the YAML file,
then command-line flags on top; every field is a flag (``--field-name`` or ``--field_name``). Loss
hyperparameters go in ``loss_kwargs`` (YAML mapping, or ``--loss-kwargs q=1e-4 clip_ratio_low=3e-4``) and are
checked against the hyperparameters the chosen loss accepts. :meth:`TrainConfig.validate` reports every
problem at once, each with its fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kpo._checks import file_in_the_way, no_tokenizer, unwritable
from kpo.data.math import DEFAULT_INSTRUCTION

__all__ = ["ConfigError", "TrainConfig", "parse_args", "TRAJECTORY_FIELDS"]

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

    # ------------------------------------------------------------------ derived
    @property
    def generation_batch(self) -> int:
        """Sequences generated per generation batch."""
        return self.prompts_per_step * self.num_generations

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step (all devices)."""
        return self.generation_batch // self.minibatches

    def task_config(self):
        from kpo.data.synthetic import TaskConfig

        return TaskConfig(kind=self.task, n_terms=self.n_terms, max_value=self.max_value)

    def tiny_shape(self):
        """The embedded model's shape: the tiny_* fields (tiny_layers unset: the task's), and a context that
        holds the task's longest prompt and response (``kpo.train.tiny.context_length``)."""
        from kpo.train.tiny import TINY_LAYERS, TinyModelConfig, context_length

        return TinyModelConfig(
            hidden_size=self.tiny_hidden_size,
            num_layers=self.tiny_layers or TINY_LAYERS[self.task],
            num_heads=self.tiny_heads,
            intermediate_size=3 * self.tiny_hidden_size,
            max_position_embeddings=context_length(self.task_config()),
        )

    def max_completion(self) -> int:
        """Longest response in tokens: max_completion_length, or the embedded task's longest reference +
        kpo.train.tiny.COMPLETION_SLACK, or 1024 with --model."""
        from kpo.train.tiny import COMPLETION_SLACK

        if self.max_completion_length is not None:
            return self.max_completion_length
        return self.task_config().max_response_chars() + COMPLETION_SLACK if self.dataset is None else 1024

    def sft_settings(self):
        """The warm start's settings: the task's preset (``kpo.train.tiny.SFT_PRESETS``) with the sft_* fields
        that are set on top."""
        from kpo.train.tiny import SFT_PRESETS

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
        return self.seed if self.warm_start_seed is None else self.warm_start_seed

    def resolved_agg_mode(self) -> str:
        from kpo.losses import get_loss_spec

        spec = get_loss_spec(self.loss)
        if self.loss_agg_mode is not None:
            return self.loss_agg_mode
        return "seq-mean-token-mean" if "seq-mean-token-mean" in spec.agg_modes else spec.default_agg

    def response_length(self) -> int:
        """The response length KPO's memory=matched scales the paper's memory to: the embedded task's longest
        reference response, or the response budget with --dataset."""
        return self.task_config().max_response_chars() if self.dataset is None else self.max_completion()

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
                else _scalar(self.rollout_rs_threshold),
                "rollout_rs_threshold_lower": self.rollout_rs_threshold_lower,
            }
        return kw

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ validation
    def validate(self, *, world_size: int = 1) -> TrainConfig:
        """Check every field; raise :class:`ConfigError` listing all problems. Returns self.

        A field of the wrong type or out of range gets one error, and the checks that combine it with other
        fields are skipped (their message would be about a value that is already reported)."""
        bad = self._type_errors()
        bad |= self._range_errors(skip=bad)
        errors = list(bad.values())

        def ok(*names: str) -> bool:
            return not bad.keys() & set(names)

        if ok(
            "prompts_per_step",
            "num_generations",
            "minibatches",
            "max_steps",
            "save_steps",
            "micro_batch_size",
        ):
            errors += self._batch_errors(world_size)
        if ok("tiny_hidden_size", "tiny_heads") and self.tiny_hidden_size % self.tiny_heads:
            errors.append(
                f"tiny_hidden_size={self.tiny_hidden_size} must be divisible by tiny_heads={self.tiny_heads}"
            )
        if ok("loss", "loss_kwargs", "loss_agg_mode"):
            errors += self._validate_loss()
        if ok("advantage"):
            errors += self._advantage_errors()
        if ok(*_MISMATCH_FIELDS):
            errors += self._mismatch_errors()
        if ok("rollout_lag", "max_steps", "minibatches"):
            errors += self._lag_errors()
        errors += self._ignored_errors(skip=bad)
        if ok("model") and self.model is not None:
            errors += self._model_errors()
        elif ok("model", "task", "n_terms", "max_value", "seed", "sft_examples", "prompts_per_step"):
            errors += self._task_errors()
        if ok("dataset", "model", "problem_key", "answer_key") and self.dataset is not None:
            errors += self._dataset_errors()
        if ok("use_vllm") and self.use_vllm:
            errors += self._vllm_errors()
        if ok("bf16") and self.bf16:
            import torch

            if not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
                errors.append("bf16=True needs a CUDA device with bfloat16; leave bf16 unset on CPU")
        if ok("report_to"):
            errors += _report_to_errors(self.report_to)
        if ok("output_dir", "resume", "overwrite"):
            errors += self._output_dir_errors()
        if errors:
            raise ConfigError(errors)
        return self

    def _type_errors(self) -> dict[str, str]:
        """{field: error} for every field whose value does not match its annotation (ints pass as floats)."""
        errors = {}
        for f in dataclasses.fields(self):
            kinds = _field_kinds(f.name)
            value = getattr(self, f.name)
            if not any(_has_type(value, kind) for kind in kinds):
                expected = " or ".join(_TYPE_NAMES[kind] for kind in kinds)
                errors[f.name] = f"{f.name}={value!r}: expected {expected}, got {type(value).__name__}"
        return errors

    def _range_errors(self, skip: dict[str, str]) -> dict[str, str]:
        """{field: error} for numbers outside :data:`_BOUNDS` (fields in ``skip`` and None values pass)."""
        errors = {}
        for name, (low, high, why) in _BOUNDS.items():
            value = getattr(self, name)
            if name in skip or value is None:
                continue
            if name in _POSITIVE and value <= low:
                errors[name] = f"{name}={value!r}: must be > {low}{why}"
            elif value < low or (high is not None and value > high):
                limit = f"in [{low}, {high}]" if high is not None else f">= {low}"
                errors[name] = f"{name}={value!r}: must be {limit}{why}"
        return errors

    def _batch_errors(self, world_size: int) -> list[str]:
        errors = []
        if self.generation_batch % self.minibatches:
            errors.append(
                f"prompts_per_step x num_generations = {self.generation_batch} is not divisible by "
                f"minibatches={self.minibatches}: pick minibatches dividing {self.generation_batch}"
            )
        elif self.mini_batch % world_size:
            errors.append(
                f"mini-batch of {self.mini_batch} sequences does not split over {world_size} devices: "
                "change prompts_per_step or minibatches"
            )
        elif self.micro_batch_size is not None and (self.mini_batch // world_size) % self.micro_batch_size:
            errors.append(
                f"micro_batch_size={self.micro_batch_size} must divide the per-device mini-batch of "
                f"{self.mini_batch // world_size} sequences"
            )
        # A checkpoint inside a generation batch cannot resume it: the rest of the batch is not saved.
        # The last checkpoint is written at max_steps, so max_steps must end a generation batch too.
        for name in ("max_steps", "save_steps"):
            value = getattr(self, name)
            if value > 0 and value % self.minibatches:
                errors.append(
                    f"{name}={value} must be a multiple of minibatches={self.minibatches} (a checkpoint "
                    "inside a generation batch could not resume to the same trajectory): use "
                    f"{name}={_round_up(value, self.minibatches)} or another multiple"
                )
        return errors

    def _vllm_errors(self) -> list[str]:
        import torch

        errors = []
        if importlib.util.find_spec("vllm") is None:
            errors.append("use_vllm=True but vllm is not installed: pip install vllm, or drop --use-vllm")
        if not torch.cuda.is_available():
            errors.append(
                "use_vllm=True needs a CUDA GPU (vLLM generates on it); drop --use-vllm on this machine"
            )
        if self.vllm_importance_sampling_mode not in _VLLM_IS_MODES:
            errors.append(
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r}: must be one of "
                f"{', '.join(_VLLM_IS_MODES)}"
            )
        return errors

    def _mismatch_errors(self) -> list[str]:
        """The sampler's settings: known names, and a rollout correction that the loss accepts."""
        import torch

        from kpo.losses.mismatch import rollout_correction
        from kpo.train.sampler import RATIO_ANCHORS, ROLLOUT_DTYPES

        errors = []
        if self.rollout_dtype not in ROLLOUT_DTYPES:
            errors.append(f"rollout_dtype={self.rollout_dtype!r}: use one of {', '.join(ROLLOUT_DTYPES)}")
        if self.ratio_anchor not in RATIO_ANCHORS:
            errors.append(f"ratio_anchor={self.ratio_anchor!r}: use one of {', '.join(RATIO_ANCHORS)}")
        if self.ratio_anchor == "rollout" and self.rollout_is is not None:
            errors.append(
                f"rollout_is={self.rollout_is!r} with ratio_anchor=rollout: the PPO ratio pi_theta / pi_sampler "
                "already corrects the mismatch (verl's bypass mode applies no TIS weight with PPO-clip); drop "
                "--rollout-is, or use --ratio-anchor trainer"
            )
        sampler_set = (
            self.rollout_dtype != "float32"
            or self.rollout_lag
            or self.ratio_anchor != "trainer"
            or self.rollout_correction()
        )
        if self.use_vllm and sampler_set:
            errors.append(
                "rollout_dtype, rollout_lag, ratio_anchor and rollout_is/rollout_rs set kpo's CPU sampler; with --use-vllm, TRL's "
                "--vllm-importance-sampling-mode corrects the mismatch: leave them at their defaults"
            )
        if not errors and self.rollout_correction():
            lp = torch.zeros(1, 2)  # the correction checks its own settings
            try:
                rollout_correction(lp, lp, torch.ones(1, 2, dtype=torch.bool), **self.rollout_correction())
            except ValueError as e:
                errors.append(f"rollout correction: {e}")
        return errors

    def _lag_errors(self) -> list[str]:
        """A lag that no generation batch of the run reaches (the sampler would keep the starting weights)."""
        batches = self.max_steps // self.minibatches
        if not self.rollout_lag or self.rollout_lag < batches:
            return []
        return [
            f"rollout_lag={self.rollout_lag}: the run has {batches} generation batch(es) (max_steps={self.max_steps} "
            f"/ minibatches={self.minibatches}), so none would be sampled {self.rollout_lag} batches behind the "
            f"trainer: the sampler would keep the starting weights all run; use --rollout-lag {batches - 1} or less "
            f"(0 = none), or --max-steps {(self.rollout_lag + 1) * self.minibatches} or more"
        ]

    def _ignored_errors(self, skip: dict[str, str]) -> list[str]:
        """Settings given (not at their default) that the run would ignore, as :data:`_IGNORED_UNLESS` says."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        errors = []
        for name, (why, fix, acts) in _IGNORED_UNLESS.items():
            value = getattr(self, name)
            if name not in skip and value != defaults[name] and not acts(self):
                flag = f"--{name.replace('_', '-')}"
                errors.append(f"{name}={value!r} is ignored {why}: drop {flag}, or {fix}")
        return errors

    def _advantage_errors(self) -> list[str]:
        import torch

        from kpo.advantages import compute_advantages

        try:
            compute_advantages(self.advantage, torch.tensor([0.0, 1.0]), [0, 0])
        except (ValueError, TypeError) as e:
            return [f"advantage={self.advantage!r}: {e}"]
        return []

    def _task_errors(self) -> list[str]:
        """The synthetic task can supply the warm start's problems and a generation batch of distinct prompts."""
        try:
            task = self.task_config()
        except ValueError as e:
            return [f"task/n_terms/max_value: {e}"]
        n_sft = self.sft_settings().n_examples
        return list(_task_check(task, self.seed, self.resolved_warm_start_seed(), n_sft, self.prompts_per_step))

    def _model_errors(self) -> list[str]:
        if not (Path(self.model) / "config.json").exists():
            return [f"model={self.model!r}: no config.json there; give a Hugging Face checkpoint directory"]
        missing = no_tokenizer(Path(self.model))
        return [] if missing is None else [f"model={self.model!r}: {missing}"]

    def _dataset_errors(self) -> list[str]:
        errors = []
        if self.model is None:
            errors.append(
                "dataset is set but model is not: the embedded tiny model only reads the synthetic task; "
                "pass --model PATH (a Hugging Face checkpoint) with --dataset"
            )
        if importlib.util.find_spec("math_verify") is None:
            errors.append(
                "dataset is set, and its rewards are graded by math-verify, which is not installed: "
                "pip install 'kpo[train]' (or 'math-verify>=0.8')"
            )
        if not Path(self.dataset).exists():
            return [*errors, f"dataset={self.dataset!r}: file not found"]
        from kpo.data.math import load_problems

        try:
            problems = load_problems(self.dataset, self.problem_key, self.answer_key)
        except (ValueError, KeyError, OSError) as e:
            return [*errors, f"dataset={self.dataset!r}: {e}"]
        if isinstance(self.prompts_per_step, int) and self.prompts_per_step > len(problems):
            errors.append(
                f"prompts_per_step={self.prompts_per_step}: dataset={self.dataset!r} has {len(problems)} problems "
                f"and a generation batch takes that many distinct ones: lower --prompts-per-step to "
                f"{len(problems)} or less"
            )
        return errors

    def _output_dir_errors(self) -> list[str]:
        out = Path(self.output_dir)
        existing = file_in_the_way(out)
        if existing is not None:
            return [
                f"output_dir={self.output_dir!r}: {str(existing)!r} is a file, not a directory; choose "
                "another --output-dir"
            ]
        if self.resume and self.overwrite:
            return ["resume and overwrite are exclusive: resume continues the run, overwrite replaces it"]
        if self.resume and not out.is_dir():
            return [
                f"resume: output_dir={self.output_dir!r} does not exist, so there is no run to resume; check the "
                "path, or start the run without --resume"
            ]
        if (why := unwritable(out)) is not None:
            return [f"output_dir={self.output_dir!r}: {why}; choose another --output-dir"]
        if not self.resume and not self.overwrite and (out / "metrics.jsonl").exists():
            return [
                f"output_dir={self.output_dir!r} already holds a run: pass --resume to continue it, "
                "--overwrite to replace it, or another --output-dir"
            ]
        return []

    def _validate_loss(self) -> list[str]:
        import torch

        from kpo.losses import get_loss_spec, policy_loss

        try:
            spec = get_loss_spec(self.loss)
        except ValueError as e:
            return [f"loss: {e}"]
        errors = []
        # The trainer itself supplies token_entropy (ASPO); a user value would be a [B, T] tensor.
        accepted = {k: v for k, v in spec.hparams.items() if k != "token_entropy"}
        unknown = sorted(set(self.loss_kwargs) - set(accepted))
        if unknown:
            listing = ", ".join(f"{k}={v!r}" for k, v in accepted.items()) or "(none)"
            errors.append(f"loss_kwargs {unknown} not accepted by loss {self.loss!r}; it accepts: {listing}")
        if self.loss_agg_mode is not None and self.loss_agg_mode not in spec.agg_modes:
            errors.append(
                f"loss_agg_mode={self.loss_agg_mode!r} not allowed for loss {self.loss!r}; use one of "
                f"{list(spec.agg_modes)} or leave it unset"
            )
        if errors:
            return errors
        # Values (e.g. q <= 0) are checked by the loss itself: run it once on a 1 x 2 batch.
        lp = torch.zeros(2, 2)
        try:
            policy_loss(
                self.loss,
                log_prob=lp,
                old_log_prob=lp,
                advantages=torch.tensor([1.0, -1.0]),
                response_mask=torch.ones(2, 2),
                loss_agg_mode=self.resolved_agg_mode(),
                **self.resolved_loss_kwargs(),
                # as the trainer supplies it (top_entropy_quantile needs it)
                **({"token_entropy": torch.ones(2, 2)} if "token_entropy" in spec.hparams else {}),
            )
        except (ValueError, TypeError) as e:
            errors.append(f"loss_kwargs for {self.loss!r}: {e}")
        return errors

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
            data["loss_kwargs"] = {k: _scalar(v) for k, v in data["loss_kwargs"].items()}
        if errors:
            raise ConfigError(errors)
        return cls(**data)

    def save_yaml(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


# Numeric fields' bounds, name -> (low, high or None, why); a None value (where the type allows it) passes.
_POSITIVE = (
    "learning_rate",
    "temperature",
    "sft_learning_rate",
    "max_grad_norm",
    "vllm_importance_sampling_clip_max",
    "rollout_is_threshold",
)  # low is exclusive
_BOUNDS = {
    **dict.fromkeys(
        (
            "max_steps",
            "prompts_per_step",
            "minibatches",
            "tiny_hidden_size",
            "tiny_layers",
            "tiny_heads",
            "sft_examples",
            "sft_epochs",
            "save_total_limit",
            "micro_batch_size",
            "max_completion_length",
            "num_threads",
        ),
        (1, None, ""),
    ),
    "num_generations": (2, None, " (a GRPO group compares at least 2 responses per prompt)"),
    **dict.fromkeys(("save_steps", "dump_ratios_every", "rollout_lag"), (0, None, " (0 = off)")),
    "weight_decay": (0, None, ""),
    "seed": (0, 2**32 - 1, " (numpy's seed range)"),
    "warm_start_seed": (0, 2**32 - 1, " (numpy's seed range)"),
    "n_terms": (1, None, ""),
    "max_value": (1, None, ""),
    "sft_noise": (0, 1, " (a probability)"),
    "vllm_gpu_memory_utilization": (0, 1, " (a share of GPU memory)"),
    **dict.fromkeys(_POSITIVE, (0, None, "")),
}
_MISMATCH_FIELDS = (
    "rollout_dtype",
    "rollout_lag",
    "ratio_anchor",
    "rollout_is",
    "rollout_is_threshold",
    "rollout_rs",
    "rollout_rs_threshold",
    "rollout_rs_threshold_lower",
    "use_vllm",
)
# Settings that act only with another one: name -> (when it is ignored, the fix that makes it act, whether a config
# has what it needs). Given (not at its default) where it would be ignored, it is refused.
_WITH_VLLM = ("without --use-vllm", "add --use-vllm", lambda c: c.use_vllm)
_WITH_DATASET = ("without --dataset (it reads dataset rows)", "add --dataset FILE", lambda c: c.dataset is not None)
# The embedded model's warm start: its seed, shape, SFT round and cache (kpo task takes them; --model replaces them)
WARM_START_FIELDS = (
    "warm_start_seed",
    "cache_dir",
    "tiny_hidden_size",
    "tiny_layers",
    "tiny_heads",
    "sft_examples",
    "sft_epochs",
    "sft_noise",
    "sft_learning_rate",
)
_IGNORED_UNLESS: dict[str, tuple[str, str, typing.Callable[[TrainConfig], bool]]] = {
    "rollout_is_threshold": (
        "without --rollout-is (no TIS weight to truncate)",
        "add --rollout-is token (or sequence)",
        lambda c: c.rollout_is is not None,
    ),
    **dict.fromkeys(
        ("rollout_rs_threshold", "rollout_rs_threshold_lower"),
        (
            "without --rollout-rs (no token is rejected)",
            "add --rollout-rs token (or sequence, or verl's options)",
            lambda c: c.rollout_rs is not None,
        ),
    ),
    **dict.fromkeys(
        ("vllm_gpu_memory_utilization", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max"),
        _WITH_VLLM,
    ),
    **dict.fromkeys(("problem_key", "answer_key", "instruction"), _WITH_DATASET),
    **dict.fromkeys(
        ("task", "n_terms", "max_value"),
        ("with --dataset (it sets the embedded task)", "drop --dataset", lambda c: c.dataset is None),
    ),
    **dict.fromkeys(
        WARM_START_FIELDS,
        ("with --model (it sets the embedded model and its warm start)", "drop --model", lambda c: c.model is None),
    ),
}
_VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_TYPE_NAMES = {
    bool: "true/false",
    int: "an integer",
    float: "a finite number",
    str: "a string",
    dict: "a mapping",
    type(None): "none",
}


@functools.cache
def _task_check(task, seed: int, warm_start_seed: int, n_sft: int, prompts_per_step: int) -> tuple[str, ...]:
    """:meth:`TrainConfig._task_errors` of these settings, computed once per process: drawing a split and the warm
    start's problems takes seconds for the 128-token task, and kpo compare validates many runs of one task."""
    from kpo.data.synthetic import MAX_ROWS, load_split
    from kpo.train.tiny import sft_problems

    try:
        rl_problems = len(load_split("train", seed=seed, task=task))
    except ValueError as e:
        return (f"task/n_terms/max_value: {e}",)
    errors = []
    task_text = f"the synthetic task ({task.kind}, n_terms={task.n_terms}, max_value={task.max_value})"
    most = task.max_problems("train")
    if n_sft > most:
        grow = "" if most == MAX_ROWS else ", or raise --max-value / --n-terms"  # at MAX_ROWS the task holds more
        errors.append(
            f"sft_examples={n_sft}: {task_text} gives at most {most} distinct training problems "
            f"for the warm start: lower --sft-examples to {most} or less{grow}"
        )
    else:
        try:
            sft_problems(task, n_sft, warm_start_seed)
        except ValueError as e:
            errors.append(f"sft_examples={n_sft}: {e}")
    if prompts_per_step > rl_problems:
        errors.append(
            f"prompts_per_step={prompts_per_step}: {task_text} gives {rl_problems} training prompts and "
            f"a generation batch takes that many distinct ones: lower --prompts-per-step to {rl_problems} "
            "or less, or raise --max-value / --n-terms"
        )
    return tuple(errors)


@functools.cache
def on_policy_step(step: int, minibatches: int) -> bool:
    """Whether optimizer step ``step`` (1-based) is on-policy: the first of its generation batch's ``minibatches``
    steps updates the policy that sampled the batch; the others are off-policy (the paper's protocol)."""
    return (step - 1) % minibatches == 0


@functools.cache
def _field_kinds(name: str) -> tuple[type, ...]:
    """The types a TrainConfig field's annotation allows: (int,) for ``int``, (int, NoneType) for ``int | None``
    (cached: resolving the annotations costs milliseconds a field, and every parse and check reads them all)."""
    hint = typing.get_type_hints(TrainConfig)[name]
    return typing.get_args(hint) or (hint,)


def _has_type(value: Any, kind: type) -> bool:
    """isinstance for config fields: bools are not numbers, ints pass as floats, floats must be finite."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _report_to_errors(report_to: str) -> list[str]:
    """``report_to`` is none, all, or one transformers integration that is installed here."""
    if report_to in ("none", "all"):
        return []
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    if report_to not in INTEGRATION_TO_CALLBACK:
        known = ", ".join(sorted(INTEGRATION_TO_CALLBACK))
        return [f"report_to={report_to!r}: unknown; use none, all or one of {known}"]
    available = get_available_reporting_integrations()
    if report_to not in available:
        return [
            f"report_to={report_to!r}: {report_to} is not installed; install it, or use --report-to none"
            + (f" or one of the installed {', '.join(available)}" if available else "")
        ]
    return []


TRAJECTORY_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if f.name not in TRAJECTORY_FIELDS_EXEMPT
)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _scalar(value: Any) -> Any:
    """A YAML/CLI scalar with numbers as numbers: '4e-4' -> 0.0004, 'true' -> True, 'skip' -> 'skip'."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return yaml.safe_load(value) if value.strip() else value


def _show_default(value: Any) -> str:
    """A default as it is written on the command line: none, true/false, {} or the value itself."""
    if value is None or isinstance(value, bool):
        return yaml.safe_dump(value).split("\n")[0].replace("null", "none")
    return str(value)


def _parse_bool(text: str) -> bool:
    value = yaml.safe_load(text)
    if not isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return value


def _parse_optional(kind):
    def parse(text: str):
        if text.lower() in ("none", "null"):
            return None
        return kind(text)

    parse.__name__ = kind.__name__
    return parse


def _parse_kwarg(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"loss kwarg {text!r}: write NAME=VALUE, e.g. q=1e-4")
    key, value = text.split("=", 1)
    return key.strip(), _scalar(value)


def build_parser(prog: str = "kpo train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="RL post-training with KPO or any importance-ratio baseline (TRL GRPOTrainer). "
        "With no arguments: the embedded tiny model on the synthetic arithmetic task (minutes on a CPU).",
    )
    parser.add_argument("--config", help="YAML file of config fields; flags override it.")
    defaults = TrainConfig().to_dict()
    for f in dataclasses.fields(TrainConfig):
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        # The flag's own default stays SUPPRESS, so an unset flag leaves the YAML file's value in place;
        # the help shows the dataclass default that applies when neither sets it.
        help_text = f"{f.metadata['help']} (default: {_show_default(defaults[f.name])})".replace("%", "%%")
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        kinds = _field_kinds(f.name)
        optional = type(None) in kinds
        if f.name == "loss_kwargs":
            kw |= {"nargs": "*", "type": _parse_kwarg, "metavar": "NAME=VALUE"}
        elif bool in kinds:
            kw |= {"nargs": "?", "const": True, "type": _parse_bool, "metavar": "BOOL"}
        elif int in kinds:
            kw["type"] = _parse_optional(int) if optional else int
        elif float in kinds:
            kw["type"] = float
        else:
            kw["type"] = _parse_optional(str) if optional else str
        parser.add_argument(*flags, **kw)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Config from ``--config FILE`` (if given) with command-line flags on top (not yet validated)."""
    args = vars(build_parser().parse_args(argv))
    path = args.pop("config", None)
    base = TrainConfig.from_yaml(path).to_dict() if path else {}
    if "loss_kwargs" in args:
        pairs = args.pop("loss_kwargs")
        keys = [k for k, _ in pairs]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError([f"--loss-kwargs sets {dupes} more than once"])
        base["loss_kwargs"] = {**base.get("loss_kwargs", {}), **dict(pairs)}
    base.update(args)
    return TrainConfig.from_dict(base, source="command line")
