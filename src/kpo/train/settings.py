"""The settings kpo adds to a GRPO trainer: the policy loss and its aggregation, the advantage estimator, the rollout
sampler and its correction (the train-inference mismatch), and ratio dumps.

:class:`KPOSettings` holds them once, with their help: ``kpo train``'s :class:`~kpo.train.config.TrainConfig` and
the API's :class:`~kpo.train.trainer_config.KPOConfig` (TRL's GRPOConfig with these fields) both extend it. Their
checks are :func:`kpo.train.checks.settings_errors`. Nothing here imports TRL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["ConfigError", "KPOSettings", "loss_kwargs_of", "option", "parse_scalar"]


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("invalid training config:\n" + "\n".join(f"  - {e}" for e in self.errors))


def option(default: Any, help: str, **kw) -> Any:
    """A config field with its documentation (``help``, which TRL's parser shows); a mutable default is copied."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


LOSS_KWARGS_HELP = (
    "Loss hyperparameters (verl names); unset ones take the method's default. On the command line NAME=VALUE "
    "pairs (--loss-kwargs q=1e-4 v=1), in a YAML file a mapping (loss_kwargs: {q: 1.0e-4, v: 1}). KPO's "
    "memory=TOKENS sets q from the filter's memory; memory=matched keeps the paper's memory-to-length ratio "
    "(1000 of 4096 tokens) at this run's response length (kpo train on the embedded task: its longest response; "
    "otherwise max_completion_length); memory=auto fits one q per optimizer step by maximum likelihood, to the "
    "previous step's log-ratios over all its micro-batches and processes (bounds q_min, q_max; logged as "
    "kpo/q and kpo/memory_tokens)."
)


@dataclass
class KPOSettings:
    """kpo's settings of a GRPO run (help text of each field below = its documentation)."""

    # --- loss ---
    loss: str = option("kpo", "Policy loss, one of kpo.list_losses().")
    loss_kwargs: dict = option({}, LOSS_KWARGS_HELP)
    loss_agg_mode: str | None = option(
        None,
        "Loss aggregation; None = the protocol's seq-mean-token-mean where the loss allows it, else the "
        "loss's own (GMPO/HolderPO: seq-mean).",
    )
    advantage: str = option("grpo", "Advantage estimator for kpo.compute_advantages: grpo, drgrpo, rloo, krpo.")

    # --- train-inference mismatch (kpo's sampler: kpo.train.sampler) ---
    rollout_dtype: str = option(
        "float32",
        "Precision of the model rollouts are sampled from, refreshed from the trainer's weights before every "
        "generation batch: float32 (the policy itself), bfloat16 (a bf16 copy, as a bf16 inference engine beside a "
        "float32 trainer) or float8 (bf16 with the decoder blocks' linear weights on the FP8 e4m3 grid, one scale "
        "per output channel, and their input activations (one scale per token) and the KV cache (one scale per "
        "token and head) rounded to e4m3 too: W8A8 with an FP8 cache, as vLLM's quantization=fp8 with "
        "kv_cache_dtype=fp8). The sampler's per-token log-probs are kept; their mismatch with "
        "the trainer's is logged as rollout_corr/* every generation batch.",
    )
    rollout_lag: int = option(
        0,
        "Generation batches the sampler's weights lag the trainer's by, as in an async trainer (samples drawn by "
        "the weights of k batches ago; the first k batches by the starting weights); 0 = none. With "
        "ratio_anchor=rollout the staleness reaches the ratio; with the trainer's anchor, rollout_is corrects it. "
        "Less than the run's generation batches (max_steps / minibatches); the sampler keeps lag + 1 float32 copies "
        "of the weights, in memory and in every checkpoint.",
    )
    ratio_anchor: str = option(
        "trainer",
        "The PPO ratio's denominator (old_log_prob): trainer (the trainer's log-probs recomputed after "
        "generation, verl's default: the first step of a batch has ratio 1) or rollout (the sampler's, verl's "
        "bypass mode and an async trainer's usual choice: the mismatch reaches every ratio).",
    )
    rollout_is: str | None = option(
        None,
        "Rollout correction, truncated importance sampling (TIS, verl's rollout_is): token or sequence weights "
        "min(pi_trainer / pi_sampler, rollout_is_threshold) on the loss; none = off. Needs ratio_anchor=trainer "
        "(with the sampler's anchor the PPO ratio itself is the correction, as in verl's bypass mode).",
    )
    rollout_is_threshold: float = option(
        2.0,
        "TIS truncation threshold (verl's default 2.0), with rollout_is; >= 1 (a cap below 1 would scale down every "
        "token whose sampler and trainer agree).",
    )
    rollout_rs: str | None = option(
        None,
        "Rollout correction, rejection (verl's rollout_rs): token or sequence (MIS: drop a token or row whose ratio "
        "leaves the bounds) or verl's divergence options (token_k1, seq_mean_k3, ...; comma-separated); none = "
        "off. The ratio is pi_trainer / pi_sampler, or pi_theta / pi_sampler with ratio_anchor=rollout (verl's "
        "bypass). A rejected token leaves the loss's mask.",
    )
    rollout_rs_threshold: str | None = option(
        None,
        "Rejection bounds in verl's spec: an upper ratio bound for token/sequence (none = 2.0), 'lower_upper' for "
        "k1 options (IcePop: rollout_rs=token_k1 rollout_rs_threshold=0.5_2.0), an upper bound for k2/k3; with "
        "rollout_rs. Ratio bounds must keep a ratio of 1 (else every token whose sampler and trainer agree is "
        "rejected).",
    )
    rollout_rs_threshold_lower: float | None = option(
        None, "Rejection lower ratio bound for rollout_rs=token/sequence, <= 1; none = no lower bound."
    )

    # --- outputs ---
    dump_ratios_every: int = option(
        0,
        "Every N optimizer steps save ratios/step_000012.safetensors under the output directory (the step, 6 "
        "digits; log-ratio, filtered, mask) for kpo analyze; 0 = never.",
    )

    def response_length(self) -> int:
        """The response length KPO's memory=matched scales the paper's memory to (each config says which)."""
        raise NotImplementedError

    def resolved_agg_mode(self) -> str:
        """loss_agg_mode, or the protocol's seq-mean-token-mean where the loss allows it, else the loss's own."""
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


def loss_kwarg(text: str) -> tuple[str, Any]:
    """One ``NAME=VALUE`` of the command line's loss kwargs, the value a number where it reads as one; ValueError
    without the ``=``."""
    if "=" not in text:
        raise ValueError(f"loss kwarg {text!r}: write NAME=VALUE, e.g. q=1e-4")
    key, value = text.split("=", 1)
    return key.strip(), parse_scalar(value)


def loss_kwargs_of(value: Any, flag: str | None = None) -> Any:
    """loss_kwargs as a mapping: a mapping's values read as scalars (a YAML file's ``1e-4`` is text), and the
    command line's ``NAME=VALUE`` strings (a list, or one string of them) as their pairs; None is no kwargs.
    ConfigError (its line prefixed by ``flag``) for a pair without ``=`` or a name given twice; anything else is
    returned as it is, for the type check."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {k: parse_scalar(v) for k, v in value.items()}
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return value
    prefix = "" if flag is None else f"{flag}: "
    try:
        pairs = [loss_kwarg(text) for text in value]
    except ValueError as e:
        raise ConfigError([f"{prefix}{e}"]) from None
    names = [k for k, _ in pairs]
    twice = sorted({k for k in names if names.count(k) > 1})
    if twice:
        raise ConfigError([f"{prefix}{twice} given more than once; give each name once"])
    return dict(pairs)
