"""The statistics of ``kpo compare``, its regime map and its studies, for an outcome that is bimodal: a run either
collapses (its held-out accuracy falls to about 0) or learns (50-70%), so collapse and accuracy are separate
outcomes. Collapse: counts with exact (Clopper-Pearson) intervals, arms compared by the exact McNemar test;
accuracy: the paired t interval where no run of a pair collapsed, else the exact sign test with the median's
distribution-free interval; multiplicity: Holm, and spending over a sequential design's looks; the seed as the
unit of a study: the sign-flip test (:func:`sign_flip_p`) or an e-process (:func:`e_values`); the seeds a
decision would need. Why each: docs/compare.md, "Design", and docs/study.md, "How it decides".

Everything is in fractions (accuracy 0..1); reports print points. Only scipy and statsmodels compute
distributions.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

__all__ = ["ALPHA", "MOST_SEEDS", "anytime_p", "centre", "collapse_count", "discordance_seeds", "e_values",
           "holm_adjusted", "mcnemar_exact", "paired_accuracy", "rate_interval", "seeds_for_effect",
           "shifted_sign_test", "sign_flip_many", "sign_flip_p", "spending"]

ALPHA = 0.05  # family-wise error rate of a report's claims
MOST_SEEDS = 200  # the most seeds per cell a sample-size search tries before it says "more than this"
MEDIAN_CI_MIN = 6  # pairs from which the median's distribution-free interval reaches 95% (1 - 2 / 2^6 = 0.969)
SIGN_FLIP_EXACT_MOST = 40  # seeds up to which sign_flip_p enumerates real differences exactly (2 x 2^20 half sums)
SIGN_FLIP_RESAMPLES = 99_999  # random sign patterns beyond them (p = (k + 1) / (R + 1), valid at any R)
BETS = np.arange(1, 10) / 10  # e_values' bets on each seed: a uniform mixture over these fractions of the wealth


def centre(c: dict) -> float:
    """A contrast's estimate (``c``: a result of kpo.compare.contrasts.contrast): the median where the sign test
    read it, else the mean."""
    return c["median"] if c["method"] == "sign" else c["mean"]


def rate_interval(k: int, n: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided 95% interval of a rate seen as ``k`` of ``n`` (n > 0; scipy)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def collapse_count(flags: Sequence[bool]) -> dict:
    """{k, n, rate, low95, upper95}: how many of ``flags`` are True, with :func:`rate_interval` (0 of 8 bounds the
    rate below 0.37)."""
    k, n = int(sum(bool(f) for f in flags)), len(flags)
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "low95": None, "upper95": None}
    low, high = rate_interval(k, n)
    return {"k": k, "n": n, "rate": k / n, "low95": low, "upper95": high}


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Exact McNemar test of two arms' collapses over paired units (seeds, or cell-seed pairs pooled over cells):
    {a_only, b_only, pairs, p} with a_only the pairs where only ``a`` collapsed; p two-sided, the binomial test of
    a_only among the discordant pairs (scipy's ``binomtest``; statsmodels' ``mcnemar(exact=True)`` agrees, a test
    checks it), 1.0 without a discordant pair. Pooled over cells (their 2x2 tables summed) it is the stratified
    exact test: given each cell's discordant count, every discordant pair is a fair coin under "no difference"."""
    from scipy.stats import binomtest

    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"mcnemar_exact: {a.size} and {b.size} flags; give one flag per pair on both sides")
    a_only, b_only = int(np.sum(a & ~b)), int(np.sum(~a & b))
    p = binomtest(a_only, a_only + b_only).pvalue if a_only + b_only else 1.0
    return {"a_only": a_only, "b_only": b_only, "pairs": int(a.size), "p": float(p)}


def shifted_sign_test(d: Sequence[float], shift: float, alternative: str) -> float:
    """Exact sign test of the median of ``d`` against ``shift`` (pairs equal to it dropped): the p-value of
    ``alternative`` "two-sided", "greater" (median > shift) or "less" (scipy's ``binomtest``)."""
    from scipy.stats import binomtest

    d = np.asarray(d, dtype=np.float64) - shift
    above, n = int(np.sum(d > 0)), int(np.sum(d != 0))
    return float(binomtest(above, n, alternative=alternative).pvalue) if n else 1.0


def _median_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free interval of the median from order statistics (scipy's ``quantile_test``): [d_(j),
    d_(n+1-j)] with the largest j whose coverage 1 - 2 P(Bin(n, 1/2) < j) is at least ``level``; None below
    MEDIAN_CI_MIN values, or where even [d_(1), d_(n)] covers less than ``level`` (6 values at 0.99: 0.969)."""
    from scipy.stats import quantile_test

    if d.size < MEDIAN_CI_MIN:
        return None
    ci = quantile_test(d, p=0.5).confidence_interval(level)
    return None if np.isnan(ci.low) else (float(ci.low), float(ci.high))


def paired_accuracy(
    d: Sequence[float],
    collapsed: Sequence[bool] | None = None,
    level: float = 0.95,
    both: Sequence[bool] | None = None,
) -> dict:
    """One contrast from its per-seed paired differences ``d`` (fractions), ``collapsed[s]`` True where a run of
    pair s collapsed, ``both[s]`` True where both did: where none did, the paired t-interval and test ("t"); else
    the exact sign test with the median and its order-statistic interval from 6 pairs ("sign"; low/high None
    below), a pair where both runs collapsed counted as a tie (difference 0: two collapsed runs' accuracies differ
    by noise). Returns {method, seeds, mean, median, low, high, p, sd (points), per_seed (as measured), ties}."""
    d = np.asarray(d, dtype=np.float64)
    n = d.size
    out = {
        "seeds": n,
        "mean": float(d.mean()) if n else None,
        "median": float(np.median(d)) if n else None,
        "per_seed": d.tolist(),
        "sd": float(d.std(ddof=1)) * 100 if n > 1 else None,
    }
    if collapsed is not None and any(collapsed):
        tied = np.zeros(n, dtype=bool) if both is None else np.asarray(both, dtype=bool)
        signed = np.where(tied, 0.0, d)
        interval = _median_interval(signed, level)
        low, high = interval if interval else (None, None)
        return out | {
            "method": "sign",
            "median": float(np.median(signed)),
            "low": low,
            "high": high,
            "p": shifted_sign_test(signed, 0.0, "two-sided"),
            "ties": int(tied.sum()),
        }
    if n < 2:
        return out | {"method": "t", "low": None, "high": None, "p": None}
    if np.all(d == d[0]):  # no spread: the interval is the point, and a test has nothing to say
        return out | {"method": "t", "low": float(d[0]), "high": float(d[0]), "p": None if d[0] == 0 else 0.0}
    from scipy.stats import ttest_1samp

    test = ttest_1samp(d, 0.0)
    ci = test.confidence_interval(level)
    return out | {"method": "t", "low": float(ci.low), "high": float(ci.high), "p": float(test.pvalue)}


def holm_adjusted(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: the i-th smallest p-value times (m - i), made non-decreasing along the
    order and capped at 1; a hypothesis is rejected at family-wise level alpha where its adjusted p-value is at
    most alpha. The values of statsmodels' ``multipletests(method="holm")[1]`` (a test checks them and its
    decisions), without its per-call ``gc.collect()``, which costs more than the rest of a design's statistics and
    makes simulating designs slow."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(p.size)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1)))
    return adjusted.tolist()


def seeds_for_effect(sd: float | None, effect: float, alpha: float, power: float = 0.8) -> int | None:
    """Seeds a two-sided paired t-test at level ``alpha`` needs to detect ``effect`` with ``power``, when the
    seeds' differences have standard deviation ``sd`` (both fractions; statsmodels TTestPower); None when the
    spread is unknown or the effect 0."""
    from statsmodels.stats.power import TTestPower

    if sd is None or not sd > 0 or effect == 0 or not math.isfinite(sd):
        return None
    test, size = TTestPower(), abs(effect) / sd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n = float(np.atleast_1d(test.solve_power(effect_size=size, alpha=alpha, power=power, alternative="two-sided"))[0])
    if math.isfinite(n):
        return int(math.ceil(n))
    # the solver does not converge for an effect many times its spread: the least n with the power, counted
    return next((k for k in range(2, MOST_SEEDS + 1)
                 if test.power(effect_size=size, nobs=k, alpha=alpha, alternative="two-sided") >= power), None)


def discordance_seeds(
    a_only: int, b_only: int, pairs: int, cells: int, alpha: float, power: float = 0.8, cap: int = MOST_SEEDS
) -> int | None:
    """Seeds (per cell, over ``cells`` pooled cells) an exact McNemar test at ``alpha`` needs for ``power`` when
    pairs are discordant as measured (``a_only``, ``b_only`` of ``pairs``): exact binomial power over the number
    of discordant pairs; None when no pair was discordant or the sides were equal, or beyond ``cap`` seeds."""
    from scipy.stats import binom

    if a_only == b_only or pairs == 0:
        return None
    rate, share = (a_only + b_only) / pairs, max(a_only, b_only) / (a_only + b_only)
    for seeds in range(2, cap + 1):
        n = seeds * cells
        discordant = np.arange(1, n + 1)
        # the exact test rejects at D discordant pairs when the lopsided side reaches its critical count c(D),
        # the least c with P(Bin(D, 1/2) >= c) <= alpha / 2
        critical = binom.isf(alpha / 2, discordant, 0.5) + 1
        hit = np.where(critical <= discordant, binom.sf(critical - 1, discordant, share), 0.0)
        if float(np.dot(binom.pmf(discordant, n, rate), hit)) >= power:
            return seeds
    return None


def spending(alpha: float, looks: tuple[int, ...]) -> list[float]:
    """The error each look spends (they add up to ``alpha``): one look, all of it; two or more, Lan-DeMets'
    O'Brien-Fleming function alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) at the looks' information fractions
    (seeds / the last look's seeds), each look the increment (scipy's normal law)."""
    from scipy.stats import norm

    z = norm.isf(alpha / 2)
    spent = [float(2 * norm.sf(z / math.sqrt(n / looks[-1]))) for n in looks]
    spent[-1] = alpha  # alpha(1) = alpha exactly
    return [spent[0]] + [b - a for a, b in zip(spent, spent[1:])]


# ------------------------------------------------------------------ the seed as the unit: sign-flip tests
def _integer_tails(values: np.ndarray, observed: float) -> tuple[float, float]:
    """Exact P(S <= s), P(S >= s) for S = sum of +-values, values integers: the null law by convolution."""
    values = values.astype(np.int64)
    top = int(values.sum())
    pmf = np.zeros(2 * top + 1)
    pmf[top] = 1.0  # offset: index top is S = 0
    for v in values:
        pmf = 0.5 * (np.roll(pmf, v) + np.roll(pmf, -v))  # no wrap: |S| never exceeds the sum of the values
    s = int(round(observed)) + top
    return float(min(1.0, pmf[: s + 1].sum())), float(min(1.0, pmf[s:].sum()))


def _half_sums(values: np.ndarray) -> np.ndarray:
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def _meet_in_the_middle_tails(values: np.ndarray, observed: float) -> tuple[float, float]:
    """Exact tails over all 2^n sign patterns, counted as pairs of half patterns (2 x 2^(n/2) sums, sorted once)."""
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    left, right = _half_sums(values[: values.size // 2]), np.sort(_half_sums(values[values.size // 2 :]))
    total = float(left.size) * right.size
    at_most = np.searchsorted(right, observed + gamma - left, side="right").sum() / total
    at_least = (right.size - np.searchsorted(right, observed - gamma - left, side="left")).sum() / total
    return float(at_most), float(at_least)


def _random_tails(values: np.ndarray, observed: float, resamples: int, rng) -> tuple[float, float]:
    """Tails from ``resamples`` random sign patterns, counted as (k + 1) / (R + 1) (scipy's randomised
    ``permutation_test``: a valid p-value at any R)."""
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    less = greater = 0
    for start in range(0, resamples, 10_000):
        signs = rng.choice((-1.0, 1.0), size=(min(10_000, resamples - start), values.size))
        sums = signs @ values
        less += int(np.sum(sums <= observed + gamma))
        greater += int(np.sum(sums >= observed - gamma))
    return (less + 1) / (resamples + 1), (greater + 1) / (resamples + 1)


def _p_of(tails: tuple, alternative: str):
    """The p-value of ``alternative`` from the (less, greater) tails (floats, or arrays of them)."""
    less, greater = tails
    if alternative == "greater":
        return greater
    if alternative == "less":
        return less
    return np.minimum(1.0, 2.0 * np.minimum(less, greater))


def _is_integer(values: np.ndarray) -> bool:
    return bool(np.all(values == np.round(values))) and float(np.abs(values).sum()) <= 1e6


def sign_flip_p(d: Sequence[float], alternative: str = "two-sided", shift: float = 0.0) -> float:
    """p-value of the sign-flip randomisation test (Fisher's one-sample test) that the per-seed differences ``d``
    are symmetric about ``shift``, on their mean: "two-sided", "greater" (the mean above ``shift``) or "less". A
    seed's difference keeps its size and takes either sign with probability 1/2 under the null (the arms of a seed
    exchangeable), so the test is exact without normality. Exact at any number of seeds for integer differences
    (collapse counts: the null law by convolution), by enumerating every sign pattern up to
    :data:`SIGN_FLIP_EXACT_MOST` seeds otherwise (counted in halves), and from :data:`SIGN_FLIP_RESAMPLES` random
    patterns beyond (a fixed seed). The values and tie handling of ``scipy.stats.permutation_test(...,
    permutation_type="samples")`` on the mean (a test checks them); 1.0 with no seed away from ``shift``."""
    d = np.asarray(d, dtype=np.float64) - shift
    if not np.all(np.isfinite(d)):
        raise ValueError("sign_flip_p: the differences must be finite numbers")
    values = np.abs(d[d != 0])
    if values.size == 0:
        return 1.0
    observed = float(d[d != 0].sum())
    if _is_integer(values):
        tails = _integer_tails(values, observed)
    elif values.size <= SIGN_FLIP_EXACT_MOST:
        tails = _meet_in_the_middle_tails(values, observed)
    else:
        tails = _random_tails(values, observed, SIGN_FLIP_RESAMPLES, np.random.default_rng(0))
    return float(_p_of(tails, alternative))


def sign_flip_many(d: np.ndarray, alternative: str = "two-sided", resamples: int = 2000, rng=None) -> np.ndarray:
    """:func:`sign_flip_p` of every row of ``d`` [sims, n] for a design's simulation: exact for integer rows (one
    null law per distinct row, remembered) and up to 16 seeds (every sign pattern at once); from ``resamples``
    random patterns per row beyond (the simulation's test is then the randomised one, which is valid too)."""
    d = np.asarray(d, dtype=np.float64)
    sims, n = d.shape
    out = np.empty(sims)
    if _is_integer(d):
        seen: dict[tuple, float] = {}
        for i, row in enumerate(d):
            key = (tuple(sorted(np.abs(row[row != 0]).tolist())), float(row.sum()))
            if key not in seen:
                seen[key] = sign_flip_p(row, alternative)
            out[i] = seen[key]
        return out
    if n <= 16:
        signs = 1.0 - 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # [2^n, n]
        null = lambda chunk: signs @ chunk.T  # noqa: E731  [patterns, chunk]
    else:
        rng = rng if rng is not None else np.random.default_rng(0)
        null = lambda chunk: rng.choice((-1.0, 1.0), size=(resamples, n)) @ chunk.T  # noqa: E731
    adjustment = 0 if n <= 16 else 1
    for lo in range(0, sims, 128):
        chunk = d[lo : lo + 128]
        sums = null(chunk)
        observed = chunk.sum(axis=1)
        gamma = np.abs(np.finfo(np.float64).eps * 100 * observed)
        count = sums.shape[0]
        less = (np.sum(sums <= observed + gamma, axis=0) + adjustment) / (count + adjustment)
        greater = (np.sum(sums >= observed - gamma, axis=0) + adjustment) / (count + adjustment)
        out[lo : lo + 128] = _p_of((less, greater), alternative)
    return out


# ------------------------------------------------------------------ the seed as the unit: looks at any time
def e_values(d: np.ndarray, scale: float, alternative: str = "two-sided") -> np.ndarray:
    """Running e-values [..., n] of the seeds' differences ``d`` [..., n] (in seed order) against the null that
    each is symmetric about 0 given the seeds before it: the wealth of a uniform mixture of bettors, each staking a
    fixed fraction (:data:`BETS`; both signs for "two-sided", + for "greater", - for "less") of its wealth on
    ``clip(d / scale, -1, 1)``, an odd function of the difference whose mean is 0 under the null. Each bettor's
    wealth, and so the mixture's, is a nonnegative martingale under the null starting at 1: the chance it ever
    reaches 1 / alpha is at most alpha (Ville), whatever the looks. ``scale``, fixed in the plan, sets how large a
    difference counts as a full bet (a collapse count: the cells pooled; an accuracy: about twice the seeds' sd)."""
    if not scale > 0:
        raise ValueError(f"e_values: scale={scale}: give a scale > 0")
    x = np.clip(np.asarray(d, dtype=np.float64) / scale, -1.0, 1.0)
    bets = {"greater": BETS, "less": -BETS, "two-sided": np.concatenate([BETS, -BETS])}[alternative]
    wealth = np.cumprod(1.0 + bets[:, None] * x[..., None, :], axis=-1)  # [..., bettors, n]
    return wealth.mean(axis=-2)


def anytime_p(e: np.ndarray) -> np.ndarray:
    """The anytime-valid p-values of running e-values ``e`` [..., n]: min(1, 1 / the largest e-value so far)."""
    return np.minimum(1.0, 1.0 / np.maximum.accumulate(np.maximum(e, 1e-300), axis=-1))
