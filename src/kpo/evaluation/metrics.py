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
from math import comb

__all__ = ["pass_at_k", "avg_at_n", "benchmark_metrics", "bootstrap_avg_ci", "bootstrap_diff_ci"]


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


def bootstrap_diff_ci(
    a: Sequence[Sequence[int]],
    b: Sequence[Sequence[int]],
    n: int,
    *,
    level: float = 0.95,
    draws: int = 4000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean, low, high) of avg@n(a) - avg@n(b), fractions, with a percentile bootstrap over seeds and problems.

    a, b: per-seed lists of per-problem correct counts (as :func:`bootstrap_avg_ci`), all on the same problems.
    The problems drawn are shared by both sides (a paired comparison); the seeds of each side are resampled
    independently (seed s of a and of b are different runs).
    """
    import numpy as np

    acc_a, acc_b = _accuracies(a, n), _accuracies(b, n)
    if acc_a.shape[1] != acc_b.shape[1]:
        raise ValueError(
            f"a has {acc_a.shape[1]} problems and b {acc_b.shape[1]}: compare on the same problems"
        )
    rng = np.random.default_rng(seed)
    problems = acc_a.shape[1]
    p = rng.integers(0, problems, size=(draws, problems))
    ra = rng.integers(0, acc_a.shape[0], size=(draws, acc_a.shape[0]))
    rb = rng.integers(0, acc_b.shape[0], size=(draws, acc_b.shape[0]))
    diff = _drawn_means(acc_a, ra, p) - _drawn_means(acc_b, rb, p)
    return (float(acc_a.mean() - acc_b.mean()), *_percentiles(diff, level))


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
