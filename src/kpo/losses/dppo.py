"""Divergence trust regions on the sampled token: DPPO's Binary-TV and Binary-KL masks (arXiv 2602.04879;
verl ``dppo_tv``, ``dppo_kl``) and CPPO's position-weighted, prefix-budgeted Binary-TV mask (arXiv 2606.10968).

Shapes: every tensor [B, T] like the loss batch. p = exp(log_prob), p_old = exp(old_log_prob) of the sampled
token (masked entries are 0 in log space, so p = 1 there; the mask keeps them out of every sum)."""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, resolve_clip
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss


def _dppo_terms(batch: LossBatch, valid: torch.Tensor, clip_ratio_c: float) -> LossTerms:
    """verl's DPPO loss on a keep-mask ``valid`` (bool [B, T]): -A sg(min(r, c)) log_prob where valid.

    pg_clipfrac: valid tokens the mask drops; pg_clipfrac_lower: kept tokens whose ratio exceeds c (truncated)."""
    check_hparams("> 0", clip_ratio_c=clip_ratio_c)
    A, m = batch.advantages, batch.mask
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    kept = valid.to(A.dtype)
    truncated = ratio.clamp(max=clip_ratio_c).detach()
    return LossTerms(
        token_loss=-A * truncated * batch.log_prob * kept,
        clipfrac=masked_mean(1.0 - kept, m),
        clipfrac_lower=masked_mean((ratio > clip_ratio_c).to(A.dtype) * kept, m),
    )


@register_loss("dppo_tv", default_agg="seq-mean-token-sum-norm")
def dppo_tv(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 10000.0,
) -> LossTerms:
    """DPPO-Binary-TV: keep a token where A > 0 and p - p_old <= clip_ratio_high, or A <= 0 and
    p - p_old >= -clip_ratio_low; L = -A sg(min(r, clip_ratio_c)) log_prob on kept tokens (gradient
    -A min(r, c) grad log p: the ratio-advantage surrogate, truncated importance sampling at c).

    clip_ratio_low/high are TV thresholds here, not ratio bounds (verl's names). Defaults: the DPPO recipe in
    verl's examples (0.15 / 0.15, c = 1e4: no truncation, seq-mean-token-sum-norm).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.15, 0.15)
    shift = torch.exp(batch.log_prob.detach()) - torch.exp(batch.old_log_prob)
    valid = torch.where(batch.advantages > 0, shift <= high, shift >= -low)
    return _dppo_terms(batch, valid, clip_ratio_c)


@register_loss("dppo_kl", default_agg="seq-mean-token-sum-norm")
def dppo_kl(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 10000.0,
) -> LossTerms:
    """DPPO-Binary-KL: KL(Bern(p_old) || Bern(p)) = p_old (log p_old - log p) + (1 - p_old) log((1 - p_old +
    1e-8) / (1 - p + 1e-8)); keep a token where A > 0 and (KL <= clip_ratio_high or p <= p_old), or A <= 0 and
    (KL <= clip_ratio_low or p >= p_old); loss as ``dppo_tv``. Defaults: verl's DPPO recipe (0.05 / 0.05,
    c = 1e4, seq-mean-token-sum-norm).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.05, 0.05)
    lp, olp = batch.log_prob.detach(), batch.old_log_prob
    p, p_old = torch.exp(lp), torch.exp(olp)
    kl = p_old * (olp - lp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(batch.advantages > 0, (kl <= high) | (p <= p_old), (kl <= low) | (p >= p_old))
    return _dppo_terms(batch, valid, clip_ratio_c)


@register_loss("cppo", default_agg="token-mean")
def cppo(
    batch: LossBatch,
    *,
    cppo_delta: float = 0.15,
    cppo_w_min: float = 0.8,
    cppo_delta_b: float = 0.015,
    cppo_budget_quantile: float | None = None,
) -> LossTerms:
    """CPPO (Binary-TV variant): L = -A r M, r = exp(clamp(Delta, +-20)) with its gradient, M the keep-mask.

    Over a row's valid tokens t = 1..T: D_t = |p_t - p_old_t|, w_t = 1 - (1 - w_min)(t - 1)/(T - 1) (1 when
    T = 1), Z_t = w_t D_t, S_{t-1} = sum_{j<t} Z_j, W_{t-1} = sum_{j<t} w_j (every earlier token counts, kept or
    not). M_t = 1 where A_t (r_t - 1) <= 0 (the update moves r back toward 1) or
    Z_t <= min(delta, delta + delta_b W_{t-1} - S_{t-1}); else 0 (paper eq. 8-10, Algorithm 1).
    ``cppo_budget_quantile`` q: the row's budget is clamp(quantile_q(D), delta_b, 2 delta_b) (the paper's Base-
    model calibration uses q = 0.9 with delta_b = 0.02); None: delta_b for every row. Defaults: the paper's
    dense models (delta = 0.15, w_min = 0.8) with its fixed budget 0.015 (post-trained model). The paper's main
    runs score D with a Top-K TV over the vocabulary, which log-probs alone cannot give; this is its Binary-TV
    ablation. pg_clipfrac: masked tokens; ``cppo_budget_masked_fraction``: tokens within delta that the prefix
    budget masked.
    """
    check_hparams("> 0", cppo_delta=cppo_delta, cppo_delta_b=cppo_delta_b)
    if not 0.0 < cppo_w_min <= 1.0:
        raise ValueError(f"cppo_w_min must lie in (0, 1], got {cppo_w_min!r}")
    if cppo_budget_quantile is not None and not 0.0 <= cppo_budget_quantile <= 1.0:
        raise ValueError(f"cppo_budget_quantile must lie in [0, 1] or be None, got {cppo_budget_quantile!r}")
    A, m = batch.advantages, batch.mask
    mf = m.to(A.dtype)
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    with torch.no_grad():
        D = torch.where(m, (torch.exp(batch.log_prob) - torch.exp(batch.old_log_prob)).abs(), 0.0)
        position = torch.cumsum(mf, dim=-1)  # 1-based among valid tokens
        last = (batch.lengths - 1.0).clamp(min=1.0).unsqueeze(-1)
        w = torch.where(m, 1.0 - (1.0 - cppo_w_min) * (position - 1.0) / last, 0.0)
        Z = w * D
        S_prev = torch.cumsum(Z, dim=-1) - Z
        W_prev = torch.cumsum(w, dim=-1) - w
        budget = torch.full_like(A[:, :1], cppo_delta_b)
        if cppo_budget_quantile is not None:
            q = torch.nanquantile(torch.where(m, D, float("nan")), cppo_budget_quantile, dim=-1, keepdim=True)
            budget = torch.nan_to_num(q, nan=cppo_delta_b).clamp(cppo_delta_b, 2.0 * cppo_delta_b)
        prefix = cppo_delta + budget * W_prev - S_prev
        toward = A * (ratio - 1.0) <= 0
        keep = toward | (Z <= torch.clamp(prefix, max=cppo_delta))
        by_budget = m & ~keep & (Z <= cppo_delta)
    return LossTerms(
        token_loss=-A * ratio * keep.to(A.dtype),
        clipfrac=masked_mean((~keep).to(A.dtype), m),
        # a fraction of no token is undefined: left out, as the ratio statistics are
        extra={"cppo_budget_masked_fraction": masked_mean(by_budget.to(A.dtype), m)} if bool(m.any()) else {},
    )
