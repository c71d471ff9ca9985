from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from kpo.evaluation import avg_at_n, benchmark_metrics, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 1, 0.25),
        # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 2, 2, 5 / 6),
        # n - c = 2 < k = 3: every 3-subset holds a correct sample
        (4, 2, 3, 1.0),
        # 1 - C(14,4)/C(16,4) = 1 - 1001/1820 = 819/1820
        (16, 2, 4, 819 / 1820),
        # 1 - C(15,16)/C(16,16) = 1 - 0/1
        (16, 1, 16, 1.0),
        (16, 0, 16, 0.0),
        (16, 0, 1, 0.0),
        (16, 16, 1, 1.0),
        # pass@1 = c/n
        (16, 5, 1, 5 / 16),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-15, abs=1e-15)


def test_pass_at_k_exact_where_floats_of_binomials_overflow():
    # C(2000, 1000) ~ 2e600 overflows a float; the rational result stays exact.
    n, c, k = 2000, 3, 1000
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    # Closed form for c = 3: C(n-3,k)/C(n,k) = (n-k)(n-k-1)(n-k-2) / (n(n-1)(n-2))
    closed = 1 - Fraction((n - k) * (n - k - 1) * (n - k - 2), n * (n - 1) * (n - 2))
    assert exact == closed
    assert pass_at_k(n, c, k) == float(closed)
    # n - c < k: every k-subset holds a correct sample, so exactly 1.
    assert pass_at_k(1000, 999, 999) == 1.0
    # Tiny complements survive: c = 1, k = n - 1 misses with probability C(n-1, k) / C(n, k) = 1/n.
    assert pass_at_k(1000, 1, 999) == pytest.approx(999 / 1000, rel=1e-15)


def test_pass_at_k_all_counts_are_monotone_and_bounded():
    n = 16
    for k in range(1, n + 1):
        values = [pass_at_k(n, c, k) for c in range(n + 1)]
        assert values[0] == 0.0 and values[-1] == 1.0
        assert all(a <= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(
    "args, match",
    [((4, 5, 1), "c=5"), ((4, -1, 1), "c=-1"), ((4, 1, 5), "k=5"), ((4, 1, 0), "k=0"), ((0, 0, 1), "n=0")],
)
def test_pass_at_k_rejects_bad_counts(args, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)
    with pytest.raises(TypeError, match="must be an int"):
        pass_at_k(4.0, 1, 1)


def test_avg_and_benchmark_metrics():
    assert avg_at_n(8, 3) == 3 / 8
    # problem A: 1 of 4 correct, problem B: 4 of 4, problem C: 0 of 4.
    correct = [[0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    m = benchmark_metrics([[float(g) for g in row] for row in correct], ks=(1, 2, 4))
    # avg@4 = (1/4 + 1 + 0) / 3 = 5/12
    assert m["avg@4"] == pytest.approx(5 / 12)
    assert m["pass@1"] == pytest.approx(5 / 12)
    # pass@2 for A: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2 -> (1/2 + 1 + 0) / 3 = 1/2
    assert m["pass@2"] == pytest.approx(0.5)
    # pass@4: A and B solved -> 2/3
    assert m["pass@4"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="problem 1 has 3 samples"):
        benchmark_metrics([[1.0, 0.0], [1.0, 0.0, 0.0]], ks=(1,))
    with pytest.raises(ValueError, match="0.0 or 1.0"):
        benchmark_metrics([[0.5, 0.0]], ks=(1,))


def test_bootstrap_interval_of_a_constant_is_that_constant():
    from kpo.evaluation.metrics import bootstrap_avg_ci

    # every problem 3 of 4 right in both seeds: no draw can move the mean
    assert bootstrap_avg_ci([[3] * 50, [3] * 50], 4) == (0.75, 0.75)


def test_bootstrap_interval_covers_the_normal_approximation():
    import numpy as np

    from kpo.evaluation.metrics import bootstrap_avg_ci

    rng = np.random.default_rng(0)
    # 400 problems, each right (4/4) with probability 0.3: the mean's standard error is sqrt(.3 * .7 / 400)
    counts = [int(x) * 4 for x in rng.random(400) < 0.3]
    low, high = bootstrap_avg_ci([counts], 4)
    mean, se = np.mean(counts) / 4, np.sqrt(0.3 * 0.7 / 400)
    assert low < mean < high
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_bootstrap_inputs_are_checked():
    from kpo.evaluation.metrics import bootstrap_avg_ci

    with pytest.raises(ValueError, match=r"counts must lie in \[0, n=4\]"):
        bootstrap_avg_ci([[5]], 4)
    with pytest.raises(ValueError, match="one non-empty list of per-problem correct counts per run"):
        bootstrap_avg_ci([], 4)
    with pytest.raises(ValueError, match="level"):
        bootstrap_avg_ci([[1]], 4, level=1.5)


def test_paired_diff_ci_hand_worked_three_seeds():
    from math import sqrt

    from kpo.evaluation.metrics import paired_diff_ci

    # n = 4, S = 3 seeds of P = 4 problems; a count may be a real number (2.5, 1.5).
    a = [[4, 2, 1, 3], [3, 3, 0, 2], [2, 3, 1, 1.5]]
    b = [[3, 2, 1, 2], [3, 2, 0, 2], [2, 3, 1, 2.5]]
    # per-problem differences: seed 0 [1, 0, 0, 1] (sum 2), seed 1 [0, 1, 0, 0] (sum 1), seed 2 [0, 0, 0, -1]
    # (sum -1); d_s = sum / (P * n) = sum / 16 -> d = [2, 1, -1] / 16.
    # mean = (2 + 1 - 1) / 3 / 16 = 1/24  (= avg@4(a) - avg@4(b) = (25.5 - 23.5) / 48)
    # sd: deviations from 2/3 are [4/3, 1/3, -5/3] / 16, squares sum to 42/9 / 256, / (S - 1) = 7/3 / 256,
    #     so sd = sqrt(7/3) / 16.
    # t_{0.975, 2}: for df = 2, P(|T| < t) = t / sqrt(2 + t^2) = 0.95,
    #     so t = 0.95 * sqrt(2 / 0.0975) = 4.302653
    # half = t * sd / sqrt(3) = t * sqrt(7) / 48 = 4.302653 * 0.0551198 = 0.237161
    t2 = 0.95 * sqrt(2 / 0.0975)
    half = t2 * sqrt(7) / 48
    mean, low, high = paired_diff_ci(a, b, 4)
    assert mean == pytest.approx(1 / 24, abs=1e-12)
    assert (low, high) == pytest.approx((1 / 24 - half, 1 / 24 + half), abs=1e-9)
    assert half == pytest.approx(0.237161, abs=1e-6)
    # swapping the sides negates everything
    assert paired_diff_ci(b, a, 4) == pytest.approx((-1 / 24, -1 / 24 - half, -1 / 24 + half), abs=1e-9)
    # level = 0.90: t_{0.95, 2} = 0.9 * sqrt(2 / 0.19) = 2.919986
    half90 = 0.9 * sqrt(2 / 0.19) * sqrt(7) / 48
    assert paired_diff_ci(a, b, 4, level=0.9)[2] == pytest.approx(1 / 24 + half90, abs=1e-9)


def test_paired_diff_ci_hand_worked_one_seed_is_over_problems():
    from math import sqrt

    from kpo.evaluation.metrics import paired_diff_ci

    # one seed, P = 3 problems, n = 4: the per-problem differences x_p = [2, 0, -1] / 4 are the units.
    # mean = (2 + 0 - 1) / 3 / 4 = 1/12
    # sd: deviations from 1/3 are [5/3, -1/3, -4/3] / 4, squares sum to 42/9 / 16, / (P - 1),
    #     so sd = sqrt(7/3) / 4
    # half = t_{0.975, 2} * sd / sqrt(3) = 4.302653 * sqrt(7) / 12 = 0.948646
    half = 0.95 * sqrt(2 / 0.0975) * sqrt(7) / 12
    mean, low, high = paired_diff_ci([[4, 3, 1]], [[2, 3, 2]], 4)
    assert mean == pytest.approx(1 / 12, abs=1e-12)
    assert (low, high) == pytest.approx((1 / 12 - half, 1 / 12 + half), abs=1e-9)
    # P = 2 -> df = 1: x = [1, 0] / 4, mean 1/8, sd = sqrt(1/32),
    #     half = t_{0.975, 1} * sd / sqrt(2) = tan(0.475 pi) / 8 = 12.706205 / 8
    mean, low, high = paired_diff_ci([[2, 0]], [[1, 0]], 4)
    assert (mean, high) == pytest.approx((1 / 8, 1 / 8 + 12.706204736174698 / 8), abs=1e-9)


def test_paired_diff_ci_shared_warm_start_cancels():
    from kpo.evaluation.metrics import paired_diff_ci

    # the seeds differ a lot (a strong and a weak warm start) but within each pair a is one sample better on
    # every problem: d_s = 1/4 for both seeds, sd 0, so the paired interval is the point 1/4.
    a = [[4] * 10, [1] * 10]
    b = [[3] * 10, [0] * 10]
    assert paired_diff_ci(a, b, 4) == (0.25, 0.25, 0.25)


@pytest.mark.parametrize(
    "a, b, kwargs, match",
    [
        ([[1], [2]], [[1]], {}, "a has 2 seeds and b has 1: .*same number of seeds"),
        ([], [], {}, "a has 0 seeds and b has 0"),
        ([[1, 2], [1, 2]], [[1, 2], [1]], {}, r"b\[1\] has 1 problems and a\[0\] has 2: .*same problems"),
        ([[1, 2], [1, 2, 3]], [[1, 2], [1, 2]], {}, r"a\[1\] has 3 problems and a\[0\] has 2"),
        ([[[1, 2]]], [[1, 2]], {}, r"a\[0\] has shape \(1, 2\): .*flat, non-empty list"),
        ([[1, 5]], [[1, 2]], {}, r"a\[0\]\[1\] = 5.0 \(seed 0, problem 1\): .*in \[0, n=4\]"),
        ([[1, 2]], [[1, -0.5]], {}, r"b\[0\]\[1\] = -0.5 \(seed 0, problem 1\)"),
        (
            [[1, 2], [1, 2]],
            [[1, 2], [1, float("nan")]],
            {},
            r"b\[1\]\[1\] = nan \(seed 1, problem 1\): .*finite",
        ),
        ([[1, float("inf")]], [[1, 2]], {}, r"a\[0\]\[1\] = inf \(seed 0, problem 1\)"),
        ([[1]], [[2]], {}, "one seed with one problem: no spread to measure"),
        ([[1, 2]], [[1, 2]], {"level": 1.0}, r"level=1.0: must lie in \(0, 1\)"),
        ([[1, 2]], [[1, 2]], {"level": 0}, r"level=0: must lie in \(0, 1\)"),
        ([[1, 2]], [[1, 2]], {"n": 0}, "n=0: .*positive number"),
    ],
)
def test_paired_diff_ci_rejects_bad_inputs(a, b, kwargs, match):
    from kpo.evaluation.metrics import paired_diff_ci

    kwargs = {"n": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        paired_diff_ci(a, b, **kwargs)


@pytest.mark.parametrize(
    "p, df, table",
    [
        (0.975, 1, 12.706205),
        (0.975, 2, 4.302653),
        (0.975, 11, 2.200985),
        (0.975, 15, 2.131450),
        (0.995, 30, 2.749996),
        (0.975, 200, 1.971896),
        (0.025, 11, -2.200985),
    ],
)
def test_t_quantile_matches_tables(p, df, table):
    from kpo.evaluation.metrics import t_quantile

    assert t_quantile(p, df) == pytest.approx(table, abs=1e-5)


def test_t_quantile_refuses_impossible_settings():
    from kpo.evaluation.metrics import t_quantile

    for df in (0, -1, 2.5):
        with pytest.raises(ValueError, match="degrees of freedom >= 1"):
            t_quantile(0.975, df)
    with pytest.raises(ValueError, match="p in \\(0, 1\\)"):
        t_quantile(1.0, 3)


def _simulated_pairs(rng, repeats, seeds, shift=0.0, problems=256, n=8):
    """[repeats, seeds, problems] counts of arms a and b out of n.

    Each seed has a warm-start quality (logit offset, sd 1.5: seeds differ a lot) shared by its two arms,
    each problem a difficulty logit (sd 2) shared by all seeds and arms of a repeat, and each arm x seed
    its own training-noise shift (sd 0.3), identically distributed for both arms; arm a gets `shift` on top.
    """
    import numpy as np

    warm = rng.normal(0, 1.5, size=(repeats, seeds, 1))
    difficulty = rng.normal(0, 2.0, size=(repeats, 1, problems))
    logit_a = warm + difficulty + shift + rng.normal(0, 0.3, size=(repeats, seeds, 1))
    logit_b = warm + difficulty + rng.normal(0, 0.3, size=(repeats, seeds, 1))
    return rng.binomial(n, 1 / (1 + np.exp(-logit_a))), rng.binomial(n, 1 / (1 + np.exp(-logit_b)))


@pytest.mark.parametrize("seeds", [3, 8, 16])
def test_paired_diff_ci_a_a_comparisons_exclude_zero_at_the_nominal_rate(seeds):
    import numpy as np

    from kpo.evaluation.metrics import paired_diff_ci

    # 2000 A/A comparisons (no true difference) through paired_diff_ci itself. A 95% interval should exclude
    # 0 in 5% of them; the Monte Carlo standard error of the share is sqrt(0.05 * 0.95 / 2000) ~ 0.005, so
    # [0.03, 0.07] is a 4-sigma band (measured: 0.0545, 0.0380, 0.0465 for S = 3, 8, 16).
    repeats = 2000
    a, b = _simulated_pairs(np.random.default_rng(1000 + seeds), repeats, seeds)
    out = np.array([paired_diff_ci(a[r], b[r], 8) for r in range(repeats)])
    excluded = np.mean((out[:, 1] > 0) | (out[:, 2] < 0))
    assert 0.03 <= excluded <= 0.07
    assert abs(out[:, 0].mean()) < 0.01


def test_paired_diff_ci_detects_a_true_shift_at_sixteen_seeds():
    import numpy as np

    from kpo.evaluation.metrics import paired_diff_ci

    # arm a's logit is +0.3 on every seed; at S = 16 the interval should exclude 0 (above it) in most repeats
    # (measured 0.7235 over 2000 repeats, none below it) with a positive mean difference (measured 0.039).
    repeats = 2000
    a, b = _simulated_pairs(np.random.default_rng(16), repeats, 16, shift=0.3)
    out = np.array([paired_diff_ci(a[r], b[r], 8) for r in range(repeats)])
    assert np.mean(out[:, 1] > 0) > 0.5
    assert np.mean(out[:, 2] < 0) < 0.01
    assert out[:, 0].mean() > 0.02
