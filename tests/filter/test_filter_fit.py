"""fit_q: the maximum-likelihood q = Q/V of KPO's local-level model, against the float64 loop likelihood (over a
fine grid) and against statsmodels' local-level model with the same known start (level 0, variance 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kpo.filter import fit_q
from kpo.filter.fit import Q_BOUNDS, local_level_loglik
from kpo.filter.reference import local_level_loglik_reference


def simulate(q: float, rows: int, tokens: int, seed: int) -> torch.Tensor:
    """[rows, tokens] draws of KPO's model: a level starting at 0 that walks with variance q a token, seen
    with noise of variance 1."""
    g = np.random.default_rng(seed)
    level = np.cumsum(g.normal(0.0, math.sqrt(q), (rows, tokens)), axis=1)
    return torch.from_numpy(level + g.normal(0.0, 1.0, (rows, tokens)))


def holes(rows: int, tokens: int) -> torch.Tensor:
    """A mask with a hole inside every response and shorter responses in every third row."""
    mask = torch.ones(rows, tokens, dtype=torch.bool)
    mask[:, 50:60] = False
    mask[::3, -40:] = False
    return mask


@pytest.mark.parametrize("q", [1e-4, 1e-2, 1.0])
def test_fit_attains_the_likelihoods_maximum_over_a_fine_grid(q):
    z, mask = simulate(q, 64, 256, seed=0), holes(64, 256)
    fitted = fit_q(z, mask)
    best = local_level_loglik_reference(z, mask, q=fitted)
    # the fast likelihood is the loop's, at the fitted q and elsewhere
    for at in (fitted, q, 3.0 * q):
        assert local_level_loglik(z, mask, q=at) == pytest.approx(local_level_loglik_reference(z, mask, q=at), rel=1e-12)
    # a fine grid of the loop's likelihood around the truth (3 decades, 300 points) finds nothing higher
    grid = np.exp(np.linspace(math.log(q) - 3.5, math.log(q) + 3.5, 300))
    top = max(local_level_loglik_reference(z, mask, q=float(g)) for g in grid)
    assert best >= top - 1e-6 * abs(top)
    assert q / 2 < fitted < 2 * q  # 14,000 tokens pin q down to well within a factor 2


@pytest.mark.parametrize("q", [1e-4, 1e-2, 1.0])
def test_fit_agrees_with_statsmodels_on_5000_tokens(q):
    sm = pytest.importorskip("statsmodels.api")
    z = simulate(q, 1, 5000, seed=1)[0]
    model = sm.tsa.UnobservedComponents(z.numpy(), level="local level")
    model.ssm.initialize_known(np.zeros(1), np.zeros((1, 1)))  # KPO's start: level 0 known exactly
    irregular, level = model.fit(disp=False).params
    assert fit_q(z) == pytest.approx(level / irregular, rel=0.10)


def test_masked_tokens_are_skipped_not_observed():
    z, mask = simulate(1e-2, 8, 100, seed=2), holes(8, 100)
    poisoned = torch.where(mask, z, torch.full_like(z, 1e6))  # masked values cannot matter
    assert fit_q(poisoned, mask) == fit_q(z, mask)
    # a row's valid tokens are one sequence: closing the hole gives the same likelihood
    row = z[1][mask[1]]
    assert local_level_loglik(z[1], mask[1], q=0.1) == pytest.approx(local_level_loglik(row, q=0.1), rel=1e-12)


def test_bounds_and_unidentifiable_batches():
    z = simulate(1e-2, 4, 64, seed=3)
    assert fit_q(z, bounds=(1e-8, 1e-3)) == pytest.approx(1e-3)  # the maximum lies above: the bound
    with pytest.raises(ValueError, match="exactly 0 .* keep the last fitted q"):
        fit_q(torch.zeros(4, 64))
    with pytest.raises(ValueError, match="at least 2 valid tokens, got 0: with no observation there is no likelihood$"):
        fit_q(z, torch.zeros_like(z).bool())
    one = torch.zeros_like(z).bool()
    one[0, 5] = True
    with pytest.raises(ValueError, match="got 1: with one observation the likelihood does not depend on q$"):
        fit_q(z, one)
    with pytest.raises(ValueError, match="0 < q_min < q_max"):
        fit_q(z, bounds=(1e-2, 1e-3))
    with pytest.raises(ValueError, match="NaN/Inf"):
        fit_q(torch.full((2, 3), math.nan))
    with pytest.raises(ValueError, match="mask must be a tensor of log_ratio's shape"):
        fit_q(z, torch.ones(3, 3))
    assert Q_BOUNDS[0] < fit_q(z) < Q_BOUNDS[1]
