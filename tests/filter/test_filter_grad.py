"""Gradients of the filter: gradcheck in float64, finite differences, backward parity across paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kpo.filter import MASK_MODES, kalman_filter

from .helpers import CPU_BACKENDS, jacobian_product, make_mask


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_gradcheck_float64(backend, mode):
    rng = np.random.default_rng(5)
    for T, masked in ((1, False), (7, True), (40, True)):
        z = torch.from_numpy(rng.normal(0, 1, (5, T))).requires_grad_()
        mask = make_mask(rng, 5, T) if masked else None
        assert torch.autograd.gradcheck(
            lambda z, m=mask: kalman_filter(
                z, m, q=0.2, v=0.7, p0=0.3, x0=0.4, mask_mode=mode, backend=backend
            ),
            (z,),
        )


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gradient_matches_finite_differences_of_the_reference(backend):
    # the filter is affine in z, so a forward difference of the float64 loop with step 1 is its exact
    # Jacobian column: compare the whole vector-Jacobian product, every mode, x0 != 0
    rng = np.random.default_rng(8)
    T = 60
    z = torch.from_numpy(rng.normal(0, 1, (2, T))).requires_grad_()
    mask = make_mask(rng, 2, T)
    g = torch.from_numpy(rng.normal(0, 1, (2, T)))
    for mode in MASK_MODES:
        (grad,) = torch.autograd.grad(
            (
                kalman_filter(z, mask, q=0.05, v=1.0, p0=0.1, x0=0.3, mask_mode=mode, backend=backend) * g
            ).sum(),
            z,
        )
        kwargs = {"q": 0.05, "v": 1.0, "p0": 0.1, "x0": 0.3, "mask_mode": mode}
        assert float((grad - jacobian_product(z, mask, g, kwargs)).abs().max()) <= 1e-12, mode


def test_backward_paths_agree_float32():
    if len(CPU_BACKENDS) < 2:
        pytest.skip("numba is not installed: only the torch path exists here")
    rng = np.random.default_rng(9)
    z = torch.from_numpy(rng.normal(0, 1, (7, 3000)).astype(np.float32))
    mask = make_mask(rng, 7, 3000)
    g = torch.from_numpy(rng.normal(0, 1, (7, 3000)).astype(np.float32))
    for mode in MASK_MODES:
        grads = []
        for backend in CPU_BACKENDS:
            zz = z.clone().requires_grad_()
            (grad,) = torch.autograd.grad(
                (
                    kalman_filter(zz, mask, q=1e-4, v=1.0, p0=0.5, x0=0.1, mask_mode=mode, backend=backend)
                    * g
                ).sum(),
                zz,
            )
            grads.append(grad)
        torch.testing.assert_close(grads[1], grads[0], rtol=2**-23, atol=1e-30)
        assert bool((grads[0][~mask] == 0).all())


def test_half_gradient_dtype():
    z = torch.randn(3, 20, dtype=torch.bfloat16, requires_grad=True)
    out = kalman_filter(z, None, q=1e-2, v=1.0, p0=0.0, x0=0.0, mask_mode="skip", backend="auto")
    out.float().sum().backward()
    assert z.grad.dtype == torch.bfloat16 and bool(torch.isfinite(z.grad).all())
