"""Shared case generators for the filter tests: realistic masks (right padding, long holes) and parameters."""

from __future__ import annotations

import numpy as np
import torch

from kpo.filter.dispatch import compiled
from kpo.filter.reference import kalman_filter_reference

# every path runnable on this machine; numba only where the extra is installed
CPU_BACKENDS = ["torch"] + (["numba"] if compiled is not None else [])


def make_mask(rng: np.random.Generator, B: int, T: int, *, holes: bool = True) -> torch.Tensor:
    """bool [B, T]: random right padding per row, plus (optionally) long masked holes and scattered singles."""
    mask = np.ones((B, T), dtype=bool)
    for b in range(B):
        length = int(rng.integers(0, T + 1)) if b % 3 else T  # some rows unpadded, some fully padded
        mask[b, length:] = False
        if holes and T > 4:
            for _ in range(int(rng.integers(0, 3))):
                start = int(rng.integers(0, T))
                mask[b, start : start + int(rng.integers(1, max(2, T // 3)))] = False
            mask[b, rng.random(T) < 0.05] = False
    return torch.from_numpy(mask)


def make_params(rng: np.random.Generator) -> dict:
    """q/v log-uniform in [1e-8, 1e2], p0/v in {0} or log-uniform in [1e-4, 1e4], x0 != 0."""
    v = float(10 ** rng.uniform(-2, 2))
    q = v * float(10 ** rng.uniform(-8, 2))
    p0 = 0.0 if rng.random() < 0.3 else v * float(10 ** rng.uniform(-4, 4))
    x0 = float(rng.uniform(-1, 1))
    return {"q": q, "v": v, "p0": p0, "x0": x0}


def float32_bound(z: torch.Tensor) -> float:
    """The contract for float32 input: 2e-6 * max(1, max |z|)."""
    return 2e-6 * max(1.0, float(z.abs().max()) if z.numel() else 0.0)


def jacobian_product(
    z: torch.Tensor, mask: torch.Tensor | None, g: torch.Tensor, kwargs: dict
) -> torch.Tensor:
    """g^T J of the float64 loop, float64 [B, T]: the filter is affine in z, so its response to a unit bump of
    z[:, j] is column j of the Jacobian (exact, no step size to choose)."""
    base = kalman_filter_reference(z, mask, **kwargs)
    expected = torch.zeros(z.shape, dtype=torch.float64)
    for j in range(z.shape[1]):
        bumped = z.detach().clone()
        bumped[:, j] += 1.0
        expected[:, j] = ((kalman_filter_reference(bumped, mask, **kwargs) - base) * g).sum(1)
    return expected
