"""kpo.compare.stats: hand-worked cases and parity with scipy's and statsmodels' own tests (the fast paths beside
them)."""

from __future__ import annotations

import numpy as np
import pytest

from kpo.compare import stats


def test_collapse_bound_is_clopper_pearson():
    # 0 of 8: the exact two-sided 95% interval's upper end solves (1 - p)^8 = 0.025: 1 - 0.025^(1/8) = 0.3694
    found = stats.collapse_count([False] * 8)
    assert (found["k"], found["n"]) == (0, 8) and found["upper95"] == pytest.approx(1 - 0.025 ** (1 / 8))
    assert stats.collapse_count([True] * 4)["low95"] == pytest.approx(0.025 ** (1 / 4))


def test_mcnemar_counts_discordant_pairs_and_matches_statsmodels():
    from statsmodels.stats.contingency_tables import mcnemar

    # 7 pairs where only GRPO collapsed, none where only KPO did: p = 2 x 0.5^7 = 0.015625 (the pooled
    # stress cells)
    a = [True] * 7 + [False] * 5 + [True] * 4
    b = [False] * 7 + [False] * 5 + [True] * 4
    found = stats.mcnemar_exact(a, b)
    assert (found["a_only"], found["b_only"], found["pairs"]) == (7, 0, 16) and found["p"] == pytest.approx(2 * 0.5**7)
    rng = np.random.default_rng(0)
    for _ in range(50):
        x, y = rng.random(20) < 0.4, rng.random(20) < 0.2
        table = [[np.sum(x & y), np.sum(x & ~y)], [np.sum(~x & y), np.sum(~x & ~y)]]
        expected = 1.0 if table[0][1] + table[1][0] == 0 else mcnemar(table, exact=True).pvalue
        assert stats.mcnemar_exact(x, y)["p"] == pytest.approx(expected, rel=1e-12)


def test_the_sign_test_is_scipys_binomial_test_of_the_signs():
    # 6 differences, 5 above 0 and one at 0 (dropped): two-sided p = 2 x P(Bin(5, 1/2) >= 5) = 2 / 32 = 0.0625
    assert stats.shifted_sign_test([0.1, 0.2, 0.0, 0.3, 0.05, 0.4], 0.0, "two-sided") == pytest.approx(0.0625)
    assert stats.shifted_sign_test([0.1, 0.2, 0.0, 0.3, 0.05, 0.4], 0.0, "greater") == pytest.approx(1 / 32)
    # shifted by 0.15: 2 above (0.2, 0.3, 0.4 -> 3 above), 3 below: one-sided "less" p = P(Bin(6, 1/2) <= 3) = 42/64
    assert stats.shifted_sign_test([0.1, 0.2, 0.0, 0.3, 0.05, 0.4], 0.15, "less") == pytest.approx(42 / 64)
    assert stats.shifted_sign_test([0.0, 0.0], 0.0, "two-sided") == 1.0


def test_holm_adjusted_p_values_are_statsmodels_and_agree_with_the_decisions():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(5)
    for _ in range(8):
        p = rng.random(rng.integers(1, 21)) ** 3
        adjusted = stats.holm_adjusted(p)
        assert adjusted == pytest.approx(multipletests(p, alpha=0.05, method="holm")[1].tolist(), rel=1e-12)
        assert [a <= 0.05 for a in adjusted] == multipletests(p, alpha=0.05, method="holm")[0].tolist()


def test_median_interval_out_of_reach_is_none():
    # 6 pairs: even [d_(1), d_(6)] covers the median with 1 - 2 / 64 = 0.969 only
    d = np.arange(6, dtype=float)
    assert stats._median_interval(d, 0.99) is None
    assert stats._median_interval(d, 0.95) == (0.0, 5.0)


def test_pairs_where_both_runs_collapsed_are_ties():
    """Six pairs whose runs all collapsed, one arm ahead by a hair in each (the issue's bf16-depth16-lr5e-4 KPO
    (auto) - GRPO, sign p = 0.031 on main): ties, no sign at all."""
    hair = [0.0006, 0.0001, 0.0003, 0.0002, 0.0004, 0.0005]
    fell = [True] * 6
    found = stats.paired_accuracy(hair, fell, both=fell)
    assert found["p"] == 1.0 and found["ties"] == 6 and found["median"] == 0.0
    assert found["per_seed"] == hair  # the measured differences are kept for the figure
    # one arm collapsed, the other learned: a sign
    assert stats.paired_accuracy(hair, fell, both=[False] * 6)["p"] == pytest.approx(2 / 64)


def test_paired_accuracy_picks_its_method_by_collapses():
    # no collapse: the paired t over d = -0.07, -0.10, -0.05, -0.08 (mean -0.075, sd 0.0208, t_{3,.975} = 3.182:
    # half-width 3.182 x 0.0208 / 2 = 0.0331)
    t = stats.paired_accuracy([-0.07, -0.10, -0.05, -0.08], [False] * 4)
    assert t["method"] == "t" and t["high"] == pytest.approx(-0.075 + 0.03312, abs=1e-4)
    # a collapse in a pair: the sign test (3 of 4 positive: two-sided p = 2 x 5/16 = 0.625), no interval below 6
    s = stats.paired_accuracy([0.41, 0.30, -0.25, 0.50], [True, False, False, False])
    assert s["method"] == "sign" and s["p"] == pytest.approx(0.625) and s["low"] is None
    # 8 pairs: the order-statistic interval [d_(2), d_(7)] covers the median with 1 - 2 x 9/256 = 0.93 < 0.95,
    # so it is [d_(1), d_(8)] (0.992)
    d = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    eight = stats.paired_accuracy(d, [True] + [False] * 7)
    assert (eight["low"], eight["high"]) == (0.1, 0.8) and eight["p"] == pytest.approx(2 / 256)


def test_seeds_needed_grow_with_noise_and_shrink_with_discordance():
    # an effect 35 times its spread: 3 seeds have the power (the solver gave nan, read as "no number of seeds")
    assert stats.seeds_for_effect(0.002, 0.07, 0.0042) == 3
    assert stats.seeds_for_effect(0.02, 0.05, 0.05) < stats.seeds_for_effect(0.06, 0.05, 0.05)
    assert stats.seeds_for_effect(None, 0.05, 0.05) is None
    few = stats.discordance_seeds(7, 0, 16, 4, 0.05 / 20)
    assert few is not None and few < stats.discordance_seeds(4, 1, 16, 4, 0.05 / 20)
    assert stats.discordance_seeds(0, 0, 16, 4, 0.05) is None


# ------------------------------------------------------------------ the seed as the unit
def _scipy_sign_flip(d, alternative="two-sided"):
    from scipy.stats import permutation_test

    return permutation_test(
        (np.asarray(d, dtype=np.float64),), np.mean, permutation_type="samples", alternative=alternative,
        n_resamples=np.inf, vectorized=True,
    ).pvalue


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_sign_flip_p_is_scipys_permutation_test(alternative):
    from kpo.compare.stats import sign_flip_p

    rng = np.random.default_rng(7)
    cases = [rng.normal(0.03, 0.05, size=n) for n in (3, 7, 12)]
    cases += [np.array([0.02] * 5 + [-0.02] * 3), np.array([1.0, 2.0, -1.0, 0.0, 2.0, 1.0, 1.0, -2.0, 1.0])]
    for d in cases:  # real differences, ties in |d|, integer counts with zeros
        assert sign_flip_p(d, alternative) == pytest.approx(min(1.0, _scipy_sign_flip(d, alternative)), abs=1e-12)


def test_sign_flip_p_hand_cases():
    from kpo.compare.stats import sign_flip_p

    # five positive differences: 2 of the 32 sign patterns have |mean| >= the observed one -> p = 2/32
    assert sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    # one-sided: only the all-plus pattern reaches the observed sum -> 1/32
    assert sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5], "greater") == pytest.approx(1 / 32)
    # shifted: d + 0.05 (a non-inferiority margin of 5 points) = [0.04, 0.05, 0.06]: 1/8 one-sided
    assert sign_flip_p([-0.01, 0.0, 0.01], "greater", shift=-0.05) == pytest.approx(1 / 8)
    assert sign_flip_p([0.0, 0.0]) == 1.0 and sign_flip_p([1.0, -1.0]) == 1.0
    with pytest.raises(ValueError, match="finite"):
        sign_flip_p([0.1, float("nan")])


def test_sign_flip_p_exact_where_scipy_cannot_enumerate():
    from scipy.stats import binomtest

    from kpo.compare.stats import sign_flip_p

    # collapse counts of one cell are +-1 or 0: the sign-flip test is the exact McNemar (binomial) test, at 60
    # seeds as at 6 (scipy would enumerate 2^60 patterns)
    d = np.array([1] * 15 + [-1] * 2 + [0] * 43, dtype=float)
    assert sign_flip_p(d) == pytest.approx(binomtest(15, 17).pvalue, rel=1e-10)
    # real differences at 24 seeds: counted in halves, equal to the brute-force count over all 2^24 patterns
    # done in blocks (both exact)
    rng = np.random.default_rng(2)
    d = rng.normal(0.01, 0.05, size=22)
    signs = 1.0 - 2.0 * ((np.arange(2**11)[:, None] >> np.arange(11)) & 1)
    half = np.add.outer(signs @ d[:11], signs @ d[11:]).ravel()
    s = d.sum()
    brute = min(1.0, 2 * min(np.mean(half <= s + 1e-13 * abs(s)), np.mean(half >= s - 1e-13 * abs(s))))
    assert sign_flip_p(d) == pytest.approx(brute, abs=1e-12)


def test_sign_flip_many_agrees_with_sign_flip_p():
    from kpo.compare.stats import sign_flip_many, sign_flip_p

    rng = np.random.default_rng(3)
    real = rng.normal(-0.03, 0.04, size=(30, 9))
    real[0, :] = 0.02  # ties in |d|: exactness of the comparison matters
    counts = rng.integers(-2, 3, size=(30, 28)).astype(float)
    for d in (real, counts):
        for alternative in ("two-sided", "greater"):
            assert sign_flip_many(d, alternative) == pytest.approx(
                [sign_flip_p(row, alternative) for row in d], abs=1e-12
            )
    # beyond 16 real-valued seeds: random sign patterns, within 5 standard errors of the exact p (a two-sided p is
    # twice a tail estimated from 4000 patterns: se = 2 sqrt(tail (1 - tail) / 4000))
    wide = rng.normal(0.02, 0.05, size=(20, 24))
    exact = np.array([sign_flip_p(row) for row in wide])
    se = 2 * np.sqrt(exact / 2 * (1 - exact / 2) / 4000)
    assert np.all(np.abs(sign_flip_many(wide, resamples=4000) - exact) <= 5 * se + 2 / 4000)


def test_e_values_hand_case_and_their_error_under_continuous_monitoring():
    from scipy.stats import binomtest

    from kpo.compare.stats import ALPHA, BETS, anytime_p, e_values

    # one seed at the full scale: each bettor's wealth is 1 + bet (greater) -> the mean of 1.1 .. 1.9 = 1.5
    assert e_values(np.array([0.2]), 0.2, "greater")[0] == pytest.approx(1 + BETS.mean())
    # two-sided: half the bettors win, half lose the same amounts -> 1
    assert e_values(np.array([0.2]), 0.2)[0] == pytest.approx(1.0)
    # under the null (symmetric differences, here heavy-tailed and scaled wrongly on purpose), the share of 5,000
    # studies whose e-value ever reaches 1 / alpha over 60 seeds, looked at after every seed, is at most alpha
    rng = np.random.default_rng(4)
    d = rng.standard_t(3, size=(5000, 60)) * 0.05
    crossed = (anytime_p(e_values(d, 0.1)) <= ALPHA).any(axis=1)
    assert binomtest(int(crossed.sum()), crossed.size, ALPHA, alternative="greater").pvalue > 0.01
    # and it has power: a 0.6-sd effect crosses in most studies
    crossed = (anytime_p(e_values(d + 0.05, 0.1)) <= ALPHA).any(axis=1)
    assert crossed.mean() > 0.8
