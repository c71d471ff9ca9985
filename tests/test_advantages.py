"""compute_advantages: hand-worked grpo/drgrpo/rloo/krpo, grouping by any hashable, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kpo import compute_advantages
from kpo.advantages import ADVANTAGES

# Group "a" = responses 0, 1, 4 with rewards [1, 0, 1]; group "b" = 2, 3 with [0, 1]; "c" = response 5 alone.
R = [1.0, 0.0, 0.0, 1.0, 1.0, 0.5]
G = ["a", "a", "b", "b", "a", "c"]


def test_grpo_by_hand():
    # a: mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3 -> std sqrt(1/3); A = (R - 2/3) / (std + eps)
    # b: mean 1/2, var (1/4 + 1/4) / 1 = 1/2; c: single -> mean 0, std 1 -> 0.5 / (1 + eps)
    eps = 1e-6
    sa, sb = math.sqrt(1 / 3), math.sqrt(1 / 2)
    want = [
        1 / 3 / (sa + eps),
        -2 / 3 / (sa + eps),
        -0.5 / (sb + eps),
        0.5 / (sb + eps),
        1 / 3 / (sa + eps),
        0.5 / (1 + eps),
    ]
    torch.testing.assert_close(compute_advantages("grpo", R, G), torch.tensor(want, dtype=torch.float64))
    # TRL's eps.
    assert compute_advantages("grpo", R, G, eps=1e-4)[5].item() == pytest.approx(0.5 / (1 + 1e-4))


def test_drgrpo_and_rloo_by_hand():
    # drgrpo: R - group mean (single: mean 0).
    want = [1 / 3, -2 / 3, -0.5, 0.5, 1 / 3, 0.5]
    torch.testing.assert_close(compute_advantages("drgrpo", R, G), torch.tensor(want, dtype=torch.float64))
    # rloo: R_i - mean of the others: a: 1 - (0 + 1)/2 = 0.5, 0 - 1 = -1; b: 0 - 1 = -1, 1 - 0 = 1; c: R.
    want = [0.5, -1.0, -1.0, 1.0, 0.5, 0.5]
    torch.testing.assert_close(compute_advantages("rloo", R, G), torch.tensor(want, dtype=torch.float64))


def test_krpo_by_hand():
    # Group [1, 0] with q = 1e-5, v = 1e-2, x0 = 0, P0 = 1:
    # step 1: P- = 1 + q, K1 = P-/(P- + v), x1 = K1 * 1, P1 = v K1; A1 = (1 - x1) / (sqrt(P1) + 1e-8)
    # step 2: P- = P1 + q, K2 = P-/(P- + v), x2 = x1 + K2 (0 - x1), P2 = v K2; A2 = (0 - x2) / (sqrt(P2) + 1e-8)
    q, v = 1e-5, 1e-2
    p = 1 + q
    k1 = p / (p + v)
    x1, p1 = k1, v * k1
    p = p1 + q
    k2 = p / (p + v)
    x2, p2 = x1 - k2 * x1, v * k2
    want = [(1 - x1) / (math.sqrt(p1) + 1e-8), -x2 / (math.sqrt(p2) + 1e-8)]
    got = compute_advantages("krpo", [1.0, 0.0], [7, 7])
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    assert got[0].item() == pytest.approx(
        0.0995, abs=1e-4
    )  # "about 0.1 for the first sample" (METHODS.md 11)


def test_krpo_groups_are_independent_and_order_matters():
    # Interleaved groups give the same result as each group alone (a fresh filter per group).
    r, g = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([3, 9, 3, 9, 3])
    got = compute_advantages("krpo", r, g)
    torch.testing.assert_close(got[[0, 2, 4]], compute_advantages("krpo", [1.0, 0.0, 1.0], [0, 0, 0]))
    torch.testing.assert_close(got[[1, 3]], compute_advantages("krpo", [0.0, 1.0], [0, 0]))
    assert not torch.allclose(
        compute_advantages("krpo", [0.0, 1.0], [0, 0]), compute_advantages("krpo", [1.0, 0.0], [0, 0]).flip(0)
    )


@pytest.mark.parametrize("name", ADVANTAGES)
def test_group_id_types_and_empty(name):
    a = compute_advantages(name, R, G)
    ints = compute_advantages(name, torch.tensor(R), torch.tensor([0, 0, 1, 1, 0, 2]))
    tuples = compute_advantages(name, R, [("p", 1), ("p", 1), ("q",), ("q",), ("p", 1), None])
    torch.testing.assert_close(a, ints)
    torch.testing.assert_close(a, tuples)
    # verl's uids: a numpy object array of strings
    uids = np.array(["u0", "u0", "u1", "u1", "u0", "u2"], dtype=object)
    torch.testing.assert_close(a, compute_advantages(name, np.array(R), uids))
    assert compute_advantages(name, [], []).shape == (0,)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'.*grpo, drgrpo, rloo, krpo"):
        compute_advantages("gae", R, G)
    with pytest.raises(ValueError, match="'rloo' does not accept 'eps'"):
        compute_advantages("rloo", R, G, eps=1e-6)
    with pytest.raises(ValueError, match="group_ids has 2 entries but rewards has 6"):
        compute_advantages("grpo", R, ["a", "b"])
    with pytest.raises(ValueError, match=r"rewards\[1\] is nan"):
        compute_advantages("grpo", [1.0, math.nan], [0, 0])
    with pytest.raises(ValueError, match="rewards must be 1-D"):
        compute_advantages("grpo", [[1.0]], [0])
    with pytest.raises(TypeError, match=r"group_ids\[0\].*not hashable"):
        compute_advantages("grpo", [1.0], [["a"]])
    with pytest.raises(ValueError, match="krpo needs q > 0"):
        compute_advantages("krpo", R, G, q=0.0)
    with pytest.raises(TypeError, match="eps must be a real number, got NoneType"):
        compute_advantages("grpo", R, G, eps=None)
    with pytest.raises(TypeError, match="rewards must be numbers"):
        compute_advantages("grpo", np.array([{"r": 1}], dtype=object), [0])


def test_list_rewards_keep_float64():
    """A list went through torch's default float32: 1 + 1e-9 rounded to 1 (advantages all 0) and 1e308 to inf."""
    adv = compute_advantages("grpo", [1.0, 1.0 + 1e-9, 1.0], [0, 0, 0])
    assert torch.equal(
        adv, compute_advantages("grpo", torch.tensor([1.0, 1.0 + 1e-9, 1.0], dtype=torch.float64), [0] * 3)
    )
    assert adv[1] > 0 > adv[0]
    assert compute_advantages("drgrpo", [1e308, -1e308], [0, 1]).tolist() == [1e308, -1e308]


@pytest.mark.parametrize(
    "ids",
    [[0, float("nan")], torch.tensor([0.0, float("nan")]), np.array([0.0, np.nan])],
    ids=["list", "tensor", "numpy"],
)
def test_nan_group_ids_are_refused(ids):
    """NaN equals nothing, itself included: each NaN id was a group of one."""
    with pytest.raises(ValueError, match=r"group_ids\[1\] is NaN; give each response its prompt's id"):
        compute_advantages("grpo", [1.0, 2.0], ids)


def test_grpo_needs_a_positive_eps():
    # Equal rewards in a group give std 0: eps = 0 would make that group's advantages 0/0 = NaN.
    with pytest.raises(ValueError, match=r"grpo needs eps > 0.*got eps=0"):
        compute_advantages("grpo", [1.0, 1.0], [0, 0], eps=0)
    # krpo divides by its posterior std, which q > 0 keeps positive: eps = 0 is fine there.
    a = compute_advantages("krpo", [1.0, 1.0, 1.0], [0, 0, 0], eps=0.0, p0=0.0)
    assert bool(torch.isfinite(a).all())


def test_huge_finite_rewards_keep_their_advantages():
    """Rewards of +-1e308 (finite): the group's sum of squares overflowed, its std was inf and every grpo advantage
    0; a sum of 1e308 + 1e308 overflowed the mean too. The group is now scaled (by a power of two) first."""
    assert compute_advantages("grpo", [1e308, -1e308], [0, 0]).tolist() == pytest.approx(
        [2**-0.5, -(2**-0.5)], rel=1e-12
    )
    # std of (1, 1, -1) x 1.7e308: 2 / sqrt(3) x 1.7e308, itself finite; the advantages are those of (1, 1, -1)
    big = compute_advantages("grpo", [1.7e308, 1.7e308, -1.7e308, 5.0], [0, 0, 0, 1])
    assert big.tolist() == pytest.approx(
        [0.5**0.5 * 2 / 6**0.5] * 2 + [-(2 / 3**0.5), 5 / (1 + 1e-6)], rel=1e-12
    )
    assert compute_advantages("drgrpo", [1e308, 1e308, -1e308], [0, 0, 0]).tolist() == pytest.approx(
        [1e308 / 3 * 2, 1e308 / 3 * 2, -1e308 / 3 * 4],
        rel=1e-12,  # mean 1e308 / 3
    )
