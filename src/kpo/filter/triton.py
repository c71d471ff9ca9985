"""Triton GPU kernels of the filter (extra ``gpu``): one pass over memory forward, one backward.

Each program owns one row and walks T in tiles. Inside a tile the recurrence x_t = (1 - c_t) x_{t-1} + b_t
(c = gain, b = gain * z) is a scan of affine maps, done with ``tl.associative_scan``; the state between
tiles is carried in float64. Maps are stored as (c, b) rather than (1 - c, b): composing keeps c's relative
precision, where 1 - c in float32 would lose the gain itself when it is small (c ~ 1e-4 at q/v = 1e-8).

Gains come from the float64 table (cast to the compute dtype) at the token's position (``zero``, no mask)
or rank among valid tokens (``skip``). In ``advance`` mode they depend on the hole pattern: the variance
steps are Moebius maps (see ``scan._advance_priors``), scanned in float64 in the kernel; the posterior
after token t is v K_t, so K_t = posterior / v needs no shifted scan. The backward is the reverse scan
u_t = w_t + (1 - K_{t+1}) u_{t+1}, dz_t = K_t u_t, walking tiles from the end. A tile is held in
descending order (a forward scan over it runs backwards in time: ``reverse=True`` scans have had
wrong results for non-commutative combines on GPUs, triton issue 4362), but read and written as rows of
ascending 16-byte vectors that each thread flips in registers (``_positions_down``).

Memory accesses decide the speed: ``kpo bench triton-ptx`` compiles every variant for sm_90 without a GPU
and counts vector and scalar accesses, barriers and shuffles (the tests hold the backward to vector
accesses and to no more barriers than the forward). ``TRITON_INTERPRET=1`` runs the kernels on CPU tensors
(the tests do).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kpo.filter.gains import gain_tensors

# kernels may read only constexpr globals
NOMASK, SKIP, ADVANCE, ZERO = (tl.constexpr(code) for code in range(4))
_MODE_CODE = {"skip": 1, "advance": 2, "zero": 3}
# tokens per tile and warps per program, overridable for tuning on a given GPU; defaults measured on an
# H200 at 1024 x 32768 in skip mode: forward 8 warps 48% of copy bandwidth (4 warps: 42%), and with the
# earlier backward (scalar descending reads) 4 warps 20% (8: 17%)
BLOCK = int(os.environ.get("KPO_TRITON_BLOCK", "1024"))
NUM_WARPS = int(os.environ.get("KPO_TRITON_WARPS", "8"))
NUM_WARPS_BACKWARD = int(os.environ.get("KPO_TRITON_WARPS", "4"))


@triton.jit
def _affine(c1, b1, c2, b2):
    # map 1 then map 2: x -> (1 - c2)((1 - c1) x + b1) + b2
    return c1 + c2 - c1 * c2, b2 + b1 - c2 * b1


@triton.jit
def _moebius(a11, a12, a21, a22, b11, b12, b21, b22):
    # map a then map b: the product b @ a, rescaled (a Moebius map is unchanged by scaling)
    c11 = b11 * a11 + b12 * a21
    c12 = b11 * a12 + b12 * a22
    c21 = b21 * a11 + b22 * a21
    c22 = b21 * a12 + b22 * a22
    s = c11 + c12 + c21 + c22
    return c11 / s, c12 / s, c21 / s, c22 / s


@triton.jit
def _add2(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _last2(c, b, idx, BLOCK: tl.constexpr):
    """The tile's composed map (its last scan entry) as float64, with a single reduction."""
    is_last = idx == BLOCK - 1
    c_last, b_last = tl.reduce((tl.where(is_last, c, 0.0), tl.where(is_last, b, 0.0)), 0, _add2)
    return c_last.to(tl.float64), b_last.to(tl.float64)


@triton.jit
def _last(x, idx, BLOCK: tl.constexpr):
    return tl.sum(tl.where(idx == BLOCK - 1, x, 0.0), axis=0)


@triton.jit
def _advance_gains(valid, inb, p, q, v, idx, BLOCK: tl.constexpr):
    """Gains of one tile in ``advance`` mode from the posterior p before it; returns (gains, p after)."""
    one = tl.full([BLOCK], 1.0, tl.float64)
    zero = tl.zeros([BLOCK], tl.float64)
    # update [[v, vq], [1, q + v]]; hole [[1, q], [0, 1]]; beyond T the identity
    m11 = tl.where(valid, one * v, one)
    m12 = tl.where(valid, one * (v * q), tl.where(inb, one * q, zero))
    m21 = tl.where(valid, one, zero)
    m22 = tl.where(valid, one * (q + v), one)
    s11, s12, s21, s22 = tl.associative_scan((m11, m12, m21, m22), 0, _moebius)
    post = (s11 * p + s12) / (s21 * p + s22)
    return tl.where(valid, post / v, 0.0), _last(post, idx, BLOCK)


@triton.jit
def _load_tile(z_ptr, m_ptr, base, offs, T, MODE: tl.constexpr):
    """(valid, z) of one tile; a masked z reads as 0 (it may be NaN).

    z is loaded under the tile bounds only and zeroed with a select: a per-token load mask would stop the
    compiler from vectorizing the load, and the masked tokens' bytes are in the same cache lines anyway."""
    inb = offs < T
    if MODE == NOMASK:
        valid = inb
    else:
        valid = tl.load(m_ptr + base + offs, mask=inb, other=0) != 0
    return valid, tl.where(valid, tl.load(z_ptr + base + offs, mask=inb, other=0.0), 0.0)


@triton.jit
def _positions_down(lo, VEC: tl.constexpr, BLOCK: tl.constexpr):
    """Positions lo + BLOCK - VEC (r + 1) + c of the tile [lo, lo + BLOCK) as [BLOCK / VEC, VEC]: ascending
    along a row, so that a row is one vector access when lo is aligned (the compiler proves it from T's
    divisibility); ``_flat_down`` turns a tile of them into the descending order lo + BLOCK - 1, ..., lo."""
    rows = tl.arange(0, BLOCK // VEC)[:, None]
    cols = tl.arange(0, VEC)[None, :]
    return lo + (BLOCK - VEC) - VEC * rows + cols


@triton.jit
def _flat_down(x, BLOCK: tl.constexpr):
    # the flip stays within a thread's vector of VEC elements
    return tl.reshape(tl.flip(x, 1), [BLOCK])


@triton.jit
def _unflat_down(x, VEC: tl.constexpr, BLOCK: tl.constexpr):
    # the inverse of _flat_down (a flip is its own inverse)
    return tl.flip(tl.reshape(x, [BLOCK // VEC, VEC]), 1)


@triton.jit
def _gather_down(ptr, index, mask, VEC: tl.constexpr, BLOCK: tl.constexpr):
    """ptr[index] (0 where not mask) for [BLOCK] index and mask in tile order. Done in the tiles' 2D shape:
    the compiler then gives the gather the layout of the tile's vector loads, with no layout shuffle."""
    index2 = _unflat_down(index, VEC, BLOCK)
    mask2 = _unflat_down(mask.to(tl.int8), VEC, BLOCK) != 0
    return _flat_down(tl.load(ptr + index2, mask=mask2, other=0.0), BLOCK)


@triton.jit
def _load_down(ptr, base, lo, T, VEC: tl.constexpr, BLOCK: tl.constexpr):
    """Positions lo + BLOCK - 1, ..., lo of a row as [BLOCK] (0 outside [0, T))."""
    pos = _positions_down(lo, VEC, BLOCK)
    return _flat_down(tl.load(ptr + base + pos, mask=(pos >= 0) & (pos < T), other=0), BLOCK)


@triton.jit
def _forward_kernel(
    z_ptr,
    m_ptr,
    out_ptr,
    gain_ptr,
    param_ptr,
    xend_ptr,
    T,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = row * T
    q = tl.load(param_ptr + 0)
    v = tl.load(param_ptr + 1)
    p = tl.load(param_ptr + 2)
    x = tl.load(param_ptr + 3)
    idx = tl.arange(0, BLOCK)
    cnt = 0
    # the next tile is loaded while this one is scanned: the loads' latency hides behind the scan
    valid_next, z_next = _load_tile(z_ptr, m_ptr, base, idx, T, MODE)
    for start in range(0, T, BLOCK):
        offs = start + idx
        inb = offs < T
        valid, zt = valid_next, z_next
        valid_next, z_next = _load_tile(z_ptr, m_ptr, base, offs + BLOCK, T, MODE)
        if MODE == SKIP:
            rank = cnt + tl.cumsum(valid.to(tl.int32), axis=0) - 1
            k = tl.load(gain_ptr + rank, mask=valid, other=0.0)
            cnt += tl.sum(valid.to(tl.int32), axis=0)
        elif MODE == ADVANCE:
            k64, p = _advance_gains(valid, inb, p, q, v, idx, BLOCK)
            k = k64.to(gain_ptr.dtype.element_ty)
        else:
            k = tl.load(gain_ptr + offs, mask=inb, other=0.0)
        c, b = tl.associative_scan((k, k * zt.to(k.dtype)), 0, _affine)
        xc = x.to(k.dtype)
        tl.store(out_ptr + base + offs, tl.where(valid, xc + (b - c * xc), 0.0), mask=inb)
        c_tile, b_tile = _last2(c, b, idx, BLOCK)
        x = x + (b_tile - c_tile * x)
    tl.store(xend_ptr + row, x)


@triton.jit
def _advance_gains_kernel(m_ptr, k_ptr, param_ptr, T, BLOCK: tl.constexpr):
    """Per-token gains [B, T] of ``advance`` mode (0 at holes) for its backward, from the mask alone."""
    row = tl.program_id(0).to(tl.int64)
    base = row * T
    q = tl.load(param_ptr + 0)
    v = tl.load(param_ptr + 1)
    p = tl.load(param_ptr + 2)
    idx = tl.arange(0, BLOCK)
    for start in range(0, T, BLOCK):
        offs = start + idx
        inb = offs < T
        valid = tl.load(m_ptr + base + offs, mask=inb, other=0) != 0
        k, p = _advance_gains(valid, inb, p, q, v, idx, BLOCK)
        tl.store(k_ptr + base + offs, k.to(k_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _store_down(ptr, base, lo, x, VEC: tl.constexpr, BLOCK: tl.constexpr):
    """Store [BLOCK] x, element j at position lo + BLOCK - 1 - j (positions below 0 dropped)."""
    pos = _positions_down(lo, VEC, BLOCK)
    tl.store(ptr + base + pos, tl.flip(tl.reshape(x, [BLOCK // VEC, VEC]), 1), mask=pos >= 0)


@triton.jit
def _backward_kernel(
    g_ptr,
    m_ptr,
    dz_ptr,
    gain_ptr,
    count_ptr,
    T,
    MODE: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = row * T
    idx = tl.arange(0, BLOCK)
    u = tl.sum(tl.zeros([1], tl.float64), axis=0)
    if MODE == SKIP:
        cnt_hi = tl.load(count_ptr + row)  # valid tokens at or before the current tile's last position
    # tiles [lo, lo + BLOCK) from the row's end down; element j of a tile is position lo + BLOCK - 1 - j, so
    # the scan runs backwards in time. The next tile is loaded while this one is scanned.
    g_next = _load_down(g_ptr, base, T - BLOCK, T, VEC, BLOCK)
    if MODE != NOMASK:
        m_next = _load_down(m_ptr, base, T - BLOCK, T, VEC, BLOCK)
    for i in range(0, tl.cdiv(T, BLOCK)):
        lo = T - (i + 1) * BLOCK
        offs = lo + (BLOCK - 1) - idx
        inb = offs >= 0
        gt = g_next
        g_next = _load_down(g_ptr, base, lo - BLOCK, T, VEC, BLOCK)
        if MODE == NOMASK:
            valid = inb
        else:
            valid = m_next != 0
            m_next = _load_down(m_ptr, base, lo - BLOCK, T, VEC, BLOCK)
        if MODE == SKIP:  # a hole takes no step: K_{t+1} is 0 there, and the next valid rank's gain otherwise
            after = _load_down(m_ptr, base, lo + 1, T, VEC, BLOCK) != 0
            suffix = tl.cumsum(valid.to(tl.int32), axis=0)  # valid tokens in [t, tile end]
            k = _gather_down(gain_ptr, cnt_hi - suffix, valid, VEC, BLOCK)
            k_next = _gather_down(gain_ptr, cnt_hi - suffix + valid.to(tl.int32), after, VEC, BLOCK)
            cnt_hi -= tl.sum(valid.to(tl.int32), axis=0)
        elif MODE == ADVANCE:  # gain_ptr holds this call's per-token gains [B, T] (0 at holes)
            k = _load_down(gain_ptr, base, lo, T, VEC, BLOCK)
            k_next = _load_down(gain_ptr, base, lo + 1, T, VEC, BLOCK)
        else:  # every token, masked or not, is a step: K_{t+1} is the next position's gain
            k = _load_down(gain_ptr, 0, lo, T, VEC, BLOCK)
            k_next = _load_down(gain_ptr, 0, lo + 1, T, VEC, BLOCK)
        w = tl.where(valid, gt, 0.0).to(k.dtype)  # a masked token's incoming gradient must not leak in
        c, b = tl.associative_scan((k_next, w), 0, _affine)
        uc = u.to(k.dtype)
        _store_down(dz_ptr, base, lo, tl.where(valid, k * (uc + (b - c * uc)), 0.0), VEC, BLOCK)
        c_tile, b_tile = _last2(c, b, idx, BLOCK)
        u = u + (b_tile - c_tile * u)


def _setup(x: torch.Tensor, mask, mode: str, q: float, v: float, p0: float):
    B, T = x.shape
    code = 0 if mask is None else _MODE_CODE[mode]
    gain, _ = gain_tensors(T + 1, q, v, p0, x.device, x.dtype)  # one spare entry: the backward reads K_{t+1}
    m = mask.view(torch.uint8) if mask is not None else x  # never read without a mask
    return B, T, code, gain, m


@functools.lru_cache(maxsize=64)
def _params(q: float, v: float, p0: float, x0: float, device: torch.device) -> torch.Tensor:
    """(q, v, p0, x0) as a float64 device tensor (a Python float would reach the kernel as float32), cached:
    building it is a host-to-device copy."""
    return torch.tensor([q, v, p0, x0], dtype=torch.float64, device=device)


def _meta(kernel, dtype: torch.dtype) -> dict:
    """Compile-time arguments and warps of a kernel launch on ``dtype`` tensors (read at call time, so that
    tests and tuning can change BLOCK and the warps)."""
    if kernel is not _backward_kernel:
        return {"BLOCK": BLOCK, "num_warps": NUM_WARPS}
    return {"VEC": 16 // dtype.itemsize, "BLOCK": BLOCK, "num_warps": NUM_WARPS_BACKWARD}


def forward(z, mask, mode, q, v, p0, x0):
    """Filter of z [B, T] (float32/64, contiguous) -> (out in z's dtype, 0 at masked; final states float64 [B])."""
    B, T, code, gain, m = _setup(z, mask, mode, q, v, p0)
    out = torch.empty_like(z)
    x_end = torch.empty(B, dtype=torch.float64, device=z.device)
    params = _params(q, v, p0, x0, z.device)
    meta = _meta(_forward_kernel, z.dtype)
    _forward_kernel[(B,)](z, m, out, gain, params, x_end, T, MODE=code, **meta)
    return out, x_end


def backward(grad, mask, mode, q, v, p0):
    """Gradient w.r.t. z of sum(grad * filter(z)) [B, T] in grad's dtype."""
    B, T, code, gain, m = _setup(grad, mask, mode, q, v, p0)
    dz = torch.empty_like(grad)
    if code == _MODE_CODE["advance"]:
        # the gains depend on the holes before a token, and the backward walks from the end: a pass over
        # the mask writes them first (5 bytes/token)
        gain = torch.empty_like(grad)
        params = _params(q, v, p0, 0.0, grad.device)
        _advance_gains_kernel[(B,)](m, gain, params, T, **_meta(_advance_gains_kernel, grad.dtype))
    # skip mode ranks tokens from the row's end, so it needs each row's count of valid tokens
    count = mask.sum(dim=1, dtype=torch.int32) if code == _MODE_CODE["skip"] else gain
    _backward_kernel[(B,)](grad, m, dz, gain, count, T, MODE=code, **_meta(_backward_kernel, grad.dtype))
    return dz


# launch variants: (kernel, mode code) with mode code 0 = no mask
VARIANTS = [(kernel, code) for kernel in (_forward_kernel, _backward_kernel) for code in range(4)]
VARIANTS += [(_advance_gains_kernel, 2)]
MODE_NAMES = ("none", "skip", "advance", "zero")
# argument types by name; the data pointers take the dtype compiled for
_ARG_TYPES = {"m_ptr": "*u8", "param_ptr": "*fp64", "xend_ptr": "*fp64", "count_ptr": "*i32", "T": "i32"}


def compile_for(kernel, code: int, dtype: torch.dtype, arch: int = 90):
    """One kernel variant compiled for NVIDIA sm_{arch} with triton's bundled toolchain: no GPU needed.

    Specialized as a launch on 16-byte-aligned tensors with T % 16 == 0 is (what lets the compiler prove
    vector accesses). Returns triton's compiled kernel; ``.asm`` holds its "ttgir" and "ptx". Needs
    TRITON_INTERPRET unset when triton was imported.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    data = {torch.float32: "*fp32", torch.float64: "*fp64"}[dtype]
    meta = _meta(kernel, dtype)
    warps = meta.pop("num_warps")
    consts = ({"MODE": code} if "MODE" in kernel.arg_names else {}) | meta
    names = kernel.arg_names
    signature = {n: "constexpr" if n in consts else _ARG_TYPES.get(n, data) for n in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in consts}
    source = ASTSource(kernel, signature, consts, aligned)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
