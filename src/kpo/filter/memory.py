"""The filter's memory in tokens, and the q that gives a memory (docs/methods.md K, "Filter memory and response length").

With r = q/v the gains converge to K_inf = S / (S + v), where S = (q + sqrt(q^2 + 4 q v)) / 2 is the steady-state
prior variance (the positive root of S^2 - q S - q v = 0). There the filter is an exponential moving average of
the log-ratios whose weights fall by e every M = -1 / ln(1 - K_inf) tokens: its memory. Inverting,
q = v K^2 / (1 - K) with K = 1 - exp(-1 / M). The paper's KPO (q/v = 1e-6) has a memory of 1000 tokens over
4096-token responses; :func:`matched_memory` keeps that memory-to-length ratio at another response length.
"""

from __future__ import annotations

import math

from kpo.filter.gains import check_params

__all__ = [
    "PAPER_LENGTH",
    "PAPER_Q",
    "filter_memory",
    "matched_memory",
    "q_for_memory",
    "steady_state_gain",
    "steady_state_variance",
]

PAPER_Q = 1e-6  # KPO-clipped's Q/V in the paper (V = 1)
PAPER_LENGTH = 4096  # the paper's maximum response length


def _steady_prior(q: float, v: float) -> float:
    """S = (q + sqrt(q^2 + 4 q v)) / 2, written so that q^2 cannot overflow (q reaches 1e289 at memory 0.0015)."""
    check_params(q, v, 0.0)
    return q * (1.0 + math.sqrt(1.0 + 4.0 * v / q)) / 2.0


def steady_state_gain(q: float, v: float = 1.0) -> float:
    """K_inf, the limit of the gains K_t for any p0 (float64)."""
    s = _steady_prior(q, v)
    return s / (s + v)


def steady_state_variance(q: float, v: float = 1.0) -> float:
    """The posterior variance the filter converges to, S v / (S + v) (float64). As ``p0`` it starts the filter
    at its steady state: the first prior is p0 + q = S, so every gain is K_inf and the filter is a constant-gain
    exponential moving average from the first token (no ramp from the prior)."""
    s = _steady_prior(q, v)
    return s * v / (s + v)


def filter_memory(q: float, v: float = 1.0) -> float:
    """Memory in tokens, -1 / ln(1 - K_inf): how far back a log-ratio's weight in the steady-state filter has
    fallen by e. About 1/K_inf ~ sqrt(v/q) for small q/v (q/v = 1e-6: 1000 tokens)."""
    return -1.0 / math.log1p(-steady_state_gain(q, v))


def _check_tokens(name: str, value) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite number of tokens > 0, got {value!r}")


def q_for_memory(memory: float, v: float = 1.0) -> float:
    """The q whose steady-state filter has ``memory`` tokens of memory (> 0), the inverse of :func:`filter_memory`."""
    _check_tokens("memory", memory)
    check_params(1.0, v, 0.0)
    gain = -math.expm1(-1.0 / memory)
    # 1 - gain = exp(-1 / memory), which rounds to 0 below ~0.03 tokens: divide by it as a product
    try:
        q = v * gain * gain * math.exp(1.0 / memory)
    except OverflowError:
        q = math.inf
    if not math.isfinite(q):
        raise ValueError(
            f"memory={memory!r} tokens needs a q beyond float64's range; give memory >= 0.0015 tokens (a memory "
            "below 1 token already has the filter follow each log-ratio)"
        )
    return q


def matched_memory(
    length: float, *, q: float = PAPER_Q, v: float = 1.0, reference_length: float = PAPER_LENGTH
) -> float:
    """The memory that keeps the paper's memory-to-length ratio at responses of ``length`` tokens:
    filter_memory(q, v) * length / reference_length (the paper's KPO at 128 tokens: 31.2 tokens, q/v ~ 1.0e-3)."""
    _check_tokens("length", length)
    _check_tokens("reference_length", reference_length)
    return filter_memory(q, v) * length / reference_length
