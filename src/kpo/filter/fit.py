"""The filter's noise ratio q = Q/V fitted to the data by maximum likelihood (``memory="auto"``).

KPO's filter is the Kalman filter of a local-level model: a level that walks (variance Q a token) observed with
noise (variance V). Its one free constant, q = Q/V, is identifiable from the innovations e_t = z_t - x_{t-1}
(the log-ratio minus the filter's prediction), whose Gaussian likelihood is the textbook way to fit a Kalman
filter (Harvey 1989, ch. 3; Durbin and Koopman 2012, ch. 7). With V scaled out, innovation t has variance
V f_t, f_t = p_{t-1} + q + 1 = 1 / (1 - K_t), so V's maximum is the mean of e_t^2 / f_t and the concentrated
log-likelihood of the N observed tokens of a batch is

    l(q) = -1/2 [ N (log 2 pi + 1 + log Vhat(q)) + sum_t log f_t ],   Vhat(q) = (1/N) sum_t e_t^2 / f_t.

The model is the filter the loss applies, with its settings: x0 and p0 (p0 in units of V, or "steady"), the mask
mode (``skip``: a masked token is no time step; ``advance``: a time step without observation, so f_t grows over
a hole; ``zero``: a hole inside a response is an observation of 0), every row an independent sequence sharing
one q.

At a fixed q, N, sum e^2/f and sum log f add over tokens, rows, micro-batches and processes, so l of a whole
optimizer step is a sum over its pieces wherever they lie (:class:`Likelihood`; a trainer all-reduces them over
its ranks). :func:`fit_q` / :meth:`Likelihood.fit` maximize l over log q in float64: a fixed grid (3 points a
decade within the bounds), then golden-section search in the grid's best bracket, each point one float64 pass
over the tokens of every piece, stacked into one batch: the filter's recursion token by token compiled by numba
(the ``fast`` extra), else one pass of the filter's torch scan (the package's dispatcher imports this module, so
the scan is called directly). ``reference.py`` has the likelihood as a token-by-token loop, the oracle of
:func:`local_level_loglik`.

When the data do not identify q (:class:`NotIdentified`, a ValueError): fewer than 2 observed tokens; every
innovation 0 (an on-policy batch: the ratios are 1, and the filter's output is 0 whatever q); or a flat
likelihood, every q in the bounds within the 95% likelihood-ratio interval of the best (one valid token per
row: then l does not depend on q at all). :class:`StepFit` then keeps the last q it had.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np
import torch

from kpo._checks import with_values
from kpo.filter import scan
from kpo.filter.gains import check_params, gain_tables

try:  # optional extra `fast`: the likelihood's token loop compiled; without it, one filter scan a point
    from numba import njit
except ImportError:  # pragma: no cover - exercised only where numba is absent
    njit = None

__all__ = [
    "MASK_MODES_FITTED",
    "Q_BOUNDS",
    "Fit",
    "Likelihood",
    "NotIdentified",
    "StepFit",
    "check_bounds",
    "fit_metrics",
    "fit_q",
    "local_level_loglik",
]

# Memory from about 10,000 tokens (q = 1e-8) to under one token (q = 100: gain 0.99, the token ratio itself).
Q_BOUNDS = (1e-8, 1e2)
MASK_MODES_FITTED = ("skip", "advance", "zero")
_GRID_PER_DECADE = 3  # coarse grid in log q; the golden-section search then refines within one grid step
_TOL_LOG_Q = 1e-4  # stop when the bracket in ln q is this narrow (q to 1e-4 relative: l(q) is flat there)
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_INTERVAL = 1.920729410347062  # half the chi-square(1) 95% quantile: l within this of its maximum is in the interval
_LARGEST = 1e140  # |log-ratio| up to which the float64 squares summed over 1e12 tokens stay finite
_TINY = 1e-280  # a mean squared innovation below this is 0 to float64 precision (its log would be meaningless)
STEADY = "steady"


class NotIdentified(ValueError):
    """The batch's likelihood does not depend on q (too few tokens, no variation, or flat within the bounds)."""


class Fit(NamedTuple):
    """The maximum-likelihood q = Q/V and its 95% likelihood-ratio interval (low, high) on the grid."""

    q: float
    low: float
    high: float


def check_bounds(bounds) -> tuple[float, float]:
    """(q_min, q_max) as floats; ValueError unless two real numbers (not booleans) with 0 < q_min < q_max < inf."""
    try:
        low, high = bounds
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be two numbers (q_min, q_max), got {bounds!r}") from None
    for name, value in (("q_min", low), ("q_max", high)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number > 0, got {type(value).__name__} {value!r}")
    low, high = float(low), float(high)
    if not (0 < low < high < math.inf):
        raise ValueError(f"bounds must satisfy 0 < q_min < q_max < inf, got {bounds!r}")
    return low, high


def _check_settings(p0, x0, mask_mode) -> None:
    if mask_mode not in MASK_MODES_FITTED:
        raise ValueError(f"mask_mode={mask_mode!r}: use one of {', '.join(MASK_MODES_FITTED)}")
    if p0 != STEADY:
        check_params(1.0, 1.0, p0, x0)
    else:
        check_params(1.0, 1.0, 0.0, x0)


def _check(log_ratio, mask) -> None:
    if not isinstance(log_ratio, torch.Tensor):
        raise TypeError(f"log_ratio must be a floating-point torch tensor [B, T] or [T], got {type(log_ratio).__name__}")
    with_values(log_ratio=log_ratio, mask=mask)
    if not log_ratio.is_floating_point():
        raise TypeError(
            f"log_ratio must be a floating-point torch tensor, got dtype {log_ratio.dtype}: pass "
            "log_ratio.double() (a real log-ratio; a complex one has no ordering for the likelihood)"
        )
    if log_ratio.dim() not in (1, 2):
        raise ValueError(f"log_ratio must be [B, T] or [T], got shape {tuple(log_ratio.shape)}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != log_ratio.shape):
        raise ValueError(
            f"mask must be a tensor of log_ratio's shape {tuple(log_ratio.shape)} (bool or 0/1), got "
            f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}"
        )


def _innovation_sums(values, starts, gaps, q, p0, x0):
    """(sum e^2 / f, sum log f) of the observed tokens ``values`` (float64 [N], row after row; ``starts``: bool
    [N], a row's first; ``gaps``: int [N], time steps without observation just before each: advance mode's
    holes) at q, with p0 in units of V: the filter's recursion token by token, the reference loop's arithmetic."""
    squares = 0.0
    log_f = 0.0
    x = x0
    p = p0
    for i in range(values.shape[0]):
        if starts[i]:
            x = x0
            p = p0
        prior = p + q * (gaps[i] + 1)
        f = prior + 1.0
        e = values[i] - x
        squares += e * e / f
        log_f += math.log(f)
        x = x + prior / f * e
        p = prior / f
    return squares, log_f


_compiled_sums = njit(cache=True, nogil=True)(_innovation_sums) if njit is not None else None


def _prepared(log_ratio, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(z float64 [B, T], mask bool [B, T]) on the CPU, with 0 at masked tokens; ValueError for a non-finite or
    overflowing value at a valid token."""
    from kpo._checks import bool_mask

    _check(log_ratio, mask)
    z = log_ratio.detach().to(device="cpu", dtype=torch.float64)
    z = z.reshape(1, -1) if z.dim() == 1 else z
    m = torch.ones_like(z, dtype=torch.bool) if mask is None else bool_mask(mask).cpu().reshape(z.shape)
    values = z[m]
    if not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).sum())
        raise ValueError(f"log_ratio has {bad} NaN/Inf value(s) at valid positions; mask them or fix them upstream")
    largest = float(values.abs().max()) if values.numel() else 0.0
    if largest > _LARGEST:
        raise ValueError(
            f"log_ratio reaches |{largest:.3g}| at a valid token, beyond {_LARGEST:.0e}, where the likelihood's "
            "float64 squares overflow: log-ratios that large mean the two policies do not overlap; check the "
            "log-probs upstream"
        )
    return torch.where(m, z, 0.0), m


def _stacked(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Batches of any widths as one [sum B, max T]: padding after a row's last token changes no innovation."""
    width = max(z.shape[1] for z, _ in parts)
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
    return torch.cat([pad(z) for z, _ in parts]), torch.cat([pad(m) for _, m in parts])


class _Part:
    """One batch's observed tokens as the likelihood needs them, whatever q: the filter's input y (float64 [B, T],
    0 at holes), the observed positions (bool [B, T]), the observed values in row order (float64 [N]), each one's
    index among its row's observed tokens (int [N]) and the flat position of the observed token before it in its
    row (int [N], -1 for a row's first). ``y``, ``mask``: :func:`_prepared`'s."""

    def __init__(self, y: torch.Tensor, m: torch.Tensor, mask_mode: str):
        observed = m
        if mask_mode == "zero":  # a hole before a row's last valid token is an observation of 0
            positions = torch.arange(y.shape[1]).expand_as(m)
            last = torch.where(m, positions, -1).max(dim=1, keepdim=True).values
            observed = positions <= last
        self.mode = "advance" if mask_mode == "advance" else "skip"
        self.mask = m.contiguous()
        self.observed = observed.contiguous()
        self.y = y.contiguous()
        flat = observed.reshape(-1).numpy()
        self.flat = flat
        self.values = self.y.reshape(-1).numpy()[flat]
        steps = np.cumsum(observed.numpy(), axis=1) - 1  # [B, T] observed tokens before each one in its row
        self.index = steps.reshape(-1)[flat]
        positions = np.flatnonzero(flat)
        self.previous = np.where(self.index > 0, np.concatenate(([-1], positions[:-1])), -1)
        self.longest = int(self.index.max()) + 1 if self.index.size else 0
        self.starts = self.index == 0
        self.gaps = np.zeros(self.values.size, dtype=np.int64)
        if self.mode == "advance":  # positions since the row's previous valid token, less one (from 0: leading)
            column = positions % y.shape[1]
            before = np.where(self.starts, -1, np.concatenate(([-1], column[:-1])))
            self.gaps = column - before - 1

    def pieces(self, q: float, p0: float, x0: float, compiled: bool = True) -> tuple[float, float]:
        """(sum e^2 / f, sum log f) of this part at q (p0 in units of V), float64: by the compiled token loop
        where numba is installed (``compiled``), else from one pass of the filter's torch scan."""
        if self.values.size == 0:
            return 0.0, 0.0
        if compiled and _compiled_sums is not None:
            return _compiled_sums(self.values, self.starts, self.gaps, q, p0, x0)
        x = scan.forward(self.y, self.observed if self.mode == "skip" else self.mask, self.mode, q, 1.0, p0, x0)[0]
        x = x.reshape(-1).numpy()
        prediction = np.where(self.previous >= 0, x[np.maximum(self.previous, 0)], x0)
        if self.mode == "advance":  # per-token gains: a hole grows the variance of the tokens after it
            keep = scan.advance_gains(self.mask, q, 1.0, p0)[1].reshape(-1).numpy()[self.flat]
        else:
            keep = gain_tables(self.longest, q, 1.0, p0)[1][self.index]  # 1 - K_t = 1 / f_t
        e = self.values - prediction
        return float(np.dot(e * e, keep)), -float(np.log(keep).sum())


def _p0_at(p0, q: float) -> float:
    from kpo.filter.memory import steady_state_variance

    return steady_state_variance(q, 1.0) if p0 == STEADY else float(p0)


def _loglik(n: float, squares, log_f):
    """l from its additive pieces (floats or float64 arrays)."""
    return -0.5 * (n * (math.log(2.0 * math.pi) + 1.0 + np.log(squares / n)) + log_f)


def _no_reduce(values: np.ndarray) -> np.ndarray:
    return values


class Likelihood:
    """l(q) of batches added one at a time (micro-batches, or one process's share of a step), maximized by
    :meth:`fit` from sums over them and, through ``reduce``, over processes.

    ``p0`` (float, in units of V, or "steady"), ``x0`` and ``mask_mode`` are the filter's (module docstring).
    The search: l on the fixed grid of ``bounds`` (one reduce of [1 + 2 G] sums), then golden-section search in
    the bracket of the grid's best point down to ``_TOL_LOG_Q`` in ln q (one reduce of 2 sums per point).
    Every process reaches the same values, so every one takes the same path and makes the same reduces.
    """

    def __init__(self, bounds=Q_BOUNDS, *, p0: float | str = 0.0, x0: float = 0.0, mask_mode: str = "skip"):
        self.bounds = check_bounds(bounds)
        _check_settings(p0, x0, mask_mode)
        self.p0, self.x0, self.mask_mode = p0, float(x0), mask_mode
        self.parts: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # as added, on their device

    def add(self, log_ratio: torch.Tensor, mask: torch.Tensor | None = None) -> Likelihood:
        """Add one batch: ``log_ratio`` [B, T] or [T] (detached; rows independent), ``mask`` the same shape. It
        stays where it is until :meth:`fit` copies every batch to the CPU at once (one host sync a fit on a GPU)."""
        _check(log_ratio, mask)
        self.parts.append((log_ratio.detach(), mask))
        return self

    def fit(self, reduce=_no_reduce) -> Fit:
        """The maximum-likelihood q and its 95% interval; :class:`NotIdentified` where the data cannot tell.
        ``reduce`` sums a float64 array over processes (every process calls fit at the same point)."""
        a, b = (math.log(v) for v in self.bounds)
        points = max(3, math.ceil((b - a) / math.log(10.0) * _GRID_PER_DECADE) + 1)
        grid = np.linspace(a, b, points)
        # this process's batches as one: one scan a point, however many micro-batches the step had
        part = _Part(*_stacked([_prepared(*p) for p in self.parts]), self.mask_mode) if self.parts else None

        def pieces(u: float) -> tuple[float, float]:
            """(sum e^2/f, sum log f) of this process's batches at q = exp(u)."""
            return part.pieces(math.exp(u), _p0_at(self.p0, math.exp(u)), self.x0) if part else (0.0, 0.0)

        local = np.array([pieces(u) for u in grid])  # [G, 2]
        sums = reduce(np.concatenate(([0 if part is None else part.values.size], local.T.reshape(-1))))
        n, squares, log_f = float(sums[0]), sums[1 : 1 + points], sums[1 + points :]
        if n < 2:
            why = "no observation there is no likelihood" if n == 0 else "one observation the likelihood does not depend on q"
            raise NotIdentified(f"fit_q needs at least 2 valid tokens, got {int(n)}: with {why}")
        if not (np.isfinite(squares).all() and np.isfinite(log_f).all()):
            # not a property of the data: a settings error, never "not identified" (which would keep a stale q)
            raise ValueError(
                f"the likelihood of q overflows float64 with x0={self.x0!r}, p0={self.p0!r}: the squared distances of "
                "the log-ratios from x0 pass 1.8e308; x0 and p0 are on the log-ratio's scale (the paper: 0 and 0)"
            )
        if not squares.max() / n > _TINY:
            raise NotIdentified(
                "every valid log-ratio is exactly 0 (an on-policy step: the ratios are 1), or 0 to float64 "
                "precision: the likelihood has no scale and q is not identifiable; the filter's output is 0 "
                "whatever q, so keep the last fitted q"
            )
        values = _loglik(n, squares, log_f)
        best = int(np.argmax(values))  # the first of equal maxima: deterministic
        inside = np.flatnonzero(values >= values[best] - _INTERVAL)
        if inside.size == points:
            raise NotIdentified(
                f"the likelihood is flat in q over {self.bounds[0]:g}..{self.bounds[1]:g}: every q there is within "
                f"the 95% likelihood-ratio interval, so these {int(n)} tokens do not identify q (one valid token "
                "per row, or too few tokens)"
            )

        def f(u: float) -> float:
            s, lf = reduce(np.array(pieces(u)))
            return float(_loglik(n, s, lf))

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
        q = min(max(math.exp(u_best), self.bounds[0]), self.bounds[1])
        low, high = math.exp(grid[inside[0]]), math.exp(grid[inside[-1]])
        return Fit(q, min(low, q), max(high, q))


def local_level_loglik(
    log_ratio: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    q: float,
    p0: float | str = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
) -> float:
    """The concentrated log-likelihood l(q) of the local-level model behind KPO's filter (module docstring).

    log_ratio: [B, T] or [T] token log-ratios (rows: independent sequences); mask: same shape, bool or 0/1.
    """
    check_params(q, 1.0, 0.0)
    _check_settings(p0, x0, mask_mode)
    part = _Part(*_prepared(log_ratio, mask), mask_mode)
    n = part.values.size
    if n == 0:
        raise NotIdentified("the likelihood needs at least 1 valid token, got 0")
    squares, log_f = part.pieces(float(q), _p0_at(p0, float(q)), float(x0))
    return -0.5 * (n * (math.log(2.0 * math.pi) + 1.0 + math.log(squares / n)) + log_f)


def fit_q(
    log_ratio: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    bounds: tuple[float, float] = Q_BOUNDS,
    p0: float | str = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
) -> float:
    """The maximum-likelihood q = Q/V of the batch under KPO's filter with ``p0`` (units of V, or "steady"),
    ``x0`` and ``mask_mode``, V concentrated out; on the fixed grid of ``bounds`` refined by a parabola (module
    docstring; a maximum at a bound returns it).

    log_ratio: [B, T] or [T] log importance ratios (detached; rows share one q); mask: same shape, bool or 0/1.
    :class:`NotIdentified` (a ValueError) when the batch does not identify q: fewer than 2 valid tokens, every
    valid log-ratio 0, or a likelihood flat over the bounds.
    """
    return Likelihood(bounds, p0=p0, x0=x0, mask_mode=mask_mode).add(log_ratio, mask).fit().q


def fit_metrics(fit: Fit, stale: bool) -> dict[str, float]:
    """What a loss reports of the q it used: ``kpo/q`` (Q/V), ``kpo/memory_tokens`` (its memory),
    ``kpo/q_stale`` (1 where q is not the fit of the data it was meant for: an older fit, or a fallback) and,
    where q was fitted, ``kpo/q_low`` / ``kpo/q_high`` (the fit's 95% likelihood-ratio interval on the grid)."""
    from kpo.filter.memory import filter_memory

    out = {"kpo/q": fit.q, "kpo/memory_tokens": filter_memory(fit.q), "kpo/q_stale": float(stale)}
    if math.isfinite(fit.low):
        out |= {"kpo/q_low": fit.low, "kpo/q_high": fit.high}
    return out


class StepFit:
    """One q per optimizer step, the same on every process and for any micro-batch size (``memory="auto"`` in
    ``kpo train`` and the verl plugin).

    The losses of step k filter with :attr:`q`; each of its micro-batches' log-ratios goes to :meth:`add` (kept
    on its device until the step ends, then copied to the CPU in float64 at once); :meth:`finish`, called by every
    process at the end of the step, maximizes the likelihood of the whole step, its sums added over the processes
    that hold different data (``reduce``: float64 [n] -> its sum over them; by default
    ``kpo._distributed.sum_over_ranks``, every process of the default group), and that q is the one of step k + 1.
    So q lags the log-ratios by one optimizer step: the fit needs no forward pass of its own. A step that does not
    identify q (:class:`NotIdentified`) keeps the q the step used: the last fit, or before any fit ``fallback_q``.
    All q are Q/V.

    ``steps_per_batch``: the optimizer steps of a generation batch, counted from the first step this object sees
    (a generation batch's first). The first of each batch updates the policy that sampled it: in theory its
    ratios are exactly 1, in practice two computations of one policy (a recomputed old log-prob and the training
    forward) differ by noise that the likelihood would read as a token-level signal (i.i.d. noise of 1e-3 fits q at
    its lower bound, a 10,000-token memory) and hand to the next, off-policy step. So that step is not fitted: its
    log-ratios are not kept and q carries over it from the batch before. None: every step is fitted.
    """

    def __init__(
        self,
        *,
        bounds=Q_BOUNDS,
        p0=0.0,
        x0=0.0,
        mask_mode="skip",
        fallback_q: float,
        steps_per_batch: int | None = None,
        reduce=None,
    ):
        check_params(float(fallback_q), 1.0, 0.0)
        if steps_per_batch is not None and (
            isinstance(steps_per_batch, bool) or not isinstance(steps_per_batch, int) or steps_per_batch < 1
        ):
            raise ValueError(f"steps_per_batch must be an integer >= 1 or None, got {steps_per_batch!r}")
        self.settings = {"bounds": check_bounds(bounds), "p0": p0, "x0": x0, "mask_mode": mask_mode}
        self.steps_per_batch = steps_per_batch
        self.reduce = reduce
        self._data = Likelihood(**self.settings)
        self.fit = Fit(float(fallback_q), math.nan, math.nan)  # the fit that q is; NaN interval: the fallback
        self.stale = True  # whether the last finished step identified no q (q is older or the fallback)
        self.reason = "no step fitted yet"
        self.steps = 0  # optimizer steps finished

    @property
    def q(self) -> float:
        return self.fit.q

    @property
    def on_policy(self) -> bool:
        """Whether the step under way is the first of its generation batch (not fitted: the class docstring)."""
        return self.steps_per_batch is not None and self.steps % self.steps_per_batch == 0

    def add(self, log_ratio: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        if not self.on_policy:
            self._data.add(log_ratio, mask)

    def finish(self) -> None:
        """End the step: sum its pieces over processes (every process calls this once a step) and fit; an on-policy
        step ends without a fit (and without a collective: every process skips it alike)."""
        from kpo._distributed import sum_over_ranks

        skip, self.steps = self.on_policy, self.steps + 1
        data, self._data = self._data, Likelihood(**self.settings)
        if skip:
            return
        try:
            self.fit, self.stale, self.reason = data.fit(self.reduce or sum_over_ranks), False, ""
        except NotIdentified as err:
            self.stale, self.reason = True, str(err)

    def metrics(self) -> dict[str, float]:
        """:func:`fit_metrics` of the q this step's losses use (``kpo/q_stale`` 1: the previous step identified
        no q, so q is an older fit or the fallback)."""
        return fit_metrics(self.fit, self.stale)

    def state_dict(self) -> dict:
        return {"fit": list(self.fit), "stale": self.stale, "reason": self.reason}

    def load_state_dict(self, state: dict) -> None:
        """The fit of a checkpoint; the caller sets :attr:`steps` to the checkpoint's optimizer steps."""
        self.fit, self.stale, self.reason = Fit(*state["fit"]), bool(state["stale"]), str(state["reason"])
