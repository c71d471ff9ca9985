"""Causal Kalman filter over token log importance ratios (METHODS.md section K).

PROVISIONAL: this module is being replaced by the exact, fast implementation (issue "Foundation").
Until then it delegates to the float64 loop reference so that other layers can be built against the API.
"""

from __future__ import annotations

import torch

from kpo.filter.reference import MASK_MODES, kalman_filter_reference, kalman_gains_reference


def kalman_gains(T: int, *, q: float = 1e-6, v: float = 1.0, p0: float = 0.0) -> torch.Tensor:
    return kalman_gains_reference(T, q=q, v=v, p0=p0)


def kalman_filter(z, mask=None, *, q=1e-6, v=1.0, p0=0.0, x0=0.0, mask_mode="skip"):
    return kalman_filter_reference(z, mask, q=q, v=v, p0=p0, x0=x0, mask_mode=mask_mode).to(z.dtype)


__all__ = ["MASK_MODES", "kalman_filter", "kalman_gains"]
