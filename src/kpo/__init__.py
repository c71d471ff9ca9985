"""kpo: policy optimization with an online causal Kalman filter over token importance ratios.

Public API (stable names)::

    from kpo import kalman_filter, kalman_gains, policy_loss, list_losses, compute_advantages, token_dynamics

Attributes are imported on first use, so ``import kpo`` stays cheap for the command line and for
hosts (TRL, verl) that only need one layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kpo._lazy import lazy_getattr

__version__ = "0.1.0"

_EXPORTS = {
    "kalman_filter": "kpo.filter",
    "kalman_gains": "kpo.filter",
    "filter_memory": "kpo.filter.memory",
    "q_for_memory": "kpo.filter.memory",
    "matched_memory": "kpo.filter.memory",
    "policy_loss": "kpo.losses",
    "list_losses": "kpo.losses",
    "compute_advantages": "kpo.advantages",
    "token_dynamics": "kpo.diagnostics",
}

__all__ = [
    "__version__",
    "compute_advantages",
    "filter_memory",
    "kalman_filter",
    "kalman_gains",
    "list_losses",
    "matched_memory",
    "policy_loss",
    "q_for_memory",
    "token_dynamics",
]


__getattr__ = lazy_getattr("kpo", _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - static analysers only
    from kpo.advantages import compute_advantages
    from kpo.diagnostics import token_dynamics
    from kpo.filter import kalman_filter, kalman_gains
    from kpo.filter.memory import filter_memory, matched_memory, q_for_memory
    from kpo.losses import list_losses, policy_loss
