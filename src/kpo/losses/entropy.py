"""Token entropy of the policy from logits, and its masked aggregate (what verl logs as actor/entropy)."""

from __future__ import annotations

import torch

from kpo.losses.aggregation import aggregate


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy [B, T] of softmax(logits / temperature) for ``logits`` [B, T, V].

    H = logsumexp(z) - sum softmax(z) * z with z = logits / temperature (the rollout temperature, so that the
    entropy is that of the sampling distribution, as in verl). Differentiable.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    z = logits / temperature if temperature != 1.0 else logits
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def aggregate_entropy(
    entropy: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str = "token-mean", **global_batch
) -> torch.Tensor:
    """Masked aggregate of an entropy [B, T] with the same mode and global-batch keywords as the loss."""
    return aggregate(entropy, mask, loss_agg_mode, **global_batch)


__all__ = ["aggregate_entropy", "entropy_from_logits"]
