"""Compiled CPU loops of the filter (numba, the optional extra ``fast``).

The recurrence x_t = keep_t * x_{t-1} + gain_t * z_t is a chain of dependent multiply-adds, so one row
is bound by latency, not by memory. Each inner iteration of the forward and of the backward therefore
advances four rows at once (four independent chains in flight). The loops release the GIL; the caller runs
row ranges in parallel threads (cheaper to compile than numba's own parallel mode). The state is float64
whatever the input dtype, so float32 results are the float64 recurrence rounded once.

Each mode gets its own copy of the row loop (the mode is a constant inside it, so the other modes' code is
compiled away): a mode tested per token costs several times the loop itself.

Modes: NOMASK (every token valid), SKIP, ADVANCE, ZERO (see ``kpo.filter.kalman_filter``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

NOMASK, SKIP, ADVANCE, ZERO = 0, 1, 2, 3
ROWS = 4  # rows per inner iteration


@njit(inline="always")
def _fstep(mode, z, m, r, t, x, c, p, gain, keep, q, v):
    """One forward token of row r: returns (state, valid count, posterior variance, output).

    A masked z is never used (it may be NaN): it is read, then replaced by a select.
    """
    if mode == NOMASK:
        x = keep[t] * x + gain[t] * np.float64(z[r, t])
        return x, c, p, x
    valid = m[r, t]
    zt = np.float64(z[r, t]) if valid else 0.0
    if mode == ZERO:
        x = keep[t] * x + gain[t] * zt
        return x, c, p, (x if valid else 0.0)
    if mode == SKIP:
        if valid:
            x = keep[c] * x + gain[c] * zt
            return x, c + 1, p, x
        return x, c, p, 0.0
    prior = p + q  # ADVANCE: the variance grows at every token, observed or not
    if valid:
        x = (v / (prior + v)) * x + (prior / (prior + v)) * zt
        return x, c, v * prior / (prior + v), x
    return x, c, prior, 0.0


@njit(inline="always")
def _forward_rows(mode, z, m, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi):
    T = z.shape[1]
    for r0 in range(row_lo, row_hi, ROWS):
        if r0 + ROWS <= row_hi:
            xa = xb = xc = xd = x0
            ca = cb = cc = cd = 0
            pa = pb = pc = pd = p0
            for t in range(T):
                xa, ca, pa, oa = _fstep(mode, z, m, r0, t, xa, ca, pa, gain, keep, q, v)
                xb, cb, pb, ob = _fstep(mode, z, m, r0 + 1, t, xb, cb, pb, gain, keep, q, v)
                xc, cc, pc, oc = _fstep(mode, z, m, r0 + 2, t, xc, cc, pc, gain, keep, q, v)
                xd, cd, pd, od = _fstep(mode, z, m, r0 + 3, t, xd, cd, pd, gain, keep, q, v)
                out[r0, t] = oa
                out[r0 + 1, t] = ob
                out[r0 + 2, t] = oc
                out[r0 + 3, t] = od
            x_end[r0], x_end[r0 + 1], x_end[r0 + 2], x_end[r0 + 3] = xa, xb, xc, xd
        else:
            for r in range(r0, row_hi):
                x, c, p = x0, 0, p0
                for t in range(T):
                    x, c, p, o = _fstep(mode, z, m, r, t, x, c, p, gain, keep, q, v)
                    out[r, t] = o
                x_end[r] = x


@njit(cache=True, nogil=True)
def forward(z, m, mode, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi):
    """out[r] <- filtered z[r]; x_end[r] <- row r's final state (non-finite iff a valid z was); rows [lo, hi)."""
    if mode == NOMASK:
        _forward_rows(NOMASK, z, m, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi)
    elif mode == SKIP:
        _forward_rows(SKIP, z, m, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi)
    elif mode == ADVANCE:
        _forward_rows(ADVANCE, z, m, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi)
    else:
        _forward_rows(ZERO, z, m, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi)


@njit(inline="always")
def _bstep(mode, g, m, r, t, u, c, a_next, gain, keep, kb, ab):
    """One reverse token of row r: u_t = w_t + keep_{t+1} u_{t+1}, dz_t = gain_t u_t.

    Returns (u, valid tokens up to t - 1, keep_t, dz_t). ``kb``/``ab`` are row r's gains and keeps
    (ADVANCE only), 0 and 1 at masked tokens.
    """
    if mode == NOMASK:
        u = a_next * u + np.float64(g[r, t])
        return u, c, keep[t], gain[t] * u
    valid = m[r, t]
    u = a_next * u + (np.float64(g[r, t]) if valid else 0.0)
    if mode == ZERO:
        return u, c, keep[t], (gain[t] * u if valid else 0.0)
    if mode == SKIP:
        if valid:
            return u, c - 1, keep[c - 1], gain[c - 1] * u
        return u, c, 1.0, 0.0
    return u, c, ab[t], kb[t] * u


@njit(inline="always")
def _setup_step(mode, m, r, t, p, c, q, v, kb, ab):
    """Token t of the forward pass that row r's reverse scan needs first -> (posterior variance, count).

    ADVANCE: the row's gains depend on its holes, so its variance runs forward, filling ``kb``/``ab`` with
    its gains and keeps (0 and 1 at masked tokens). SKIP: counts the valid tokens (the reverse scan walks
    the gain table backwards from there). Other modes need nothing.
    """
    if mode == ADVANCE:
        prior = p + q
        if m[r, t]:
            kb[t] = prior / (prior + v)
            ab[t] = v / (prior + v)
            return v * prior / (prior + v), c
        kb[t] = 0.0
        ab[t] = 1.0
        return prior, c
    if mode == SKIP:
        return p, c + (1 if m[r, t] else 0)
    return p, c


@njit(inline="always")
def _backward_rows(mode, g, m, gain, keep, q, v, p0, dz, row_lo, row_hi):
    # four rows per inner iteration, as in the forward: four independent chains in flight
    T = g.shape[1]
    kb = np.empty((ROWS, T if mode == ADVANCE else 1))
    ab = np.empty((ROWS, T if mode == ADVANCE else 1))
    ka, kb_, kc, kd = kb[0], kb[1], kb[2], kb[3]
    aa, ab_, ac, ad = ab[0], ab[1], ab[2], ab[3]
    for r0 in range(row_lo, row_hi, ROWS):
        if r0 + ROWS <= row_hi:
            ca = cb = cc = cd = 0
            if mode == ADVANCE or mode == SKIP:
                pa = pb = pc = pd = p0
                for t in range(T):
                    pa, ca = _setup_step(mode, m, r0, t, pa, ca, q, v, ka, aa)
                    pb, cb = _setup_step(mode, m, r0 + 1, t, pb, cb, q, v, kb_, ab_)
                    pc, cc = _setup_step(mode, m, r0 + 2, t, pc, cc, q, v, kc, ac)
                    pd, cd = _setup_step(mode, m, r0 + 3, t, pd, cd, q, v, kd, ad)
            ua = ub = uc = ud = 0.0
            na = nb = nc = nd = 1.0
            for t in range(T - 1, -1, -1):
                ua, ca, na, da = _bstep(mode, g, m, r0, t, ua, ca, na, gain, keep, ka, aa)
                ub, cb, nb, db = _bstep(mode, g, m, r0 + 1, t, ub, cb, nb, gain, keep, kb_, ab_)
                uc, cc, nc, dc = _bstep(mode, g, m, r0 + 2, t, uc, cc, nc, gain, keep, kc, ac)
                ud, cd, nd, dd = _bstep(mode, g, m, r0 + 3, t, ud, cd, nd, gain, keep, kd, ad)
                dz[r0, t] = da
                dz[r0 + 1, t] = db
                dz[r0 + 2, t] = dc
                dz[r0 + 3, t] = dd
        else:
            for r in range(r0, row_hi):
                c, p = 0, p0
                if mode == ADVANCE or mode == SKIP:
                    for t in range(T):
                        p, c = _setup_step(mode, m, r, t, p, c, q, v, ka, aa)
                u, a_next = 0.0, 1.0
                for t in range(T - 1, -1, -1):
                    u, c, a_next, d = _bstep(mode, g, m, r, t, u, c, a_next, gain, keep, ka, aa)
                    dz[r, t] = d


@njit(cache=True, nogil=True)
def backward(g, m, mode, gain, keep, q, v, p0, dz, row_lo, row_hi):
    """dz[r] <- gradient of sum(g * filter(z)) w.r.t. z[r] (the reverse scan) for rows [lo, hi)."""
    if mode == NOMASK:
        _backward_rows(NOMASK, g, m, gain, keep, q, v, p0, dz, row_lo, row_hi)
    elif mode == SKIP:
        _backward_rows(SKIP, g, m, gain, keep, q, v, p0, dz, row_lo, row_hi)
    elif mode == ADVANCE:
        _backward_rows(ADVANCE, g, m, gain, keep, q, v, p0, dz, row_lo, row_hi)
    else:
        _backward_rows(ZERO, g, m, gain, keep, q, v, p0, dz, row_lo, row_hi)
