"""The paper's RL protocol as arithmetic, shared by the trainer (``kpo.train``) and the comparisons that read its
metrics (``kpo.compare``): a generation batch is sampled once and gives ``minibatches`` optimizer steps, the
first on the policy that sampled it, the others off it."""

from __future__ import annotations

import functools

__all__ = ["on_policy_step"]


@functools.cache
def on_policy_step(step: int, minibatches: int) -> bool:
    """Whether optimizer step ``step`` (1-based) is on-policy: the first of its generation batch's ``minibatches``
    steps updates the policy that sampled the batch; the others are off-policy (the paper's protocol)."""
    return (step - 1) % minibatches == 0
