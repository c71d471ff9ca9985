"""``KPOConfig``: TRL's ``GRPOConfig`` with kpo's settings, the config of :class:`~kpo.train.trainer.KPOTrainer`.

A TRL script changes its imports and a few fields::

    from kpo.train import KPOConfig, KPOTrainer
    args = KPOConfig(output_dir="runs/x", loss="kpo", loss_kwargs={"memory": "matched"}, ...)
    KPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data).train()

and TRL's parser reads it as it reads GRPOConfig (``TrlParser((ScriptArguments, KPOConfig, ModelConfig))``, a YAML
file under ``--config``; ``--loss_kwargs q=1e-4 v=1``). kpo's fields are :class:`~kpo.train.settings.KPOSettings`;
``memory="matched"`` scales the paper's memory to ``max_completion_length``. The GRPOConfig options whose work
KPOTrainer does its own way (the loss, the advantages) are refused where they are set, each with kpo's way to get it
(:data:`REFUSED`); docs/train.md lists what it keeps, overrides and refuses. Every problem is reported at once
(:class:`~kpo.train.settings.ConfigError`) when the config is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trl import GRPOConfig

from kpo.train.checks import settings_errors
from kpo.train.settings import LOSS_KWARGS_HELP, ConfigError, KPOSettings, loss_kwargs_of

__all__ = ["KPOConfig", "REFUSED", "trainer_args"]

_LOSS = "KPOTrainer's loss is kpo.policy_loss(loss)"
# GRPOConfig options that GRPOTrainer reads only where KPOTrainer does the work itself (the policy loss, the
# advantages, the optimizer steps per generation batch): set away from TRL's default they would be ignored, so
# they are refused, each with kpo's way to get it.
REFUSED = {
    "loss_type": f"{_LOSS}: choose loss (kpo.list_losses(): vanilla, gspo, cispo, sapo, vespo, luspo, ...) and "
    "loss_agg_mode (TRL's dapo is token-mean, grpo seq-mean-token-mean, dr_grpo seq-mean-token-sum-norm)",
    "epsilon": f"{_LOSS}: set loss_kwargs clip_ratio_low (and clip_ratio_high)",
    "epsilon_high": f"{_LOSS}: set loss_kwargs clip_ratio_high",
    "delta": f"{_LOSS}: set loss_kwargs delta (vanilla, luspo)",
    "importance_sampling_level": f"{_LOSS}: a sequence-level ratio is loss='gspo' (or 'gspo_token')",
    "top_entropy_quantile": f"{_LOSS}: set loss_kwargs top_entropy_quantile",
    "off_policy_mask_threshold": f"{_LOSS}: set loss_kwargs off_policy_mask_threshold",
    "sapo_temperature_pos": f"{_LOSS}: loss='sapo' with loss_kwargs tau_pos",
    "sapo_temperature_neg": f"{_LOSS}: loss='sapo' with loss_kwargs tau_neg",
    "vespo_k_pos": f"{_LOSS}: loss='vespo' with loss_kwargs k_pos",
    "vespo_lambda_pos": f"{_LOSS}: loss='vespo' with loss_kwargs lambda_pos",
    "vespo_k_neg": f"{_LOSS}: loss='vespo' with loss_kwargs k_neg",
    "vespo_lambda_neg": f"{_LOSS}: loss='vespo' with loss_kwargs lambda_neg",
    "entropy_coef": f"{_LOSS}, with no entropy bonus: leave it at 0",
    "use_adaptive_entropy": f"{_LOSS}, with no entropy bonus: leave it off",
    "beta": "the paper's protocol has no KL term (KPOTrainer's loss adds none): leave it at 0",
    "scale_rewards": "KPOTrainer's advantages are kpo.compute_advantages(advantage): advantage='grpo' is TRL's "
    "group scaling, 'drgrpo' its none",
    "multi_objective_aggregation": "KPOTrainer's advantages sum the weighted rewards first (TRL's "
    "sum_then_normalize): leave it at that",
    "num_iterations": "KPOTrainer counts a generation batch's optimizer steps by steps_per_generation: for more "
    "optimizer steps on one generation batch raise steps_per_generation (its first step stays on-policy)",
}


# The constructor keywords of kpo's settings before they were KPOConfig fields -> the field now.
MOVED_KEYWORDS = {
    "loss_name": "loss",
    "loss_kwargs": "loss_kwargs",
    "loss_agg_mode": "loss_agg_mode",
    "advantage": "advantage",
    "dump_ratios_every": "dump_ratios_every",
    "ratios_dir": "dump_ratios_every (dumps go to output_dir/ratios)",
    "rollout_dtype": "rollout_dtype",
    "rollout_lag": "rollout_lag",
    "ratio_anchor": "ratio_anchor",
    "rollout_correction": "rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold[_lower]",
}


@dataclass
class KPOConfig(KPOSettings, GRPOConfig):
    """GRPOConfig with kpo's settings (:class:`~kpo.train.settings.KPOSettings`: loss, loss_kwargs, loss_agg_mode,
    advantage, the rollout sampler and its correction, dump_ratios_every); the config of ``KPOTrainer``."""

    # TRL's parser reads a `dict | str | None` field as text: here the NAME=VALUE pairs, one or more
    loss_kwargs: dict | str | None = field(
        default_factory=dict,
        metadata={"help": LOSS_KWARGS_HELP + " With TRL's parser: --loss_kwargs q=1e-4 v=1.", "nargs": "*"},
    )

    def __post_init__(self):
        self.loss_kwargs = loss_kwargs_of(self.loss_kwargs, flag="loss_kwargs")
        errors = settings_errors(self) + _refused(self)
        if errors:
            raise ConfigError(errors)
        super().__post_init__()

    def response_length(self) -> int:
        """memory=matched's response length: the longest completion, ``max_completion_length``."""
        if self.max_completion_length is None:  # the loss's dry run reports it (kpo.train.checks.loss_errors)
            raise ValueError(
                "memory='matched' scales the paper's memory to max_completion_length, which is None: set "
                "max_completion_length, or give memory a number of tokens"
            )
        return self.max_completion_length


def _refused(config: KPOConfig) -> list[str]:
    """The :data:`REFUSED` options set away from GRPOConfig's defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    return [
        f"{name}={getattr(config, name)!r} would be ignored: {why}"
        for name, why in REFUSED.items()
        if getattr(config, name) != defaults[name]
    ]


def trainer_args(args, keywords: dict):
    """KPOTrainer's ``args``: a KPOConfig (None: its defaults). TypeError, in one line, for a plain GRPOConfig or
    the constructor ``keywords`` that are KPOConfig fields now (:data:`MOVED_KEYWORDS`), naming each one's field."""
    moved = sorted(keywords.keys() & MOVED_KEYWORDS)
    if moved:
        fields = ", ".join(f"{k} -> {MOVED_KEYWORDS[k]}" for k in moved)
        raise TypeError(
            f"KPOTrainer({', '.join(f'{k}=' for k in moved)}...): kpo's settings are fields of its config now: "
            f"pass args=kpo.train.KPOConfig(..., {fields})"
        )
    if args is None:
        return KPOConfig()
    if not isinstance(args, KPOConfig):
        raise TypeError(
            f"KPOTrainer takes args=kpo.train.KPOConfig(...), got {type(args).__name__}: KPOConfig is "
            "GRPOConfig with kpo's fields (loss, loss_kwargs, advantage, ...), so replace the class name"
        )
    return args
