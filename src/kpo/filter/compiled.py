"""Compiled CPU loops of the filter (numba, the optional extra ``fast``).

The recurrence x_t = keep_t * x_{t-1} + gain_t * z_t is a chain of dependent multiply-adds. Four rows (a group,
one per lane) advance together in step over tiles of TILE tokens:

- a tile whose tokens are all valid in all four rows (checked once per tile: the only read of those mask
  bytes) runs with no per-token mask work, on the gain table (skip mode: offset by each row's count of
  valid tokens), as 8-token vector blocks along time (the vector blocks section below; ~1.5x the four
  scalar chains it replaced), and consecutive such tiles run back to back with the states in registers;
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

The loops release the GIL. Large calls spread row ranges over numba's threading layer (FORWARD_THREADS,
BACKWARD_THREADS), whose threads take the ranges one at a time, so a thread that gets no core on a shared
machine holds up no one. The state is float64 whatever the input dtype, so float32 results are the float64
recurrence rounded once. Each mode gets its own copy of the loops (the mode is a constant inside them, so the
other modes' code is compiled away) and its own entry points in FORWARD and BACKWARD, compiled on first use.
Modes: NOMASK (every token valid), SKIP, ADVANCE, ZERO.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

NOMASK, SKIP, ADVANCE, ZERO = 0, 1, 2, 3
ROWS = 4  # lanes: rows in flight
# the only fast-math flag: a * x + b fused into one instruction, rounded once (exact to float64 rounding, like
# the unfused form, and ~20% faster: the chain of multiply-adds is the loop's critical path)
FMA = {"contract"}
# tokens per lane per step: long enough to amortize the mask check, short enough that few tiles hold a hole
TILE = 64
# per-row facts the forward records for the backward: aux[r] = (end, valid count, first hole)
END, COUNT, HOLE = 0, 1, 2


# ---- Vector blocks: the all-valid tiles, in LLVM IR through numba's ``intrinsic`` ----
#
# A scalar chain costs a multiply-add, a conversion and a store per token and lane, and LLVM does not
# vectorize across a group's lanes. Here each row advances LANES tokens per vector, along time (b = gain * z,
# n = a token's table index):
#
#     w1_n = b_n + keep[n] b_{n-1}
#     w2_n = w1_n + keep2[n] w1_{n-2}
#     w4_n = w2_n + keep4[n] w2_{n-4}      = sum over the 8 tokens up to n of (product of the keeps after each) b
#     y_n  = w4_n + keep8[n] y_{n-8}
#
# with keepK[n] = keep[n-K+1] ... keep[n], made by three more shifts per block and shared by the rows at one
# table offset (tables of them would double the memory read per token). The shifts take their first lanes
# from the block before (one shuffle each) and the last line chains each lane to the same lane of the block
# before, so nothing is extracted or broadcast inside a tile. A tile's first block has no block before: its
# shifts take zeros and y_n = w4_n + (keep[o] ... keep[n]) x, with x the state entering the tile (the one
# broadcast); its last lane is the state leaving it (the one extraction). The backward is the same in
# reverse, with the keep of the token after each token.
#
# Exactness: the float64 sums run in another order than the chain's (a few ulps of the state's scale); float32
# results are the float64 values rounded once, as before. The four rows are written block by block in turn,
# so the out-of-order core overlaps their chains. Any CPU: LLVM splits the 8-wide vectors where the hardware's
# are narrower. These live in this module, not their own, because numba's cache of the loops is keyed on this
# file alone: a change to an intrinsic elsewhere would leave stale compiled loops.

LANES = 8  # tokens per vector: float64 x 8 fills an AVX-512 register
_F64 = ir.DoubleType()
_VEC = ir.VectorType(_F64, LANES)
_I32 = ir.IntType(32)


class _Emit:
    """IR helpers over one builder: vector loads and stores at element pointers, shifts, fused multiply-adds."""

    def __init__(self, context, builder, elt):
        self.context, self.builder, self.elt = context, builder, elt

    def pointer(self, arrty, arr, index):
        """Element pointer of a C-contiguous array at a flat index."""
        data = self.context.make_array(arrty)(self.context, self.builder, arr).data
        return self.builder.gep(data, [index])

    def load(self, ptr, elt=None):
        """LANES elements from ``ptr`` as a float64 vector."""
        elt = elt or self.elt
        vec = self.builder.load(self.builder.bitcast(ptr, ir.VectorType(elt, LANES).as_pointer()), align=4)
        return vec if elt == _F64 else self.builder.fpext(vec, _VEC)

    def store(self, ptr, vec):
        """A float64 vector into LANES elements at ``ptr``, rounded once to the element type."""
        if self.elt != _F64:
            vec = self.builder.fptrunc(vec, ir.VectorType(self.elt, LANES))
        self.builder.store(vec, self.builder.bitcast(ptr, vec.type.as_pointer()), align=4)

    def offset(self, ptr, k):
        return self.builder.gep(ptr, [ir.Constant(ir.IntType(64), k)])

    def window(self, lo, hi, start):
        """Lanes start..start+LANES-1 of the 2 * LANES lanes (lo, hi)."""
        mask = ir.Constant(ir.VectorType(_I32, LANES), list(range(start, start + LANES)))
        return self.builder.shuffle_vector(lo, hi, mask)

    def fma(self, a, b, c):
        """a * b + c, rounded once."""
        module = self.builder.module
        name = f"llvm.fma.v{LANES}f64"
        fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(_VEC, [_VEC] * 3), name)
        return self.builder.call(fn, [a, b, c])

    def splat(self, x):
        one = self.builder.insert_element(ir.Constant(_VEC, ir.Undefined), x, ir.Constant(_I32, 0))
        return self.builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))

    def lane(self, vec, j):
        return self.builder.extract_element(vec, ir.Constant(_I32, j))


def _check_types(z, out, gain, keep, tile, shared):
    for name, arr in (("z", z), ("out", out), ("gain", gain), ("keep", keep)):
        if not isinstance(arr, types.Array) or arr.layout != "C":
            raise TypingError(f"{name} must be a C-contiguous array, got {arr}")
    if z.dtype != out.dtype or z.dtype not in (types.float32, types.float64):
        raise TypingError(f"z and out must share float32 or float64, got {z.dtype} and {out.dtype}")
    if gain.dtype != types.float64 or keep.dtype != types.float64:
        raise TypingError(f"gain and keep must be float64, got {gain.dtype} and {keep.dtype}")
    if not isinstance(tile, types.IntegerLiteral) or tile.literal_value % LANES:
        raise TypingError(f"tile must be a literal multiple of {LANES}, got {tile}")
    if not isinstance(shared, types.BooleanLiteral):
        raise TypingError(f"shared must be a literal bool, got {shared}")


def _setup(context, builder, sig, args):
    """(emitter, per-row element pointers of z and out at token t, per-row table offsets, gain and keep pointers)."""
    z, out, t, rows, offsets, _, gain, keep = args[:8]
    zty, outty = sig.args[0], sig.args[1]
    emit = _Emit(context, builder, context.get_value_type(zty.dtype))
    T = cgutils.unpack_tuple(builder, context.make_array(zty)(context, builder, z).shape)[1]
    gain_keep = tuple(context.make_array(sig.args[i])(context, builder, args[i]).data for i in (6, 7))
    zp, op = [], []
    for r in cgutils.unpack_tuple(builder, rows, ROWS):
        flat = builder.add(builder.mul(r, T), t)
        zp.append(emit.pointer(zty, z, flat))
        op.append(emit.pointer(outty, out, flat))
    return emit, zp, op, cgutils.unpack_tuple(builder, offsets, ROWS), gain_keep


def _doubling(emit, x, before, forward, combine):
    """The three doubling steps of a block -> their levels: level_i = combine(i, level_{i-1}, shifted), level_0 = x,
    where ``shifted`` takes each lane's value 1, 2, 4 lanes back (forward) or ahead, from the neighbouring
    block's level (``before``) where that lies outside the block."""
    levels, level = [], x
    for i, (span, prior) in enumerate(zip((1, 2, 4), before, strict=True)):
        shifted = emit.window(prior, level, LANES - span) if forward else emit.window(level, prior, span)
        level = combine(i, level, shifted)
        levels.append(level)
    return levels


def _keep_products(emit, keep, before, forward):
    """(keep2, keep4, keep8): lane j holds the product of the 2, 4, 8 keeps up to j (forward) or from j on.
    With ``before`` all ones (no neighbouring block), keep8 is the product from the block's edge to lane j."""
    return _doubling(emit, keep, before, forward, lambda i, level, shifted: emit.builder.fmul(level, shifted))


def _window_sums(emit, x, before, keeps, forward):
    """(w1, w2, w4): lane j sums x over the 2, 4, 8 tokens up to j (forward) or from j on, each times the keeps
    between it and j; ``keeps`` = (keep, keep2, keep4) of the block, ``before`` the neighbour's (x, w1, w2)."""
    return _doubling(emit, x, before, forward, lambda i, level, shifted: emit.fma(keeps[i], shifted, level))


@intrinsic
def forward_tile(typingctx, z, out, t, rows, offsets, states, gain, keep, tile, shared):
    """Filter tokens t..t+tile-1 (all valid) of four rows: out[row, t + i] <- the state after token i.

    z, out: [B, T] C-contiguous float32/64; rows, offsets: 4-tuples of row and table index of token t;
    states: the four states entering; gain, keep: float64 tables [>= offset + tile]; tile: a literal
    multiple of LANES; shared: a literal, True when the four offsets are equal (the table products are then
    computed once for the four rows). Returns the four states leaving.
    """
    _check_types(z, out, gain, keep, tile, shared)
    sig = types.UniTuple(types.float64, ROWS)(z, out, t, rows, offsets, states, gain, keep, tile, shared)

    def codegen(context, builder, sig, args):
        emit, zp, op, offs, (gain_p, keep_p) = _setup(context, builder, sig, args)
        zero, one = ir.Constant(_VEC, [0.0] * LANES), ir.Constant(_VEC, [1.0] * LANES)
        xs = cgutils.unpack_tuple(builder, args[5], ROWS)
        sets = 1 if shared.literal_value else ROWS  # coefficient sets: one per distinct offset
        prior = [(one, one, one)] * sets  # the block before's keep, keep2, keep4 (ones: none before)
        before = [(zero, zero, zero, None)] * ROWS  # per row, the block before's b, w1, w2, y
        for s in range(0, tile.literal_value, LANES):
            coef = []
            for c in range(sets):
                n = builder.add(offs[c], ir.Constant(offs[c].type, s))
                keep = emit.load(builder.gep(keep_p, [n]), _F64)
                # in the tile's first block (``prior`` all ones) keep8 is keep[o] ... keep[n], which carries
                # the state entering the tile
                keep2, keep4, keep8 = _keep_products(emit, keep, prior[c], True)
                prior[c] = (keep, keep2, keep4)
                coef.append((emit.load(builder.gep(gain_p, [n]), _F64), (keep, keep2, keep4), keep8))
            for k in range(ROWS):
                gain, keeps, keep8 = coef[k % sets]
                b = builder.fmul(gain, emit.load(emit.offset(zp[k], s)))
                w1, w2, w4 = _window_sums(emit, b, before[k][:3], keeps, True)
                y = emit.fma(keep8, emit.splat(xs[k]) if s == 0 else before[k][3], w4)
                emit.store(emit.offset(op[k], s), y)
                before[k] = (b, w1, w2, y)
        last = [emit.lane(y, LANES - 1) for _, _, _, y in before]
        return context.make_tuple(builder, sig.return_type, last)

    return sig, codegen


@intrinsic
def backward_tile(typingctx, g, dz, t, rows, offsets, states, gain, keep, tile, shared):
    """The reverse scan over tokens t+tile-1 down to t (all valid) of four rows.

    u_n = g_n + keep[n + 1] u_{n+1}, dz[row, t + i] <- gain[n] u_n (n the table index of token t + i).
    states: 4-tuple of (u, a) entering from above: the reverse state and the keep of the token after the tile
    (1 at a row's end, where u is 0); gain, keep: [>= offset + tile + 1]; the rest as forward_tile.
    Returns the four u leaving (the token below takes keep[offset] as its a).
    """
    _check_types(g, dz, gain, keep, tile, shared)
    sig = types.UniTuple(types.float64, ROWS)(g, dz, t, rows, offsets, states, gain, keep, tile, shared)

    def codegen(context, builder, sig, args):
        emit, gp, dp, offs, (gain_p, keep_p) = _setup(context, builder, sig, args)
        zero, one = ir.Constant(_VEC, [0.0] * LANES), ir.Constant(_VEC, [1.0] * LANES)
        entering = [
            cgutils.unpack_tuple(builder, pair, 2) for pair in cgutils.unpack_tuple(builder, args[5], ROWS)
        ]
        sets = 1 if shared.literal_value else ROWS
        prior = [(one, one, one)] * sets  # the block after's keep_after, keep2, keep4
        after = [(zero, zero, zero, None)] * ROWS  # per row, the block after's g, w1, w2, u
        top = tile.literal_value - LANES
        for s in range(top, -1, -LANES):
            coef = []
            for c in range(sets):
                n = builder.add(offs[c], ir.Constant(offs[c].type, s))
                # keep_after[j] = keep[n + j + 1], the keep of the token after token j
                keep_after = emit.load(builder.gep(keep_p, [builder.add(n, ir.Constant(n.type, 1))]), _F64)
                keep2, keep4, keep8 = _keep_products(emit, keep_after, prior[c], False)
                prior[c] = (keep_after, keep2, keep4)
                carry = keep8
                if s == top:
                    # keep[n + j + 1] ... keep[o + tile - 1], from lane j to the tile's top: the keep after
                    # the top token is the row's own ``a``, applied with u
                    last = ir.Constant(_I32, LANES - 1)
                    inner = builder.insert_element(keep_after, ir.Constant(_F64, 1.0), last)
                    carry = _keep_products(emit, inner, (one, one, one), False)[2]
                coef.append((emit.load(builder.gep(gain_p, [n]), _F64), (keep_after, keep2, keep4), carry))
            for k in range(ROWS):
                gain, keeps, carry = coef[k % sets]
                gv = emit.load(emit.offset(gp[k], s))
                w1, w2, w4 = _window_sums(emit, gv, after[k][:3], keeps, False)
                if s == top:  # u entering from above, carried by the keeps to the tile's top and a
                    u_in, a_in = entering[k]
                    u_next = emit.splat(builder.fmul(a_in, u_in))
                else:
                    u_next = after[k][3]
                u = emit.fma(carry, u_next, w4)
                emit.store(emit.offset(dp[k], s), builder.fmul(gain, u))
                after[k] = (gv, w1, w2, u)
        first_lanes = [emit.lane(u, 0) for _, _, _, u in after]
        return context.make_tuple(builder, sig.return_type, first_lanes)

    return sig, codegen


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
    """Whether any of tokens t..t+TILE-1 of row r is valid (slices, not indices: their bounds are known, so
    no negative-index wrap is compiled and the loop vectorizes)."""
    mr = m[r, t : t + TILE]
    acc = 0
    for i in range(TILE):
        acc |= mr[i]
    return acc != 0


@njit(inline="always")
def _all_valid(mode, m, ra, rb, rc, rd, t):
    """Whether tokens t..t+TILE-1 of rows ra..rd are all valid: mask bytes are 0 or 1, so their AND is 1
    (four rows in one vectorized pass and one reduction: a reduction per row costs ~30% of the loop)."""
    if mode == NOMASK:
        return True
    ma, mb, mc, md = m[ra, t : t + TILE], m[rb, t : t + TILE], m[rc, t : t + TILE], m[rd, t : t + TILE]
    acc = np.uint8(1)
    for i in range(TILE):
        acc &= ma[i] & mb[i] & mc[i] & md[i]
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
            if fast:  # a run of such tiles, while every lane holds a whole one: the states stay in registers
                rows4, xs = (row[a], row[b], row[c], row[d]), (x[a], x[b], x[c], x[d])
                stop = T
                for k in range(ROWS):
                    if end[k] >= 0:
                        stop = min(stop, end[k])
                run = 0
                shared = mode != SKIP or cnt[a] == cnt[b] == cnt[c] == cnt[d]
                while True:
                    if mode == SKIP:
                        o = (cnt[a] + run, cnt[b] + run, cnt[c] + run, cnt[d] + run)
                    else:
                        o = (t + run, t + run, t + run, t + run)
                    if shared:  # one set of table products for the four rows
                        xs = forward_tile(z, out, t + run, rows4, o, xs, gain, keep, TILE, True)
                    else:  # skip mode, rows that skipped different numbers of tokens
                        xs = forward_tile(z, out, t + run, rows4, o, xs, gain, keep, TILE, False)
                    run += TILE
                    if t + run + TILE > stop or not _all_valid(
                        mode, m, rows4[0], rows4[1], rows4[2], rows4[3], t + run
                    ):
                        break
                x[a], x[b], x[c], x[d] = xs
            else:
                run = TILE
                for k in range(ROWS):
                    if mode == ADVANCE and end[k] >= 0 and hole[k] > T:  # no hole yet: the table's variance
                        p[k] = _posterior(gain, t, p0, v)
                _general_forward(mode, z, m, out, gain, keep, q, v, t, lanes, row, cnt, x, p)
            for k in range(ROWS):
                if end[k] >= 0:
                    if fast:
                        cnt[k] += run
                    elif hole[k] > T and cnt[k] < t + TILE:
                        # the row's first hole (until then its valid count equals its position)
                        hole[k] = _first_hole(m, row[k], t)
            t += run


# One compiled entry point per mode, so that a run compiles only the modes it uses (each is several
# seconds): out[r] <- filtered z[r] for rows [lo, hi); x_end[r] <- the final state (non-finite iff a valid z
# was); aux[r] <- (end, valid count, first hole) of row r, for the backward.
# z, out: [B, T] float32/64, C-contiguous; m: uint8 [B, T] (any [1, 1] array in NOMASK); gain, keep: float64
# [>= T + 1] (the backward's vector blocks read the keep after the last token).
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


# The same over numba's threading layer: rows [0, B) in ranges of ``per`` rows, one entry point per mode
# (each links its serial one, so it compiles in ~1 s). Its native threads start and join in microseconds
# (Python threads took ~0.13 ms a call: 1.1x on two cores against 1.9x here). The caller sets the thread
# count and a chunk size of 1, so threads take the ranges one at a time and one that gets no core on a
# shared machine holds up no one. Written out per mode, not made by a factory: numba's cache misses closures
# (each process would add and compile a new entry).
@njit(cache=True, nogil=True, parallel=True)
def _forward_nomask_threads(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, per):
    B = z.shape[0]
    for i in prange(-(-B // per)):
        _forward_nomask(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, i * per, min(B, i * per + per))


@njit(cache=True, nogil=True, parallel=True)
def _forward_skip_threads(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, per):
    B = z.shape[0]
    for i in prange(-(-B // per)):
        _forward_skip(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, i * per, min(B, i * per + per))


@njit(cache=True, nogil=True, parallel=True)
def _forward_advance_threads(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, per):
    B = z.shape[0]
    for i in prange(-(-B // per)):
        _forward_advance(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, i * per, min(B, i * per + per))


@njit(cache=True, nogil=True, parallel=True)
def _forward_zero_threads(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, per):
    B = z.shape[0]
    for i in prange(-(-B // per)):
        _forward_zero(z, m, gain, keep, q, v, p0, x0, out, x_end, aux, i * per, min(B, i * per + per))


FORWARD_THREADS = {
    NOMASK: _forward_nomask_threads,
    SKIP: _forward_skip_threads,
    ADVANCE: _forward_advance_threads,
    ZERO: _forward_zero_threads,
}


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
        t = start - TILE
        while t >= 0:
            src, joins = -1, -1  # an active lane; the top of the next lane to join (lower tops join later)
            for k in range(ROWS):
                if top[k] > t:
                    src = k
                else:
                    joins = max(joins, top[k])
            clean = True
            for k in range(ROWS):
                lanes[k] = k if top[k] > t else src  # lanes not yet in (a lower top) mirror an active one
                clean = clean and not (top[k] > t and t + TILE > hole[k])
            a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
            # below every row's first hole all tokens are valid (the forward found it): no mask read; above
            # it advance mode's gains are the row's own, the other modes look at the mask
            fast = clean or (mode != ADVANCE and _all_valid(mode, m, row[a], row[b], row[c], row[d], t))
            if fast:  # a run of such tiles down to the next lane's top: the states stay in registers
                rows4 = (row[a], row[b], row[c], row[d])
                entering = ((u[a], an[a]), (u[b], an[b]), (u[c], an[c]), (u[d], an[d]))
                run = 0
                shared = mode != SKIP or cnt[a] == cnt[b] == cnt[c] == cnt[d]
                floor, hole_min = max(joins, 0), T  # the run's lanes stay; clean down to their first hole
                for k in range(ROWS):
                    if top[k] > t:
                        hole_min = min(hole_min, hole[k])
                while True:
                    if mode == SKIP:
                        o = (
                            cnt[a] - run - TILE,
                            cnt[b] - run - TILE,
                            cnt[c] - run - TILE,
                            cnt[d] - run - TILE,
                        )
                    else:
                        o = (t - run, t - run, t - run, t - run)
                    if shared:
                        us = backward_tile(g, dz, t - run, rows4, o, entering, gain, keep, TILE, True)
                    else:
                        us = backward_tile(g, dz, t - run, rows4, o, entering, gain, keep, TILE, False)
                    keeps = (keep[o[0]], keep[o[1]], keep[o[2]], keep[o[3]])  # the token below takes these
                    entering = ((us[0], keeps[0]), (us[1], keeps[1]), (us[2], keeps[2]), (us[3], keeps[3]))
                    run += TILE
                    below = t - run
                    if below < floor:
                        break
                    # scalars only in this loop: an array handed to a helper here costs reference counts
                    if below + TILE > hole_min and (
                        mode == ADVANCE
                        or not _all_valid(mode, m, rows4[0], rows4[1], rows4[2], rows4[3], below)
                    ):
                        break
                u[a], u[b], u[c], u[d] = us
                an[a], an[b], an[c], an[d] = keeps
                for k in range(ROWS):
                    if top[k] > t:
                        cnt[k] -= run
            else:
                run = TILE
                _general_backward(mode, g, m, dz, gain, keep, kb, ab, t, lanes, row, cnt, hole, u, an)
            t -= run


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


@njit(cache=True, nogil=True, parallel=True)
def _backward_nomask_threads(g, m, gain, keep, q, v, p0, aux, dz, per):
    B = g.shape[0]
    for i in prange(-(-B // per)):
        _backward_nomask(g, m, gain, keep, q, v, p0, aux, dz, i * per, min(B, i * per + per))


@njit(cache=True, nogil=True, parallel=True)
def _backward_skip_threads(g, m, gain, keep, q, v, p0, aux, dz, per):
    B = g.shape[0]
    for i in prange(-(-B // per)):
        _backward_skip(g, m, gain, keep, q, v, p0, aux, dz, i * per, min(B, i * per + per))


@njit(cache=True, nogil=True, parallel=True)
def _backward_advance_threads(g, m, gain, keep, q, v, p0, aux, dz, per):
    B = g.shape[0]
    for i in prange(-(-B // per)):
        _backward_advance(g, m, gain, keep, q, v, p0, aux, dz, i * per, min(B, i * per + per))


@njit(cache=True, nogil=True, parallel=True)
def _backward_zero_threads(g, m, gain, keep, q, v, p0, aux, dz, per):
    B = g.shape[0]
    for i in prange(-(-B // per)):
        _backward_zero(g, m, gain, keep, q, v, p0, aux, dz, i * per, min(B, i * per + per))


BACKWARD_THREADS = {
    NOMASK: _backward_nomask_threads,
    SKIP: _backward_skip_threads,
    ADVANCE: _backward_advance_threads,
    ZERO: _backward_zero_threads,
}
