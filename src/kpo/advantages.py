"""Outcome advantages from one scalar reward per response, grouped by prompt (docs/methods.md sections 0 and 11).

``compute_advantages(name, rewards [N], group_ids [N], **kw) -> [N]`` with

- ``grpo``:   A_i = (R_i - mean_g) / (std_g + eps), unbiased std (N-1), eps = 1e-6 (verl; TRL uses 1e-4);
              eps must be > 0: std_g is 0 in a group whose rewards are all equal.
- ``drgrpo``: A_i = R_i - mean_g (Dr. GRPO: no std division).
- ``rloo``:   A_i = R_i - mean_{j != i in g} R_j = G/(G-1) (R_i - mean_g).
- ``krpo``:   per group, in sample order, a scalar Kalman filter over the rewards (x0 = 0, P0 = 1, q = 1e-5,
              v = 1e-2, the KRPO authors' values): A_i = (R_i - x_i) / (sqrt(P_i) + eps), with x_i, P_i the
              posterior after observing R_i and eps = 1e-8. Runs ``kpo.filter`` (the posterior variance is
              P_i = v K_i, K_i the gain). eps may be 0: P_i > 0 since q > 0 enters before the first step.

A group of one response gets mean 0 and std 1 (verl's rule), so its grpo/drgrpo advantage is R / (1 + eps), R,
and its rloo advantage R. ``group_ids`` may be a tensor of ints or any list of hashables (e.g. prompt uids);
groups are numbered in order of first appearance. The result is float64 on the rewards' device, no gradient.
grpo, drgrpo and rloo compute each group in units of a power of two near its largest |R| (exact: the same numbers
as unscaled), so that finite rewards of any size, up to 1e308, keep finite sums and a finite std.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from kpo._checks import with_values
from kpo.filter import kalman_filter, kalman_gains

ADVANTAGES = ("grpo", "drgrpo", "rloo", "krpo")
_DEFAULTS = {
    "grpo": {"eps": 1e-6},
    "drgrpo": {},
    "rloo": {},
    "krpo": {"q": 1e-5, "v": 1e-2, "p0": 1.0, "x0": 0.0, "eps": 1e-8},
}


def _group_index(group_ids, n: int, device) -> torch.Tensor:
    if isinstance(group_ids, torch.Tensor | np.ndarray):  # verl's uids: a numpy object array
        group_ids = group_ids.reshape(-1).tolist()
    if not isinstance(group_ids, Sequence) or isinstance(group_ids, str):
        raise TypeError(
            f"group_ids must be a tensor, a numpy array or a list of hashables, got {type(group_ids).__name__}"
        )
    if len(group_ids) != n:
        raise ValueError(
            f"group_ids has {len(group_ids)} entries but rewards has {n}; give one id per response"
        )
    index: dict = {}
    out = []
    for i, g in enumerate(group_ids):
        if isinstance(g, float) and math.isnan(g):  # NaN equals nothing, itself included: a group of one each
            raise ValueError(f"group_ids[{i}] is NaN; give each response its prompt's id")
        try:
            out.append(index.setdefault(g, len(index)))
        except TypeError:
            raise TypeError(f"group_ids[{i}] = {g!r} is not hashable") from None
    return torch.tensor(out, dtype=torch.long, device=device)


def _group_sums(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def _group_scale(r: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Each response's group scale [N]: a power of two, 1 where the group's largest |R| is below 2, else at most
    that |R|. Dividing by it is exact and keeps the group's sums and squares finite (rewards of 1e308: the sum of
    squares overflowed, the std was inf and every advantage 0)."""
    top = torch.zeros(n_groups, dtype=r.dtype, device=r.device).scatter_reduce_(0, index, r.abs(), "amax")
    _, exponent = torch.frexp(top)  # top = m 2^exponent, 0.5 <= m < 1
    return torch.exp2((exponent - 1).clamp(min=0).to(r.dtype))[index]


def _krpo(r: torch.Tensor, index: torch.Tensor, n_groups: int, q, v, p0, x0, eps) -> torch.Tensor:
    counts = torch.bincount(index, minlength=n_groups)
    width = int(counts.max())
    # Rank of each response inside its group, in sample order: its time step in that group's filter.
    rank = torch.zeros_like(index)
    seen = torch.zeros(n_groups, dtype=torch.long)
    for i, g in enumerate(index.tolist()):
        rank[i] = seen[g]
        seen[g] += 1
    z = torch.zeros(n_groups, width, dtype=torch.float64, device=r.device)
    mask = torch.zeros(n_groups, width, dtype=torch.bool, device=r.device)
    z[index, rank] = r
    mask[index, rank] = True
    x = kalman_filter(z, mask, q=q, v=v, p0=p0, x0=x0, mask_mode="skip")[index, rank]
    posterior_var = v * kalman_gains(width, q=q, v=v, p0=p0).to(r.device)[rank]
    return (r - x) / (posterior_var.sqrt() + eps)


def compute_advantages(name: str, rewards, group_ids, **kw) -> torch.Tensor:
    """Advantages [N] (float64) of ``rewards`` [N] grouped by ``group_ids`` [N]; ``name`` in ``ADVANTAGES``.

    Keywords: grpo ``eps``; krpo ``q``, ``v``, ``p0``, ``x0``, ``eps`` (defaults in the module docstring).
    """
    if name not in _DEFAULTS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid names: {', '.join(ADVANTAGES)}")
    unknown = sorted(set(kw) - set(_DEFAULTS[name]))
    if unknown:
        accepted = ", ".join(f"{k}={v!r}" for k, v in _DEFAULTS[name].items()) or "(none)"
        raise ValueError(
            f"advantage {name!r} does not accept {', '.join(map(repr, unknown))}; it accepts: {accepted}"
        )
    opts = {**_DEFAULTS[name], **kw}
    with_values(rewards=rewards)
    try:
        # a list straight to float64: through torch's default float32 it would round (1 + 1e-9 -> 1, 1e308 -> inf)
        r = (
            rewards.detach().to(torch.float64)
            if isinstance(rewards, torch.Tensor)
            else torch.as_tensor(rewards, dtype=torch.float64)
        )
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"rewards must be numbers [N] (a list, numpy array or tensor): {e}") from None
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N] (one scalar per response), got shape {tuple(r.shape)}")
    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"rewards[{i}] is {r[i].item()}; rewards must be finite")
    for key, value in opts.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{key} must be a real number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value) or (key != "x0" and value < 0):
            raise ValueError(f"{key} must be finite{' and >= 0' if key != 'x0' else ''}, got {value!r}")
    if name == "grpo" and not opts["eps"] > 0:
        raise ValueError(
            f"grpo needs eps > 0: it divides by the group std, which is 0 when a group's rewards are all equal "
            f"(verl uses 1e-6, TRL 1e-4); got eps={opts['eps']!r}"
        )
    n = r.shape[0]
    if n == 0:
        return r.clone()
    index = _group_index(group_ids, n, r.device)
    n_groups = int(index.max()) + 1
    if name == "krpo":
        if not opts["q"] > 0 or not opts["v"] > 0:
            raise ValueError(f"krpo needs q > 0 and v > 0, got q={opts['q']!r}, v={opts['v']!r}")
        return _krpo(r, index, n_groups, opts["q"], opts["v"], opts["p0"], opts["x0"], opts["eps"])
    scale = _group_scale(r, index, n_groups)
    r = r / scale  # in units of the group's scale (exact); the results are the same numbers as unscaled
    counts = _group_sums(torch.ones_like(r), index, n_groups)
    single = (counts == 1)[index]
    mean = (_group_sums(r, index, n_groups) / counts)[index]
    mean = torch.where(single, torch.zeros_like(mean), mean)
    if name == "drgrpo":
        return (r - mean) * scale
    if name == "rloo":
        g = counts[index]
        return torch.where(single, r, g / (g - 1).clamp(min=1) * (r - mean)) * scale
    centred = r - (_group_sums(r, index, n_groups) / counts)[index]
    var = _group_sums(centred**2, index, n_groups) / (counts - 1).clamp(min=1)
    std = torch.where(single, 1 / scale, var.sqrt()[index])  # a group of one: std 1
    return (r - mean) / (std + opts["eps"] / scale)


__all__ = ["ADVANTAGES", "compute_advantages"]
