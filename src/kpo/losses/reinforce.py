"""REINFORCE-form losses, L = -w A log_prob with a detached weight w: CISPO (docs/methods.md section 5), MinPRO, GPG
and DRO (verl ``gpg``, ``dro``). Their values are not objectives (they move with log_prob itself); only their
gradients are meaningful."""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, resolve_clip, token_stats
from kpo.losses.aggregation import masked_mean
from kpo.losses.masks import apply_trl_masks
from kpo.losses.registry import register_loss


@register_loss("cispo", default_agg="token-mean")
def cispo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    off_policy_mask_threshold: float | None = None,
    top_entropy_quantile: float = 1.0,
    token_entropy: torch.Tensor | None = None,
) -> LossTerms:
    """L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log_prob: every token keeps a gradient, weighted by clip(r).

    r = exp(clamp(Delta, +-20)). MiniMax-M1 leaves the lower side open and tunes only eps_high without stating
    it; defaults follow verl's example: eps_low = 10 (no lower bound), eps_high = 0.2 (cap 1.2).
    TRL's masks: ``kpo.losses.masks`` (TRL's own cispo caps r at its epsilon_high itself, not at 1 + eps).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 10.0, 0.2)
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    clipped = ratio.clamp(1.0 - low, 1.0 + high)
    token_loss, extra = apply_trl_masks(
        batch,
        -clipped.detach() * batch.advantages * batch.log_prob,
        "cispo",
        off_policy_mask_threshold,
        top_entropy_quantile,
        token_entropy,
    )
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean((ratio != clipped).to(ratio.dtype), batch.mask),
        extra=extra,
    )


@register_loss("minpro", default_agg="token-mean")
def minpro(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> LossTerms:
    """MinPRO (arXiv 2601.22718): L = -sg(clip(m_t r_t, 1 - eps_low, 1 + eps_high)) A log_prob.

    r_t = exp(clamp(Delta_t, +-20)); m_t = min of r over the valid tokens before t (1 at a row's first valid
    token): a non-cumulative stand-in for the prefix ratio prod_{i<t} r_i, so that one token far off the old
    policy damps the gradient of every token after it. The paper's objective averages over all tokens of the
    group (token-mean). Defaults eps 0.2 / 0.28 (the bounds of a published verl sweep script for minpro; the
    paper's table was not read). Metrics: ``prefix_min_ratio_*`` (m_t over valid tokens).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.2, 0.28)
    m = batch.mask
    log_r = batch.log_ratio.clamp(-20.0, 20.0).detach()
    inf = torch.full_like(log_r[:, :1], float("inf"))
    # exclusive running minimum over valid tokens: padding and holes read as +inf, the first token sees none
    before = torch.cat([inf, torch.where(m, log_r, inf.expand_as(log_r))[:, :-1]], dim=-1)
    log_min = torch.cummin(before, dim=-1).values
    log_min = torch.where(torch.isinf(log_min), torch.zeros_like(log_min), log_min)
    weight = torch.exp(log_min + log_r)
    clipped = weight.clamp(1.0 - low, 1.0 + high)
    return LossTerms(
        token_loss=-clipped * batch.advantages * batch.log_prob,
        clipfrac=masked_mean((weight != clipped).to(weight.dtype), m),
        extra=token_stats("prefix_min_ratio", torch.exp(log_min), m),
    )


@register_loss("gpg", default_agg="token-mean")
def gpg(batch: LossBatch) -> LossTerms:
    """GPG (verl ``gpg``, AMAP-ML/GPG): plain policy gradient L = -A log_prob, no ratio and no clip."""
    return LossTerms(token_loss=-batch.log_prob * batch.advantages)


@register_loss("dro", default_agg="token-mean")
def dro(batch: LossBatch, *, dro_beta: float = 0.05) -> LossTerms:
    """DRO (verl ``dro``): L = -(A log_prob - beta/2 Delta^2), a policy gradient with a quadratic penalty on the
    unclamped log-ratio Delta. verl has no default for beta (``policy_loss.dro_beta`` must be set); kpo's 0.05
    is the value of the usage example in the verl pull request that added the loss. ``ppo_kl`` is verl's: the
    mean of -Delta unclamped."""
    check_hparams("> 0", dro_beta=dro_beta)
    delta = batch.log_ratio
    return LossTerms(
        token_loss=-(batch.log_prob * batch.advantages - 0.5 * dro_beta * delta.square()),
        extra={"ppo_kl": masked_mean(-delta.detach(), batch.mask)},
    )
