"""Reduce a per-token (or per-sequence) loss to the scalar that is back-propagated.

The modes and their global-batch semantics follow verl 0.9.1 ``agg_loss`` (docs/methods.md section 0) so that a verl
plugin can pass verl's ``global_batch_info`` straight through:

=====================  ===============================  ==============================================
kpo keyword            verl ``global_batch_info`` key    meaning
=====================  ===============================  ==============================================
``global_num_tokens``  ``batch_num_tokens``             valid tokens in the whole global mini-batch
``global_num_seqs``    ``global_batch_size``            sequences in the whole global mini-batch
``dp_size``            ``dp_size``                      data-parallel ranks whose gradients are averaged
``loss_scale_factor``  ``loss_scale_factor``            constant C of ``seq-mean-token-sum-norm``
=====================  ===============================  ==============================================

Every mode returns ``local_sum / global_count * dp_size``: summing the losses of the micro-batches of one rank
(gradient accumulation) and averaging over ``dp_size`` ranks (what DDP/FSDP do to gradients) gives exactly the
loss of the unsplit global mini-batch. Without global counts the local counts are used (one micro-batch = the
whole batch); ``dp_size > 1`` then is an error, as in verl.

Local counts: tokens are the valid tokens; sequences are the rows with at least one valid token (verl's rule),
so a fully masked row contributes nothing and changes no denominator. For exact split invariance pass as
``global_num_seqs`` the same count over the global mini-batch; verl passes all its sequences
(``ppo_mini_batch_size * rollout.n``), which is the same number unless a response has no valid token. Denominators are clamped at 1, so an
all-masked batch gives a loss of exactly 0, never NaN (verl would divide 0 by 0 there).
"""

from __future__ import annotations

import math
import operator

import torch

TOKEN_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
)
# Losses that produce one value per sequence (GMPO, HolderPO) are reduced by a plain mean over sequences.
SEQ_AGG_MODE = "seq-mean"
GLOBAL_BATCH_KEYS = ("global_num_tokens", "global_num_seqs", "dp_size", "loss_scale_factor")
# TRL 1.16 GRPOConfig.loss_type -> (kpo loss, loss_agg_mode) computing the same loss. TRL's grpo/bnpo/dr_grpo/dapo
# are one clipped loss (kpo vanilla, whose dual clip TRL lacks: pass a clip_ratio_c above every ratio) under four
# aggregations: bnpo is a token mean over the local batch (no global counts), dapo the token mean over the
# generation batch (global_num_tokens = TRL's num_items_in_batch), dr_grpo divides by B * max_completion_length
# (loss_scale_factor = max_completion_length; the same when no row is empty).
TRL_LOSS_TYPES = {
    "grpo": ("vanilla", "seq-mean-token-mean"),
    "bnpo": ("vanilla", "token-mean"),
    "dr_grpo": ("vanilla", "seq-mean-token-sum-norm"),
    "dapo": ("vanilla", "token-mean"),
    "luspo": ("luspo", "seq-mean-token-sum"),
    "sapo": ("sapo", "seq-mean-token-mean"),
    "vespo": ("vespo", "token-mean"),
}


def _check_global(global_num_tokens, global_num_seqs, dp_size, loss_scale_factor) -> int:
    """Validate the global-batch keywords; returns dp_size as an int."""
    try:
        valid = not isinstance(dp_size, bool) and operator.index(dp_size) >= 1
    except TypeError:
        valid = False
    if not valid:
        raise ValueError(f"dp_size must be an int >= 1, got {dp_size!r}")
    for name, value in (("global_num_tokens", global_num_tokens), ("global_num_seqs", global_num_seqs)):
        if value is not None and not (math.isfinite(float(value)) and float(value) >= 0):
            raise ValueError(f"{name} must be a finite count >= 0 over the global mini-batch, got {value!r}")
    if loss_scale_factor is not None and not float(loss_scale_factor) > 0:
        raise ValueError(
            f"loss_scale_factor must be > 0 (e.g. the max response length), got {loss_scale_factor!r}"
        )
    return operator.index(dp_size)


def _count(local: torch.Tensor, global_count, dp_size: int, what: str, key: str):
    if global_count is None:
        if dp_size > 1:
            raise ValueError(
                f"{key} (the {what} over the global mini-batch) is required when dp_size > 1; "
                f"pass verl's global_batch_info or count them yourself"
            )
        return local.clamp(min=1)
    if float(global_count) < float(local):
        raise ValueError(
            f"{key}={global_count!r} is less than the {int(local)} {what} of this call alone; it must count "
            f"the {what} of the whole global mini-batch (every micro-batch on every data-parallel rank)"
        )
    return max(float(global_count), 1.0)


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Scalar loss from a per-token loss ``loss_mat`` [B, T] and validity ``mask`` [B, T] (bool or 0/1).

    token-mean               sum(L*m) / N_tok * dp
    seq-mean-token-mean      sum_i [sum_t(L*m)_i / |y_i|] / N_seq * dp
    seq-mean-token-sum       sum_i sum_t(L*m)_i / N_seq * dp
    seq-mean-token-sum-norm  sum(L*m) / N_seq / C * dp  (C = loss_scale_factor, default T; verl divides by N_seq
                             here too, TRL's dr_grpo by B*max_len: same up to a constant)
    token-sum                sum(L*m) * dp
    Masked entries never reach the sum (also not as NaN*0). ``loss_scale_factor`` is ignored by the other modes,
    as in verl, so a host can always pass it.
    """
    if mode not in TOKEN_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(TOKEN_AGG_MODES)}")
    dp_size = _check_global(global_num_tokens, global_num_seqs, dp_size, loss_scale_factor)
    m = mask.to(torch.bool)
    masked = torch.where(m, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if mode == "token-sum":
        return masked.sum() * dp_size
    if mode == "token-mean":
        n_tok = _count(
            m.sum().to(loss_mat.dtype), global_num_tokens, dp_size, "valid tokens", "global_num_tokens"
        )
        return masked.sum() / n_tok * dp_size
    lengths = m.sum(dim=-1).to(loss_mat.dtype)
    n_seq = _count(
        (lengths > 0).sum().to(loss_mat.dtype), global_num_seqs, dp_size, "sequences", "global_num_seqs"
    )
    seq_sums = masked.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        return (seq_sums / lengths.clamp(min=1)).sum() / n_seq * dp_size
    loss = seq_sums.sum() / n_seq * dp_size
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mat.shape[-1] if loss_scale_factor is None else float(loss_scale_factor))
    return loss


def aggregate_sequences(
    seq_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    global_num_seqs: float | None = None,
    dp_size: int = 1,
    global_num_tokens: float | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """``seq-mean`` of a per-sequence loss ``seq_loss`` [B]: sum over non-empty rows / N_seq * dp.

    ``global_num_tokens`` and ``loss_scale_factor`` are accepted (and ignored) so that one set of global-batch
    keywords serves every loss.
    """
    dp_size = _check_global(global_num_tokens, global_num_seqs, dp_size, loss_scale_factor)
    nonempty = mask.to(torch.bool).any(dim=-1)
    n_seq = _count(
        nonempty.sum().to(seq_loss.dtype), global_num_seqs, dp_size, "sequences", "global_num_seqs"
    )
    zero = torch.zeros((), dtype=seq_loss.dtype, device=seq_loss.device)
    return torch.where(nonempty, seq_loss, zero).sum() / n_seq * dp_size


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (0 when nothing is valid, never NaN)."""
    m = mask.to(torch.bool)
    total = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
    return total / m.sum().clamp(min=1).to(values.dtype)


__all__ = [
    "GLOBAL_BATCH_KEYS",
    "SEQ_AGG_MODE",
    "TOKEN_AGG_MODES",
    "TRL_LOSS_TYPES",
    "aggregate",
    "aggregate_sequences",
    "masked_mean",
]
