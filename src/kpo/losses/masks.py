"""Token masks TRL 1.16 puts on top of its losses, as keywords of the kpo losses TRL applies them to:

- ``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask, TRL ``get_off_policy_mask``): a
  token whose advantage is negative is dropped when its row's mean of (reference - current) log-prob over
  valid tokens exceeds the threshold; the reference is ``rollout_log_prob`` when the call has it, else
  ``old_log_prob``, and the current log-prob is detached. A dropped token keeps its place in every
  denominator (TRL multiplies the per-token loss by 0).
- ``top_entropy_quantile`` with ``token_entropy`` ("Beyond the 80/20 rule", TRL ``get_high_entropy_mask``): the
  loss keeps only tokens whose entropy is at least the (1 - q) quantile (linear interpolation) of the entropies
  of all valid tokens of the call; 1.0 (the default) keeps every token. The quantile is over the call's tokens,
  as TRL's is over one micro-batch (gathered over ranks there).

Shapes: everything [B, T] like the loss batch.
"""

from __future__ import annotations

import torch

from kpo.losses._core import LossBatch, check_hparams


def entropy_of(token_entropy, batch: LossBatch, loss: str) -> torch.Tensor:
    """``token_entropy`` [B, T] detached in the loss dtype, or a ValueError saying what to pass."""
    m = batch.mask
    if not isinstance(token_entropy, torch.Tensor) or token_entropy.shape != m.shape:
        got = getattr(token_entropy, "shape", token_entropy)
        raise ValueError(
            f"{loss}: token_entropy must be a [B, T] tensor like log_prob (e.g. kpo.losses.entropy_from_logits), "
            f"got {got}"
        )
    return token_entropy.detach().to(device=m.device, dtype=batch.log_prob.dtype)


def off_policy_keep(batch: LossBatch, threshold: float) -> torch.Tensor:
    """Bool [B, T]: True where TRL's off-policy sequence mask keeps the token (A >= 0, or the row's mean
    reference-minus-current log-prob is at most ``threshold``)."""
    m = batch.mask
    reference = batch.old_log_prob if batch.rollout_log_prob is None else batch.rollout_log_prob
    kl = torch.where(m, reference - batch.log_prob.detach(), torch.zeros_like(reference))
    mean_kl = kl.sum(dim=-1, keepdim=True) / batch.lengths.clamp(min=1).unsqueeze(-1)
    return (batch.advantages >= 0) | (mean_kl <= threshold)


def high_entropy_keep(entropy: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float) -> torch.Tensor:
    """Bool [B, T]: valid tokens whose entropy is at least the (1 - q) quantile over all valid tokens."""
    values = entropy[mask]
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - top_entropy_quantile)
    return (entropy >= threshold) & mask


def apply_trl_masks(
    batch: LossBatch,
    token_loss: torch.Tensor,
    loss: str,
    off_policy_mask_threshold: float | None,
    top_entropy_quantile: float,
    token_entropy: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``token_loss`` times the masks that are switched on, and the fraction of valid tokens each drops
    (``off_policy_masked_fraction``, ``entropy_masked_fraction``)."""
    m, extra = batch.mask, {}
    n_valid = m.sum().clamp(min=1).to(token_loss.dtype)
    report = bool(m.any())  # a fraction of no token is undefined: left out
    if off_policy_mask_threshold is not None:
        check_hparams("finite", off_policy_mask_threshold=off_policy_mask_threshold)
        keep = off_policy_keep(batch, float(off_policy_mask_threshold))
        token_loss = token_loss * keep.to(token_loss.dtype)
        if report:
            extra["off_policy_masked_fraction"] = (m & ~keep).sum().to(token_loss.dtype) / n_valid
    if not (isinstance(top_entropy_quantile, (int, float)) and 0.0 <= top_entropy_quantile <= 1.0):
        raise ValueError(f"{loss}: top_entropy_quantile must lie in [0, 1], got {top_entropy_quantile!r}")
    if top_entropy_quantile < 1.0:
        if token_entropy is None:
            raise ValueError(
                f"{loss}: top_entropy_quantile={top_entropy_quantile} needs token_entropy= (the policy's [B, T] "
                "token entropy, e.g. kpo.losses.entropy_from_logits); pass it or leave the quantile at 1.0"
            )
        keep = high_entropy_keep(entropy_of(token_entropy, batch, loss), m, float(top_entropy_quantile))
        token_loss = token_loss * keep.to(token_loss.dtype)
        if report:
            extra["entropy_masked_fraction"] = (m & ~keep).sum().to(token_loss.dtype) / n_valid
    return token_loss, extra
