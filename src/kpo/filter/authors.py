"""The authors' filter (docs/methods.md section K), as shuohe1995/verl-kpo computes it: for comparison only.

``kpo bench filter`` times kpo's filter against it, and the tests check its known defects against the
float64 loop (``reference.py``). Never used by the library itself.
"""

from __future__ import annotations

import torch

# the authors clamp every gain to [GAIN_CLAMP, 1 - GAIN_CLAMP]
GAIN_CLAMP = 1e-6


def authors_closed_form(z: torch.Tensor, mask: torch.Tensor, q: float, v: float) -> torch.Tensor:
    """The filter computed the authors' way (docs/methods.md K), float32 [B, T].

    Closed-form Riccati gains with P_0 = 0 (cosh(eta) = 1 + q/(2v); posterior after t updates
    P_t = q sinh(t eta) / ((1 + q/v) sinh(t eta) - sinh((t-1) eta))), clamped to [1e-6, 1 - 1e-6], masked
    tokens observed as 0 (``zero`` mode), then rho_t = A_t * cumsum(K z / A)_t with A = cumprod(1 - K). In
    float32 this overflows (NaN) once t * eta > ~89, and 1 + q/(2v) rounds: kpo's filter avoids both.
    """
    T = z.shape[-1]
    eta = torch.acosh(torch.tensor(1.0 + q / (2 * v), dtype=torch.float32, device=z.device))
    t = torch.arange(0, T, dtype=torch.float32, device=z.device)  # updates before token t + 1
    post = q * torch.sinh(t * eta) / ((1 + q / v) * torch.sinh(t * eta) - torch.sinh((t - 1) * eta))
    gain = ((post + q) / (post + q + v)).clamp(GAIN_CLAMP, 1 - GAIN_CLAMP)
    decay = torch.cumprod(1 - gain, dim=-1)
    zm = z.float() * mask
    return decay * torch.cumsum(gain * zm / decay, dim=-1) * mask
