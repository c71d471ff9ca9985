"""Covariance-targeted losses of the entropy-mechanism paper (arXiv 2505.22617; verl ``clip_cov``, ``kl_cov``).

Both rank tokens by cov_t = (A_t - mean A)(log p_t - mean log p), the means over the call's valid tokens, and
treat the few with the largest covariance (the tokens that drive entropy down) apart. The selection depends on
the whole call, as in verl, so a batch split into micro-batches selects per micro-batch. Neither clamps the
log-ratio (verl does not); ``ppo_kl`` is verl's unclamped one.

Shapes: every tensor [B, T] like the loss batch.
"""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, resolve_clip
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss


def _covariance(batch: LossBatch) -> torch.Tensor:
    """cov_t [B, T] over valid tokens (0 elsewhere), detached."""
    A, m, lp = batch.advantages, batch.mask, batch.log_prob.detach()
    cov = (A - masked_mean(A, m)) * (lp - masked_mean(lp, m))
    return torch.where(m, cov, torch.zeros_like(cov))


@register_loss("clip_cov", default_agg="token-mean")
def clip_cov(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> LossTerms:
    """Clip-Cov: PPO's max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), r = exp(Delta), with the loss (and so
    the gradient) of up to max(int(clip_cov_ratio * N), 1) tokens set to 0 (N: valid tokens of the call).

    Candidates: valid tokens that PPO's clip leaves alone and whose cov lies in (clip_cov_lb, clip_cov_ub);
    when there are more than that many, a uniform random subset, drawn as verl does (``torch.randperm`` over
    the candidates in row-major order) from ``generator`` (None: torch's default generator, as verl).
    pg_clipfrac: the tokens zeroed (verl's; PPO-clipped tokens are not counted). Defaults: verl's (eps 0.2).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.2, 0.2)
    check_hparams("> 0", clip_cov_ratio=clip_cov_ratio)
    check_hparams("finite", clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub)
    A, m = batch.advantages, batch.mask
    delta = batch.log_ratio
    ratio = torch.exp(delta)
    unclipped = -A * ratio
    clipped = -A * ratio.clamp(1.0 - low, 1.0 + high)
    cov = _covariance(batch)
    candidates = torch.nonzero(m & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub))
    limit = max(int(clip_cov_ratio * int(m.sum())), 1)
    if len(candidates) > limit:
        device = generator.device if generator is not None else torch.device("cpu")
        order = torch.randperm(len(candidates), generator=generator, device=device).to(candidates.device)
        candidates = candidates[order[:limit]]
    keep = torch.ones_like(A)
    keep[candidates[:, 0], candidates[:, 1]] = 0.0
    return LossTerms(
        token_loss=torch.maximum(unclipped, clipped) * keep,
        clipfrac=masked_mean((keep == 0).to(A.dtype), m),
        extra={"ppo_kl": masked_mean(-delta.detach(), m)},
    )


@register_loss("kl_cov", default_agg="token-mean")
def kl_cov(batch: LossBatch, *, kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1) -> LossTerms:
    """KL-Cov: L = -A r, r = exp(Delta) (no clip), plus ppo_kl_coef |Delta| on the max(1, int(kl_cov_ratio * N))
    valid tokens of largest cov (``torch.topk`` over the valid tokens in row-major order, as verl).

    pg_clipfrac: the share of valid tokens penalized (verl reports none); ``ppo_kl``: verl's mean |Delta|.
    Defaults: verl's policy-loss config (ratio 2e-4, coefficient 0.1).
    """
    check_hparams("> 0", kl_cov_ratio=kl_cov_ratio)
    check_hparams(">= 0", ppo_kl_coef=ppo_kl_coef)
    A, m = batch.advantages, batch.mask
    delta = batch.log_ratio
    token_loss = -A * torch.exp(delta)
    penalized = torch.zeros_like(m)
    n_valid = int(m.sum())
    if n_valid:
        k = max(1, int(n_valid * kl_cov_ratio))
        flat = torch.nonzero(m.reshape(-1), as_tuple=True)[0]
        top = torch.topk(_covariance(batch)[m], k, largest=True).indices
        penalized.view(-1)[flat[top]] = True
    token_loss = torch.where(penalized, token_loss + ppo_kl_coef * delta.abs(), token_loss)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean(penalized.to(A.dtype), m),
        extra={"ppo_kl": masked_mean(delta.detach().abs(), m)},
    )
