"""KPO: the token log-ratio smoothed by a causal Kalman filter before it enters the loss (METHODS.md section K).

Both variants filter z = sg(log_prob - old_log_prob) with ``kpo.filter.kalman_filter`` (exact, any q/v) and use
the GSPO stop-gradient construction log r~_t = lp_t - sg(lp_t) + sg(rho_t), clamped at 10: value exp(rho_t),
gradient exp(rho_t) * grad lp_t. ``filter_grad=True`` instead lets the gradient flow through the filter
(log r~_t = rho_t(lp), an ablation the paper does not have). ``mask_mode`` says what a masked hole inside a
response does to the filter: "skip" (default: no observation, no time step), "advance" (a time step without
observation), "zero" (observed as 0, the authors' code). ``memory`` sets q from the filter's memory in tokens
(``kpo.filter.memory``) instead of q itself: ``memory=31.25`` is the paper's memory-to-length ratio at 128 tokens.
``p0="steady"`` starts the filter at its steady-state variance, so every gain is K_inf: a constant-gain moving
average of the log-ratios, the filter without its ramp from the prior (an ablation).
"""

from __future__ import annotations

import torch

from kpo.filter import kalman_filter
from kpo.filter.memory import q_for_memory, steady_state_variance
from kpo.losses._core import LossBatch, LossTerms, clipped_surrogate, resolve_clip, token_stats
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss

KALMAN_LOSSES = ("kpo", "kpo_unclipped")
PAPER_Q = {"kpo": 1e-6, "kpo_unclipped": 1e-4}  # each variant's q when neither q nor memory is given
_FILTER_DEFAULTS = {"v": 1.0, "p0": 0.0, "x0": 0.0, "mask_mode": "skip"}
STEADY = "steady"  # p0 = the steady-state posterior variance of (q, v)


def resolve_q(loss: str, q: float | None, memory: float | None, v: float) -> float:
    """The q a Kalman loss filters with: ``q``, or the q of ``memory`` tokens (``kpo.filter.memory``), or the
    variant's paper value; both given is an error."""
    if memory is None:
        return PAPER_Q[loss] if q is None else q
    if q is not None:
        raise ValueError(f"give q or memory, not both (got q={q!r}, memory={memory!r}): memory sets q")
    return q_for_memory(memory, v)


def resolve_p0(p0: float | str, q: float, v: float) -> float:
    """The initial variance: ``p0``, or for ``"steady"`` the steady-state posterior variance of (q, v)."""
    if isinstance(p0, str):
        if p0 != STEADY:
            raise ValueError(
                f"p0={p0!r}: give a variance >= 0 or {STEADY!r} (the steady state: constant gains)"
            )
        return steady_state_variance(q, v)
    return p0


def filter_settings(loss: str, loss_kwargs: dict) -> dict:
    """{q, v, p0, x0, mask_mode} that ``loss`` with ``loss_kwargs`` filters with (q resolved from memory, p0 from
    "steady"); a loss without a filter gets KPO's, so its ratios can be analysed as KPO would see them."""
    name = loss if loss in KALMAN_LOSSES else "kpo"
    kwargs = loss_kwargs if loss in KALMAN_LOSSES else {}
    out = {k: kwargs.get(k, default) for k, default in _FILTER_DEFAULTS.items()}
    out["q"] = resolve_q(name, kwargs.get("q"), kwargs.get("memory"), out["v"])
    out["p0"] = resolve_p0(out["p0"], out["q"], out["v"])
    return out


def _filtered_log_ratio(
    batch: LossBatch, q, v, p0, x0, mask_mode, filter_grad
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log r~ [B, T] with KPO's gradient, filtered log-ratio rho [B, T] detached); the filter checks q, v, p0."""
    p0 = resolve_p0(p0, q, v)
    if not isinstance(filter_grad, bool):  # a truthy string such as "false" would switch the ablation on
        raise ValueError(f"filter_grad must be True or False, got {filter_grad!r}")
    lp, m = batch.log_prob, batch.mask
    z = batch.log_ratio if filter_grad else batch.log_ratio.detach()
    rho = kalman_filter(z, m, q=q, v=v, p0=p0, x0=x0, mask_mode=mask_mode)
    log_r = rho if filter_grad else lp - lp.detach() + rho
    return log_r.clamp(max=10.0), rho.detach()


@register_loss("kpo", default_agg="seq-mean-token-mean")
def kpo(
    batch: LossBatch,
    *,
    clip_ratio: float | None = None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    q: float | None = None,
    memory: float | None = None,
    v: float = 1.0,
    p0: float | str = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
    filter_grad: bool = False,
) -> LossTerms:
    """KPO-clipped: L_t = max(-A r~_t, -A clip(r~_t, 1 - eps_low, 1 + eps_high)), ratio-space clip.

    Paper defaults: eps_low = 3e-4, eps_high = 4e-4, q = 1e-6 (memory 1000 tokens), v = 1, p0 = 0, x0 = 0,
    seq-mean-token-mean.
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 3e-4, 4e-4)
    q = resolve_q("kpo", q, memory, v)
    log_r, rho = _filtered_log_ratio(batch, q, v, p0, x0, mask_mode, filter_grad)
    A, m = batch.advantages, batch.mask
    token_loss, is_clipped = clipped_surrogate(A, torch.exp(log_r), low, high)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean(is_clipped.to(A.dtype), m),
        extra=token_stats("filtered_ratio", torch.exp(rho.clamp(max=10.0)), m),
    )


@register_loss("kpo_unclipped", default_agg="seq-mean-token-mean")
def kpo_unclipped(
    batch: LossBatch,
    *,
    q: float | None = None,
    memory: float | None = None,
    v: float = 1.0,
    p0: float | str = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
    filter_grad: bool = False,
) -> LossTerms:
    """KPO-unclipped: L_t = -A r~_t. Paper defaults: q = 1e-4 (memory 100 tokens), v = 1, seq-mean-token-mean."""
    q = resolve_q("kpo_unclipped", q, memory, v)
    log_r, rho = _filtered_log_ratio(batch, q, v, p0, x0, mask_mode, filter_grad)
    return LossTerms(
        token_loss=-batch.advantages * torch.exp(log_r),
        extra=token_stats("filtered_ratio", torch.exp(rho.clamp(max=10.0)), batch.mask),
    )
