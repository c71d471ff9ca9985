"""Sequence-ratio losses: GSPO, GSPO-token, LUSPO, GMPO, HolderPO (docs/methods.md sections 2, 3; LUSPO and HolderPO
below)."""

from __future__ import annotations

import math

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams, clipped_surrogate, resolve_clip, seq_stats
from kpo.losses.aggregation import SEQ_AGG_MODE, masked_mean
from kpo.losses.masks import apply_trl_masks
from kpo.losses.registry import register_loss


def _gspo_terms(batch: LossBatch, clip_ratio, clip_ratio_low, clip_ratio_high, cap=None) -> LossTerms:
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 3e-4, 4e-4)
    lp, A, m = batch.log_prob, batch.advantages, batch.mask
    log_s = (batch.log_ratio * m).sum(dim=-1) / batch.lengths.clamp(min=1)
    # log s_{i,t} = sg[log s_i] + lp_t - sg[lp_t]: value s_i, gradient s_i * grad lp_t.
    log_st = (lp - lp.detach() + log_s.detach().unsqueeze(-1)).clamp(max=10.0)
    token_loss, is_clipped = clipped_surrogate(A, torch.exp(log_st), low, high, cap)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean(is_clipped.to(A.dtype), m),
        extra=seq_stats("seq_ratio", torch.exp(log_s), m),
    )


@register_loss("gspo", default_agg="seq-mean-token-mean")
def gspo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> LossTerms:
    """GSPO: s_i = exp(mean_t Delta) (geometric mean of token ratios), L = max(-A s, -A clip(s, 1-eps_l, 1+eps_h)).

    Built per token as verl does (log s_{i,t} = sg[log s_i] + lp - sg[lp], clamped at 10), which with
    seq-mean-token-mean (the default, the paper's 1/G sum_i) is the paper's sequence loss in value and
    gradient. The advantage must be one value per sequence (use ``gspo_token`` for token-level advantages).
    Paper defaults eps_l = 3e-4, eps_h = 4e-4. No dual clip.
    """
    A, m = batch.advantages, batch.mask
    rows = m.any(dim=-1)
    spread = torch.where(m, A, A.new_tensor(-math.inf)).amax(-1) - torch.where(
        m, A, A.new_tensor(math.inf)
    ).amin(-1)
    if bool((rows & (spread > 0)).any()):
        row = int((rows & (spread > 0)).nonzero()[0])
        raise ValueError(
            f"gspo needs one advantage per sequence but row {row} varies over its tokens; use 'gspo_token' "
            f"for token-level advantages"
        )
    return _gspo_terms(batch, clip_ratio, clip_ratio_low, clip_ratio_high)


@register_loss("gspo_token", default_agg="seq-mean-token-mean")
def gspo_token(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> LossTerms:
    """GSPO-token: GSPO's per-token construction with a token-level advantage A_{i,t} (identical to ``gspo``
    when the advantage is per sequence). Same defaults."""
    return _gspo_terms(batch, clip_ratio, clip_ratio_low, clip_ratio_high)


@register_loss("luspo", default_agg="seq-mean-token-sum", agg_modes=("seq-mean-token-sum",))
def luspo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    delta: float | None = None,
    off_policy_mask_threshold: float | None = None,
    top_entropy_quantile: float = 1.0,
    token_entropy: torch.Tensor | None = None,
) -> LossTerms:
    """LUSPO (arXiv 2602.05261; TRL ``loss_type="luspo"``): GSPO's sequence loss scaled by the row's length.

    Per row |y_i| max(-A s_i, -A clip(s_i, 1-eps_l, 1+eps_h)), s_i = exp(mean_t Delta), averaged over rows:
    GSPO's per-token construction summed over tokens, so the aggregation is fixed to seq-mean-token-sum (TRL
    sums over tokens and averages over its rows). ``delta`` caps s in the unclipped branch (TRL's two-sided
    clip); ``off_policy_mask_threshold``, ``top_entropy_quantile`` + ``token_entropy``: ``kpo.losses.masks``.
    Defaults eps = GSPO's 3e-4 / 4e-4 (LUSPO modifies GSPO; TRL's own default is 0.2).
    """
    if delta is not None:
        check_hparams("> 0", delta=delta)
    terms = _gspo_terms(
        batch, clip_ratio, clip_ratio_low, clip_ratio_high, None if delta is None else float(delta)
    )
    terms.token_loss, masked = apply_trl_masks(
        batch, terms.token_loss, "luspo", off_policy_mask_threshold, top_entropy_quantile, token_entropy
    )
    terms.extra |= masked
    return terms


@register_loss(
    "gmpo",
    aliases=("geo_mean",),
    default_agg=SEQ_AGG_MODE,
    agg_modes=(SEQ_AGG_MODE,),
    is_weights="seq_geo_mean",
)
def gmpo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> LossTerms:
    """GMPO: per-row loss -mean_t(A) * exp(mean_t Delta*), Delta* clipped in log space by the sign of A:
    A > 0 caps Delta at eps_high, A < 0 floors it at -eps_low (no stop-gradient; clipped tokens get no gradient).

    Reduced by a plain mean over sequences (verl ignores loss_agg_mode here). Paper defaults eps = 0.4 (ratio
    range e^+-0.4). Clip metrics as verl: log-clip hits among A > 0 tokens (pg_clipfrac) and A < 0 tokens
    (pg_clipfrac_lower), whichever branch was selected.
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.4, 0.4)
    A, m = batch.advantages, batch.mask
    delta = batch.log_ratio
    sign = torch.sign(A)
    delta_clamped = delta.clamp(-low, high)
    delta_star = sign * torch.minimum(sign * delta, sign * delta_clamped)
    lengths = batch.lengths.clamp(min=1)
    rho = torch.exp((delta_star * m).sum(dim=-1) / lengths)
    seq_loss = -batch.seq_advantage() * rho
    hit = delta != delta_clamped
    return LossTerms(
        seq_loss=seq_loss,
        clipfrac=masked_mean((hit & (A > 0)).to(A.dtype), m),
        clipfrac_lower=masked_mean((hit & (A < 0)).to(A.dtype), m),
        extra=seq_stats("seq_ratio", rho, m),
    )


@register_loss("holder", default_agg=SEQ_AGG_MODE, agg_modes=(SEQ_AGG_MODE,), is_weights="seq_geo_mean")
def holder(
    batch: LossBatch,
    *,
    p: float = 1.0,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> LossTerms:
    """HolderPO (arXiv 2605.12058; authors' ``train_zero_math_holder.py``, variant ``holder``).

    s_i = ( (1/|y_i|) sum_t r_t^p )^(1/p), the Holder (power) mean of the token ratios: p = 1 arithmetic,
    p -> 0 geometric (|p| < 1e-6 uses exp(mean Delta), i.e. GSPO's ratio), p = -1 harmonic. Per-row loss
    max(-A s, -A clip(s, 1-eps_l, 1+eps_h)), reduced by a mean over sequences; the gradient flows through s
    (no stop-gradient). Computed in log space, log s = (logsumexp_t(p Delta) - log|y|) / p, so large ratios do
    not overflow. Defaults: the authors' code (p = 1, eps = 0.2); their runs schedule p from 2 down to -2 over
    training, which a trainer does by passing the current p.
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 0.2, 0.2)
    if not math.isfinite(p):
        raise ValueError(f"p must be finite, got {p!r}")
    m = batch.mask
    lengths = batch.lengths.clamp(min=1)
    delta = batch.log_ratio
    if abs(p) < 1e-6:
        log_s = (delta * m).sum(dim=-1) / lengths
    else:
        scaled = torch.where(m, p * delta, delta.new_tensor(-math.inf))
        lse = torch.logsumexp(scaled, dim=-1)
        # An empty row has logsumexp = -inf; give it s = 1 (its loss is dropped by the aggregation anyway).
        lse = torch.where(m.any(dim=-1), lse, torch.zeros_like(lse))
        log_s = (lse - torch.log(lengths)) / p
    s = torch.exp(log_s)
    seq_loss, is_clipped = clipped_surrogate(batch.seq_advantage(), s, low, high)
    clipped_rows = is_clipped.to(s.dtype).unsqueeze(-1).expand_as(delta)
    return LossTerms(
        seq_loss=seq_loss,
        clipfrac=masked_mean(clipped_rows, m),
        extra=seq_stats("seq_ratio", s, m),
    )
