"""KPO: the token log-ratio smoothed by a causal Kalman filter before it enters the loss (docs/methods.md section K).

Both variants filter z = sg(log_prob - old_log_prob) with ``kpo.filter.kalman_filter`` (exact, any q/v) and use
the GSPO stop-gradient construction log r~_t = lp_t - sg(lp_t) + sg(rho_t), clamped at 10: value exp(rho_t),
gradient exp(rho_t) * grad lp_t. ``filter_grad=True`` instead lets the gradient flow through the filter
(log r~_t = rho_t(lp), an ablation the paper does not have). ``mask_mode`` says what a masked hole inside a
response does to the filter: "skip" (default: no observation, no time step), "advance" (a time step without
observation), "zero" (observed as 0, the authors' code). ``memory`` sets q from the filter's memory in tokens
(``kpo.filter.memory``) instead of q itself: ``memory=31.25`` is the paper's memory-to-length ratio at 128 tokens.
``memory="auto"`` fits q to each call's detached log-ratios by maximum likelihood (``kpo.filter.fit.fit_q``,
within ``q_min``..``q_max``; no gradient flows through the fit) and filters with it: the metrics ``kpo/q`` and
``kpo/memory_tokens`` report it. A call whose valid log-ratios are all exactly 0 (an on-policy step: every ratio
1) has no q to fit, and the filter's output is 0 whatever q, so it reports neither (a trainer keeps the last).
``p0="steady"`` starts the filter at its steady-state variance, so every gain is K_inf: a constant-gain moving
average of the log-ratios, the filter without its ramp from the prior (an ablation).
"""

from __future__ import annotations

import math

import torch

from kpo.filter import kalman_filter
from kpo.filter.fit import Q_BOUNDS, check_bounds, fit_q
from kpo.filter.memory import filter_memory, q_for_memory, steady_state_variance
from kpo.losses._core import LossBatch, LossTerms, clipped_surrogate, resolve_clip, token_stats
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss

KALMAN_LOSSES = ("kpo", "kpo_unclipped")
PAPER_Q = {"kpo": 1e-6, "kpo_unclipped": 1e-4}  # each variant's q when neither q nor memory is given
_FILTER_DEFAULTS = {"v": 1.0, "p0": 0.0, "x0": 0.0, "mask_mode": "skip"}
STEADY = "steady"  # p0 = the steady-state posterior variance of (q, v)
AUTO = "auto"  # memory fitted to each batch by maximum likelihood (kpo.filter.fit)
FIT_METRICS = ("kpo/q", "kpo/memory_tokens")  # what a call with memory="auto" reports of its fit


def fits_memory(loss: str, loss_kwargs: dict) -> bool:
    """Whether ``loss`` with ``loss_kwargs`` fits its filter's q to each batch (``memory="auto"``)."""
    return loss in KALMAN_LOSSES and loss_kwargs.get("memory") == AUTO


def resolve_q(loss: str, q: float | None, memory: float | str | None, v: float) -> float | None:
    """The q a Kalman loss filters with: ``q``, or the q of ``memory`` tokens (``kpo.filter.memory``), or the
    variant's paper value; None for ``memory="auto"`` (fitted per batch); both given is an error."""
    if memory is None:
        return PAPER_Q[loss] if q is None else q
    if q is not None:
        raise ValueError(f"give q or memory, not both (got q={q!r}, memory={memory!r}): memory sets q")
    if memory == AUTO:
        return None
    if isinstance(memory, str):
        hint = (
            " (memory='matched' is a kpo train / kpo compare setting; through the API pass its number of tokens: "
            "memory=kpo.matched_memory(response_length))"
            if memory == "matched"
            else ""
        )
        raise ValueError(f"memory={memory!r}: give a number of tokens > 0 or {AUTO!r} (fitted per batch){hint}")
    return q_for_memory(memory, v)


def _fitted_q(batch: LossBatch, v: float, q_min: float, q_max: float, fixed: bool) -> tuple[float, dict]:
    """(q, metrics) of ``memory="auto"``: the maximum-likelihood q of the batch's detached log-ratios in units of
    ``v`` (the fit's q is Q/V); for a batch whose valid log-ratios are all 0, any q (its output is 0) and no
    metrics. ``fixed``: memory is not "auto", and q_min / q_max must then be left at their defaults."""
    if fixed:
        if (q_min, q_max) != Q_BOUNDS:
            raise ValueError(f"q_min and q_max bound the fitted q: they apply only with memory={AUTO!r}")
        return math.nan, {}
    check_bounds((q_min, q_max))
    z, m = batch.log_ratio.detach(), batch.mask
    if not bool((z[m] != 0).any()):
        return math.sqrt(q_min * q_max) * v, {}
    ratio = fit_q(z, m, bounds=(q_min, q_max))
    return ratio * v, dict(zip(FIT_METRICS, (ratio, filter_memory(ratio))))


def resolve_p0(p0: float | str, q: float, v: float) -> float:
    """The initial variance: ``p0``, or for ``"steady"`` the steady-state posterior variance of (q, v)."""
    if isinstance(p0, str):
        if p0 != STEADY:
            raise ValueError(
                f"p0={p0!r}: give a variance >= 0 or {STEADY!r} (the steady state: constant gains)"
            )
        return steady_state_variance(q, v)
    return p0


def filter_settings(loss: str, loss_kwargs: dict, *, fitted_q: float | None = None) -> dict:
    """{q, v, p0, x0, mask_mode} that ``loss`` with ``loss_kwargs`` filters with (q resolved from memory, p0 from
    "steady"); a loss without a filter gets KPO's, so its ratios can be analysed as KPO would see them. With
    ``memory="auto"``, ``fitted_q`` (Q/V, :func:`kpo.filter.fit.fit_q` of the batch) is the q."""
    name = loss if loss in KALMAN_LOSSES else "kpo"
    kwargs = loss_kwargs if loss in KALMAN_LOSSES else {}
    out = {k: kwargs.get(k, default) for k, default in _FILTER_DEFAULTS.items()}
    out["q"] = resolve_q(name, kwargs.get("q"), kwargs.get("memory"), out["v"])
    if out["q"] is None:  # memory="auto": the q fitted to the batch at hand
        if fitted_q is None:
            raise ValueError("memory='auto' fits q to each batch: pass the batch's fitted q as fitted_q")
        out["q"] = fitted_q * out["v"]
    out["p0"] = resolve_p0(out["p0"], out["q"], out["v"])
    return out


def dump_settings(loss: str, loss_kwargs: dict, log_ratio: torch.Tensor, mask: torch.Tensor, last_q=None) -> dict:
    """:func:`filter_settings` for a ratio dump of ``log_ratio`` [B, T] (``mask`` bool [B, T]): with
    ``memory="auto"`` the q fitted to these rows (the loss's own where they are one loss call); where every valid
    log-ratio is 0 the filtered ratios are 1 whatever q, and the dump records ``last_q`` (the last fit), or 1."""
    if not fits_memory(loss, loss_kwargs):
        return filter_settings(loss, loss_kwargs)
    moved = bool((log_ratio[mask] != 0).any())
    q = fit_q(log_ratio, mask) if moved else (1.0 if last_q is None else last_q)
    return filter_settings(loss, loss_kwargs, fitted_q=q)


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
    memory: float | str | None = None,
    v: float = 1.0,
    p0: float | str = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
    filter_grad: bool = False,
    q_min: float = Q_BOUNDS[0],
    q_max: float = Q_BOUNDS[1],
) -> LossTerms:
    """KPO-clipped: L_t = max(-A r~_t, -A clip(r~_t, 1 - eps_low, 1 + eps_high)), ratio-space clip.

    Paper defaults: eps_low = 3e-4, eps_high = 4e-4, q = 1e-6 (memory 1000 tokens), v = 1, p0 = 0, x0 = 0,
    seq-mean-token-mean. ``memory="auto"``: q fitted to the batch within q_min..q_max (units of v).
    """
    low, high = resolve_clip(clip_ratio, clip_ratio_low, clip_ratio_high, 3e-4, 4e-4)
    q = resolve_q("kpo", q, memory, v)
    fitted_q, fit_metrics = _fitted_q(batch, v, q_min, q_max, fixed=q is not None)
    log_r, rho = _filtered_log_ratio(batch, fitted_q if q is None else q, v, p0, x0, mask_mode, filter_grad)
    A, m = batch.advantages, batch.mask
    token_loss, is_clipped = clipped_surrogate(A, torch.exp(log_r), low, high)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean(is_clipped.to(A.dtype), m),
        extra=token_stats("filtered_ratio", torch.exp(rho.clamp(max=10.0)), m) | fit_metrics,
    )


@register_loss("kpo_unclipped", default_agg="seq-mean-token-mean")
def kpo_unclipped(
    batch: LossBatch,
    *,
    q: float | None = None,
    memory: float | str | None = None,
    v: float = 1.0,
    p0: float | str = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
    filter_grad: bool = False,
    q_min: float = Q_BOUNDS[0],
    q_max: float = Q_BOUNDS[1],
) -> LossTerms:
    """KPO-unclipped: L_t = -A r~_t. Paper defaults: q = 1e-4 (memory 100 tokens), v = 1, seq-mean-token-mean.
    ``memory="auto"``: q fitted to the batch within q_min..q_max (units of v)."""
    q = resolve_q("kpo_unclipped", q, memory, v)
    fitted_q, fit_metrics = _fitted_q(batch, v, q_min, q_max, fixed=q is not None)
    log_r, rho = _filtered_log_ratio(batch, fitted_q if q is None else q, v, p0, x0, mask_mode, filter_grad)
    return LossTerms(
        token_loss=-batch.advantages * torch.exp(log_r),
        extra=token_stats("filtered_ratio", torch.exp(rho.clamp(max=10.0)), batch.mask) | fit_metrics,
    )
