"""Sampling metrics: avg@n and the unbiased pass@k estimator.

With ``n`` samples per problem of which ``c`` are correct (Chen et al., 2021, "Evaluating Large Language
Models Trained on Code")::

    pass@k = 1 - C(n - c, k) / C(n, k)      (probability that a random k-subset holds a correct sample)
    avg@n  = c / n                          (mean accuracy over the samples; equals pass@1)

Both are averaged over problems. pass@k is computed in exact rational arithmetic (Python integers), so it
is exact for every 0 <= c <= n and 1 <= k <= n however large the binomials get; the only rounding is the
final conversion to float.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import comb, isfinite, sqrt
from numbers import Real

__all__ = [
    "pass_at_k",
    "avg_at_n",
    "benchmark_metrics",
    "bootstrap_avg_ci",
    "paired_diff_ci",
    "t_quantile",
]


def _check_counts(n: int, c: int, k: int | None = None) -> None:
    for name, value in (("n", n), ("c", c)) + ((("k", k),) if k is not None else ()):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}={value!r}: must be an int")
    if n < 1:
        raise ValueError(f"n={n}: need at least one sample")
    if not 0 <= c <= n:
        raise ValueError(f"c={c}: correct samples must lie in [0, n={n}]")
    if k is not None and not 1 <= k <= n:
        raise ValueError(f"k={k}: must lie in [1, n={n}]; draw more samples (n) to report pass@{k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `n` samples, `c` of them correct: 1 - C(n-c, k) / C(n, k).

    C(n-c, k) is 0 when n - c < k (then pass@k is exactly 1).
    """
    _check_counts(n, c, k)
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


def avg_at_n(n: int, c: int) -> float:
    """Mean accuracy over the `n` samples of one problem: c / n."""
    _check_counts(n, c)
    return c / n


def benchmark_metrics(correct: Sequence[Sequence[float]], ks: Sequence[int]) -> dict[str, float]:
    """Problem-averaged ``avg@n`` and ``pass@k`` for each k in `ks`.

    correct: one sequence of per-sample grades (1.0 / 0.0) per problem, every problem with the same n.
    Returns keys ``f"avg@{n}"`` and ``f"pass@{k}"``.
    """
    if not correct:
        raise ValueError("no problems to score")
    n = len(correct[0])
    for i, grades in enumerate(correct):
        if len(grades) != n:
            raise ValueError(f"problem {i} has {len(grades)} samples, problem 0 has {n}: all need the same n")
        bad = [g for g in grades if g not in (0.0, 1.0)]
        if bad:
            raise ValueError(f"problem {i}: grades must be 0.0 or 1.0, got {bad[:3]}")
    counts = [int(sum(grades)) for grades in correct]
    out = {f"avg@{n}": sum(avg_at_n(n, c) for c in counts) / len(counts)}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in counts) / len(counts)
    return out


def bootstrap_avg_ci(
    counts: Sequence[Sequence[int]], n: int, *, level: float = 0.95, draws: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of avg@n (a fraction) over problems and seeds.

    counts: one sequence per seed (run) of per-problem correct counts out of ``n``, every run on the same
    problems. Each draw resamples the runs, then the problems (the same problems for every run drawn, as the
    runs share them), and averages the accuracy: the interval covers both the run-to-run and the problem
    sampling noise. One run gives the usual interval over problems.
    """
    import numpy as np

    acc = _accuracies(counts, n)
    runs, problems = acc.shape
    rng = np.random.default_rng(seed)
    r = rng.integers(0, runs, size=(draws, runs))
    p = rng.integers(0, problems, size=(draws, problems))
    return _percentiles(_drawn_means(acc, r, p), level)


def _drawn_means(acc, runs, problems):
    """[draws] mean accuracy of each draw: acc [R, P], runs [draws, R'] and problems [draws, P'] indices."""
    return acc[runs[:, :, None], problems[:, None, :]].mean(axis=(1, 2))


def _accuracies(counts: Sequence[Sequence[int]], n: int):
    import numpy as np

    acc = np.asarray(counts, dtype=np.float64)
    if acc.ndim != 2 or acc.size == 0:
        raise ValueError(
            "counts: give one non-empty list of per-problem correct counts per run, all the same length"
        )
    if ((acc < 0) | (acc > n)).any():
        raise ValueError(f"counts must lie in [0, n={n}]")
    return acc / n


def _percentiles(values, level: float) -> tuple[float, float]:
    import numpy as np

    if not 0 < level < 1:
        raise ValueError(f"level={level!r}: must lie in (0, 1)")
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def paired_diff_ci(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], n: float, *, level: float = 0.95
) -> tuple[float, float, float]:
    """(mean, low, high) of avg@n(a) - avg@n(b), fractions, with a Student-t interval over paired seeds.

    a, b: shape [S][P], S >= 1 seeds of P >= 1 per-problem correct counts out of ``n`` each. Seed s of `a`
    and seed s of `b` are a pair (they share a warm start, a prompt stream and the evaluation sample seeds),
    and every seed of both sides scores the same P problems in the same order. A count may be any real
    number in [0, n] (an exact expected count such as n * probability is fine), not only an int.
    n: the number of samples per problem (a positive number). level: the coverage, in (0, 1).

    With d_s = mean over problems p of (a[s][p] - b[s][p]) / n, shape [S], the paired difference of seed s:

    * ``mean`` = mean over seeds of d_s = avg@n(a) - avg@n(b).
    * S >= 2: the seed pair is the unit. ``mean -/+ t_{S-1, (1+level)/2} * sd(d_s) / sqrt(S)``, sd with
      ddof=1. Its coverage is exact when d_s is normal (d_s is a mean over hundreds of problems), and it
      covers everything that varies from seed pair to seed pair: training noise, the prompt stream and the
      evaluation's problem and sampling noise. The warm start a pair shares cancels in d_s.
    * S == 1: no seed-to-seed variance can be estimated, so the interval is the paired t-interval over the
      P per-problem differences x_p = (a[0][p] - b[0][p]) / n:
      ``mean -/+ t_{P-1, (1+level)/2} * sd(x_p) / sqrt(P)``. It covers the evaluation's problem and
      sampling noise only, not training noise: another seed may land outside it. S == 1 with P == 1 is an
      error (no spread to measure).

    If the differences do not vary at all the interval is the single point (mean, mean, mean).
    Raises ValueError on mismatched shapes (naming the seed and side), on NaN/Inf or counts outside
    [0, n] (naming the seed and problem), on n <= 0 and on `level` outside (0, 1).
    """
    if isinstance(n, bool) or not isinstance(n, Real) or not isfinite(n) or n <= 0:
        raise ValueError(f"n={n!r}: the number of samples per problem must be a positive number")
    if isinstance(level, bool) or not isinstance(level, Real) or not 0 < level < 1:
        raise ValueError(f"level={level!r}: must lie in (0, 1), e.g. 0.95")
    acc_a, acc_b = _paired_accuracies(a, b, n)
    seeds, problems = acc_a.shape
    if seeds >= 2:
        units = (acc_a - acc_b).mean(axis=1)
    elif problems >= 2:
        units = acc_a[0] - acc_b[0]
    else:
        raise ValueError(
            "one seed with one problem: no spread to measure; give two or more seeds (paired) or problems"
        )
    mean, low, high = _t_interval(units, level)
    return float(mean), float(low), float(high)


def _paired_accuracies(a, b, n: float):
    """Checked [S, P] float arrays a / n and b / n; see :func:`paired_diff_ci` for the rules."""
    import numpy as np

    if len(a) != len(b) or len(a) == 0:
        raise ValueError(
            f"a has {len(a)} seeds and b has {len(b)}: give one list of per-problem counts per seed for both "
            "sides, the same number of seeds (at least one), seed s of a paired with seed s of b"
        )
    rows = {}
    for side, runs in (("a", a), ("b", b)):
        rows[side] = []
        for s, run in enumerate(runs):
            row = np.asarray(run, dtype=np.float64)
            if row.ndim != 1 or row.size == 0:
                raise ValueError(
                    f"{side}[{s}] has shape {row.shape}: each seed needs a flat, non-empty list of "
                    "per-problem correct counts"
                )
            rows[side].append(row)
    problems = rows["a"][0].size
    for side in ("a", "b"):
        for s, row in enumerate(rows[side]):
            if row.size != problems:
                raise ValueError(
                    f"{side}[{s}] has {row.size} problems and a[0] has {problems}: every seed of both sides "
                    "must score the same problems, in the same order"
                )
    for side in ("a", "b"):
        for s, row in enumerate(rows[side]):
            bad = np.flatnonzero(~np.isfinite(row) | (row < 0) | (row > n))
            if bad.size:
                p = int(bad[0])
                raise ValueError(
                    f"{side}[{s}][{p}] = {float(row[p])!r} (seed {s}, problem {p}): counts must be finite "
                    f"and lie in [0, n={n}]"
                )
    return np.stack(rows["a"]) / n, np.stack(rows["b"]) / n


def _t_interval(units, level: float):
    """(mean, low, high) of the Student-t interval for the mean of `units` [..., K], K >= 2, on the last axis.

    ``mean -/+ t_{K-1, (1+level)/2} * sd(units, ddof=1) / sqrt(K)``; works on stacked arrays too.
    """
    import numpy as np

    units = np.asarray(units, dtype=np.float64)
    k = units.shape[-1]
    mean = units.mean(axis=-1)
    half = t_quantile((1 + level) / 2, k - 1) * units.std(axis=-1, ddof=1) / sqrt(k)
    return mean, mean - half, mean + half


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with integer df >= 1 (scipy.stats.t)."""
    from scipy.stats import t

    if isinstance(df, bool) or int(df) != df or df < 1:
        raise ValueError(f"df={df!r}: Student's t needs an integer number of degrees of freedom >= 1")
    if not 0 < p < 1:
        raise ValueError(f"p={p!r}: a quantile needs p in (0, 1)")
    return float(t.ppf(p, int(df)))
