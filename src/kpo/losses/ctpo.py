"""CTPO: cumulative-token (prefix) importance ratio with position-adaptive log-space clipping
(docs/methods.md section 7; authors' horizon-llm/CTPO, loss ``cum-token-cumprod-la``)."""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, LossTerms, check_hparams
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss

RATIO_MODES = ("cumprod", "geomean")


@register_loss("ctpo", default_agg="token-mean")
def ctpo(
    batch: LossBatch,
    *,
    la_clip_low: float = 0.025,
    la_clip_high: float = 0.05,
    la_clip_c: float = 0.05,
    clip_ratio_la_power: float = 0.5,
    ratio_mode: str = "cumprod",
) -> LossTerms:
    """S_t = sum_{j<=t} clamp(Delta_j, +-20) over valid tokens (``geomean``: S_t / t), t = 1-based valid position.

    log rho_t = sg(S_t) + lp_t - sg(lp_t), clamped at 10: value = prefix product of ratios, gradient only through
    the current token. Bounds scale with t^power in log space: rho~ = exp(clamp(log rho, -c_l t^p, c_h t^p));
    L = max(-A rho, -A rho~); where A < 0 then min(L, -A exp(c_c t^p)) (dual clip).
    Defaults (authors' ctpo.sh): c_l = 0.025, c_h = 0.05, c_c = 0.05, p = 0.5, cumprod (use p = -0.5 with geomean).
    """
    if ratio_mode not in RATIO_MODES:
        raise ValueError(f"ratio_mode must be one of {RATIO_MODES}, got {ratio_mode!r}")
    check_hparams("> 0", la_clip_low=la_clip_low, la_clip_high=la_clip_high, la_clip_c=la_clip_c)
    check_hparams("finite", clip_ratio_la_power=clip_ratio_la_power)
    A, m, lp = batch.advantages, batch.mask, batch.log_prob
    mf = m.to(lp.dtype)
    prefix = torch.cumsum(batch.log_ratio.clamp(-20.0, 20.0) * mf, dim=-1)
    position = torch.cumsum(mf, dim=-1).clamp(min=1.0)
    if ratio_mode == "geomean":
        prefix = prefix / position
    log_rho = (prefix.detach() + lp - lp.detach()).clamp(max=10.0)
    scale = position.pow(clip_ratio_la_power)
    rho = torch.exp(log_rho)
    rho_clipped = torch.exp(torch.maximum(torch.minimum(log_rho, la_clip_high * scale), -la_clip_low * scale))
    loss1 = -A * rho
    loss2 = -A * rho_clipped
    clipped = torch.maximum(loss1, loss2)
    loss3 = -A * torch.exp(la_clip_c * scale)
    token_loss = torch.where(A < 0, torch.minimum(clipped, loss3), clipped)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean((loss2 > loss1).to(lp.dtype), m),
        clipfrac_lower=masked_mean(((clipped > loss3) & (A < 0)).to(lp.dtype), m),
    )
