"""Parity of every filter path with the float64 loop reference over the contract's matrix.

Contract (issue 2): float32 input -> max |ours - float64 loop| <= 2e-6 * max(1, max|z|) for q/v in [1e-8, 1e2],
p0/v in [0, 1e4], x0 != 0, T up to 131072, right padding and long holes, every mask mode; float64 to 1e-11.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kpo.filter import MASK_MODES, kalman_filter
from kpo.filter.reference import authors_recurrence_reference, kalman_filter_reference

from .helpers import CPU_BACKENDS, float32_bound, make_mask, make_params

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 300), mode=st.sampled_from(MASK_MODES))
def test_float32_within_contract(backend, seed, T, mode):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 7))
    scale = float(10 ** rng.uniform(-3, 2))
    z = torch.from_numpy(rng.normal(0.3, 1.0, (B, T)).astype(np.float32)) * scale
    mask = make_mask(rng, B, T)
    params = make_params(rng)
    params["x0"] *= scale
    ours = kalman_filter(z, mask, mask_mode=mode, backend=backend, **params)
    ref = kalman_filter_reference(z, mask, mask_mode=mode, **params)
    assert ours.dtype == torch.float32
    assert float((ours.double() - ref).abs().max()) <= float32_bound(z)
    assert bool((ours[~mask] == 0).all())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 200), mode=st.sampled_from(MASK_MODES))
def test_float64_to_1e11(backend, seed, T, mode):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 5))
    z = torch.from_numpy(rng.normal(0.0, 2.0, (B, T)))
    mask = make_mask(rng, B, T)
    params = make_params(rng)
    ours = kalman_filter(z, mask, mask_mode=mode, backend=backend, **params)
    ref = kalman_filter_reference(z, mask, mask_mode=mode, **params)
    assert ours.dtype == torch.float64
    assert float((ours - ref).abs().max()) <= 1e-11


# a few long rows at the contract's extremes: the slowest-converging gains (q/v = 1e-8), the fastest
# (q/v = 1e2) with a large p0, and holes long enough to matter in `advance` mode
LONG_CASES = [
    (131072, 1e-8, 1.0, 0.0, 0.5, "skip"),
    (131072, 1e-8, 1.0, 1e4, -0.7, "advance"),
    (65536, 1e2, 1.0, 1e4, 0.3, "zero"),
    (65536, 1e-3, 1.0, 0.0, 0.2, "advance"),
]


@pytest.mark.parametrize(("T", "q", "v", "p0", "x0", "mode"), LONG_CASES)
def test_long_rows_float32(T, q, v, p0, x0, mode):
    rng = np.random.default_rng(T + int(1 / q))
    # a drifting log-ratio with a non-zero mean: the hardest case for float32 accumulation
    z = torch.from_numpy((0.8 + 0.5 * rng.standard_normal((2, T)) + np.linspace(0, 1, T)).astype(np.float32))
    mask = make_mask(rng, 2, T)
    ref = kalman_filter_reference(z, mask, q=q, v=v, p0=p0, x0=x0, mask_mode=mode)
    for backend in CPU_BACKENDS:
        ours = kalman_filter(z, mask, q=q, v=v, p0=p0, x0=x0, mask_mode=mode, backend=backend)
        assert float((ours.double() - ref).abs().max()) <= float32_bound(z), backend
        assert bool(torch.isfinite(ours).all())


def test_never_nan_where_the_authors_closed_form_is():
    # METHODS.md K: the authors' float32 closed form is NaN for over half the tokens at q/v = 1e-3, T = 4096
    z = torch.randn(4, 4096) * 0.1
    out = kalman_filter(z, q=1e-3, v=1.0)
    assert bool(torch.isfinite(out).all())
    assert float((out.double() - kalman_filter_reference(z, q=1e-3, v=1.0)).abs().max()) <= float32_bound(z)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_zero_mode_is_the_authors_recurrence(backend):
    # the authors: x0 = 0, p0 = 0, masked tokens observed as 0, a hole pulls the state toward 0
    rng = np.random.default_rng(7)
    z = torch.from_numpy(rng.normal(0.5, 1.0, (5, 700)))
    mask = make_mask(rng, 5, 700)
    for q in (1e-6, 1e-4, 1e-1):
        ours = kalman_filter(z, mask, q=q, v=1.0, p0=0.0, x0=0.0, mask_mode="zero", backend=backend)
        theirs = authors_recurrence_reference(z, mask, q=q, v=1.0)
        assert float((ours - theirs).abs().max()) <= 1e-12


def test_hand_worked_two_tokens():
    # q = 1, v = 1, p0 = 0, x0 = 0, z = (2, 4), all valid:
    #   t=1: prior 1, K = 1/2, x = 0 + (2 - 0)/2 = 1, posterior 1/2
    #   t=2: prior 3/2, K = 3/5, x = 1 + 3/5 (4 - 1) = 2.8
    out = kalman_filter(torch.tensor([2.0, 4.0], dtype=torch.float64), q=1.0, v=1.0)
    torch.testing.assert_close(out, torch.tensor([1.0, 2.8], dtype=torch.float64), rtol=0, atol=1e-15)


def test_hand_worked_hole_in_each_mode():
    # z = (2, 9, 4), token 2 masked, q = v = 1, p0 = x0 = 0:
    #   skip:    token 3 is the second update: x = 1 + 3/5 (4 - 1) = 2.8
    #   advance: prior before token 3 = 1/2 + 1 + 1 = 5/2, K = 5/7: x = 1 + 5/7 (4 - 1) = 22/7
    #   zero:    token 2 observes 0: K = 3/5, x = 1 - 3/5 = 2/5, posterior 3/5; token 3: prior 8/5,
    #            K = 8/13, x = 2/5 + 8/13 (4 - 2/5) = 2/5 + 144/65 = 170/65
    z = torch.tensor([2.0, 9.0, 4.0], dtype=torch.float64)
    mask = torch.tensor([True, False, True])
    expected = {"skip": 2.8, "advance": 22 / 7, "zero": 170 / 65}
    for backend in CPU_BACKENDS:
        for mode, last in expected.items():
            out = kalman_filter(z, mask, q=1.0, v=1.0, p0=0.0, x0=0.0, mask_mode=mode, backend=backend)
            torch.testing.assert_close(
                out, torch.tensor([1.0, 0.0, last], dtype=torch.float64), rtol=0, atol=1e-15
            )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_float32(dtype):
    rng = np.random.default_rng(3)
    z = torch.from_numpy(rng.normal(0, 1, (3, 257)).astype(np.float32)).to(dtype)
    mask = make_mask(rng, 3, 257)
    out = kalman_filter(z, mask, q=1e-2)
    assert out.dtype == dtype
    expected = kalman_filter(z.float(), mask, q=1e-2).to(dtype)
    assert torch.equal(out, expected)


def test_one_dimensional_and_empty():
    z = torch.randn(50)
    assert torch.equal(kalman_filter(z, q=1e-2), kalman_filter(z[None], q=1e-2)[0])
    assert kalman_filter(torch.zeros(3, 0)).shape == (3, 0)
    assert kalman_filter(torch.zeros(0)).shape == (0,)


def test_backends_agree_and_env_var_selects(monkeypatch):
    rng = np.random.default_rng(11)
    z = torch.from_numpy(rng.normal(0, 1, (9, 333)).astype(np.float32))
    mask = make_mask(rng, 9, 333)
    outs = []
    for backend in CPU_BACKENDS:
        monkeypatch.setenv("KPO_FILTER_BACKEND", backend)
        outs.append(kalman_filter(z, mask, q=1e-3, mask_mode="advance"))
    for out in outs[1:]:
        # numba keeps a float64 state, torch scans chunks in float32: both are within the contract
        torch.testing.assert_close(out, outs[0], rtol=0, atol=float32_bound(z))
    monkeypatch.setenv("KPO_FILTER_BACKEND", "fortran")
    with pytest.raises(ValueError, match="auto"):
        kalman_filter(z)


def test_gains_cache_grows_and_matches_reference():
    from kpo import kalman_gains
    from kpo.filter.reference import kalman_gains_reference

    short = kalman_gains(5, q=0.3, v=2.0, p0=1.5)
    long = kalman_gains(20000, q=0.3, v=2.0, p0=1.5)  # grows the cached table past its first size
    assert torch.equal(long[:5], short)
    assert torch.equal(long, kalman_gains_reference(20000, q=0.3, v=2.0, p0=1.5))
    # hand-worked: q = v = 1, p0 = 0 -> K = 1/2, 3/5, 8/13 (priors 1, 3/2, 8/5)
    torch.testing.assert_close(
        kalman_gains(3, q=1.0, v=1.0),
        torch.tensor([1 / 2, 3 / 5, 8 / 13], dtype=torch.float64),
        rtol=0,
        atol=1e-16,
    )
    # the Riccati recursion reaches its steady state: K -> (sqrt(q^2 + 4qv) - q) / (2v) ... for the prior form
    k = kalman_gains(200, q=1.0, v=1.0)
    prior = (1 + 5**0.5) / 2  # fixed point of S = S/(S+1) + 1
    assert abs(float(k[-1]) - prior / (prior + 1)) < 1e-15
    kalman_gains(3, q=1.0, v=1.0)[0] = 5.0  # callers get a copy: the cache is untouched
    assert float(kalman_gains(3, q=1.0, v=1.0)[0]) == 0.5
