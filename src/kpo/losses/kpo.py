"""KPO: the token log-ratio smoothed by a causal Kalman filter before it enters the loss (docs/methods.md section K).

Both variants filter z = sg(log_prob - old_log_prob) with ``kpo.filter.kalman_filter`` (exact, any q/v) and use
the GSPO stop-gradient construction log r~_t = lp_t - sg(lp_t) + sg(rho_t), clamped at 10: value exp(rho_t),
gradient exp(rho_t) * grad lp_t. ``filter_grad=True`` instead lets the gradient flow through the filter
(log r~_t = rho_t(lp), an ablation the paper does not have). ``mask_mode`` says what a masked hole inside a
response does to the filter: "skip" (default: no observation, no time step), "advance" (a time step without
observation), "zero" (observed as 0, the authors' code). ``memory`` sets q from the filter's memory in tokens
(``kpo.filter.memory``) instead of q itself: ``memory=31.25`` is the paper's memory-to-length ratio at 128 tokens.
``memory="auto"`` fits q by maximum likelihood to the detached log-ratios (``kpo.filter.fit``, within
``q_min``..``q_max``, under the call's own p0, x0 and mask_mode; no gradient flows through the fit) and filters
with it; the metrics ``kpo/q``, ``kpo/memory_tokens``, ``kpo/q_low``/``kpo/q_high`` (its 95% likelihood-ratio
interval) and ``kpo/q_stale`` report it. Called directly, the loss fits its own batch; a batch that does not
identify q (fewer than 2 tokens, ratios all 1, a flat likelihood) is filtered at the variant's paper q, with
``kpo/q_stale`` 1. ``kpo train`` and the verl plugin instead fit one q per optimizer step over every
micro-batch and process (:class:`kpo.filter.fit.StepFit`, :func:`step_fit`) and call the loss with that q fixed
(:func:`fixed_q_kwargs`).
``p0="steady"`` starts the filter at its steady-state variance, so every gain is K_inf: a constant-gain moving
average of the log-ratios, the filter without its ramp from the prior (an ablation).
"""

from __future__ import annotations

import math

import torch

from kpo.filter import kalman_filter
from kpo.filter.fit import Q_BOUNDS, Fit, Likelihood, NotIdentified, StepFit, check_bounds, fit_metrics
from kpo.filter.gains import check_params
from kpo.filter.memory import q_for_memory, steady_state_variance
from kpo.losses._core import LossBatch, LossTerms, clipped_surrogate, resolve_clip, token_stats
from kpo.losses.aggregation import masked_mean
from kpo.losses.registry import register_loss

KALMAN_LOSSES = ("kpo", "kpo_unclipped")
PAPER_Q = {"kpo": 1e-6, "kpo_unclipped": 1e-4}  # each variant's q when neither q nor memory is given
_FILTER_DEFAULTS = {"v": 1.0, "p0": 0.0, "x0": 0.0, "mask_mode": "skip"}
STEADY = "steady"  # p0 = the steady-state posterior variance of (q, v)
AUTO = "auto"  # memory fitted by maximum likelihood (kpo.filter.fit)
_FIT_KEYS = ("memory", "q_min", "q_max")  # what memory="auto" adds to a loss's keywords


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
            " (memory='matched' is resolved where the response length is known: kpo train, kpo compare and "
            "kpo.train.KPOConfig; to the loss itself pass its number of tokens: memory=kpo.matched_memory(length))"
            if memory == "matched"
            else ""
        )
        raise ValueError(f"memory={memory!r}: give a number of tokens > 0 or {AUTO!r} (fitted per batch){hint}")
    return q_for_memory(memory, v)


def _fit_settings(v, p0, x0, mask_mode, q_min, q_max) -> dict:
    """The settings of the fit (``kpo.filter.fit.Likelihood``) of a filter with these: p0 in units of v."""
    check_params(1.0, v, 0.0)
    resolve_p0(p0, 1.0, 1.0)  # a string other than "steady" is refused with the filter's own message
    return {
        "bounds": check_bounds((q_min, q_max)),
        "p0": p0 if p0 == STEADY else p0 / v,
        "x0": x0,
        "mask_mode": mask_mode,
    }


def _fitted_q(batch: LossBatch, loss: str, fixed: bool, *filter_and_bounds) -> tuple[float, dict]:
    """(q, metrics) of ``memory="auto"`` called on one batch: the maximum-likelihood q (Q/V) of its detached
    log-ratios under the filter's settings (``filter_and_bounds``: v, p0, x0, mask_mode, q_min, q_max), or the
    variant's paper q where the batch does not identify q. ``fixed``: memory is not "auto", and q_min / q_max
    must then be left at their defaults (then (nan, {}))."""
    if fixed:
        if tuple(filter_and_bounds[-2:]) != Q_BOUNDS:
            raise ValueError(f"q_min and q_max bound the fitted q: they apply only with memory={AUTO!r}")
        return math.nan, {}
    try:
        fit = Likelihood(**_fit_settings(*filter_and_bounds)).add(batch.log_ratio.detach(), batch.mask).fit()
        stale = False
    except NotIdentified:
        fit, stale = Fit(PAPER_Q[loss], math.nan, math.nan), True
    return fit.q, fit_metrics(fit, stale)


def step_fit(
    loss: str, loss_kwargs: dict, fallback_q: float, *, steps_per_batch: int | None, reduce=None
) -> StepFit:
    """The :class:`~kpo.filter.fit.StepFit` of ``loss`` with ``loss_kwargs`` (``memory="auto"``): its bounds
    and filter settings, ``fallback_q`` (Q/V) until a step identifies q, the optimizer steps of a generation batch
    (``steps_per_batch``: the first of each is on-policy and not fitted) and ``reduce`` (the sum over the
    processes holding different data; None: every process)."""
    kwargs = {k: loss_kwargs.get(k, d) for k, d in _FILTER_DEFAULTS.items()}
    bounds = (loss_kwargs.get("q_min", Q_BOUNDS[0]), loss_kwargs.get("q_max", Q_BOUNDS[1]))
    settings = _fit_settings(kwargs["v"], kwargs["p0"], kwargs["x0"], kwargs["mask_mode"], *bounds)
    return StepFit(**settings, fallback_q=fallback_q, steps_per_batch=steps_per_batch, reduce=reduce)


def add_to_fit(fit: StepFit, log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor) -> None:
    """Give ``fit`` a micro-batch's log-ratios as the loss computes them (float32 at least), [B, T] each."""
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    fit.add(log_prob.detach().to(dtype) - old_log_prob.detach().to(dtype), mask)


def fixed_q_kwargs(loss_kwargs: dict, q: float) -> dict:
    """``loss_kwargs`` of ``memory="auto"`` with the fit's q (Q/V) fixed instead: the loss of those keywords is
    the fixed-q loss at that q."""
    kwargs = {k: value for k, value in loss_kwargs.items() if k not in _FIT_KEYS}
    kwargs["q"] = q * kwargs.get("v", _FILTER_DEFAULTS["v"])
    return kwargs


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
    ``memory="auto"``, ``fitted_q`` (Q/V: the q the loss filtered with) is the q."""
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
    fitted_q, fitted = _fitted_q(batch, "kpo", q is not None, v, p0, x0, mask_mode, q_min, q_max)
    log_r, rho = _filtered_log_ratio(batch, fitted_q * v if q is None else q, v, p0, x0, mask_mode, filter_grad)
    A, m = batch.advantages, batch.mask
    token_loss, is_clipped = clipped_surrogate(A, torch.exp(log_r), low, high)
    return LossTerms(
        token_loss=token_loss,
        clipfrac=masked_mean(is_clipped.to(A.dtype), m),
        extra=token_stats("filtered_ratio", torch.exp(rho.clamp(max=10.0)), m) | fitted,
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
    fitted_q, fitted = _fitted_q(batch, "kpo_unclipped", q is not None, v, p0, x0, mask_mode, q_min, q_max)
    log_r, rho = _filtered_log_ratio(batch, fitted_q * v if q is None else q, v, p0, x0, mask_mode, filter_grad)
    return LossTerms(
        token_loss=-batch.advantages * torch.exp(log_r),
        extra=token_stats("filtered_ratio", torch.exp(rho.clamp(max=10.0)), batch.mask) | fitted,
    )
