"""PPO/GRPO clipped surrogate with dual clip (docs/methods.md section 1; verl ``vanilla``), with TRL's two-sided
clip (``delta``) and masks (``kpo.losses.masks``)."""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, clipped_surrogate, resolve_clip
from kpo.losses.aggregation import masked_mean
from kpo.losses.masks import apply_trl_masks
from kpo.losses.registry import register_loss


@register_loss("vanilla", aliases=("grpo", "ppo"), default_agg="token-mean")
def vanilla(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    delta: float | None = None,
    off_policy_mask_threshold: float | None = None,
    top_entropy_quantile: float = 1.0,
    token_entropy: torch.Tensor | None = None,
) -> LossTerms:
    """L = max(-A min(r, delta), -A clip(r, 1 - eps_low, 1 + eps_high)); where A < 0 then min(L, -A c) (dual clip).

    r = exp(clamp(Delta, +-20)). Defaults eps = 0.2 (PPO/GRPO); DAPO: clip_ratio_high=0.28 with token-mean;
    original GRPO: loss_agg_mode="seq-mean-token-mean"; Dr. GRPO: "seq-mean-token-sum-norm".
    ``delta`` (TRL's two-sided clip, INTELLECT-2): the unclipped ratio is capped at delta for every advantage
    (None: no cap); ``off_policy_mask_threshold``, ``top_entropy_quantile`` + ``token_entropy``: TRL's masks
    (``kpo.losses.masks``). TRL's grpo/bnpo/dr_grpo/dapo have no dual clip: pass a ``clip_ratio_c`` above any
    ratio (with ``delta`` set, the dual clip at c >= delta changes nothing).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.2, 0.2)
    check_hparams("> 1", clip_ratio_c=clip_ratio_c)  # the dual-clip bound
    A, m = batch.advantages, batch.mask
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    if delta is not None:
        check_hparams("> 0", delta=delta)
    clipped, is_clipped = clipped_surrogate(A, ratio, low, high, None if delta is None else float(delta))
    loss3 = -A * clip_ratio_c
    dual = torch.minimum(clipped, loss3)
    token_loss = torch.where(A < 0, dual, clipped)
    token_loss, extra = apply_trl_masks(
        batch, token_loss, "vanilla", off_policy_mask_threshold, top_entropy_quantile, token_entropy
    )
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean(is_clipped.to(A.dtype), m),
        clipfrac_lower=masked_mean(((clipped > loss3) & (A < 0)).to(A.dtype), m),
        extra=extra,
    )
