"""Policy losses: one registry, one entry point, verl-compatible semantics (formulas: docs/methods.md).

>>> loss, metrics = policy_loss(
...     "kpo", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=mask
... )

The tensors are keyword-only, under verl's names: verl's ``compute_policy_loss`` takes ``old_log_prob`` first,
and a swap of two <= 0 [B, T] tensors would pass every check (docs/losses.md). Shapes: ``log_prob``,
``old_log_prob``, ``response_mask`` and optional ``rollout_log_prob``/``rollout_is_weights`` are [B, T],
right-padded; ``response_mask`` is bool or 0/1; ``advantages`` is [B], [B, 1] or [B, T]. ``log_prob`` carries the
gradient. Each loss is a function ``fn(batch: LossBatch, *, hparam=default, ...) -> LossTerms`` registered with
``register_loss``; its keyword defaults are the method's paper defaults and the only hyperparameters it accepts.

Keywords every loss accepts (besides its own):

- global batch (see ``kpo.losses.aggregation``): ``global_num_tokens``, ``global_num_seqs``, ``dp_size`` (1),
  ``loss_scale_factor``. They are verl's ``global_batch_info`` (``batch_num_tokens``, ``global_batch_size``,
  ``dp_size``, ``loss_scale_factor``) under kpo names: the loss is ``local_sum / global_count * dp_size``, so the
  sum of the losses of the pieces of a split mini-batch equals the loss of the unsplit one.
- train/inference mismatch (see ``kpo.losses.mismatch``): ``rollout_is``, ``rollout_is_threshold``,
  ``rollout_rs``, ``rollout_rs_threshold``, ``rollout_rs_threshold_lower`` (used with ``rollout_log_prob``), or
  precomputed detached weights ``rollout_is_weights`` [B, T] (what verl passes; >= 0). A token that
  ``rollout_rs`` rejects leaves the mask, as verl's rejection takes it out of ``response_mask``; a precomputed
  weight of 0 (verl's IcePop, TRL's *_mask modes) keeps its token in the mask, as verl and TRL do: it counts in
  the denominators and sequence ratios and KPO's filter observes it, with no loss of its own. The weights
  multiply the per-token loss; GMPO and HolderPO multiply their per-sequence loss by the geometric mean of the
  row's weights (as verl's geo_mean); VESPO folds them into its sequence weight (as its authors).

Log-probs are checked at valid tokens: finite, and at most ``LOG_PROB_SLACK`` (1e-4, a float32 log-softmax's
rounding) above 0, since a probability is at most 1.

Metrics (plain floats): ``pg_loss``; ``pg_clipfrac`` (valid tokens whose clipped branch is active);
``pg_clipfrac_lower`` (dual-clip fraction; GMPO: log-clip hits with A < 0); ``ppo_kl`` = mean(old - new
log-prob) and ``ratio_mean/min/max`` of the token ratio exp(log_prob - old_log_prob) over valid tokens, both with
the log-ratio clamped at +-20 as verl's; per loss:
``filtered_ratio_mean/min/max`` (KPO: exp of the filtered log-ratio), ``seq_ratio_mean/min/max`` (sequence
ratio of GSPO, GMPO, HolderPO, VESPO over non-empty rows), ``prefix_min_ratio_*`` (MinPRO),
``cppo_budget_masked_fraction`` (CPPO), ``off_policy_masked_fraction`` / ``entropy_masked_fraction`` (TRL's masks,
when on; ``kpo.losses.masks``); clip_cov, kl_cov and dro report verl's own ``ppo_kl`` (unclamped; kl_cov's is
mean |Delta|); with mismatch correction ``rollout_is_mean/max`` and ``rollout_rs_masked_fraction``. Where a statistic has nothing to run over (no valid token, no non-empty row,
no kept token) it is left out of the dict, never reported as 0; the loss, clip fractions and ``ppo_kl`` of such
a batch are 0. A trainer that averages metrics over micro-batches then averages each one over the micro-batches
that define it.
"""

from __future__ import annotations

import functools

import torch

from kpo._checks import bool_mask, with_values
from kpo.losses._core import LossBatch, LossTerms, token_stats
from kpo.losses.aggregation import (
    GLOBAL_BATCH_KEYS,
    SEQ_AGG_MODE,
    TOKEN_AGG_MODES,
    aggregate,
    aggregate_sequences,
    masked_mean,
)
from kpo.losses.entropy import aggregate_entropy, entropy_from_logits
from kpo.losses.mismatch import MISMATCH_KEYS, rollout_correction
from kpo.losses.registry import SHARED_KEYS, LossSpec, get_loss_spec, list_losses, register_loss

# The most a log-probability (<= 0) may exceed 0 by at a valid token: the rounding of a float32 log-softmax is a
# few ulps of the largest logit (about 1e-5 at logits of 100); more is no log-probability (logits, a sign slip).
LOG_PROB_SLACK = 1e-4


def _first_bad(
    name: str, t: torch.Tensor, valid: torch.Tensor, bad: torch.Tensor | None = None, why: str = ""
) -> None:
    """ValueError at the first valid entry of ``t`` that is non-finite (or ``bad``, ``why``), naming row and
    position."""
    bad = (~torch.isfinite(t) if bad is None else bad) & valid
    if bool(bad.any()):
        pos = bad.nonzero()[0].tolist()
        where = f"row {pos[0]}" + (f", position {pos[1]}" if len(pos) > 1 else "")
        raise ValueError(
            f"{name} is {t[tuple(pos)].item()}{why} at {where} (a valid token); "
            f"check the model output or the mask there"
        )


def _validate(log_prob, old_log_prob, advantages, mask, rollout_log_prob, rollout_is_weights):
    tensors = {
        "log_prob": log_prob,
        "old_log_prob": old_log_prob,
        "advantages": advantages,
        "response_mask": mask,
    }
    tensors |= {"rollout_log_prob": rollout_log_prob, "rollout_is_weights": rollout_is_weights}
    for key, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{key} must be a torch.Tensor, got {type(t).__name__}")
    with_values(**tensors)
    if log_prob.dim() != 2 or not log_prob.is_floating_point():
        raise ValueError(
            f"log_prob must be a floating [B, T] tensor, got shape {tuple(log_prob.shape)}, "
            f"dtype {log_prob.dtype}"
        )
    shape = tuple(log_prob.shape)
    for key in ("old_log_prob", "response_mask", "rollout_log_prob", "rollout_is_weights"):
        t = tensors[key]
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(
                f"{key} has shape {tuple(t.shape)} but log_prob has {shape}; both must be [B, T]"
            )
        if t is not None and t.device != log_prob.device:
            raise ValueError(f"{key} is on {t.device} but log_prob is on {log_prob.device}")
        if key.endswith("log_prob") and t is not None and not t.is_floating_point():
            raise ValueError(
                f"{key} must be a floating tensor of log-probabilities, as log_prob is; got {t.dtype}"
            )
    mask = bool_mask(mask)
    B, T = shape
    if B == 0 or T == 0:
        raise ValueError(f"log_prob has shape {shape}: an empty batch has no loss; skip the call for it")
    if tuple(advantages.shape) not in ((B,), (B, 1), (B, T)):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; expected [B]={B}, [B, 1] or [B, T]={shape}"
        )
    if advantages.device != log_prob.device:
        raise ValueError(f"advantages is on {advantages.device} but log_prob is on {log_prob.device}")
    # at least float32: a bf16 ratio moves in steps of ~0.004 near 1, wider than KPO's and GSPO's 3e-4 clip
    # band, and an fp16 exp(Delta) overflows above Delta = 11
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    # advantages are targets: no gradient reaches whatever computed them (a critic)
    adv = advantages.detach().reshape(B, -1).to(dtype)
    rows = mask.any(dim=-1, keepdim=True)
    _first_bad("advantages", adv, rows if adv.shape[1] == 1 else mask)
    for key in ("log_prob", "old_log_prob", "rollout_log_prob", "rollout_is_weights"):
        if tensors[key] is not None:
            _first_bad(key, tensors[key].detach(), mask)
    # logits passed as log-probs, or a sign slip
    above_one = f" (> {LOG_PROB_SLACK:g}: a probability above 1)"
    for key in ("log_prob", "old_log_prob", "rollout_log_prob"):
        if tensors[key] is not None:
            _first_bad(key, tensors[key].detach(), mask, tensors[key] > LOG_PROB_SLACK, above_one)
    if rollout_is_weights is not None:  # a negative importance weight would flip the token's loss
        _first_bad("rollout_is_weights", rollout_is_weights.detach(), mask, rollout_is_weights < 0, " (< 0)")
    zero = torch.zeros((), dtype=dtype, device=log_prob.device)
    return (
        torch.where(mask, log_prob.to(dtype), zero),
        torch.where(mask, old_log_prob.detach().to(dtype), zero),
        torch.where(mask, adv.expand(B, T), zero),
        mask,
    )


def _tensors_by_keyword(fn):
    """``fn(name, *, ...)`` refusing positional tensors with a TypeError that shows the call."""

    @functools.wraps(fn)
    def call(name, *positional, **kwargs):
        if positional:
            raise TypeError(
                f"policy_loss takes its tensors by keyword (verl's compute_policy_loss takes old_log_prob first): "
                f"policy_loss({name!r}, log_prob=..., old_log_prob=..., advantages=..., response_mask=...)"
            )
        return fn(name, **kwargs)

    return call


@_tensors_by_keyword
def policy_loss(
    name: str,
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str | None = None,
    rollout_log_prob: torch.Tensor | None = None,
    **hparams,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss ``name`` (see ``list_losses()``) and its metrics; a loss to minimize.

    log_prob, old_log_prob, advantages, response_mask: the batch, by keyword only (the module docstring says why).
    loss_agg_mode: None = the method's default; the modes of ``kpo.losses.aggregation`` (sequence-level losses
    use ``"seq-mean"``; SAPO allows only ``"seq-mean-token-mean"``, as verl forces).
    rollout_log_prob: [B, T] log-probs of the rollout engine; enables TIS/MIS (``kpo.losses.mismatch``).
    hparams: the loss's own hyperparameters (verl names) plus the shared keywords in the module docstring.
    Computes in float32 at least (bf16/fp16 log-probs are upcast; the loss is then float32).
    Returns (0-dim loss tensor, dict of float metrics).
    """
    spec = get_loss_spec(name)
    shared = {k: hparams.pop(k) for k in list(hparams) if k in SHARED_KEYS}
    unknown = sorted(set(hparams) - set(spec.hparams))
    if unknown:
        accepted = ", ".join(f"{k}={v!r}" for k, v in spec.hparams.items()) or "(none)"
        raise ValueError(
            f"loss {name!r} does not accept {', '.join(map(repr, unknown))}; its hyperparameters: {accepted}; "
            f"shared by all losses: {', '.join(SHARED_KEYS)}"
        )
    mode = spec.default_agg if loss_agg_mode is None else loss_agg_mode
    if mode not in spec.agg_modes:
        raise ValueError(
            f"loss {name!r} aggregates with {', '.join(spec.agg_modes)}, not {mode!r}; "
            f"pass one of those or loss_agg_mode=None"
        )
    global_kw = {k: shared[k] for k in GLOBAL_BATCH_KEYS if k in shared}
    mismatch_kw = {k: shared[k] for k in MISMATCH_KEYS if k in shared}
    weights = shared.get("rollout_is_weights")
    lp, olp, adv, m = _validate(log_prob, old_log_prob, advantages, response_mask, rollout_log_prob, weights)

    metrics: dict[str, torch.Tensor | float] = {}
    if rollout_log_prob is not None:
        if weights is not None:
            raise ValueError("pass rollout_log_prob or precomputed rollout_is_weights, not both")
        weights, rc_metrics = rollout_correction(olp, rollout_log_prob.to(lp.dtype), m, **mismatch_kw)
        metrics.update(rc_metrics)
        # the tokens rollout_rs rejected (weight 0) leave the mask, as verl's rejection takes them out of
        # response_mask before the loss
        m = m & (weights > 0)
    elif mismatch_kw:
        raise ValueError(
            f"{', '.join(sorted(mismatch_kw))} need rollout_log_prob (the rollout engine's log-probs)"
        )
    if weights is not None:
        # A precomputed weight of 0 (verl's IcePop, TRL's *_mask modes) keeps its token in the mask, as both
        # hosts do: it counts in every denominator and sequence ratio, and KPO's filter observes it; its own
        # loss is multiplied by 0.
        weights = weights.detach().to(lp.dtype)

    rollout = None
    if rollout_log_prob is not None:
        rollout = torch.where(m, rollout_log_prob.detach().to(lp.dtype), torch.zeros_like(lp))
    batch = LossBatch(lp, olp, adv, m, weights if spec.is_weights == "consumed" else None, rollout)
    terms = spec.fn(batch, **hparams)
    if terms.token_loss is not None:
        token_loss = (
            terms.token_loss if weights is None or spec.is_weights != "token" else terms.token_loss * weights
        )
        loss = aggregate(token_loss, m, mode, **global_kw)
    else:
        seq_loss = terms.seq_loss
        if weights is not None and spec.is_weights == "seq_geo_mean":
            # verl geo_mean: the row weight is the geometric mean of its token weights (1e-10 keeps log finite).
            log_w = torch.where(m, torch.log(weights + 1e-10), torch.zeros_like(weights))
            seq_loss = seq_loss * torch.exp(log_w.sum(dim=-1) / batch.lengths.clamp(min=1))
        loss = aggregate_sequences(seq_loss, m, **global_kw)

    # clamped at +-20 as verl does before its ratio and ppo_kl metrics
    log_ratio = (lp - olp).detach().clamp(-20.0, 20.0)
    metrics |= {
        "pg_loss": loss.detach(),
        "pg_clipfrac": terms.clipfrac,
        "pg_clipfrac_lower": terms.clipfrac_lower,
        "ppo_kl": masked_mean(-log_ratio, m),
        **token_stats("ratio", torch.exp(log_ratio), m),
    }
    metrics |= terms.extra
    keys = list(metrics)
    values = torch.stack(
        [torch.as_tensor(metrics[k], dtype=torch.float64).detach().cpu() for k in keys]
    ).tolist()
    return loss, dict(zip(keys, values))


# Importing the loss modules registers them.
from kpo.losses import aspo, covariance, ctpo, dppo, kpo, ppo, reinforce, sequence, soft  # noqa: E402, F401

__all__ = [
    "SEQ_AGG_MODE",
    "TOKEN_AGG_MODES",
    "LossBatch",
    "LossSpec",
    "LossTerms",
    "aggregate",
    "aggregate_entropy",
    "aggregate_sequences",
    "entropy_from_logits",
    "get_loss_spec",
    "list_losses",
    "policy_loss",
    "register_loss",
    "rollout_correction",
]
