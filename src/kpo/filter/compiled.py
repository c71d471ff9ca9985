"""Compiled CPU loops of the filter (numba, the optional extra ``fast``).

The recurrence x_t = keep_t * x_{t-1} + gain_t * z_t is a chain of dependent multiply-adds, so one row
is bound by latency, not by memory. Each inner iteration therefore advances four rows at once (four
independent chains in flight). The loops release the GIL; the caller runs row ranges in parallel threads
(cheaper to compile than numba's own parallel mode). The state is float64 whatever the input dtype, so
float32 results are the float64 recurrence rounded once.

Modes: NOMASK (every token valid), SKIP, ADVANCE, ZERO (see ``kpo.filter.kalman_filter``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

NOMASK, SKIP, ADVANCE, ZERO = 0, 1, 2, 3
ROWS = 4  # rows per inner iteration


@njit(inline="always")
def _fstep(mode, zt, mt, t, x, c, p, gain, keep, q, v):
    """One forward token of one row: returns (state, valid count, posterior variance, output)."""
    if mode == NOMASK:
        x = keep[t] * x + gain[t] * zt
        return x, c, p, x
    if mode == ZERO:
        y = zt if mt else 0.0
        x = keep[t] * x + gain[t] * y
        return x, c, p, (x if mt else 0.0)
    if mode == SKIP:
        if mt:
            x = keep[c] * x + gain[c] * zt
            return x, c + 1, p, x
        return x, c, p, 0.0
    prior = p + q  # ADVANCE: the variance grows at every token, observed or not
    if mt:
        x = (v / (prior + v)) * x + (prior / (prior + v)) * zt
        return x, c, v * prior / (prior + v), x
    return x, c, prior, 0.0


@njit(inline="always")
def _load(z, m, has_mask, r, t):
    mt = m[r, t] if has_mask else True
    zt = np.float64(z[r, t]) if mt else 0.0  # a masked z is never read into the state (it may be NaN)
    return zt, mt


@njit(cache=True, nogil=True)
def forward(z, m, mode, gain, keep, q, v, p0, x0, out, x_end, row_lo, row_hi):
    """out[r] <- filtered z[r]; x_end[r] <- row r's final state (non-finite iff a valid z was); rows [lo, hi)."""
    B, T = row_hi, z.shape[1]
    has_mask = mode != NOMASK
    for r0 in range(row_lo, row_hi, ROWS):
        if r0 + ROWS <= B:
            xa = xb = xc = xd = x0
            ca = cb = cc = cd = 0
            pa = pb = pc = pd = p0
            for t in range(T):
                za, ma = _load(z, m, has_mask, r0, t)
                zb, mb = _load(z, m, has_mask, r0 + 1, t)
                zc, mc = _load(z, m, has_mask, r0 + 2, t)
                zd, md = _load(z, m, has_mask, r0 + 3, t)
                xa, ca, pa, oa = _fstep(mode, za, ma, t, xa, ca, pa, gain, keep, q, v)
                xb, cb, pb, ob = _fstep(mode, zb, mb, t, xb, cb, pb, gain, keep, q, v)
                xc, cc, pc, oc = _fstep(mode, zc, mc, t, xc, cc, pc, gain, keep, q, v)
                xd, cd, pd, od = _fstep(mode, zd, md, t, xd, cd, pd, gain, keep, q, v)
                out[r0, t] = oa
                out[r0 + 1, t] = ob
                out[r0 + 2, t] = oc
                out[r0 + 3, t] = od
            x_end[r0], x_end[r0 + 1], x_end[r0 + 2], x_end[r0 + 3] = xa, xb, xc, xd
        else:
            for r in range(r0, B):
                x, c, p = x0, 0, p0
                for t in range(T):
                    zt, mt = _load(z, m, has_mask, r, t)
                    x, c, p, o = _fstep(mode, zt, mt, t, x, c, p, gain, keep, q, v)
                    out[r, t] = o
                x_end[r] = x


@njit(inline="always")
def _bstep(mode, gt, mt, t, u, c, a_next, gain, keep, kb, ab):
    """One reverse token of one row: u_t = w_t + keep_{t+1} u_{t+1}, dz_t = gain_t u_t.

    Returns (u, count of valid tokens before t, keep_t, dz_t). ``kb``/``ab`` are this row's
    gains and keeps (ADVANCE only), 0 and 1 at masked tokens.
    """
    w = np.float64(gt) if mt else 0.0
    u = a_next * u + w
    if mode == NOMASK:
        return u, c, keep[t], gain[t] * u
    if mode == ZERO:
        return u, c, keep[t], (gain[t] * u if mt else 0.0)
    if mode == SKIP:
        if mt:
            return u, c - 1, keep[c - 1], gain[c - 1] * u
        return u, c, 1.0, 0.0
    return u, c, ab[t], kb[t] * u


@njit(inline="always")
def _advance_gains(m, r, q, v, p0, kb, ab):
    """This row's gains and keeps under ADVANCE (the variance pattern depends on the holes)."""
    p = p0
    for t in range(m.shape[1]):
        prior = p + q
        if m[r, t]:
            kb[t] = prior / (prior + v)
            ab[t] = v / (prior + v)
            p = v * prior / (prior + v)
        else:
            kb[t] = 0.0
            ab[t] = 1.0
            p = prior


@njit(inline="always")
def _count(m, has_mask, r, T):
    if not has_mask:
        return T
    c = 0
    for t in range(T):
        c += 1 if m[r, t] else 0
    return c


@njit(cache=True, nogil=True)
def backward(g, m, mode, gain, keep, q, v, p0, dz, row_lo, row_hi):
    """dz[r] <- gradient of sum(g * filter(z)) w.r.t. z[r] (the reverse scan) for rows [lo, hi)."""
    B, T = row_hi, g.shape[1]
    has_mask = mode != NOMASK
    for r0 in range(row_lo, row_hi, ROWS):
        n = min(ROWS, B - r0)
        kb = np.empty((n, T if mode == ADVANCE else 1))
        ab = np.empty((n, T if mode == ADVANCE else 1))
        if mode == ADVANCE:
            for i in range(n):
                _advance_gains(m, r0 + i, q, v, p0, kb[i], ab[i])
        if n == ROWS:
            ua = ub = uc = ud = 0.0
            aa = ab_ = ac = ad = 1.0
            ca, cb = _count(m, has_mask, r0, T), _count(m, has_mask, r0 + 1, T)
            cc, cd = _count(m, has_mask, r0 + 2, T), _count(m, has_mask, r0 + 3, T)
            for t in range(T - 1, -1, -1):
                ma = m[r0, t] if has_mask else True
                mb = m[r0 + 1, t] if has_mask else True
                mc = m[r0 + 2, t] if has_mask else True
                md = m[r0 + 3, t] if has_mask else True
                ua, ca, aa, da = _bstep(mode, g[r0, t], ma, t, ua, ca, aa, gain, keep, kb[0], ab[0])
                ub, cb, ab_, db = _bstep(mode, g[r0 + 1, t], mb, t, ub, cb, ab_, gain, keep, kb[1], ab[1])
                uc, cc, ac, dc = _bstep(mode, g[r0 + 2, t], mc, t, uc, cc, ac, gain, keep, kb[2], ab[2])
                ud, cd, ad, dd = _bstep(mode, g[r0 + 3, t], md, t, ud, cd, ad, gain, keep, kb[3], ab[3])
                dz[r0, t] = da
                dz[r0 + 1, t] = db
                dz[r0 + 2, t] = dc
                dz[r0 + 3, t] = dd
        else:
            for i in range(n):
                r = r0 + i
                u, a_next, c = 0.0, 1.0, _count(m, has_mask, r, T)
                for t in range(T - 1, -1, -1):
                    mt = m[r, t] if has_mask else True
                    u, c, a_next, d = _bstep(mode, g[r, t], mt, t, u, c, a_next, gain, keep, kb[i], ab[i])
                    dz[r, t] = d
