"""The torch path's two routes: positional gains (no mask, right padding, ``zero`` mode) as a weighted cumsum
along each chunk rescaled per token, and per-row gains (holes) as the stepwise chunked scan; both with float64
carries over chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kpo.filter import MASK_MODES, kalman_filter, kalman_gains, scan
from kpo.filter.reference import kalman_filter_reference

from .helpers import float32_bound, jacobian_product, make_mask, make_params


def right_padded(rng: np.random.Generator, B: int, T: int) -> torch.Tensor:
    lengths = rng.integers(0, T + 1, (B, 1))
    lengths[0] = T
    return torch.from_numpy(np.arange(T)[None] < lengths)


def test_right_padded_finds_any_valid_token_after_a_hole():
    # the route test behind the positional route for masks: a row passes iff it is 1...1 0...0. Every
    # single-token change of a right-padded row that breaks this (a hole inside the valid part, a valid token
    # inside the padding, first or last position included) must be caught, in any row, at any T
    rng = np.random.default_rng(5)
    for T in (1, 2, 7, 8, 9, 64, 1000):
        mask = right_padded(rng, 4, T)
        assert scan.right_padded(mask)
        assert scan.right_padded(torch.zeros(4, T, dtype=torch.bool))
        for row in range(4):
            for t in range(T):
                flipped = mask.clone()
                flipped[row, t] = ~flipped[row, t]
                values = flipped[row].tolist()
                expected = values == sorted(values, reverse=True)
                assert scan.right_padded(flipped) == expected, (T, row, t)


@pytest.mark.parametrize("T", [1, scan.CHUNK - 1, scan.CHUNK, 3 * scan.CHUNK + 5, 40 * scan.CHUNK**2 + 7])
@pytest.mark.parametrize("mode", MASK_MODES)
def test_positional_route_float32_and_float64(T, mode):
    # T spans one partial chunk, exact chunks, a padded last chunk and three levels of the carry scan
    rng = np.random.default_rng(T)
    z = torch.from_numpy((0.8 + 0.5 * rng.standard_normal((3, T)) + np.linspace(0, 1, T)).astype(np.float32))
    for mask in (None, right_padded(rng, 3, T)):
        for q, p0 in ((1e-8, 0.0), (1e2, 1e4), (1e-3, 0.5)):
            ref = kalman_filter_reference(z, mask, q=q, v=1.0, p0=p0, x0=-0.4, mask_mode=mode)
            out32 = kalman_filter(z, mask, q=q, v=1.0, p0=p0, x0=-0.4, mask_mode=mode, backend="torch")
            assert float((out32.double() - ref).abs().max()) <= float32_bound(z), (mask is None, q)
            out64 = kalman_filter(
                z.double(), mask, q=q, v=1.0, p0=p0, x0=-0.4, mask_mode=mode, backend="torch"
            )
            assert float((out64 - ref).abs().max()) <= 1e-11, (mask is None, q)


@pytest.mark.parametrize(
    "q, T, L",
    [
        (1.0, 101, scan.CHUNK),
        (1e2, 101, 8),
        (1e8, 101, 2),
        (1e30, 101, 1),
        (1e-2, 8192, 256),
        (0.1, 8192, 128),
    ],
)
def test_positional_route_shortens_chunks_where_keeps_are_small(q, T, L):
    # the positional route rescales by 1 / (keeps of the chunk's later tokens): with keeps near v / q a
    # chunk of CHUNK tokens would need a factor up to (q / v)^31, past float32's range from q / v ~ 17.
    # The route halves the chunk until every factor is at most MAX_UNSCALE = 2^64 ~ 1.8e19 (q = 1: 0.38^31
    # ~ 1e-13 fits whole chunks; q = 1e2: keeps ~1e-2, 8 tokens; q = 1e8 and 1e30: chunks of 2 and 1), and
    # stays exact for z up to float32's largest values. Long float32 rows on CPU start from WIDE_CHUNK: q =
    # 1e-2 has steady keeps ~0.905 and 0.905^255 ~ 8e-12 fits; q = 0.1 has keeps ~0.73, 0.73^255 ~ 1e-35
    # does not and 0.73^127 ~ 5e-18 does
    weight, unscale, _ = scan._positional_factors(q, 1.0, 0.0, T, torch.device("cpu"), torch.float32)
    assert weight.shape[1] == L
    assert float(unscale.max()) <= scan.MAX_UNSCALE and bool(torch.isfinite(weight).all())
    rng = np.random.default_rng(3)
    for scale in (1.0, 1e38):
        z = torch.from_numpy((scale * rng.uniform(-3, 3, (2, T))).astype(np.float32))
        ref = kalman_filter_reference(z, q=q, v=1.0, x0=0.5)
        out = kalman_filter(z, q=q, v=1.0, x0=0.5, backend="torch")
        assert bool(torch.isfinite(out).all())
        assert float((out.double() - ref).abs().max()) <= float32_bound(z), scale


def test_wide_chunks_only_where_the_cumsum_accumulates_wider(monkeypatch):
    # long chunks are exact only because the cumsum adds float32 in float64 (torch's CPU kernel does): the
    # probe must see that on CPU, and not for float64 (nothing wider to add in); where it does not hold,
    # chunks keep CHUNK tokens. Both chunkings match the float64 loop on a 4096-token row (table 4096: the
    # wide chunk is min(WIDE_CHUNK, 4096 / 16) = 256)
    cpu = torch.device("cpu")
    assert scan._cumsum_is_wide(cpu, torch.float32) and not scan._cumsum_is_wide(cpu, torch.float64)
    z = torch.from_numpy(np.random.default_rng(4).standard_normal((2, 4096)).astype(np.float32))
    ref = kalman_filter_reference(z, q=1e-4, v=1.0)
    try:
        for wide, L in ((True, scan.WIDE_CHUNK), (False, scan.CHUNK)):
            monkeypatch.setattr(scan, "_cumsum_is_wide", lambda device, dtype, wide=wide: wide)
            scan._positional_factor_table.cache_clear()
            assert scan._positional_factors(1e-4, 1.0, 0.0, 4096, cpu, torch.float32)[0].shape[1] == L
            out = kalman_filter(z, q=1e-4, v=1.0, backend="torch")
            assert float((out.double() - ref).abs().max()) <= float32_bound(z), wide
    finally:  # no chunking of the patched probe outlives the test
        scan._positional_factor_table.cache_clear()


@pytest.mark.parametrize("T", [3 * scan.CHUNK + 5, 9000])
@pytest.mark.parametrize("q", [1e-6, 1e2])
def test_positional_backward_matches_the_reverse_loop(T, q):
    # the backward is the reverse recurrence u_t = w_t + (1 - K_{t+1}) u_{t+1}, dz_t = K_t u_t: written
    # out here as a float64 loop. T = 101: the reverse carries in one product; 9000 (282 chunks): by the
    # scan. q = 1e2: chunks of 8 tokens (keeps ~1e-2)
    rng = np.random.default_rng(int(T + q))
    z = torch.from_numpy(rng.normal(0, 1, (2, T))).requires_grad_()
    w = rng.normal(0, 1, (2, T))
    (dz,) = torch.autograd.grad(
        (kalman_filter(z, q=q, v=1.0, backend="torch") * torch.from_numpy(w)).sum(), z
    )
    gain = kalman_gains(T, q=q, v=1.0).numpy()
    expected, u = np.zeros((2, T)), np.zeros(2)
    for t in range(T - 1, -1, -1):
        u = w[:, t] + (1 - gain[t + 1]) * u if t + 1 < T else w[:, t]
        expected[:, t] = gain[t] * u
    scale = np.abs(expected).max()
    assert float(np.abs(dz.numpy() - expected).max()) <= 1e-12 * max(1.0, scale)


@pytest.mark.parametrize("mode", MASK_MODES)
def test_positional_route_gradient_is_the_exact_jacobian(mode):
    # affine in z: the float64 loop's response to a unit bump is a Jacobian column (T = 70: three chunks)
    rng = np.random.default_rng(4)
    B, T = 3, 2 * scan.CHUNK + 6
    z = torch.from_numpy(rng.normal(0, 1, (B, T))).requires_grad_()
    mask = right_padded(rng, B, T)
    g = torch.from_numpy(rng.normal(0, 1, (B, T)))
    (grad,) = torch.autograd.grad(
        (kalman_filter(z, mask, q=0.05, v=1.0, p0=0.1, x0=0.3, mask_mode=mode, backend="torch") * g).sum(), z
    )
    kwargs = {"q": 0.05, "v": 1.0, "p0": 0.1, "x0": 0.3, "mask_mode": mode}
    assert float((grad - jacobian_product(z, mask, g, kwargs)).abs().max()) <= 1e-12


def test_routes_agree():
    # the same right-padded rows through both routes: the stepwise scan is forced by one row with a hole
    rng = np.random.default_rng(6)
    B, T = 5, 1000
    z = torch.from_numpy(rng.normal(0.3, 1.0, (B, T)).astype(np.float32))
    mask = right_padded(rng, B, T)
    holed = mask.clone()
    holed[-1] = make_mask(rng, 1, T)[0] & torch.arange(T).lt(T // 2)  # not a prefix: per-row gains
    positional = kalman_filter(
        z[:-1], mask[:-1], q=1e-4, v=1.0, p0=0.0, x0=0.2, mask_mode="skip", backend="torch"
    )
    stepwise = kalman_filter(z, holed, q=1e-4, v=1.0, p0=0.0, x0=0.2, mask_mode="skip", backend="torch")[:-1]
    torch.testing.assert_close(stepwise, positional, rtol=0, atol=float32_bound(z))


@pytest.mark.parametrize("mode", MASK_MODES)
def test_right_padding_is_never_read_even_when_not_finite(mode):
    # right-padded rows go in unmasked (the padding reaches only states the mask zeroes) unless a final
    # state comes out non-finite: NaN/Inf in the padding must give the same result as zeros there
    rng = np.random.default_rng(21)
    B, T = 4, 3 * scan.CHUNK + 5
    mask = right_padded(rng, B, T)
    mask[1, T // 2 :] = False
    mask[2, 0] = True
    z = torch.from_numpy(rng.normal(0.3, 1.0, (B, T)).astype(np.float32))
    poisoned = z.clone()
    poisoned[1, -1], poisoned[1, T // 2] = float("nan"), float("inf")
    ref = kalman_filter_reference(z, mask, q=1e-3, v=1.0, x0=0.1, mask_mode=mode)
    for zz in (z, poisoned):
        out = kalman_filter(zz, mask, q=1e-3, v=1.0, p0=0.0, x0=0.1, mask_mode=mode, backend="torch")
        assert bool(torch.isfinite(out).all())
        assert float((out.double() - ref).abs().max()) <= float32_bound(z)
    poisoned[2, 0] = float("nan")  # a valid one is still an error
    with pytest.raises(ValueError, match=r"1 NaN/Inf.*\(2, 0\)"):
        kalman_filter(poisoned, mask, q=1e-3, v=1.0, p0=0.0, x0=0.1, mask_mode=mode, backend="torch")


@pytest.mark.parametrize("mode", MASK_MODES)
def test_holes_are_never_read_even_when_not_finite(mode):
    # interior holes: skip mode moves each row's valid tokens left (one scatter), advance takes per-row gains,
    # zero observes 0 there. NaN/Inf under the mask must give what zeros give, values and gradients, and a
    # fully masked row comes out all 0
    rng = np.random.default_rng(23)
    B, T = 4, 3 * scan.CHUNK + 5
    mask = make_mask(rng, B, T)
    mask[0] = False
    mask[1] = True
    mask[1, 7:40] = False
    z = torch.from_numpy(rng.normal(0.3, 1.0, (B, T)))
    poisoned = z.clone()
    poisoned[~mask] = float("nan")
    poisoned[1, 8] = float("inf")
    g = torch.from_numpy(rng.normal(0, 1, (B, T)))
    ref = kalman_filter_reference(z, mask, q=1e-3, v=1.0, x0=0.1, mask_mode=mode)
    grads = []
    for zz in (z, poisoned):
        leaf = zz.clone().requires_grad_()
        out = kalman_filter(leaf, mask, q=1e-3, v=1.0, x0=0.1, mask_mode=mode, backend="torch")
        assert float((out.detach() - ref).abs().max()) <= 1e-11
        assert bool((out[0] == 0).all())
        (grad,) = torch.autograd.grad((out * g).sum(), leaf)
        grads.append(grad)
    assert bool(torch.isfinite(grads[1]).all()) and bool((grads[1][~mask] == 0).all())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_advance_gains_match_the_variance_loop():
    # advance mode's gains come from runs of valid tokens (powers of the update within a run, maps composed
    # over runs): against the variance recursion written out, for random parameters and masks with leading
    # holes, single valid tokens, half the tokens masked at random and a row with nothing valid
    rng = np.random.default_rng(31)
    for trial in range(40):
        params = make_params(rng)
        q, v, p0 = params["q"], params["v"], params["p0"]
        B, T = 4, int(rng.choice([1, 2, 9, 200]))
        mask = make_mask(rng, B, T) if trial % 2 else torch.from_numpy(rng.random((B, T)) < 0.5)
        mask[0] = False
        gain, keep = scan.advance_gains(mask, q, v, p0)
        expected_gain, expected_keep = np.zeros((B, T)), np.ones((B, T))
        for b in range(B):
            p = p0
            for t in range(T):
                prior = p + q
                if mask[b, t]:
                    expected_gain[b, t], expected_keep[b, t] = prior / (prior + v), v / (prior + v)
                    p = v * prior / (prior + v)
                else:
                    p = prior
        np.testing.assert_allclose(gain.numpy(), expected_gain, rtol=1e-12, atol=0)
        np.testing.assert_allclose(keep.numpy(), expected_keep, rtol=1e-12, atol=0)


@pytest.mark.parametrize("blocks_in_one_product", [0, 64])
def test_carries_over_many_blocks_by_product_and_by_scan(blocks_in_one_product, monkeypatch):
    # the carries over blocks of chunks: one dense product up to MAX_BLOCKS_IN_ONE_PRODUCT blocks, else the
    # recursive scan; both against the float64 loop, at a T of 41 blocks
    monkeypatch.setattr(scan, "MAX_BLOCKS_IN_ONE_PRODUCT", blocks_in_one_product)
    scan._carry_map_table.cache_clear()
    try:
        rng = np.random.default_rng(blocks_in_one_product)
        T = 40 * scan.CHUNK**2 + 7
        z = torch.from_numpy(0.8 + 0.5 * rng.standard_normal((2, T)))
        for q, p0, x0 in ((1e-6, 0.0, 0.0), (1e-2, 3.0, -0.4)):
            ref = kalman_filter_reference(z, q=q, p0=p0, x0=x0)
            out = kalman_filter(z, q=q, p0=p0, x0=x0, backend="torch")
            assert float((out - ref).abs().max()) <= 1e-11, (q, p0, x0)
    finally:
        scan._carry_map_table.cache_clear()
