"""Pure-torch path of the filter (any device): per-token gains, then a blocked linear scan, in float64.

With data-independent gains the filter is the first-order linear recurrence
    x_t = keep_t * x_{t-1} + gain_t * y_t          (keep = 1 - gain; skipped tokens: keep 1, gain 0)
whose backward is the same recurrence run in reverse. The blocked scan cuts T into ~sqrt(T) chunks of
~sqrt(T) tokens: one loop step advances every chunk of every row at once, a second loop carries the
state across chunks, and a final vectorized pass adds each chunk's carried-in state. It never divides by a
cumulative product (the authors' overflow), so it is exact in float64 for any gains.
"""

from __future__ import annotations

import math

import torch

from kpo.filter.gains import gain_tensors

_F64 = torch.float64


def token_gains(
    mask: torch.Tensor | None, mode: str, T: int, q: float, v: float, p0: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (gain, keep), float64 [B, T], or the shared [T] table entries when they serve every row.

    mask: bool [B, T] or None. A masked token gets gain 0 and keep 1, except in ``zero`` mode (a masked
    token is an observation of 0) and in trailing padding: when every row is a valid prefix followed by
    padding, the positional table serves all rows, since nothing valid follows the padding.
    """
    gain, keep = gain_tensors(T, q, v, p0, device, _F64)
    if mask is None or mode == "zero" or bool((mask[:, 1:] <= mask[:, :-1]).all()):
        return gain, keep
    if mode == "skip":
        # a valid token takes the table entry of its rank among the row's valid tokens
        rank = (torch.cumsum(mask, dim=1) - 1).clamp_(min=0)
        return torch.where(mask, gain[rank], 0.0), torch.where(mask, keep[rank], 1.0)
    prior = _advance_priors(mask, q, v, p0)
    return torch.where(mask, prior / (prior + v), 0.0), torch.where(mask, v / (prior + v), 1.0)


def _advance_priors(mask: torch.Tensor, q: float, v: float, p0: float) -> torch.Tensor:
    """Prior variances P_{t|t-1}, float64 [B, T], of ``advance`` mode with masked holes.

    Both variance steps are Moebius maps with non-negative 2x2 matrices: an update
    P -> v(P+q)/(P+q+v) is [[v, vq], [1, q+v]], a hole P -> P+q is [[1, q], [0, 1]]. Their running
    products compose by a doubling scan (log2 T steps); each product is rescaled to entries summing to 1,
    which leaves the map unchanged and keeps the entries finite. Non-negative entries mean no cancellation.
    """
    B, T = mask.shape

    def pick(on_update: float, on_hole: float) -> torch.Tensor:
        return torch.where(mask, torch.tensor(on_update, dtype=_F64), torch.tensor(on_hole, dtype=_F64))

    m11, m12, m21, m22 = pick(v, 1.0), pick(v * q, q), pick(1.0, 0.0), pick(q + v, 1.0)
    shift = 1
    while shift < T:
        # C_t <- C_t @ C_{t-shift}: later maps act after earlier ones
        a11, a12, a21, a22 = (x[:, shift:] for x in (m11, m12, m21, m22))
        b11, b12, b21, b22 = (x[:, :-shift] for x in (m11, m12, m21, m22))
        c11, c12 = a11 * b11 + a12 * b21, a11 * b12 + a12 * b22
        c21, c22 = a21 * b11 + a22 * b21, a21 * b12 + a22 * b22
        scale = c11 + c12 + c21 + c22
        for full, new in ((m11, c11), (m12, c12), (m21, c21), (m22, c22)):
            full[:, shift:] = new / scale
        shift *= 2
    # posterior before token t is the product up to t-1 applied to p0 (the empty product before token 0)
    post = (m11 * p0 + m12) / (m21 * p0 + m22)
    before = torch.cat([torch.full((B, 1), p0, dtype=_F64, device=mask.device), post[:, :-1]], dim=1)
    return before + q


def linear_scan(keep: torch.Tensor, inc: torch.Tensor, x0: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x_t = keep_t x_{t-1} + inc_t along dim 1 from x_{-1} = x0; float64 [B, T] -> (x [B, T], x_{T-1} [B]).

    ``keep`` may be [T] (shared by all rows). Blocked: ~2 sqrt(T) Python steps, each over all rows.
    """
    B, T = inc.shape
    L = max(1, math.isqrt(T - 1) + 1) if T > 1 else 1
    n = -(-T // L)
    pad = n * L - T
    rows = B if keep.dim() == 2 else 1  # a shared [T] keep is scanned once, not once per row
    keep = keep.reshape(rows, T)
    if pad:
        keep = torch.nn.functional.pad(keep, (0, pad), value=1.0)
        inc = torch.nn.functional.pad(inc, (0, pad), value=0.0)
    # [L, rows, n]: step i of the first loop reads one contiguous slab holding token i of every chunk
    k3 = keep.reshape(rows, n, L).permute(2, 0, 1).contiguous()
    i3 = inc.reshape(B, n, L).permute(2, 0, 1).contiguous()
    local = torch.empty_like(i3)
    s = torch.zeros(B, n, dtype=inc.dtype, device=inc.device)
    for i in range(L):
        s = torch.addcmul(i3[i], k3[i], s)
        local[i] = s
    decay = torch.cumprod(k3, dim=0)  # decay[i] = product of keeps from the chunk start to token i
    carry = torch.empty(n, B, dtype=inc.dtype, device=inc.device)
    c = torch.full((B,), float(x0), dtype=inc.dtype, device=inc.device)
    for j in range(n):
        carry[j] = c
        c = torch.addcmul(local[L - 1, :, j], decay[L - 1, :, j], c)  # decay row broadcasts when shared
    x = torch.addcmul(local, decay, carry.T.unsqueeze(0))
    return x.permute(1, 2, 0).reshape(B, n * L)[:, :T], c


def forward(z, mask, mode, q, v, p0, x0):
    """Filter of z [B, T] (float32/64) in float64 -> (out in z's dtype, 0 at masked; final states [B])."""
    B, T = z.shape
    gain, keep = token_gains(mask, mode, T, q, v, p0, z.device)
    y = z if mask is None else torch.where(mask, z, 0.0)  # a masked z is never read (it may be NaN)
    x, x_end = linear_scan(keep, gain * y.to(_F64), x0)
    if mask is not None:
        x = torch.where(mask, x, 0.0)
    return x.to(z.dtype), x_end


def backward(grad, mask, mode, q, v, p0):
    """Gradient w.r.t. z of sum(grad * filter(z)): u_t = w_t + keep_{t+1} u_{t+1}, dz_t = gain_t u_t."""
    B, T = grad.shape
    gain, keep = token_gains(mask, mode, T, q, v, p0, grad.device)
    w = (grad if mask is None else torch.where(mask, grad, 0.0)).to(_F64)
    keep_next = torch.nn.functional.pad(keep[..., 1:], (0, 1), value=1.0)
    u, _ = linear_scan(keep_next.flip(-1), w.flip(1), 0.0)
    dz = gain * u.flip(1)
    if mask is not None:
        dz = torch.where(mask, dz, 0.0)
    return dz.to(grad.dtype)
