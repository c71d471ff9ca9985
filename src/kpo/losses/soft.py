"""Soft (gated or kernel-weighted) losses without hard clipping: SAPO and VESPO (docs/methods.md sections 4, 9)."""

from __future__ import annotations

import math

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, seq_stats
from kpo.losses.masks import apply_trl_masks
from kpo.losses.registry import register_loss


@register_loss("sapo", default_agg="seq-mean-token-mean", agg_modes=("seq-mean-token-mean",))
def sapo(
    batch: LossBatch,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    off_policy_mask_threshold: float | None = None,
    top_entropy_quantile: float = 1.0,
    token_entropy: torch.Tensor | None = None,
) -> LossTerms:
    """L = -A * sigmoid(tau (r - 1)) * 4 / tau, tau = tau_pos where A > 0 else tau_neg; r = exp(clamp(Delta, +-20)).

    The gradient weight A r 4 sigma (1 - sigma) is 1 at r = 1 and decays smoothly away from it. Aggregation is
    fixed to seq-mean-token-mean (verl forces it). The paper asks tau_neg >= tau_pos. TRL's masks:
    ``kpo.losses.masks``.
    """
    check_hparams("> 0", tau_pos=tau_pos, tau_neg=tau_neg)
    A = batch.advantages
    ratio = torch.exp(batch.log_ratio.clamp(-20.0, 20.0))
    tau = torch.where(A > 0, torch.full_like(A, tau_pos), torch.full_like(A, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    token_loss, extra = apply_trl_masks(
        batch, -gate * A, "sapo", off_policy_mask_threshold, top_entropy_quantile, token_entropy
    )
    return LossTerms(token_loss=token_loss, extra=extra)


@register_loss("vespo", default_agg="token-mean", is_weights="consumed")
def vespo(
    batch: LossBatch,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    off_policy_mask_threshold: float | None = None,
    top_entropy_quantile: float = 1.0,
    token_entropy: torch.Tensor | None = None,
) -> LossTerms:
    """L = -sg(phi(W)) A log_prob with the full-product sequence weight W and phi(W) = e^lambda W^k e^(-lambda W).

    log W = clamp(sum_t clamp(Delta, +-20) [+ sum_t log w_t of rollout IS weights], +-20); (k, lambda) by the sign
    of the row's advantage (A >= 0: pos). phi(1) = 1, peak at W = k / lambda; NaN/inf phi -> 0 (as the authors).
    The row's sign comes from its mean advantage over valid tokens (the authors read the first column: the
    same for a sequence-level advantage). Defaults: the authors' code and scripts. TRL's masks:
    ``kpo.losses.masks``.
    """
    check_hparams("> 0", k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)
    m = batch.mask
    log_w = (batch.log_ratio.clamp(-20.0, 20.0) * m).sum(dim=-1)
    if batch.is_weights is not None:
        log_tis = torch.log(batch.is_weights.clamp(min=1e-8)).clamp(-20.0, 20.0)
        log_w = log_w + (log_tis * m).sum(dim=-1)
    log_w = log_w.clamp(-20.0, 20.0).detach()
    w = torch.exp(log_w)
    positive = batch.seq_advantage() >= 0
    k = torch.where(positive, torch.full_like(w, k_pos), torch.full_like(w, k_neg))
    lam = torch.where(positive, torch.full_like(w, lambda_pos), torch.full_like(w, lambda_neg))
    # The authors take log(max(W, 1e-8)) in the power term; kept so that values match for W < 1e-8.
    phi = torch.exp(lam + k * log_w.clamp(min=math.log(1e-8)) - lam * w)
    phi = torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)
    token_loss, extra = apply_trl_masks(
        batch,
        -phi.unsqueeze(-1) * batch.advantages * batch.log_prob,
        "vespo",
        off_policy_mask_threshold,
        top_entropy_quantile,
        token_entropy,
    )
    return LossTerms(
        token_loss=token_loss, extra={**seq_stats("seq_ratio", w, m), **seq_stats("phi", phi, m), **extra}
    )
