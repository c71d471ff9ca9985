"""The dispatch behind ``kpo.filter.kalman_filter``: the backend choice, the autograd function and the numba
path's threads.

``kalman_filter(..., backend=...)`` picks one path: ``auto`` (the default: triton for CUDA tensors, numba for CPU
tensors, torch otherwise), ``numba``, ``torch``, ``triton``, or ``reference`` (the float64 loop: slow, no
gradient, for checks). Without the keyword, ``KPO_FILTER_BACKEND`` names it. numba's compiled loop
(``compiled.py``) runs rows in ranges over torch's thread count; the Triton kernels (``triton.py``) load on first
use (:func:`triton_kernels`).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import threading

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from kpo._checks import bool_mask, with_values
from kpo.filter import scan
from kpo.filter.gains import check_params, gain_tables
from kpo.filter.reference import MASK_MODES, kalman_filter_reference

try:
    import numba

    from kpo.filter import compiled
except ImportError:  # numba missing: the torch path serves CPU tensors
    compiled = None


@functools.cache
def triton_kernels():
    """The Triton kernel module, or None without triton (then the torch path serves CUDA tensors).

    Imported on first use: importing triton is slow, and TRITON_INTERPRET must be set before it is.
    """
    try:
        return importlib.import_module("kpo.filter.triton")
    except ImportError:
        return None


BACKENDS = ("auto", "numba", "torch", "triton", "reference")


def kalman_filter(
    z: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    q: float = 1e-6,
    v: float = 1.0,
    p0: float = 0.0,
    x0: float = 0.0,
    mask_mode: str = "skip",
    backend: str | None = None,
) -> torch.Tensor:
    """Filtered log-ratio rho_{t|t} of ``z``: same shape, dtype and device, 0 where ``mask`` is 0.

    z:    [B, T] or [T] log importance ratios, floating (fp16/bf16 are computed in float32).
    mask: same shape, bool or 0/1; None = every token valid.
    q, v: process and observation noise (> 0); p0 (>= 0), x0: initial variance and state.
    mask_mode: "skip"    masked token = no observation and no time step (the state carries over);
               "advance" masked token = a time step (P += q) without an observation;
               "zero"    masked token = an observation of 0 (the authors' recurrence).
    backend: "auto" (triton for CUDA tensors, numba for CPU tensors, torch otherwise), "numba", "torch",
             "triton", or "reference" (the float64 loop: slow and not differentiable, for checks);
             None = the environment variable KPO_FILTER_BACKEND, else "auto".
    Differentiable w.r.t. z (the backward is the reverse scan); detach z for the paper's behaviour.
    """
    if backend is None:
        backend = os.environ.get("KPO_FILTER_BACKEND", "auto")
    if not isinstance(z, torch.Tensor):
        hint = " (torch.from_numpy(z) makes one without a copy)" if type(z).__module__ == "numpy" else ""
        raise TypeError(
            f"z must be a torch tensor, got {type(z).__module__}.{type(z).__name__}: pass a "
            f"floating-point torch.Tensor{hint}"
        )
    with_values(z=z, mask=mask)
    if not z.is_floating_point():
        raise TypeError(f"z must be a floating-point tensor, got {z.dtype}: convert it with z.float()")
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mask_mode!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend (or KPO_FILTER_BACKEND) must be one of {BACKENDS}, got {backend!r}")
    check_params(q, v, p0, x0)
    if z.dim() not in (1, 2):
        raise ValueError(f"z must be [B, T] or [T], got shape {tuple(z.shape)}")
    if mask is not None:
        mask = _check_mask(z, mask)
    if z.numel() == 0:
        return z.clone()
    squeeze = z.dim() == 1
    z2 = z.unsqueeze(0) if squeeze else z
    m2 = None if mask is None else (mask.unsqueeze(0) if squeeze else mask)
    work = z2 if z2.dtype in (torch.float32, torch.float64) else z2.float()
    if backend == "reference":
        out = _reference(work, m2, mask_mode, q, v, p0, x0)
    else:
        params = (mask_mode, float(q), float(v), float(p0), float(x0))
        if work.requires_grad and torch.is_grad_enabled():
            out = _Filter.apply(work.contiguous(), m2, params, backend)
        else:  # no graph to record (KPO detaches z): the autograd Function's entry and exit cost ~50 us
            out = _forward(work.contiguous(), m2, params, backend)[0]
    out = out.to(z.dtype)
    return out.squeeze(0) if squeeze else out


def _reference(z, mask, mode, q, v, p0, x0):
    """The float64 loop reference through the public call's checks (no gradient: it runs in Python floats)."""
    if z.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("backend 'reference' computes no gradient: detach z, or pick another backend")
    out = kalman_filter_reference(
        z.cpu(), None if mask is None else mask.cpu(), q=q, v=v, p0=p0, x0=x0, mask_mode=mode
    )
    if not bool(torch.isfinite(out).all()):
        _raise_non_finite(z, mask, mode)
    return out.to(z.dtype).to(z.device)


def _check_mask(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mask as a contiguous bool tensor, or ValueError naming what is wrong and where."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a tensor (bool or 0/1) or None, got {type(mask).__name__}")
    if mask.shape != z.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match z shape {tuple(z.shape)}")
    if mask.device != z.device:
        raise ValueError(f"mask is on {mask.device} but z is on {z.device}; move one of them")
    return bool_mask(mask).contiguous()


def _resolve(backend: str, z: torch.Tensor) -> str:
    if backend == "auto":
        if z.is_cuda:
            return "triton" if triton_kernels() is not None else "torch"
        return "numba" if compiled is not None and z.device.type == "cpu" else "torch"
    if backend == "numba" and (compiled is None or z.device.type != "cpu"):
        raise RuntimeError("backend 'numba' needs numba (pip install 'kpo[fast]') and a CPU tensor")
    if backend == "triton" and triton_kernels() is None:
        raise RuntimeError("backend 'triton' needs triton (pip install 'kpo[gpu]')")
    return backend


def _numba_rows(serial, threaded, B: int, T: int, *args) -> None:
    """Run ``serial(*args, 0, B)``, or ``threaded(*args, per)`` over row ranges when the work is large enough.

    Threads: torch.get_num_threads() (so kpo never runs more threads than torch beside it), at most numba's
    and the groups of rows. The rows are cut into about CHUNKS_PER_THREAD ranges per thread (multiples of
    ROWS, each at least MIN_CHUNK_TOKENS) that the threads take one at a time. A process forked from one
    that ran threads stays on one: GNU OpenMP, numba's threading layer where it is installed, cannot start
    again after a fork, and numba ends such a child ("fork() called from a process already using GNU OpenMP").
    """
    global _threads_started
    groups = -(-B // compiled.ROWS)
    threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS, groups)
    if threads <= 1 or B * T < 2 * MIN_CHUNK_TOKENS or _forked:
        serial(*args, 0, B)
        return
    per = max(-(-groups // (threads * CHUNKS_PER_THREAD)), -(-MIN_CHUNK_TOKENS // (T * compiled.ROWS)))
    with _THREADS_LOCK:  # numba's workqueue layer (where no OpenMP or TBB) aborts on concurrent launches
        _threads_started = True
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            with numba.parallel_chunksize(1):
                threaded(*args, per * compiled.ROWS)
        finally:
            numba.set_num_threads(before)


# row ranges per thread, and the fewest tokens in one: on the 2-core machine of the README two threads pay off
# from ~256k tokens a call (1.1x there, 1.4-1.6x at 1M, 1.6-1.8x at 2M)
CHUNKS_PER_THREAD = 4
MIN_CHUNK_TOKENS = 1 << 17
_THREADS_LOCK = threading.Lock()
_threads_started = False  # in this process or the one it was forked from
_forked = False  # from a process whose threads had started


def _after_fork_in_child() -> None:
    global _forked
    _forked = _threads_started


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _numba_mask(mask, mode):
    """(uint8 view of the mask or a placeholder, the kernel's mode code): no copy of the mask."""
    if mask is None:
        return _NO_MASK, compiled.NOMASK
    return mask.numpy().view(np.uint8), _MODE_CODE[mode]


def _numba_forward(z, mask, mode, q, v, p0, x0):
    """-> (out [B, T] in z's dtype, final states float64 [B], per-row facts int64 [B, 3] for the backward)."""
    B, T = z.shape
    gain, keep = gain_tables(T, q, v, p0)
    out = torch.empty_like(z)
    x_end = torch.empty(B, dtype=torch.float64)
    aux = torch.empty(B, 3, dtype=torch.int64)
    m, code = _numba_mask(mask, mode)
    args = (z.detach().numpy(), m, gain, keep, q, v, p0, x0, out.numpy(), x_end.numpy(), aux.numpy())
    _numba_rows(compiled.FORWARD[code], compiled.FORWARD_THREADS[code], B, T, *args)
    return out, x_end, aux


def _numba_backward(grad, mask, aux, mode, q, v, p0):
    B, T = grad.shape
    gain, keep = gain_tables(T + 1, q, v, p0)  # + 1: the vector blocks read the keep after the last token
    dz = torch.empty_like(grad)
    m, code = _numba_mask(mask, mode)
    args = (grad.numpy(), m, gain, keep, q, v, p0, aux.numpy(), dz.numpy())
    _numba_rows(compiled.BACKWARD[code], compiled.BACKWARD_THREADS[code], B, T, *args)
    return dz


_MODE_CODE = {"skip": 1, "advance": 2, "zero": 3}
_NO_MASK = np.ones((1, 1), dtype=np.uint8)


def _forward(z, mask, params, backend):
    """-> (the filtered z, the path that ran, the numba path's per-row facts for its backward or None)."""
    mode, q, v, p0, x0 = params
    path = _resolve(backend, z)
    aux = None  # the numba path's per-row facts (end, valid count, first hole), for its backward
    if path == "numba":
        out, x_end, aux = _numba_forward(z, mask, mode, q, v, p0, x0)
    elif path == "triton":
        out, x_end = triton_kernels().forward(z, mask, mode, q, v, p0, x0)
    else:
        out, x_end = scan.forward(z, mask, mode, q, v, p0, x0)
    # one reduction and one device sync: the sum of the final states is finite unless one is not (or,
    # harmlessly, unless finite float64 states overflow in the sum, which the exact check then clears)
    total = float(x_end.numpy().sum()) if x_end.device.type == "cpu" else float(x_end.sum())
    if not math.isfinite(total) and not bool(torch.isfinite(x_end).all()):
        _raise_non_finite(z, mask, mode)
    return out, path, aux


class _Filter(torch.autograd.Function):
    """Linear in z: the backward is the reverse scan with the same gains (no tensors of z are kept)."""

    @staticmethod
    def forward(ctx, z, mask, params, backend):
        out, path, aux = _forward(z, mask, params, backend)
        ctx.save_for_backward(mask, aux)
        ctx.params, ctx.path = params, path
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        mask, aux = ctx.saved_tensors
        mode, q, v, p0, _ = ctx.params
        grad = grad.contiguous()
        if ctx.path == "numba":
            dz = _numba_backward(grad, mask, aux, mode, q, v, p0)
        elif ctx.path == "triton":
            dz = triton_kernels().backward(grad, mask, mode, q, v, p0)
        else:
            dz = scan.backward(grad, mask, mode, q, v, p0)
        return dz, None, None, None


def _raise_non_finite(z, mask, mode):
    """A row's final state is non-finite only if a z it read was: name how many and the first (row, t)."""
    bad = ~torch.isfinite(z)
    if mask is not None:
        bad &= mask
    count = int(bad.sum())
    if not count:  # the state is a convex combination of x0 and z, and check_params keeps the gains finite
        raise RuntimeError(
            f"internal error: a non-finite filter state from finite z (mask_mode={mode!r}); please report it "
            "with the inputs"
        )
    first = tuple(int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"z has {count} NaN/Inf value(s) at valid (unmasked) positions, first at (row, t) = {first}; "
        "mask them out or fix the log-probabilities upstream"
    )

