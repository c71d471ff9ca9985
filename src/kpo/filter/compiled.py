"""Compiled CPU loops of the filter (numba, the optional extra ``fast``).

The recurrence x_t = keep_t * x_{t-1} + gain_t * z_t is a chain of dependent multiply-adds, so one row
is bound by latency, not by memory. Four rows (a group, one per lane) therefore advance together, four
independent chains in flight, in step over tiles of TILE tokens, so that they share each table load:

- a tile whose tokens are all valid in all four rows (checked once per tile: the only read of those mask
  bytes) runs with no per-token mask work, on the gain table (skip mode: offset by the count of valid
  tokens, which rows share until they differ in holes), in three passes over the tile: gain * z into a
  float64 buffer (vectorized), the four chains of fused multiply-adds, the results out;
- any other tile runs the per-token step (mask read, masked z replaced by a select: it may be NaN).

A row's trailing padding is found by scanning its mask backwards, a tile at a time, and is zero-filled
without reading z, so right-padded rows pay only for their valid tokens. Rows are grouped in order of
length so that a group's rows end close together; the tokens of a row's last partial tile run in its lane
alone, and a lane whose row has ended mirrors an active lane (same reads, the same values written to the
same places) so that the four-lane loops keep their shape.

``advance`` mode: a row's gains are the positional table's up to its first hole (a masked token before its
last valid one). From there its variance runs per token (a division each), forward and backward. The forward
records each row's end, valid count and first hole: the backward rebuilds advance mode's gains only after the
hole, and in every mode reads no mask below it (full and right-padded masks are read once, by the forward).

The loops release the GIL; the caller runs row ranges in parallel threads, which take the ranges in turn
(cheaper to compile than numba's own parallel mode, and a thread that gets no core on a shared machine
holds up no one). The state is float64 whatever the input dtype, so float32 results are the float64
recurrence rounded once. Each mode gets its own copy of the loops (the mode is a constant inside them, so the
other modes' code is compiled away) and its own entry points in FORWARD and BACKWARD, compiled on first use.
Modes: NOMASK (every token valid), SKIP, ADVANCE, ZERO.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NOMASK, SKIP, ADVANCE, ZERO = 0, 1, 2, 3
ROWS = 4  # lanes: rows in flight
# the only fast-math flag: a * x + b fused into one instruction, rounded once (exact to float64 rounding, like
# the unfused form, and ~20% faster: the chain of multiply-adds is the loop's critical path)
FMA = {"contract"}
# tokens per lane per step: long enough to amortize the mask check, short enough that few tiles hold a hole
TILE = 64
# per-row facts the forward records for the backward: aux[r] = (end, valid count, first hole)
END, COUNT, HOLE = 0, 1, 2


@njit(inline="always")
def _row_end(mode, m, r, T):
    """1 + the index of row r's last valid token (0 if none): only the trailing padding is read, a tile
    of mask bytes at a time (one vectorized test each) and then byte by byte."""
    if mode == NOMASK:
        return T
    e = T
    while e >= TILE and not _any_valid(m, r, e - TILE):
        e -= TILE
    while e > 0 and m[r, e - 1] == 0:
        e -= 1
    return e


@njit(inline="always")
def _any_valid(m, r, t):
    """Whether any of tokens t..t+TILE-1 of row r is valid."""
    acc = 0
    for i in range(t, t + TILE):
        acc |= m[r, i]
    return acc != 0


@njit(inline="always")
def _all_valid(mode, m, ra, rb, rc, rd, t):
    """Whether tokens t..t+TILE-1 of rows ra..rd are all valid: mask bytes are 0 or 1, so their AND is 1
    (four rows in one vectorized pass and one reduction: a reduction per row costs ~30% of the loop)."""
    if mode == NOMASK:
        return True
    acc = np.uint8(1)
    for i in range(t, t + TILE):
        acc &= m[ra, i] & m[rb, i] & m[rc, i] & m[rd, i]
    return acc != 0


@njit(inline="always")
def _posterior(gain, t, p0, v):
    """Posterior variance after t consecutive updates from p0 (P = v K; the table holds the gains K)."""
    return p0 if t == 0 else v * gain[t - 1]


@njit(inline="always")
def _fstep(mode, z, m, r, t, x, c, p, gain, keep, q, v):
    """One forward token of row r, mask read: returns (state, valid count, posterior variance, output).

    The valid count runs in every mode: it falls behind the position at the row's first hole.

    A masked z is never used (it may be NaN): it is read, then replaced by a select. ADVANCE always runs the
    variance here (the caller seeds p from the table while the row has had no hole).
    """
    if mode == NOMASK:
        x = keep[t] * x + gain[t] * np.float64(z[r, t])
        return x, c + 1, p, x
    valid = m[r, t] != 0
    zt = np.float64(z[r, t]) if valid else 0.0
    if mode == ZERO:
        x = keep[t] * x + gain[t] * zt
        return x, c + valid, p, (x if valid else 0.0)
    if mode == SKIP:
        if valid:
            x = keep[c] * x + gain[c] * zt
            return x, c + 1, p, x
        return x, c, p, 0.0
    prior = p + q  # ADVANCE: the variance grows at every token, observed or not
    if valid:
        x = (v / (prior + v)) * x + (prior / (prior + v)) * zt
        return x, c + 1, v * prior / (prior + v), x
    return x, c, prior, 0.0


@njit(inline="always")
def _observe(z, gain, y, k, r, t, g):
    """y[k] <- gain[g + i] * z[r, t + i] for the TILE tokens from t, in float64: no chain runs through it, so
    it vectorizes (slices, not indices: their bounds are known, so no negative-index wrap is compiled)."""
    zr, gr, yk = z[r, t : t + TILE], gain[g : g + TILE], y[k]
    for i in range(TILE):
        yk[i] = gr[i] * np.float64(zr[i])


@njit(inline="always")
def _fast_forward(z, out, gain, keep, y, t, ra, ga, xa, rb, gb, xb, rc, gc, xc, rd, gd, xd):
    """Tokens t..t+TILE-1, all valid, in four lanes (row r, table offset g, state x) -> the four states.

    The gain times z of each lane is computed first, into ``y`` (float64 [ROWS, TILE]); the loop that
    carries the four chains then holds one multiply-add per token and lane (~15% faster than one pass).
    Called with one offset variable for all four lanes where they share it, so that each keep is loaded
    once for four rows (separate table loads per lane cost ~1.8x the loop).
    """
    _observe(z, gain, y, 0, ra, t, ga)
    _observe(z, gain, y, 1, rb, t, gb)
    _observe(z, gain, y, 2, rc, t, gc)
    _observe(z, gain, y, 3, rd, t, gd)
    ya, yb, yc, yd = y[0], y[1], y[2], y[3]
    ka, kb, kc, kd = keep[ga : ga + TILE], keep[gb : gb + TILE], keep[gc : gc + TILE], keep[gd : gd + TILE]
    oa, ob = out[ra, t : t + TILE], out[rb, t : t + TILE]
    oc, od = out[rc, t : t + TILE], out[rd, t : t + TILE]
    for i in range(TILE):
        xa = ka[i] * xa + ya[i]
        xb = kb[i] * xb + yb[i]
        xc = kc[i] * xc + yc[i]
        xd = kd[i] * xd + yd[i]
        oa[i] = xa
        ob[i] = xb
        oc[i] = xc
        od[i] = xd
    return xa, xb, xc, xd


@njit(inline="always")
def _general_forward(mode, z, m, out, gain, keep, q, v, t, lanes, row, cnt, x, p):
    """Tokens t..t+TILE-1 token by token in four lanes (``lanes``: the lane each slot reads)."""
    a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
    ra, rb, rc, rd = row[a], row[b], row[c], row[d]
    xa, xb, xc, xd = x[a], x[b], x[c], x[d]
    ca, cb, cc, cd = cnt[a], cnt[b], cnt[c], cnt[d]
    pa, pb, pc, pd = p[a], p[b], p[c], p[d]
    for i in range(t, t + TILE):
        xa, ca, pa, oa = _fstep(mode, z, m, ra, i, xa, ca, pa, gain, keep, q, v)
        xb, cb, pb, ob = _fstep(mode, z, m, rb, i, xb, cb, pb, gain, keep, q, v)
        xc, cc, pc, oc = _fstep(mode, z, m, rc, i, xc, cc, pc, gain, keep, q, v)
        xd, cd, pd, od = _fstep(mode, z, m, rd, i, xd, cd, pd, gain, keep, q, v)
        out[ra, i] = oa
        out[rb, i] = ob
        out[rc, i] = oc
        out[rd, i] = od
    x[a], x[b], x[c], x[d] = xa, xb, xc, xd
    cnt[a], cnt[b], cnt[c], cnt[d] = ca, cb, cc, cd
    p[a], p[b], p[c], p[d] = pa, pb, pc, pd


@njit(inline="always")
def _first_hole(m, r, t):
    """The first masked token of row r from t on (the caller knows there is one)."""
    while m[r, t] != 0:
        t += 1
    return t


@njit(inline="always")
def _lane_state():
    """One int64 per lane."""
    return np.zeros(ROWS, np.int64)


@njit(inline="always")
def _by_length(mode, m, T, row_lo, row_hi):
    """(rows lo..hi-1 ordered by end, their ends), so that the four rows of a group end close together."""
    ends = np.empty(row_hi - row_lo, np.int64)
    for r in range(row_lo, row_hi):
        ends[r - row_lo] = _row_end(mode, m, r, T)
    order = np.argsort(ends)
    return order + row_lo, ends[order]


@njit(inline="always")
def _forward_rows(mode, z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi):
    T = z.shape[1]
    rows, ends = _by_length(mode, m, T, row_lo, row_hi)
    row, end, cnt, hole, lanes = _lane_state(), _lane_state(), _lane_state(), _lane_state(), _lane_state()
    x, p = np.zeros(ROWS), np.zeros(ROWS)
    y = np.empty((ROWS, TILE))  # the fast tiles' gain * z
    for g0 in range(0, rows.shape[0], ROWS):
        # four rows walk the tiles in step (one position: the positional gains are shared); the last
        # group may hold fewer rows, its empty lanes start finished
        for k in range(ROWS):
            j = min(g0 + k, rows.shape[0] - 1)
            row[k], end[k] = rows[j], (ends[j] if g0 + k == j else -1)
            cnt[k], hole[k], x[k], p[k] = 0, T + 1, x0, p0
            if end[k] >= 0:
                for t in range(end[k], T):
                    out[row[k], t] = 0.0
        t = 0
        while True:
            src = -1
            for k in range(ROWS):
                if end[k] >= 0 and end[k] - t < TILE:  # less than a tile left: this lane alone
                    r, xk, ck, pk, hk = row[k], x[k], cnt[k], p[k], hole[k]
                    if mode == ADVANCE and hk > T:
                        pk = _posterior(gain, t, p0, v)
                    for i in range(t, end[k]):
                        xk, ck, pk, o = _fstep(mode, z, m, r, i, xk, ck, pk, gain, keep, q, v)
                        out[r, i] = o
                        if hk > T and ck <= i:  # the row's first hole
                            hk = i
                    x_end[r] = xk
                    aux[r, END], aux[r, COUNT], aux[r, HOLE] = end[k], ck, min(hk, end[k])
                    end[k] = -1
                if end[k] >= 0:
                    src = k
            if src < 0:
                break
            fast = True
            for k in range(ROWS):
                lanes[k] = k if end[k] >= 0 else src  # finished lanes mirror an active one
                fast = fast and not (mode == ADVANCE and end[k] >= 0 and hole[k] <= T)
            a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
            fast = fast and _all_valid(mode, m, row[a], row[b], row[c], row[d], t)
            if fast and (mode != SKIP or cnt[a] == cnt[b] == cnt[c] == cnt[d]):
                o = cnt[a] if mode == SKIP else t
                x[a], x[b], x[c], x[d] = _fast_forward(
                    z,
                    out,
                    gain,
                    keep,
                    y,
                    t,
                    row[a],
                    o,
                    x[a],
                    row[b],
                    o,
                    x[b],
                    row[c],
                    o,
                    x[c],
                    row[d],
                    o,
                    x[d],
                )
            elif fast:  # skip mode, rows that skipped different numbers of tokens
                x[a], x[b], x[c], x[d] = _fast_forward(
                    z,
                    out,
                    gain,
                    keep,
                    y,
                    t,
                    row[a],
                    cnt[a],
                    x[a],
                    row[b],
                    cnt[b],
                    x[b],
                    row[c],
                    cnt[c],
                    x[c],
                    row[d],
                    cnt[d],
                    x[d],
                )
            else:
                for k in range(ROWS):
                    if mode == ADVANCE and end[k] >= 0 and hole[k] > T:  # no hole yet: the table's variance
                        p[k] = _posterior(gain, t, p0, v)
                _general_forward(mode, z, m, out, gain, keep, q, v, t, lanes, row, cnt, x, p)
            for k in range(ROWS):
                if end[k] >= 0:
                    if fast:
                        cnt[k] += TILE
                    elif hole[k] > T and cnt[k] < t + TILE:
                        # the row's first hole (until then its valid count equals its position)
                        hole[k] = _first_hole(m, row[k], t)
            t += TILE


# One compiled entry point per mode, so that a run compiles only the modes it uses (each is several
# seconds): out[r] <- filtered z[r] for rows [lo, hi); x_end[r] <- the final state (non-finite iff a valid z
# was); aux[r] <- (end, valid count, first hole) of row r, for the backward.
# z, out: [B, T] float32/64; m: uint8 [B, T] (any [1, 1] array in NOMASK); gain, keep: float64 [>= T].
@njit(cache=True, nogil=True, fastmath=FMA)
def _forward_nomask(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi):
    _forward_rows(NOMASK, z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi)


@njit(cache=True, nogil=True, fastmath=FMA)
def _forward_skip(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi):
    _forward_rows(SKIP, z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi)


@njit(cache=True, nogil=True, fastmath=FMA)
def _forward_advance(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi):
    _forward_rows(ADVANCE, z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi)


@njit(cache=True, nogil=True, fastmath=FMA)
def _forward_zero(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi):
    _forward_rows(ZERO, z, m, gain, keep, q, v, p0, x0, out, x_end, aux, row_lo, row_hi)


FORWARD = {NOMASK: _forward_nomask, SKIP: _forward_skip, ADVANCE: _forward_advance, ZERO: _forward_zero}


@njit(inline="always")
def _bstep(mode, g, m, r, t, u, c, a, gain, keep, kb, ab, k, h):
    """One reverse token of row r: u_t = w_t + a u_{t+1}, dz_t = gain_t u_t, with ``a`` the keep of the next
    time step. Returns (u, valid tokens before t, the keep ``a`` for token t - 1, dz_t).

    ADVANCE: tokens from the row's first hole h on take lane k's gains and keeps ``kb``/``ab``.
    """
    if mode == NOMASK:
        u = a * u + np.float64(g[r, t])
        return u, c, keep[t], gain[t] * u
    valid = m[r, t] != 0
    if mode == ZERO:  # a masked token is still a time step (an observation of 0)
        u = a * u + (np.float64(g[r, t]) if valid else 0.0)
        return u, c, keep[t], (gain[t] * u if valid else 0.0)
    if not valid:  # neither an observation nor (skip) a step: the reverse state carries over
        return u, c, a, 0.0
    u = a * u + np.float64(g[r, t])
    if mode == SKIP:
        return u, c - 1, keep[c - 1], gain[c - 1] * u
    if t < h:
        return u, c, keep[t], gain[t] * u
    return u, c, ab[k, t], kb[k, t] * u


@njit(inline="always")
def _load(g, y, k, r, t):
    """y[k] <- g[r, t:t+TILE] in float64 (vectorized: no chain runs through it)."""
    gr, yk = g[r, t : t + TILE], y[k]
    for i in range(TILE):
        yk[i] = np.float64(gr[i])


@njit(inline="always")
def _scale(dz, gain, y, k, r, t, o):
    """dz[r, t:t+TILE] <- gain[o:o+TILE] * y[k] (vectorized)."""
    dr, gr, yk = dz[r, t : t + TILE], gain[o : o + TILE], y[k]
    for i in range(TILE):
        dr[i] = gr[i] * yk[i]


@njit(inline="always")
def _fast_backward(g, dz, gain, keep, y, t, ra, oa, ua, aa, rb, ob, ub, ab, rc, oc, uc, ac, rd, od, ud, ad):
    """Tokens t..t+TILE-1, all valid, in reverse, in four lanes (table offset o; reverse state u and the
    keep a of the token after) -> (u, a) of each lane. One offset variable where the lanes share it.

    As in the forward, the loop that carries the chains does only their multiply-adds: g is read into
    ``y`` before it, and dz = gain * u is written from ``y`` after it."""
    _load(g, y, 0, ra, t)
    _load(g, y, 1, rb, t)
    _load(g, y, 2, rc, t)
    _load(g, y, 3, rd, t)
    ya, yb, yc, yd = y[0], y[1], y[2], y[3]
    ka, kb, kc, kd = keep[oa : oa + TILE], keep[ob : ob + TILE], keep[oc : oc + TILE], keep[od : od + TILE]
    for i in range(TILE - 1, -1, -1):
        ua = aa * ua + ya[i]
        ub = ab * ub + yb[i]
        uc = ac * uc + yc[i]
        ud = ad * ud + yd[i]
        ya[i] = ua
        yb[i] = ub
        yc[i] = uc
        yd[i] = ud
        aa, ab, ac, ad = ka[i], kb[i], kc[i], kd[i]
    _scale(dz, gain, y, 0, ra, t, oa)
    _scale(dz, gain, y, 1, rb, t, ob)
    _scale(dz, gain, y, 2, rc, t, oc)
    _scale(dz, gain, y, 3, rd, t, od)
    return ua, aa, ub, ab, uc, ac, ud, ad


@njit(inline="always")
def _general_backward(mode, g, m, dz, gain, keep, kb, ab, t, lanes, row, cnt, hole, u, an):
    """Tokens t+TILE-1 down to t, token by token in four lanes (``lanes``: the lane each slot reads)."""
    a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
    ra, rb, rc, rd = row[a], row[b], row[c], row[d]
    ha, hb, hc, hd = hole[a], hole[b], hole[c], hole[d]
    ua, ub, uc, ud = u[a], u[b], u[c], u[d]
    ca, cb, cc, cd = cnt[a], cnt[b], cnt[c], cnt[d]
    na, nb, nc, nd = an[a], an[b], an[c], an[d]
    for i in range(t + TILE - 1, t - 1, -1):
        ua, ca, na, da = _bstep(mode, g, m, ra, i, ua, ca, na, gain, keep, kb, ab, a, ha)
        ub, cb, nb, db = _bstep(mode, g, m, rb, i, ub, cb, nb, gain, keep, kb, ab, b, hb)
        uc, cc, nc, dc = _bstep(mode, g, m, rc, i, uc, cc, nc, gain, keep, kb, ab, c, hc)
        ud, cd, nd, dd = _bstep(mode, g, m, rd, i, ud, cd, nd, gain, keep, kb, ab, d, hd)
        dz[ra, i] = da
        dz[rb, i] = db
        dz[rc, i] = dc
        dz[rd, i] = dd
    u[a], u[b], u[c], u[d] = ua, ub, uc, ud
    cnt[a], cnt[b], cnt[c], cnt[d] = ca, cb, cc, cd
    an[a], an[b], an[c], an[d] = na, nb, nc, nd


@njit(inline="always")
def _gain_step(m, r, t, p, q, v, kb, ab, k):
    """Token t of row r's variance (advance mode) -> the posterior; lane k's gain and keep if t is valid."""
    prior = p + q
    if m[r, t] == 0:
        return prior
    kb[k, t] = prior / (prior + v)
    ab[k, t] = v / (prior + v)
    return v * prior / (prior + v)


@njit(inline="always")
def _hole_posterior(gain, hole, end, k, p0, v):
    """The variance entering lane k's first hole (any finite value for a lane with no hole)."""
    return _posterior(gain, hole[k], p0, v) if hole[k] < end[k] else p0


@njit(inline="always")
def _advance_gains(m, row, hole, end, gain, q, v, p0, kb, ab):
    """Each lane's gains and keeps from its row's first hole to its end into kb/ab (read at valid tokens).

    A division sits on each variance chain, so the four lanes' chains run interleaved, as the scans do
    (one chain alone made advance mode's backward with holes ~1.5x slower than before the tiles). A lane
    does nothing outside its [hole, end); a lane with no row has end -1.
    """
    lo, hi = kb.shape[1], 0
    for k in range(ROWS):
        if hole[k] < end[k]:
            lo, hi = min(lo, hole[k]), max(hi, end[k])
    # the tokens before a row's first hole are all valid: the variance entering it is the table's
    pa, pb = _hole_posterior(gain, hole, end, 0, p0, v), _hole_posterior(gain, hole, end, 1, p0, v)
    pc, pd = _hole_posterior(gain, hole, end, 2, p0, v), _hole_posterior(gain, hole, end, 3, p0, v)
    for t in range(lo, hi):
        if hole[0] <= t < end[0]:
            pa = _gain_step(m, row[0], t, pa, q, v, kb, ab, 0)
        if hole[1] <= t < end[1]:
            pb = _gain_step(m, row[1], t, pb, q, v, kb, ab, 1)
        if hole[2] <= t < end[2]:
            pc = _gain_step(m, row[2], t, pc, q, v, kb, ab, 2)
        if hole[3] <= t < end[3]:
            pd = _gain_step(m, row[3], t, pd, q, v, kb, ab, 3)


@njit(inline="always")
def _backward_rows(mode, g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi):
    T = g.shape[1]
    order = np.argsort(aux[row_lo:row_hi, END]) + row_lo
    row, top, cnt, hole, lanes = _lane_state(), _lane_state(), _lane_state(), _lane_state(), _lane_state()
    end = _lane_state()
    u, an = np.zeros(ROWS), np.zeros(ROWS)
    y = np.empty((ROWS, TILE))  # the fast tiles' g, then reverse states
    kb = np.empty((ROWS, T if mode == ADVANCE else 1))
    ab = np.empty((ROWS, T if mode == ADVANCE else 1))
    for g0 in range(0, order.shape[0], ROWS):
        # a group of four rows walks the tiles of one grid (multiples of TILE) down to 0 in step; each
        # row first does the tokens above its last whole tile alone. Empty lanes of a last group stay out.
        start = 0
        for k in range(ROWS):
            if g0 + k >= order.shape[0]:
                row[k], top[k], hole[k], end[k] = 0, -1, T, -1
                continue
            r = order[g0 + k]
            e = aux[r, END]
            row[k], top[k], cnt[k], hole[k], end[k] = r, e - e % TILE, aux[r, COUNT], aux[r, HOLE], e
            start = max(start, top[k])
            for t in range(e, T):
                dz[r, t] = 0.0
        if mode == ADVANCE:
            _advance_gains(m, row, hole, end, gain, q, v, p0, kb, ab)
        for k in range(ROWS):
            if top[k] < 0:
                continue
            r, uk, ck, nk = row[k], 0.0, cnt[k], 1.0
            for t in range(end[k] - 1, top[k] - 1, -1):
                uk, ck, nk, d = _bstep(mode, g, m, r, t, uk, ck, nk, gain, keep, kb, ab, k, hole[k])
                dz[r, t] = d
            u[k], cnt[k], an[k] = uk, ck, nk
        for t in range(start - TILE, -1, -TILE):
            src = -1
            for k in range(ROWS):
                if top[k] > t:
                    src = k
            clean = True
            for k in range(ROWS):
                lanes[k] = k if top[k] > t else src  # lanes not yet in (a lower top) mirror an active one
                clean = clean and not (top[k] > t and t + TILE > hole[k])
            a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
            # below every row's first hole all tokens are valid (the forward found it): no mask read; above
            # it advance mode's gains are the row's own, the other modes look at the mask
            fast = clean or (mode != ADVANCE and _all_valid(mode, m, row[a], row[b], row[c], row[d], t))
            if fast and (mode != SKIP or cnt[a] == cnt[b] == cnt[c] == cnt[d]):
                o = cnt[a] - TILE if mode == SKIP else t
                u[a], an[a], u[b], an[b], u[c], an[c], u[d], an[d] = _fast_backward(
                    g,
                    dz,
                    gain,
                    keep,
                    y,
                    t,
                    row[a],
                    o,
                    u[a],
                    an[a],
                    row[b],
                    o,
                    u[b],
                    an[b],
                    row[c],
                    o,
                    u[c],
                    an[c],
                    row[d],
                    o,
                    u[d],
                    an[d],
                )
            elif fast:
                u[a], an[a], u[b], an[b], u[c], an[c], u[d], an[d] = _fast_backward(
                    g,
                    dz,
                    gain,
                    keep,
                    y,
                    t,
                    row[a],
                    cnt[a] - TILE,
                    u[a],
                    an[a],
                    row[b],
                    cnt[b] - TILE,
                    u[b],
                    an[b],
                    row[c],
                    cnt[c] - TILE,
                    u[c],
                    an[c],
                    row[d],
                    cnt[d] - TILE,
                    u[d],
                    an[d],
                )
            else:
                _general_backward(mode, g, m, dz, gain, keep, kb, ab, t, lanes, row, cnt, hole, u, an)
            if fast:
                for k in range(ROWS):
                    if top[k] > t:
                        cnt[k] -= TILE


# dz[r] <- gradient of sum(g * filter(z)) w.r.t. z[r] (the reverse scan) for rows [lo, hi), one entry
# point per mode. g, dz: [B, T] float32/64; m, gain, keep as in FORWARD; aux: int64 [B, 3] the forward wrote.
@njit(cache=True, nogil=True, fastmath=FMA)
def _backward_nomask(g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi):
    _backward_rows(NOMASK, g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi)


@njit(cache=True, nogil=True, fastmath=FMA)
def _backward_skip(g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi):
    _backward_rows(SKIP, g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi)


@njit(cache=True, nogil=True, fastmath=FMA)
def _backward_advance(g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi):
    _backward_rows(ADVANCE, g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi)


@njit(cache=True, nogil=True, fastmath=FMA)
def _backward_zero(g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi):
    _backward_rows(ZERO, g, m, gain, keep, q, v, p0, aux, dz, row_lo, row_hi)


BACKWARD = {NOMASK: _backward_nomask, SKIP: _backward_skip, ADVANCE: _backward_advance, ZERO: _backward_zero}
