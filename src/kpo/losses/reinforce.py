"""REINFORCE-form losses with a detached, clipped importance weight: CISPO (METHODS.md section 5)."""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, resolve_clip
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss


@register_loss("cispo", default_agg="token-mean")
def cispo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> LossTerms:
    """L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log_prob: every token keeps a gradient, weighted by clip(r).

    r = exp(clamp(Delta, +-20)). MiniMax-M1 leaves the lower side open and tunes only eps_high without stating
    it; defaults follow verl's example: eps_low = 10 (no lower bound), eps_high = 0.2 (cap 1.2).
    The value of this loss is not an objective (it moves with log_prob itself); only its gradient is meaningful.
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 10.0, 0.2)
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    clipped = ratio.clamp(1.0 - low, 1.0 + high)
    token_loss = -clipped.detach() * batch.advantages * batch.log_prob
    return LossTerms(
        token_loss=token_loss, clipfrac=masked_mean((ratio != clipped).to(ratio.dtype), batch.mask)
    )
