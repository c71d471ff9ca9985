"""A seeded synthetic trace set shaped like a training dump, for ``kpo analyze --synthetic`` and the tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kpo.analysis.dumps import write_dump

SYNTHETIC_SETTINGS = {"q": 1e-6, "v": 1.0, "p0": 0.0, "x0": 0.0, "mask_mode": "skip"}  # the paper's filter


def synthetic_dump(*, seed: int = 0, samples: int = 64, length: int = 1024) -> dict[str, np.ndarray]:
    """A documented synthetic trace set shaped like a training dump (right padded, with masked holes).

    Per response b (seeded numpy Generator):
    - length n_b uniform in [length // 4, length]; positions >= n_b are padding (mask 0, value 0);
    - a slow latent drift rho_t: AR(1) with coefficient 0.995 and innovation std 0.005 (stationary std 0.05),
      started from its stationary law;
    - heavy-tailed token noise: Student-t with 3 degrees of freedom, scaled by 0.2;
    - "confident" tokens whose log-ratio is exactly 0 (both policies near-certain, as bf16 training produces),
      chosen with probability 0.6 - 0.3 t / length, so off-policy tokens grow more frequent along the response
      as the paper's Figure 1 reports; every other token is z_t = rho_t + noise_t;
    - in a quarter of the responses one masked hole of 5 to 20 tokens inside the response (a tool output in a
      multi-turn rollout): mask 0, value 0.
    Returns {"log_ratio": float32 [B, T], "mask": uint8 [B, T]}.
    """
    rng = np.random.default_rng(seed)
    B, T = samples, length
    n = rng.integers(max(1, T // 4), T + 1, size=B)
    pos = np.arange(T)[None, :]
    mask = pos < n[:, None]
    coef, innov = 0.995, 0.005
    drift = np.empty((B, T))
    drift[:, 0] = rng.normal(0.0, innov / math.sqrt(1 - coef**2), size=B)
    shocks = rng.normal(0.0, innov, size=(B, T))
    for t in range(1, T):  # generator only (not an analysis path): one vectorized step per position
        drift[:, t] = coef * drift[:, t - 1] + shocks[:, t]
    z = drift + 0.2 * rng.standard_t(3, size=(B, T))
    z[rng.random((B, T)) < 0.6 - 0.3 * pos / T] = 0.0
    for b in np.flatnonzero(rng.random(B) < 0.25):
        width = int(rng.integers(5, 21))
        if n[b] > width + 2:
            start = int(rng.integers(1, n[b] - width))
            mask[b, start : start + width] = False
    z[~mask] = 0.0
    return {"log_ratio": z.astype(np.float32), "mask": mask.astype(np.uint8)}


def write_synthetic(folder: str | Path, *, seed: int = 0, samples: int = 64, length: int = 1024) -> Path:
    """Write :func:`synthetic_dump` as ``folder/ratios/step_000000.safetensors``, filtered at the paper's settings."""
    data = synthetic_dump(seed=seed, samples=samples, length=length)
    return write_dump(
        Path(folder) / "ratios" / "step_000000.safetensors",
        data["log_ratio"],
        data["mask"],
        step=0,
        settings=SYNTHETIC_SETTINGS,
        source=f"kpo analyze --synthetic (seed={seed}, samples={samples}, length={length})",
    )
