"""Float64 gain tables of the causal Kalman filter (docs/methods.md section K).

The gains depend only on q, v, p0 and the number of updates taken, never on the data, so one table per
(q, v, p0) serves every row and every call. Each entry is computed with the same arithmetic as the loop
reference (``reference.py``), so the tables agree with it bit for bit.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import OrderedDict

import numpy as np
import torch

try:  # optional extra `fast`: the Riccati loop compiled; without it the same loop runs in Python
    from numba import njit
except ImportError:  # pragma: no cover - exercised only where numba is absent
    njit = None

_MAX_TABLES = 32  # distinct (q, v, p0) kept; a training run uses one
_MIN_LENGTH = 4096


def check_params(q: float, v: float, p0: float, x0: float = 0.0) -> None:
    """ValueError unless q > 0, v > 0, p0 >= 0 and all four are finite real numbers."""
    for name, value in (("q", q), ("v", v), ("p0", p0), ("x0", x0)):
        if isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a Python float, got a tensor; pass float({name}) instead")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if q <= 0:
        raise ValueError(f"q (process noise) must be > 0, got {q!r}")
    if v <= 0:
        raise ValueError(f"v (observation noise) must be > 0, got {v!r}")
    if p0 < 0:
        raise ValueError(f"p0 (initial variance) must be >= 0, got {p0!r}")
    if not (math.isfinite(p0 + q + v) and math.isfinite(q * v)):
        raise ValueError(
            f"q={q!r}, v={v!r}, p0={p0!r} overflow float64 in the variance updates; the filter depends only on "
            "q/v and p0/v, so divide all three by the same factor"
        )


def _riccati_python(p: float, q: float, v: float, gain: np.ndarray, keep: np.ndarray) -> float:
    """Fill ``gain``/``keep`` with K_t and 1 - K_t of consecutive updates from posterior ``p``; return the last posterior.

    1 - K_t is computed as v / (P + v), not 1 - K_t, so it keeps full relative precision when K_t is near 1.
    The recursion converges to its steady state; once the posterior stops changing in float64 the rest of
    the table is that fixed point.
    """
    n = gain.shape[0]
    for t in range(n):
        prior = p + q
        gain[t] = prior / (prior + v)
        keep[t] = v / (prior + v)
        p_next = v * prior / (prior + v)
        if p_next == p:
            gain[t + 1 :] = gain[t]
            keep[t + 1 :] = keep[t]
            return p
        p = p_next
    return p


_riccati = njit(cache=True, nogil=True)(_riccati_python) if njit is not None else _riccati_python


class _Table:
    __slots__ = ("gain", "keep", "p_end", "devices")

    def __init__(self) -> None:
        self.gain = np.empty(0)
        self.keep = np.empty(0)
        self.p_end = 0.0
        self.devices: dict[tuple[str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


_tables: OrderedDict[tuple[float, float, float], _Table] = OrderedDict()
_lock = threading.RLock()  # gain_tensors holds it across gain_tables


def gain_tables(T: int, q: float, v: float, p0: float) -> tuple[np.ndarray, np.ndarray]:
    """Read-only float64 arrays (gain [>= T], keep = 1 - gain [>= T]) for T consecutive updates.

    The arrays may be longer than T (tables grow by doubling and are shared); index only the first T.
    """
    key = (float(q), float(v), float(p0))
    with _lock:
        table = _tables.get(key)
        if table is None:
            table = _tables[key] = _Table()
            table.p_end = key[2]
            if len(_tables) > _MAX_TABLES:
                _tables.popitem(last=False)
        _tables.move_to_end(key)
        have = table.gain.shape[0]
        if have < T:
            n = max(T, 2 * have, _MIN_LENGTH)
            gain, keep = np.empty(n), np.empty(n)
            gain[:have], keep[:have] = table.gain, table.keep
            p_end = _riccati(table.p_end, key[0], key[1], gain[have:], keep[have:])
            gain.flags.writeable = keep.flags.writeable = False
            table.gain, table.keep, table.p_end = gain, keep, p_end
            table.devices.clear()
        return table.gain, table.keep


def gain_tensors(T: int, q: float, v: float, p0: float, device: torch.device, dtype: torch.dtype):
    """(gain, keep) as [T] tensors on ``device`` in ``dtype``, cached per device so a GPU call copies nothing."""
    with _lock:  # one critical section: a concurrent growth or eviction cannot pair stale arrays with it
        gain, keep = gain_tables(T, q, v, p0)
        table = _tables[(float(q), float(v), float(p0))]
        slot = (str(device), dtype)
        cached = table.devices.get(slot)
        if cached is None:
            cached = (
                torch.tensor(gain, dtype=dtype, device=device),
                torch.tensor(keep, dtype=dtype, device=device),
            )
            table.devices[slot] = cached
    return cached[0][:T], cached[1][:T]


def kalman_gains(T: int, *, q: float = 1e-6, v: float = 1.0, p0: float = 0.0) -> torch.Tensor:
    """Gains K_1..K_T of T consecutive observations, float64 [T] (a fresh tensor; the cache stays private).

    K_t = P_{t|t-1} / (P_{t|t-1} + v) with P_{t|t-1} = P_{t-1|t-1} + q and P_{0|0} = p0.
    """
    if isinstance(T, bool) or not isinstance(T, int | np.integer) or T < 0:
        raise ValueError(f"T must be a non-negative int, got {T!r}")
    check_params(q, v, p0)
    gain, _ = gain_tables(int(T), q, v, p0)
    return torch.tensor(gain[:T], dtype=torch.float64)
