"""Types shared by the loss modules and the registry (kept apart so that loss modules never import the package
``__init__``, which imports them)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LossBatch:
    """Validated inputs of one loss call, all [B, T] and on one device/dtype.

    Masked entries of ``log_prob``/``old_log_prob``/``advantages`` are replaced by 0 (``log_prob`` through
    ``torch.where``, so its gradient there is exactly 0): padding can never produce NaN, in value or gradient.
    """

    log_prob: torch.Tensor  # carries the gradient
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor  # bool
    is_weights: torch.Tensor | None  # detached train/inference weights, only for losses that consume them
    # detached rollout-engine log-probs (0 where masked), when the caller passed them; else None
    rollout_log_prob: torch.Tensor | None = None

    @property
    def log_ratio(self) -> torch.Tensor:
        """Delta = log_prob - old_log_prob (unclamped)."""
        return self.log_prob - self.old_log_prob

    @property
    def lengths(self) -> torch.Tensor:
        """|y_i|: valid tokens per row, [B], in the loss dtype."""
        return self.mask.sum(dim=-1).to(self.log_prob.dtype)

    def seq_advantage(self) -> torch.Tensor:
        """Per-row advantage [B]: mean over the valid tokens (the advantage itself when it is per sequence)."""
        return (self.advantages * self.mask).sum(dim=-1) / self.lengths.clamp(min=1)


@dataclass
class LossTerms:
    """What a loss function returns: exactly one of ``token_loss`` [B, T] or ``seq_loss`` [B], and the
    clip fractions (0-dim tensors, fractions of valid tokens). ``extra`` holds further 0-dim metrics."""

    token_loss: torch.Tensor | None = None
    seq_loss: torch.Tensor | None = None
    clipfrac: torch.Tensor | float = 0.0
    clipfrac_lower: torch.Tensor | float = 0.0
    extra: dict[str, torch.Tensor | float] = field(default_factory=dict)


_CONDITIONS = {
    "finite": lambda v: True,
    ">= 0": lambda v: v >= 0,
    "> 0": lambda v: v > 0,
    "> 1": lambda v: v > 1,
}


def check_hparams(condition: str, **values) -> None:
    """ValueError naming the first hyperparameter in ``values`` that is not a finite real number meeting
    ``condition`` (a key of ``_CONDITIONS``)."""
    holds = _CONDITIONS[condition]
    for name, value in values.items():
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and holds(value)):
            rule = "a finite number" + ("" if condition == "finite" else f" {condition}")
            raise ValueError(f"{name} must be {rule}, got {value!r}")


def resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, default_low: float, default_high: float):
    """verl's rule: an unset ``clip_ratio_low``/``_high`` falls back to ``clip_ratio``, then to the paper value."""
    base_low = default_low if clip_ratio is None else clip_ratio
    base_high = default_high if clip_ratio is None else clip_ratio
    low = base_low if clip_ratio_low is None else clip_ratio_low
    high = base_high if clip_ratio_high is None else clip_ratio_high
    check_hparams(">= 0", clip_ratio_low=low, clip_ratio_high=high)
    return float(low), float(high)


def clipped_surrogate(
    advantages: torch.Tensor, ratio: torch.Tensor, low: float, high: float, cap: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic bound max(-A r, -A clip(r, 1 - low, 1 + high)) and where the clipped branch is the
    larger one (bool), elementwise over any matching shapes. ``cap`` (TRL's ``delta``, two-sided clipping)
    replaces r in the unclipped branch by min(r, cap)."""
    unclipped = -advantages * (ratio if cap is None else ratio.clamp(max=cap))
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def seq_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """mean/min/max of a per-row quantity [B] over the rows with a valid token; none without such a row."""
    return token_stats(prefix, values, mask.any(dim=-1))


def token_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """mean/min/max of ``values`` over the entries where ``mask`` is True (same shape); none when there is no
    such entry: a statistic of nothing is undefined, and a 0 in its place would read as a measured value."""
    if not bool(mask.any()):
        return {}
    v = values.detach()[mask]
    return {f"{prefix}_mean": v.mean(), f"{prefix}_min": v.min(), f"{prefix}_max": v.max()}
