"""The filter's noise ratio q = Q/V fitted to the data by maximum likelihood (``memory="auto"``).

KPO's filter is the Kalman filter of a local-level model: a level that walks (variance Q a token) observed with
noise (variance V). Its one free constant, q = Q/V, is identifiable from the innovations e_t = z_t - x_{t-1}
(the log-ratio minus the filter's prediction), whose Gaussian likelihood is the textbook way to fit a Kalman
filter (Harvey 1989, ch. 3; Durbin and Koopman 2012, ch. 7). With V scaled out, innovation t has variance
V f_t, f_t = p_{t-1} + q + 1 = 1 / (1 - K_t), so V's maximum is the mean of e_t^2 / f_t and the concentrated
log-likelihood of the N valid tokens of a batch is

    l(q) = -1/2 [ N (log 2 pi + 1 + log Vhat(q)) + sum_t log f_t ],   Vhat(q) = (1/N) sum_t e_t^2 / f_t.

The model is exactly KPO's filter: x0 = 0 and p0 = 0 (the level starts known at ratio 1), masked tokens skipped
(no observation, no time step), every row an independent sequence sharing one q. :func:`fit_q` maximizes l over
log q in float64: a grid, then golden-section search in the grid's best bracket, each point one pass of the
filter's torch scan in float64 (the package's dispatcher imports this module, so the scan is called directly).
``reference.py`` has the likelihood as a token-by-token loop, the oracle of :func:`local_level_loglik`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kpo._checks import bool_mask
from kpo.filter import scan
from kpo.filter.gains import check_params, gain_tables

__all__ = ["Q_BOUNDS", "check_bounds", "fit_q", "local_level_loglik"]

# Memory from about 10,000 tokens (q = 1e-8) to under one token (q = 100: gain 0.99, the token ratio itself).
Q_BOUNDS = (1e-8, 1e2)
_GRID_PER_DECADE = 3  # coarse grid in log q; the golden-section search then refines within one grid step
_TOL_LOG_Q = 1e-4  # stop when the bracket in ln q is this narrow (q to 1e-4 relative: l(q) is flat there)
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


class _Innovations:
    """What the likelihood of one batch needs, whatever q: the valid log-ratios in row order (float64 [N]), each
    one's index among its row's valid tokens (int [N]), the flat position of the valid token before it in its
    row (int [N], -1 for a row's first), and the batch as the filter takes it."""

    def __init__(self, log_ratio: torch.Tensor, mask: torch.Tensor | None):
        z = log_ratio.detach().to(device="cpu", dtype=torch.float64)
        z = z.reshape(1, -1) if z.dim() == 1 else z
        m = torch.ones_like(z, dtype=torch.bool) if mask is None else bool_mask(mask).cpu().reshape(z.shape)
        self.z, self.mask = z.contiguous(), m.contiguous()
        flat = m.reshape(-1).numpy()
        self.values = z.reshape(-1).numpy()[flat]
        steps = np.cumsum(m.numpy(), axis=1) - 1  # [B, T] valid tokens before each one in its row
        self.index = steps.reshape(-1)[flat]
        positions = np.flatnonzero(flat)
        self.previous = np.where(self.index > 0, np.concatenate(([-1], positions[:-1])), -1)
        self.longest = int(self.index.max()) + 1 if self.index.size else 0

    def loglik(self, q: float) -> float:
        """The concentrated log-likelihood l(q) of the batch (float64)."""
        x = scan.forward(self.z, self.mask, "skip", q, 1.0, 0.0, 0.0)[0].reshape(-1).numpy()
        prediction = np.where(self.previous >= 0, x[np.maximum(self.previous, 0)], 0.0)
        _, keep = gain_tables(self.longest, q, 1.0, 0.0)
        keep = keep[self.index]  # 1 - K_t = 1 / f_t
        n = self.values.size
        v_hat = float(np.dot((self.values - prediction) ** 2, keep)) / n
        return -0.5 * (n * (math.log(2.0 * math.pi) + 1.0 + math.log(v_hat)) - float(np.log(keep).sum()))


def _check(log_ratio, mask) -> None:
    if not isinstance(log_ratio, torch.Tensor) or not log_ratio.is_floating_point():
        raise TypeError(f"log_ratio must be a floating-point torch tensor [B, T] or [T], got {type(log_ratio)}")
    if log_ratio.dim() not in (1, 2):
        raise ValueError(f"log_ratio must be [B, T] or [T], got shape {tuple(log_ratio.shape)}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != log_ratio.shape):
        raise ValueError(
            f"mask must be a tensor of log_ratio's shape {tuple(log_ratio.shape)} (bool or 0/1), got "
            f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}"
        )


def _prepared(log_ratio, mask) -> _Innovations:
    """The batch's innovations' inputs; ValueError when q is not identifiable from it."""
    _check(log_ratio, mask)
    data = _Innovations(log_ratio, mask)
    if data.values.size < 2:
        raise ValueError(
            f"fit_q needs at least 2 valid tokens, got {data.values.size}: with one observation the likelihood does "
            "not depend on q"
        )
    if not np.isfinite(data.values).all():
        bad = int((~np.isfinite(data.values)).sum())
        raise ValueError(f"log_ratio has {bad} NaN/Inf value(s) at valid positions; mask them or fix them upstream")
    if not data.values.any():
        raise ValueError(
            "every valid log-ratio is exactly 0 (an on-policy step: the ratios are 1): the likelihood has no "
            "scale and q is not identifiable; the filter's output is 0 whatever q, so keep the last fitted q"
        )
    return data


def local_level_loglik(log_ratio: torch.Tensor, mask: torch.Tensor | None = None, *, q: float) -> float:
    """The concentrated log-likelihood l(q) of the local-level model behind KPO's filter (module docstring).

    log_ratio: [B, T] or [T] token log-ratios (rows: independent sequences); mask: same shape, bool or 0/1.
    """
    check_params(q, 1.0, 0.0)
    return _prepared(log_ratio, mask).loglik(float(q))


def fit_q(
    log_ratio: torch.Tensor, mask: torch.Tensor | None = None, *, bounds: tuple[float, float] = Q_BOUNDS
) -> float:
    """The maximum-likelihood q = Q/V of the batch under KPO's filter (x0 = 0, p0 = 0, masked tokens skipped),
    V concentrated out; searched in float64 over log q within ``bounds`` (a maximum at a bound returns it).

    log_ratio: [B, T] or [T] log importance ratios (detached; rows share one q); mask: same shape, bool or 0/1.
    ValueError when q is not identifiable: fewer than 2 valid tokens, or every valid log-ratio exactly 0.
    """
    low, high = check_bounds(bounds)
    data = _prepared(log_ratio, mask)
    f = lambda u: data.loglik(math.exp(u))  # noqa: E731 - the search runs in u = ln q
    a, b = math.log(low), math.log(high)
    points = max(2, math.ceil((b - a) / math.log(10.0) * _GRID_PER_DECADE) + 1)
    grid = np.linspace(a, b, points)
    values = [f(u) for u in grid]
    best = int(np.argmax(values))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, points - 1)]
    u_best, f_best = grid[best], values[best]
    # golden-section search for the maximum within the bracket around the grid's best point
    c, d = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > _TOL_LOG_Q:
        if fc >= fd:
            hi, d, fd = d, c, fc
            c = hi - _GOLDEN * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + _GOLDEN * (hi - lo)
            fd = f(d)
    for u, value in ((c, fc), (d, fd)):
        if value > f_best:
            u_best, f_best = u, value
    return min(max(math.exp(u_best), low), high)


def check_bounds(bounds) -> tuple[float, float]:
    """(q_min, q_max) as floats; ValueError unless 0 < q_min < q_max < inf."""
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be two numbers (q_min, q_max), got {bounds!r}") from None
    if not (0 < low < high < math.inf):
        raise ValueError(f"bounds must satisfy 0 < q_min < q_max < inf, got {bounds!r}")
    return low, high
