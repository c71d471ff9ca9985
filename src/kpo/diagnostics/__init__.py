"""Token-dynamics statistics of importance ratios: the paper's Table 2 and Figure 1 (docs/methods.md section K).

The authors published no code for these statistics; this module implements the definitions of the paper's
appendix B.1 and C. Every choice the paper leaves open is fixed here and written down once:

Token state (App. C.1)
    up if ``r > 1 + eps_high``, down if ``r < 1 - eps_low``, on otherwise, with ``r = exp(log_ratio)``.
    The comparison is made in log space (``z > log1p(eps_high)``, ``z < log1p(-eps_low)``) in float64, so
    ``eps_low = eps_high = 0`` means exactly the paper's "before filtering" rule: on iff ``log_ratio == 0``.

Valid tokens
    Only positions with ``mask != 0`` count. A masked hole inside a response is removed and the valid tokens are
    compacted in order, so runs, switches, windows and the DFT all see the response with its holes closed
    (two valid tokens on either side of a hole are adjacent). Rows with 0 valid tokens are left out of every
    average (they are not samples).

Per sample, then averaged over samples (Table 2: "averaged over all samples")
    prop_{up,down,on}    share of the sample's valid tokens in each state.
    runlen_{up,down,on}  mean length of the sample's maximal runs of that state (= tokens in the state / number
                         of runs of it). A sample with no run of a state is left out of that state's average.
    switch_freq          (App. B.1) the valid state sequence is cut into ``n // window`` full non-overlapping
                         windows; each window's rate is (adjacent changes) / (window - 1); the sample's value is
                         the mean over windows. Tokens after the last full window are not used (the paper reshapes
                         the valid prefix of n_w * window tokens). A sample with fewer than ``window`` valid
                         tokens uses its whole sequence as one window (changes / (n - 1)); 1 valid token gives 0.
    lfr                  (App. C.2) low-frequency energy ratio of the unnormalised DFT ``X_k`` of the sample's n
                         valid values: sum of ``|X_k|^2`` over ``k in {0..k_c} U {n-k_c..n-1}`` over the sum over all
                         k, with ``k_c = floor(lf_cutoff * n)``. The mean is NOT removed: the paper's band starts at
                         bin 0, so a constant offset counts as the lowest frequency. (The paper's 0.12 before
                         filtering therefore also implies the log-ratio signal: in ratio space the DC term of
                         r ~ 1 would dominate.) A sample whose values are all 0 has no energy and is left out.
    global_var           population variance (ddof 0) of the sample's valid values.
    local_var            mean over the sample's full windows of the population variance inside each window; a
                         sample with fewer than ``window`` valid tokens uses its whole sequence (the same fallback
                         the paper uses for switch frequency), so short responses still count.

Signal
    ``signal="log_ratio"`` (default) computes lfr, global_var and local_var on ``z = log r`` (the space the
    filter works in); ``signal="ratio"`` on ``r = exp(z)``. States, runs and switches do not depend on it.

Window-wise off-policy frequency (Figure 1, App. B.1): see :func:`window_stats`.

Everything is vectorized over the batch with numpy (float64); ``kpo.diagnostics.reference.token_dynamics_reference`` is the plain-Python
per-sample loop that the tests hold the fast path to.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from kpo._checks import with_values

STAT_KEYS = (
    "prop_up",
    "prop_down",
    "prop_on",
    "runlen_up",
    "runlen_down",
    "runlen_on",
    "switch_freq",
    "lfr",
    "global_var",
    "local_var",
)
STATES = {"down": -1, "on": 0, "up": 1}
SIGNALS = ("log_ratio", "ratio")

# Rows per Bluestein chunk are chosen so that one complex128 work array stays near 64 MiB.
_FFT_CHUNK_ELEMENTS = 1 << 22


def _to_numpy(x: Any, name: str) -> np.ndarray:
    with_values(**{name: x})
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError(f"{name} must be a numeric array or tensor, got dtype object")
    return arr


def _check_count(name: str, value: Any, minimum: int, why: str) -> None:
    """`value` must be an int (numpy ints too, not bool) >= `minimum`: it sizes a reshape, so 50.0 cannot pass."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer >= {minimum} ({why}), got {type(value).__name__} {value!r}; pass an int"
        )
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} ({why}), got {value}")


def _validate_options(eps_low: float, eps_high: float, window: int, lf_cutoff: float, signal: str) -> None:
    if not (0.0 <= eps_low < 1.0):
        raise ValueError(f"eps_low must be in [0, 1) (the down threshold is r < 1 - eps_low), got {eps_low}")
    if not (eps_high >= 0.0 and math.isfinite(eps_high)):
        raise ValueError(f"eps_high must be a finite number >= 0, got {eps_high}")
    _check_count("window", window, 2, "a rate needs one adjacent pair")
    if not (0.0 <= lf_cutoff <= 0.5):
        raise ValueError(f"lf_cutoff must be in [0, 0.5] (a fraction of the n DFT bins), got {lf_cutoff}")
    if signal not in SIGNALS:
        raise ValueError(f"signal must be one of {SIGNALS}, got {signal!r}")


def prepare(log_ratio: Any, mask: Any = None, *, name: str = "log_ratio") -> tuple[np.ndarray, np.ndarray]:
    """Validate and convert inputs: ``log_ratio`` [B, T] or [T]; ``mask`` same shape, bool or 0/1, None = all valid.

    Returns (z float64 [B, T], m bool [B, T]). Raises ValueError naming the row and position of a non-finite
    value at a valid position, or a mask value other than 0/1.
    """
    z = _to_numpy(log_ratio, name)
    shape = z.shape
    if z.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape [B, T] or [T], got shape {tuple(z.shape)}")
    if not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
        raise TypeError(f"{name} must be a real-valued array, got dtype {z.dtype}")
    z = np.atleast_2d(z).astype(np.float64, copy=False)
    if mask is None:
        m = np.ones(z.shape, dtype=bool)
    else:
        m_raw = _to_numpy(mask, "mask")
        if m_raw.shape != shape:
            raise ValueError(
                f"mask shape {tuple(m_raw.shape)} does not match {name} shape {tuple(shape)}; "
                "pass one mask entry per token"
            )
        m_raw = np.atleast_2d(m_raw)
        if m_raw.dtype != bool:
            bad = (m_raw != 0) & (m_raw != 1)
            if bad.any():
                b, t = np.argwhere(bad)[0]
                raise ValueError(
                    f"mask must be bool or 0/1; row {b}, position {t} holds {m_raw[b, t].item()!r}"
                )
        m = m_raw.astype(bool, copy=False)
    bad = m & ~np.isfinite(z)
    if bad.any():
        b, t = np.argwhere(bad)[0]
        raise ValueError(
            f"{name} is not finite at a valid position: row {b}, position {t} holds {z[b, t].item()!r} "
            f"({int(bad.sum())} such values); fix the dump or mask those tokens out"
        )
    return z, m


def compact(z: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Move each row's valid values to its front, in order: (values [B, T] zero after n, n [B] int64)."""
    n = m.sum(axis=1, dtype=np.int64)
    if m.all():
        return z.copy(), n
    order = np.argsort(~m, axis=1, kind="stable")  # valid positions first, original order kept
    zc = np.take_along_axis(z, order, axis=1)
    zc[np.arange(z.shape[1])[None, :] >= n[:, None]] = 0.0
    return zc, n


def states(z: np.ndarray, eps_low: float = 0.0, eps_high: float = 0.0) -> np.ndarray:
    """Token states of log-ratios ``z`` (any shape): +1 up (r > 1+eps_high), -1 down (r < 1-eps_low), 0 on. int8."""
    hi = math.log1p(eps_high)
    lo = math.log1p(-eps_low)
    return (z > hi).astype(np.int8) - (z < lo).astype(np.int8)


def _windows(x: np.ndarray, window: int) -> np.ndarray:
    """[B, T] -> [B, ceil(T / window), window], zero padded at the end."""
    B, T = x.shape
    nw = -(-T // window)
    if nw * window != T:
        x = np.concatenate([x, np.zeros((B, nw * window - T), dtype=x.dtype)], axis=1)
    return x.reshape(B, nw, window)


def _low_frequency_ratio(x: np.ndarray, n: np.ndarray, lf_cutoff: float) -> np.ndarray:
    """LFR per row of compacted values ``x`` [B, T] (zero after ``n``); NaN for n = 0 or zero energy. [B]

    For real x, |X_{n-k}| = |X_k|, so the band {0..k_c} U {n-k_c..n-1} holds |X_0|^2 + 2 sum_{k=1..k_c} |X_k|^2
    when its two halves do not overlap (2 k_c + 1 < n), and the whole spectrum (ratio 1) otherwise. The total
    comes from Parseval: sum_k |X_k|^2 = n sum_t x_t^2. Rows have different lengths n, so the bins 0..k_c of each
    row's own n-point DFT come from Bluestein's chirp-z identity (see ``_band_energy``), batched over rows.
    """
    B = x.shape[0]
    out = np.full(B, np.nan)
    total = n * np.einsum("bt,bt->b", x, x)
    kc = np.floor(lf_cutoff * n).astype(np.int64)
    has_energy = (n > 0) & (total > 0)
    whole = has_energy & (2 * kc + 1 >= n)
    out[whole] = 1.0
    rows = np.flatnonzero(has_energy & ~whole)
    if rows.size == 0:
        return out
    # Rows are grouped by FFT size (the power of two >= n + k_c), so short rows never pay for the longest one.
    fft_size = np.left_shift(1, np.frexp((n[rows] + kc[rows] - 1).astype(np.float64))[1]).astype(np.int64)
    for M in np.unique(fft_size):
        group = rows[fft_size == M]
        size = max(1, _FFT_CHUNK_ELEMENTS // int(M))
        for start in range(0, group.size, size):
            idx = group[start : start + size]
            out[idx] = _band_energy(x[idx], n[idx], kc[idx], int(M)) / total[idx]
    return np.minimum(out, 1.0)


def _band_energy(x: np.ndarray, n: np.ndarray, kc: np.ndarray, M: int) -> np.ndarray:
    """|X_0|^2 + 2 sum_{k=1..k_c} |X_k|^2 of each row's n-point DFT, by one Bluestein convolution of size M. [b]

    With kt = (k^2 + t^2 - (k-t)^2) / 2 and c_m = exp(-i pi m^2 / n): X_k = c_k sum_t (x_t c_t) conj(c_{k-t}).
    The convolution offsets k - t lie in [-(n-1), k_c], so a circular convolution of size M >= n + k_c holds
    them without wrap-around: conj(c_m) sits at m = 0..k_c and at M - m for m = 1..n-1. |c_k| = 1, so
    |X_k|^2 = |conv_k|^2. x: [b, T] zero after n; n, kc: [b].
    """
    n_max, k_top = int(n.max()), int(kc.max())
    nn = n[:, None]
    m_ = np.arange(n_max, dtype=np.int64)[None, :]
    # Phase pi m^2 / n with m^2 reduced mod 2n in integers, so that long rows keep full precision.
    phase = (np.pi / nn) * ((m_ * m_) % (2 * nn))
    chirp = np.cos(phase) - 1j * np.sin(phase)
    a = np.zeros((n.size, M), dtype=np.complex128)
    a[:, :n_max] = x[:, :n_max] * chirp
    b = np.zeros((n.size, M), dtype=np.complex128)
    b[:, : k_top + 1] = np.conj(chirp[:, : k_top + 1])
    b[:, M - n_max + 1 :] = np.conj(chirp[:, :0:-1])
    conv = np.fft.ifft(np.fft.fft(a, axis=1) * np.fft.fft(b, axis=1), axis=1)[:, : k_top + 1]
    power = conv.real**2 + conv.imag**2
    weights = np.where(np.arange(k_top + 1)[None, :] <= kc[:, None], 2.0, 0.0)
    weights[:, 0] = 1.0
    return np.einsum("bk,bk->b", power, weights)


def sample_dynamics(
    log_ratio: Any,
    mask: Any = None,
    *,
    eps_low: float = 0.0,
    eps_high: float = 0.0,
    window: int = 50,
    lf_cutoff: float = 0.1,
    signal: str = "log_ratio",
) -> dict[str, np.ndarray]:
    """Per-sample token-dynamics statistics (definitions in the module docstring).

    log_ratio: [B, T] or [T] token log importance ratios; mask: same shape (None = all valid).
    Returns each key of ``STAT_KEYS`` as a float64 array [B], plus ``n_valid`` [B]. NaN marks "left out of the
    average": every statistic of a row with no valid token, runlen_<state> of a row without that state, and lfr
    of a row with zero energy.
    """
    _validate_options(eps_low, eps_high, window, lf_cutoff, signal)
    z, m = prepare(log_ratio, mask)
    zc, n = compact(z, m)
    B, T = zc.shape
    valid = np.arange(T)[None, :] < n[:, None]
    s = states(zc, eps_low, eps_high)
    s[~valid] = 0
    n_f = n.astype(np.float64)
    has = n > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        inv_n = np.where(has, 1.0 / np.maximum(n_f, 1.0), np.nan)
        out: dict[str, np.ndarray] = {}

        # Runs: a run starts at every valid token whose state differs from the previous token's.
        starts = valid.copy()
        starts[:, 1:] &= s[:, 1:] != s[:, :-1]
        for key, code in STATES.items():
            in_state = valid & (s == code)
            count = in_state.sum(axis=1).astype(np.float64)
            runs = (starts & in_state).sum(axis=1).astype(np.float64)
            out[f"prop_{key}"] = count * inv_n
            out[f"runlen_{key}"] = np.where(runs > 0, count / np.maximum(runs, 1.0), np.nan)

        # Switch frequency: full windows of `window` valid tokens, or the whole sequence when shorter.
        change = np.zeros_like(valid)
        change[:, 1:] = (s[:, 1:] != s[:, :-1]) & valid[:, 1:]
        n_full = n // window
        # Changes inside each window; a change across a window edge belongs to no window.
        sw = _windows(change, window)[:, :, 1:].sum(axis=2)
        full = np.arange(sw.shape[1])[None, :] < n_full[:, None]
        windowed = (sw * full).sum(axis=1) / ((window - 1) * np.maximum(n_full, 1))
        whole = change.sum(axis=1) / np.maximum(n_f - 1.0, 1.0)
        switch = np.where(n_full > 0, windowed, np.where(n > 1, whole, 0.0))
        out["switch_freq"] = np.where(has, switch, np.nan)

        x = np.exp(zc) if signal == "ratio" else zc
        x = np.where(valid, x, 0.0)
        out["lfr"] = _low_frequency_ratio(x, n, lf_cutoff)

        mean = x.sum(axis=1) * inv_n
        dev = np.where(valid, x - mean[:, None], 0.0)
        global_var = np.einsum("bt,bt->b", dev, dev) * inv_n
        out["global_var"] = global_var
        xw = _windows(x, window)
        wdev = xw - xw.mean(axis=2, keepdims=True)
        wvar = np.einsum("bjw,bjw->bj", wdev, wdev) / window
        local = (wvar * full).sum(axis=1) / np.maximum(n_full, 1)
        out["local_var"] = np.where(n_full > 0, local, global_var)
    out["n_valid"] = n
    return out


def average_samples(per_sample: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean over samples of each statistic of :func:`sample_dynamics`, leaving out NaN; NaN if none has a value."""
    result = {}
    for key in STAT_KEYS:
        v = per_sample[key]
        ok = ~np.isnan(v)
        result[key] = float(v[ok].mean()) if ok.any() else float("nan")
    return result


def token_dynamics(
    log_ratio: Any,
    mask: Any = None,
    *,
    eps_low: float = 0.0,
    eps_high: float = 0.0,
    window: int = 50,
    lf_cutoff: float = 0.1,
    signal: str = "log_ratio",
) -> dict[str, float]:
    """Table 2's statistics of one batch of token log-ratios, averaged over samples.

    log_ratio: [B, T] or [T] float (torch tensor or numpy array), ``log pi_theta - log pi_old`` per token.
    mask: same shape, bool or 0/1; None = all valid.
    eps_low, eps_high: the on-policy band (0, 0 = exact r == 1 as the paper uses before filtering; the paper uses
        3e-4, 4e-4 after filtering). window: switch-frequency / local-variance window in valid tokens (50).
    lf_cutoff: k_c = floor(lf_cutoff * n) for the low-frequency ratio (the paper does not state k_c).
    signal: "log_ratio" or "ratio": the values lfr and the variances are computed on.

    Returns {prop_up, prop_down, prop_on, runlen_up, runlen_down, runlen_on, switch_freq, lfr, global_var,
    local_var} as floats; each is the mean over samples of the per-sample value (see the module docstring for
    every definition, and :func:`sample_dynamics` for the per-sample values).
    """
    return average_samples(
        sample_dynamics(
            log_ratio,
            mask,
            eps_low=eps_low,
            eps_high=eps_high,
            window=window,
            lf_cutoff=lf_cutoff,
            signal=signal,
        )
    )


def run_lengths(
    log_ratio: Any, mask: Any = None, *, eps_low: float = 0.0, eps_high: float = 0.0
) -> dict[str, np.ndarray]:
    """Lengths of all maximal runs of each state, pooled over samples (Figure 1's run-length distribution).

    log_ratio, mask: [B, T] or [T]. Returns {"up": int64 [R_up], "down": [R_down], "on": [R_on]}, runs in row order.
    Runs never cross rows; masked holes are closed first (as everywhere in this module).
    """
    _validate_options(eps_low, eps_high, 2, 0.0, "log_ratio")
    z, m = prepare(log_ratio, mask)
    zc, n = compact(z, m)
    valid = np.arange(zc.shape[1])[None, :] < n[:, None]
    s = states(zc, eps_low, eps_high)
    starts = valid.copy()
    starts[:, 1:] &= s[:, 1:] != s[:, :-1]
    flat_start = starts[valid]  # row-major: rows stay contiguous and in order
    run_id = np.cumsum(flat_start) - 1
    lengths = np.bincount(run_id, minlength=int(flat_start.sum())) if run_id.size else np.zeros(0, np.int64)
    run_state = s[valid][flat_start]
    return {key: lengths[run_state == code].astype(np.int64) for key, code in STATES.items()}


def window_stats(
    log_ratio: Any,
    mask: Any = None,
    *,
    eps_low: float = 0.0,
    eps_high: float = 0.0,
    window: int = 50,
    max_windows: int = 80,
) -> dict[str, np.ndarray]:
    """Figure 1's window-wise off-policy frequency (App. B.1).

    Per sample, the valid tokens (holes closed) are cut into ``min(n // window, max_windows)`` full
    non-overlapping windows; a window's frequency is (up + down) / window. For each window index j the
    frequencies of all samples that have window j are averaged (nanmean) and their population variance taken
    (nanvar, ddof 0). The paper uses the sign of the log-ratio (eps 0) and window 50, up to 80 windows.

    log_ratio, mask: [B, T] or [T]. Returns {"mean": [J], "var": [J], "count": [J] int64, "freq": [B, J] with NaN
    where a sample has no window j}, J = the largest number of windows any sample has (0 if none).
    """
    _validate_options(eps_low, eps_high, window, 0.0, "log_ratio")
    _check_count("max_windows", max_windows, 1, "windows per sample")
    z, m = prepare(log_ratio, mask)
    zc, n = compact(z, m)
    nw = np.minimum(n // window, max_windows)
    J = int(nw.max()) if nw.size else 0
    off = (states(zc[:, : J * window], eps_low, eps_high) != 0).reshape(zc.shape[0], J, window)
    freq = off.sum(axis=2) / float(window)
    present = np.arange(J)[None, :] < nw[:, None]
    freq = np.where(present, freq, np.nan)
    count = present.sum(axis=0).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(present, freq, 0.0).sum(axis=0) / count
        var = np.where(present, (freq - mean[None, :]) ** 2, 0.0).sum(axis=0) / count
    return {"mean": mean, "var": var, "count": count, "freq": freq}


__all__ = [
    "SIGNALS",
    "STATES",
    "STAT_KEYS",
    "average_samples",
    "compact",
    "prepare",
    "run_lengths",
    "sample_dynamics",
    "states",
    "token_dynamics",
    "window_stats",
]
