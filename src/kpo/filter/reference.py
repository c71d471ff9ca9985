"""Float64 loop reference of the causal Kalman filter: the oracle for tests, never a fast path.

It runs the textbook predict/update recursion token by token, exactly as docs/methods.md section K writes it,
so every fast implementation is checked against the model itself rather than against another derivation.
Not exported from ``kpo``.
"""

from __future__ import annotations

import math

import torch

MASK_MODES = ("skip", "advance", "zero")


def kalman_filter_reference(
    z: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    q: float = 1e-6,
    v: float = 1.0,
    p0: float = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
) -> torch.Tensor:
    """Filtered log-ratio rho_{t|t} of ``z`` ([B, T] or [T]), float64, 0 where ``mask`` is 0.

    skip:    a masked token is neither an observation nor a time step.
    advance: a masked token is a time step (P grows by q) without an observation.
    zero:    a masked token is observed as z = 0 (the authors' recurrence).
    """
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mask_mode!r}")
    squeeze = z.dim() == 1
    zz = z.detach().to(torch.float64).reshape(1, -1) if squeeze else z.detach().to(torch.float64)
    if mask is None:
        mm = torch.ones_like(zz, dtype=torch.bool)
    else:
        mm = (mask.reshape(1, -1) if squeeze else mask).to(torch.bool)
    zs, ms = zz.tolist(), mm.tolist()
    rows = []
    for zrow, mrow in zip(zs, ms):
        x, p, filtered = float(x0), float(p0), []
        for zt, valid in zip(zrow, mrow):
            if not valid and mask_mode == "skip":
                filtered.append(0.0)
                continue
            p_prior = p + q
            if not valid and mask_mode == "advance":
                p = p_prior
                filtered.append(0.0)
                continue
            obs = zt if valid else 0.0
            k = p_prior / (p_prior + v)
            x = x + k * (obs - x)
            p = v * p_prior / (p_prior + v)  # = (1 - K) P, without the cancellation of 1 - K near 1
            filtered.append(x if valid else 0.0)
        rows.append(filtered)
    out = torch.tensor(rows, dtype=torch.float64).reshape(zz.shape)
    return out.reshape(-1) if squeeze else out


def kalman_gains_reference(T: int, *, q: float = 1e-6, v: float = 1.0, p0: float = 0.0) -> torch.Tensor:
    """Gains K_1..K_T of T consecutive observations, float64 [T]."""
    gains, p = [], float(p0)
    for _ in range(T):
        p_prior = p + q
        gains.append(p_prior / (p_prior + v))
        p = v * p_prior / (p_prior + v)
    return torch.tensor(gains, dtype=torch.float64)


def authors_recurrence_reference(z: torch.Tensor, mask: torch.Tensor, *, q: float, v: float) -> torch.Tensor:
    """The authors' recurrence written out directly, float64 [B, T] (for the ``zero`` mode tests).

    As shuohe1995/verl-kpo defines it (docs/methods.md K): rho_0 = 0, P_0 = 0, every token a time step, masked
    tokens observed as 0, textbook update P <- (1 - K) P, output multiplied by the mask.
    """
    zz = (z.detach().to(torch.float64) * mask.to(torch.float64)).tolist()
    out = []
    for row in zz:
        rho, p, filtered = 0.0, 0.0, []
        for obs in row:
            p = p + q
            k = p / (p + v)
            rho = rho + k * (obs - rho)
            p = (1.0 - k) * p
            filtered.append(rho)
        out.append(filtered)
    return torch.tensor(out, dtype=torch.float64) * mask.to(torch.float64)


def local_level_loglik_reference(z: torch.Tensor, mask: torch.Tensor | None = None, *, q: float) -> float:
    """The concentrated Gaussian log-likelihood of the local-level model behind KPO's filter, token by token
    (``kpo.filter.fit``): x0 = 0, P0 = 0, V = 1 while filtering, masked tokens skipped; V's maximum is then the
    mean of e^2 / F over the N valid tokens and l = -1/2 (N log(2 pi Vhat) + N + sum log F)."""
    zz = z.detach().to(torch.float64).reshape(1, -1) if z.dim() == 1 else z.detach().to(torch.float64)
    mm = torch.ones_like(zz, dtype=torch.bool) if mask is None else mask.reshape(zz.shape).to(torch.bool)
    squares, log_f, n = 0.0, 0.0, 0
    for zrow, mrow in zip(zz.tolist(), mm.tolist()):
        x, p = 0.0, 0.0
        for zt, valid in zip(zrow, mrow):
            if not valid:
                continue
            f = p + q + 1.0  # innovation variance, in units of V
            e = zt - x
            squares += e * e / f
            log_f += math.log(f)
            n += 1
            k = (p + q) / f
            x = x + k * e
            p = (p + q) / f  # = (1 - K) (p + q) with V = 1
    v_hat = squares / n
    return -0.5 * (n * math.log(2.0 * math.pi * v_hat) + n + log_f)
