"""A plain-Python loop of the token-dynamics statistics, written from the paper's wording (App. B.1, C.1): the
reference beside :func:`kpo.diagnostics.sample_dynamics`, as ``kpo.filter.reference`` is beside the fast filter."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kpo.diagnostics import STAT_KEYS, STATES, prepare


def token_dynamics_reference(
    log_ratio: Any,
    mask: Any = None,
    *,
    eps_low: float = 0.0,
    eps_high: float = 0.0,
    window: int = 50,
    lf_cutoff: float = 0.1,
    signal: str = "log_ratio",
) -> dict[str, list[float]]:
    """Plain-Python per-sample loop of :func:`sample_dynamics`, written from the paper's wording; the tests compare
    the vectorized statistics against it.

    Returns each statistic as a list over rows (NaN = left out), without n_valid.
    """
    z, m = prepare(log_ratio, mask)
    hi, lo = math.log1p(eps_high), math.log1p(-eps_low)
    nan = float("nan")
    out: dict[str, list[float]] = {key: [] for key in STAT_KEYS}
    for zrow, mrow in zip(z.tolist(), m.tolist()):
        vals = [v for v, ok in zip(zrow, mrow) if ok]
        n = len(vals)
        if n == 0:
            for key in STAT_KEYS:
                out[key].append(nan)
            continue
        st = [1 if v > hi else (-1 if v < lo else 0) for v in vals]
        # Runs, scanned left to right as App. B.1 describes.
        runs: dict[int, list[int]] = {-1: [], 0: [], 1: []}
        length = 1
        for t in range(1, n + 1):
            if t < n and st[t] == st[t - 1]:
                length += 1
            else:
                runs[st[t - 1]].append(length)
                length = 1
        for key, code in STATES.items():
            out[f"prop_{key}"].append(st.count(code) / n)
            out[f"runlen_{key}"].append(sum(runs[code]) / len(runs[code]) if runs[code] else nan)
        # Switch frequency (App. B.1 (i)-(v)).
        if n <= 1:
            sf = 0.0
        elif n < window:
            sf = sum(st[j] != st[j - 1] for j in range(1, n)) / (n - 1)
        else:
            rates = []
            for w in range(n // window):
                seg = st[w * window : (w + 1) * window]
                rates.append(sum(seg[j] != seg[j - 1] for j in range(1, window)) / (window - 1))
            sf = sum(rates) / len(rates)
        out["switch_freq"].append(sf)
        x = [math.exp(v) for v in vals] if signal == "ratio" else vals
        spectrum = np.abs(np.fft.fft(np.asarray(x))) ** 2
        kc = math.floor(lf_cutoff * n)
        band = set(range(0, kc + 1)) | set(range(n - kc, n))
        total = float(spectrum.sum())
        out["lfr"].append(sum(float(spectrum[k]) for k in band) / total if total > 0 else nan)

        def var(seg: list[float]) -> float:
            mu = sum(seg) / len(seg)
            return sum((v - mu) ** 2 for v in seg) / len(seg)

        out["global_var"].append(var(x))
        if n < window:
            out["local_var"].append(var(x))
        else:
            wv = [var(x[w * window : (w + 1) * window]) for w in range(n // window)]
            out["local_var"].append(sum(wv) / len(wv))
    return out
