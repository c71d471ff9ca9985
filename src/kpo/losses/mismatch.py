"""Train/inference mismatch correction from rollout-engine log-probs: TIS and MIS (METHODS.md section 10).

With l_t = old_log_prob_t - rollout_log_prob_t (trainer vs rollout engine, verl's decoupled mode):

- ``rollout_is`` (TIS, truncated importance sampling): ``"token"`` w_t = exp(clamp(l_t, +-20)); ``"sequence"``
  w = exp(clamp(sum_t l_t, +-20)) for every token of the row; then w = min(w, ``rollout_is_threshold``) (2.0,
  Yao et al.; verl's default). ``None``: no IS weight (w = 1).
- ``rollout_rs`` (MIS, rejection): ``"token"`` drops a token, ``"sequence"`` a whole row, whose ratio (token or
  sequence, as above) lies above ``rollout_rs_threshold`` (2.0) or below ``rollout_rs_threshold_lower`` (None =
  no lower bound; Liu & Li's MIS masks only from above). A dropped token gets weight 0, and ``policy_loss``
  takes a token of weight 0 out of the response mask, as verl does with rejected tokens: it counts in no local
  denominator, a sequence-level loss (GMPO, HolderPO, VESPO) forms its row ratio without it, and KPO's filter
  treats it as a hole. Global token/sequence counts, when given, are the denominators as passed (verl counts
  kept tokens only).

When ``rollout_log_prob`` is given and neither option is set, token-level TIS is used. The weights are detached
and 0 on padding.
"""

from __future__ import annotations

import torch

MISMATCH_KEYS = (
    "rollout_is",
    "rollout_is_threshold",
    "rollout_rs",
    "rollout_rs_threshold",
    "rollout_rs_threshold_lower",
)
LEVELS = ("token", "sequence")
_BOUND = 20.0


def _log_ratio(level: str, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if level == "token":
        return log_ratio.clamp(-_BOUND, _BOUND)
    seq = (log_ratio * mask).sum(dim=-1, keepdim=True).clamp(-_BOUND, _BOUND)
    return seq.expand_as(log_ratio)


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float = 2.0,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached per-token weights [B, T] (0 on padding and rejected tokens, > 0 elsewhere) and their metrics
    (0-dim tensors) from trainer and rollout log-probs."""
    if rollout_is is None and rollout_rs is None:
        rollout_is = "token"
    for key, level in (("rollout_is", rollout_is), ("rollout_rs", rollout_rs)):
        if level is not None and level not in LEVELS:
            raise ValueError(f"{key} must be one of {LEVELS} or None, got {level!r}")
    if not rollout_is_threshold > 0 or not rollout_rs_threshold > 0:
        raise ValueError(
            f"rollout_is_threshold and rollout_rs_threshold must be > 0, got {rollout_is_threshold!r}, {rollout_rs_threshold!r}"
        )
    if rollout_rs_threshold_lower is not None and not 0 <= rollout_rs_threshold_lower <= rollout_rs_threshold:
        raise ValueError(
            f"rollout_rs_threshold_lower must lie in [0, rollout_rs_threshold={rollout_rs_threshold}], "
            f"got {rollout_rs_threshold_lower!r}"
        )
    m = mask.to(torch.bool)
    kept = m
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    log_ratio = torch.where(m, log_ratio, torch.zeros_like(log_ratio))
    weights = torch.ones_like(log_ratio)
    metrics: dict[str, torch.Tensor] = {}
    if rollout_is is not None:
        weights = torch.exp(_log_ratio(rollout_is, log_ratio, m)).clamp(max=rollout_is_threshold)
    if rollout_rs is not None:
        ratio = torch.exp(_log_ratio(rollout_rs, log_ratio, m))
        keep = ratio <= rollout_rs_threshold
        if rollout_rs_threshold_lower is not None:
            keep &= ratio >= rollout_rs_threshold_lower
        kept = m & keep
        dropped = (~keep & m).sum().to(weights.dtype)
        metrics["rollout_rs_masked_fraction"] = dropped / m.sum().clamp(min=1).to(weights.dtype)
    weights = torch.where(kept, weights, torch.zeros_like(weights))
    n = kept.sum().clamp(min=1).to(weights.dtype)
    metrics["rollout_is_mean"] = weights.sum() / n
    metrics["rollout_is_max"] = weights.max() if kept.any() else torch.zeros(())
    return weights.detach(), metrics


__all__ = ["LEVELS", "MISMATCH_KEYS", "rollout_correction"]
