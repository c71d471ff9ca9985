"""PPO/GRPO clipped surrogate with dual clip (METHODS.md section 1; verl ``vanilla``)."""

from __future__ import annotations

import torch

from kpo.losses import register_loss
from kpo.losses._core import LossBatch, LossTerms, resolve_clip
from kpo.losses.aggregation import masked_mean


@register_loss("vanilla", aliases=("grpo", "ppo"), default_agg="token-mean")
def vanilla(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> LossTerms:
    """L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); where A < 0 then min(L, -A c) (dual clip).

    r = exp(clamp(Delta, +-20)). Defaults eps = 0.2 (PPO/GRPO); DAPO: clip_ratio_high=0.28 with token-mean;
    original GRPO: loss_agg_mode="seq-mean-token-mean"; Dr. GRPO: "seq-mean-token-sum-norm".
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.2, 0.2)
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1, got {clip_ratio_c!r}")
    A, m = batch.advantages, batch.mask
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    loss1 = -A * ratio
    loss2 = -A * ratio.clamp(1.0 - low, 1.0 + high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -A * clip_ratio_c
    dual = torch.minimum(clipped, loss3)
    token_loss = torch.where(A < 0, dual, clipped)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean((loss2 > loss1).to(A.dtype), m),
        clipfrac_lower=masked_mean(((clipped > loss3) & (A < 0)).to(A.dtype), m),
    )
