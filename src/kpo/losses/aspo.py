"""ASPO: asymmetric importance sampling, flipped ratio for positive advantages (docs/methods.md section 6;
authors' ``compute_policy_loss_archer`` in wizard-III/Archer2.0)."""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, resolve_clip
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss


@register_loss("aspo", default_agg="token-mean")
def aspo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    high_entropy_clip_ratio_low: float = 0.4,
    high_entropy_clip_ratio_high: float = 0.4,
    clip_ratio_c: float = 3.0,
    token_entropy: torch.Tensor | None = None,
    entropy_quantile: float = 0.8,
) -> LossTerms:
    """r = exp(clamp(Delta, +-20)); c = clip_ratio_c for both signs.

    A >= 0: p = min(r, 1 + eps_h); L = -A (p / sg p) / sg p (value -A/p, gradient -A (1/r) grad lp: the IS
            weight flips to pi_old/pi; no gradient once r > 1 + eps_h); if 1/p > c: L = -A sg(c) lp.
    A < 0:  n = max(r, 1 - eps_l); L = -A n; if n > c: L = -A sg(c) lp (gradient kept, unlike verl's dual clip).
    eps: tokens whose entropy is at most the row's ``entropy_quantile`` (0.8) use clip_ratio_low/high (0.2), the
    rest high_entropy_clip_ratio_low/high (0.4). ``token_entropy`` [B, T] is the policy's token entropy (e.g.
    ``entropy_from_logits``); without it every token uses the low-entropy bounds.
    pg_clipfrac: tokens whose ratio was clamped; pg_clipfrac_lower: tokens in either dual-clip branch.
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.2, 0.2)
    check_hparams(
        ">= 0",
        high_entropy_clip_ratio_low=high_entropy_clip_ratio_low,
        high_entropy_clip_ratio_high=high_entropy_clip_ratio_high,
    )
    check_hparams("> 1", clip_ratio_c=clip_ratio_c)
    if not 0.0 <= entropy_quantile <= 1.0:
        raise ValueError(f"entropy_quantile must lie in [0, 1], got {entropy_quantile!r}")
    A, m, lp = batch.advantages, batch.mask, batch.log_prob
    if token_entropy is None:
        low_entropy = torch.ones_like(m)
    else:
        if not isinstance(token_entropy, torch.Tensor) or token_entropy.shape != m.shape:
            raise ValueError(
                f"token_entropy must be a [B, T] tensor like log_prob, got {getattr(token_entropy, 'shape', token_entropy)}"
            )
        ent = torch.where(m, token_entropy.detach().to(lp.dtype), torch.full_like(lp, float("nan")))
        threshold = torch.nanquantile(ent, entropy_quantile, dim=-1, keepdim=True)
        low_entropy = ent <= threshold
    eps_low = torch.where(
        low_entropy, torch.full_like(lp, low), torch.full_like(lp, high_entropy_clip_ratio_low)
    )
    eps_high = torch.where(
        low_entropy, torch.full_like(lp, high), torch.full_like(lp, high_entropy_clip_ratio_high)
    )
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    neg = torch.maximum(ratio, 1.0 - eps_low)
    pos = torch.minimum(ratio, 1.0 + eps_high)
    c = torch.full_like(lp, clip_ratio_c)
    neg_dual = neg > c
    pos_dual = 1.0 / pos > c
    neg_loss = torch.where(neg_dual, -A * c * lp, -A * neg)
    pos_loss = torch.where(pos_dual, -A * c * lp, -A * (pos / pos.detach()) / pos.detach())
    negative = A < 0
    selected = torch.where(negative, neg, pos)
    dual = torch.where(negative, neg_dual, pos_dual)
    return LossTerms(
        token_loss=torch.where(negative, neg_loss, pos_loss),
        clipfrac=masked_mean((ratio != selected).to(lp.dtype), m),
        clipfrac_lower=masked_mean(dual.to(lp.dtype), m),
    )
