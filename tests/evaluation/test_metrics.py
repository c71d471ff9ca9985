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
    from kpo.evaluation.metrics import bootstrap_avg_ci, bootstrap_diff_ci

    # every problem 3 of 4 right in both seeds: no draw can move the mean
    assert bootstrap_avg_ci([[3] * 50, [3] * 50], 4) == (0.75, 0.75)
    assert bootstrap_diff_ci([[3] * 50], [[1] * 50], 4) == (0.5, 0.5, 0.5)


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


def test_bootstrap_difference_is_paired_over_problems():
    from kpo.evaluation.metrics import bootstrap_diff_ci

    # both models get the same hard and easy problems; b is one sample better on every one of them. Unpaired,
    # the spread of problem difficulty would make the interval wide; paired, it is exactly -1/4.
    a = [[0] * 50 + [3] * 50]
    b = [[1] * 50 + [4] * 50]
    assert bootstrap_diff_ci(a, b, 4) == pytest.approx((-0.25, -0.25, -0.25), abs=1e-12)
    # seeds are resampled: a seed-to-seed spread widens the interval
    mean, low, high = bootstrap_diff_ci([[4] * 50, [0] * 50], [[2] * 50], 4)
    assert mean == 0.0 and low == -0.5 and high == 0.5


def test_bootstrap_inputs_are_checked():
    from kpo.evaluation.metrics import bootstrap_avg_ci, bootstrap_diff_ci

    with pytest.raises(ValueError, match=r"counts must lie in \[0, n=4\]"):
        bootstrap_avg_ci([[5]], 4)
    with pytest.raises(ValueError, match="one non-empty list of per-problem correct counts per run"):
        bootstrap_avg_ci([], 4)
    with pytest.raises(ValueError, match="compare on the same problems"):
        bootstrap_diff_ci([[1, 2]], [[1]], 4)
    with pytest.raises(ValueError, match="level"):
        bootstrap_avg_ci([[1]], 4, level=1.5)
