"""Train/inference mismatch correction from rollout-engine log-probs: TIS and MIS (docs/methods.md section 10).

With l_t = old_log_prob_t - rollout_log_prob_t (trainer vs rollout engine, verl's decoupled mode):

- ``rollout_is`` (TIS, truncated importance sampling): ``"token"`` w_t = exp(clamp(l_t, +-20)); ``"sequence"``
  w = exp(clamp(sum_t l_t, +-20)) for every token of the row; then w = min(w, ``rollout_is_threshold``) (None =
  2.0, Yao et al.; verl's default). ``None``: no IS weight (w = 1).
- ``rollout_rs`` (MIS, rejection): ``"token"`` drops a token, ``"sequence"`` a whole row, whose ratio (token or
  sequence, as above) lies above ``rollout_rs_threshold`` (2.0) or below ``rollout_rs_threshold_lower`` (None =
  no lower bound; Liu & Li's MIS masks only from above). Or verl's divergence options (``DIVERGENCE_OPTIONS``,
  comma-separated; a token is kept when it passes all of them), with verl's threshold spec and semantics:
  per token k1 = -l, k2 = l^2 / 2, k3 = e^l - 1 - l (l clamped at +-20); ``token_k*`` per token, ``seq_sum_k*``,
  ``seq_mean_k*``, ``seq_max_k*`` per row over its valid tokens. ``rollout_rs_threshold`` is one spec for all
  options or one per option, comma-separated: an upper bound, and for k1 ``"lower_upper"`` ratio bounds
  applied in log space to k1 (a single number u means ``1/u_u``). Presets (docs/methods.md): Geo-RS
  ``rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001"``; K3-RS ``"seq_mean_k3"`` with 0.01; Seq-MIS
  ``"seq_sum_k1"`` with ``"0.5_2.0"``. A dropped token gets weight 0, and ``policy_loss``
  takes the tokens rejected here out of the response mask, as verl does with rejected tokens: it counts in no
  local denominator, a sequence-level loss (GMPO, HolderPO, VESPO) forms its row ratio without it, and KPO's
  filter treats it as a hole (precomputed ``rollout_is_weights`` of 0, IcePop's, stay in the mask). Global
  token/sequence counts, when given, are the denominators as passed (verl counts kept tokens only).

When ``rollout_log_prob`` is given and neither option is set, token-level TIS is used. The weights are detached
and 0 on padding.

Settings that make no sense are refused (ValueError naming the keyword and the fix): a threshold without its
option (``rollout_is_threshold`` without ``rollout_is``, ``rollout_rs_threshold``/``_lower`` without
``rollout_rs``), a threshold that is not a number, and bounds that exclude a ratio of exactly 1, the ratio of
every token when the sampler and the trainer agree (on-policy, no mismatch): ``rollout_is_threshold < 1`` would
scale every such token's loss down, ``rollout_rs_threshold < 1``, ``rollout_rs_threshold_lower > 1`` or k1 bounds
``"lower_upper"`` without lower <= 1 <= upper would reject all of them, and nothing would train.
"""

from __future__ import annotations

import math

import torch

from kpo.losses._core import check_hparams

MISMATCH_KEYS = (
    "rollout_is",
    "rollout_is_threshold",
    "rollout_rs",
    "rollout_rs_threshold",
    "rollout_rs_threshold_lower",
)
LEVELS = ("token", "sequence")
DIVERGENCE_OPTIONS = (
    *(f"token_k{k}" for k in (1, 2, 3)),
    *(f"seq_sum_k{k}" for k in (1, 2, 3)),
    *(f"seq_mean_k{k}" for k in (1, 2, 3)),
    "seq_max_k2",
    "seq_max_k3",
)
_BOUND = 20.0
# what a bound that excludes a ratio of 1 does (the ratio of every token when sampler and trainer agree)
_EVERY_TOKEN = (
    "it rejects every token whose sampler and trainer agree (ratio exactly 1, as on-policy without mismatch), so "
    "nothing would train"
)


def _log_ratio(level: str, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if level == "token":
        return log_ratio.clamp(-_BOUND, _BOUND)
    seq = (log_ratio * mask).sum(dim=-1, keepdim=True).clamp(-_BOUND, _BOUND)
    return seq.expand_as(log_ratio)


def _divergence_bounds(options: list[str], spec: float | str) -> list[tuple[float, float]]:
    """(lower, upper) bounds on each option's statistic from verl's threshold spec (k1: log-ratio bounds;
    k2/k3: upper only, lower -inf)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()] if isinstance(spec, str) else [str(spec)]
    if len(parts) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold={spec!r} gives {len(parts)} thresholds for {len(options)} rollout_rs options; "
            "give one shared threshold or one per option, comma-separated"
        )
    bounds = []
    for option, part in zip(options, parts * len(options) if len(parts) == 1 else parts):
        try:
            values = [float(x) for x in part.split("_")]
        except ValueError:
            raise ValueError(f"rollout_rs_threshold {part!r} for {option!r} is not a number") from None
        k1 = option.endswith("k1")
        if len(values) > (2 if k1 else 1) or not all(x > 0 and math.isfinite(x) for x in values):
            form = "an upper ratio bound u or 'lower_upper'" if k1 else "one positive upper bound"
            raise ValueError(f"rollout_rs_threshold {part!r} for {option!r} must be {form}")
        if not k1:
            bounds.append((-math.inf, values[0]))
            continue
        lower, upper = values if len(values) == 2 else (1.0 / values[0], values[0])
        if lower > upper:
            raise ValueError(f"rollout_rs_threshold {part!r} for {option!r} has lower > upper")
        if not lower <= 1 <= upper:
            raise ValueError(
                f"rollout_rs_threshold {part!r} for {option!r} keeps ratios in [{lower:g}, {upper:g}], which "
                f"excludes 1: {_EVERY_TOKEN}; give bounds with lower <= 1 <= upper, e.g. '0.5_2.0'"
            )
        bounds.append((math.log(lower), math.log(upper)))
    return bounds


def _divergence_statistic(option: str, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's rejection statistic: [B, T] for ``token_*``, [B, 1] per row otherwise (0 for an empty row's max)."""
    level, kind = option.rsplit("_", 1)
    lr = log_ratio.clamp(-_BOUND, _BOUND)
    d = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.expm1(lr) - lr}[kind]
    if level == "token":
        return d
    if level == "seq_max":
        top = d.masked_fill(~mask, -math.inf).amax(dim=-1, keepdim=True)
        return torch.where(mask.any(dim=-1, keepdim=True), top, torch.zeros_like(top))
    total = (d * mask).sum(dim=-1, keepdim=True)
    return total if level == "seq_sum" else total / (mask.sum(dim=-1, keepdim=True) + 1e-8)  # verl's mean


def _check_ratio_bounds(rollout_rs: str, threshold, lower) -> None:
    """ValueError unless ``threshold`` (upper) and ``lower`` (or None) are ratio bounds around 1 for
    ``rollout_rs="token"``/``"sequence"``."""
    if isinstance(threshold, str):  # verl's spec text, which only its divergence options read
        raise ValueError(
            f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold > 0 (an upper ratio bound, a number; the lower "
            f"one is rollout_rs_threshold_lower), got {threshold!r}"
        )
    check_hparams("> 0", rollout_rs_threshold=threshold)
    if threshold < 1:
        raise ValueError(
            f"rollout_rs_threshold={threshold!r} < 1: {_EVERY_TOKEN}; give an upper bound >= 1 (default 2.0)"
        )
    if lower is None:
        return
    check_hparams(">= 0", rollout_rs_threshold_lower=lower)
    if lower > 1:
        raise ValueError(
            f"rollout_rs_threshold_lower={lower!r} > 1: {_EVERY_TOKEN}; give a lower bound <= 1, or none"
        )


def _rejection_keep(
    rollout_rs: str, threshold: float | str | None, lower: float | None, log_ratio, mask
) -> torch.Tensor:
    """[B, T] bool: tokens kept by ``rollout_rs`` (kpo's ratio bounds or verl's divergence options)."""
    if rollout_rs in LEVELS:
        threshold = 2.0 if threshold is None else threshold
        _check_ratio_bounds(rollout_rs, threshold, lower)
        ratio = torch.exp(_log_ratio(rollout_rs, log_ratio, mask))
        keep = ratio <= threshold
        return keep & (ratio >= lower) if lower is not None else keep
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in DIVERGENCE_OPTIONS]
    if unknown or not options:
        raise ValueError(
            f"rollout_rs={rollout_rs!r}: unknown option(s) {unknown}; use one of {LEVELS}, or verl's "
            f"{', '.join(DIVERGENCE_OPTIONS)} (comma-separated to combine)"
        )
    if threshold is None or lower is not None:
        raise ValueError(
            f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold (verl's spec, e.g. '0.999_1.001' for "
            "seq_mean_k1) and no rollout_rs_threshold_lower (k1 bounds are 'lower_upper')"
        )
    keep = torch.ones_like(mask)
    for option, (lo, hi) in zip(options, _divergence_bounds(options, threshold)):
        stat = _divergence_statistic(option, log_ratio, mask)
        keep = keep & (stat >= lo) & (stat <= hi)
    return keep


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float | None = None,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached per-token weights [B, T] (0 on padding and rejected tokens, > 0 elsewhere) and their metrics
    (0-dim tensors) from trainer and rollout log-probs. ``rollout_is_threshold`` None: 2.0.
    ``rollout_rs_threshold`` None: 2.0 for ``"token"`` and ``"sequence"``; verl's options need it given."""
    if rollout_is is None and rollout_rs is None:
        rollout_is = "token"
    if rollout_is is not None and rollout_is not in LEVELS:
        raise ValueError(f"rollout_is must be one of {LEVELS} or None, got {rollout_is!r}")
    if rollout_rs is not None and not isinstance(rollout_rs, str):
        raise ValueError(f"rollout_rs must be a string or None, got {rollout_rs!r}")
    if rollout_rs is None and (rollout_rs_threshold is not None or rollout_rs_threshold_lower is not None):
        raise ValueError(
            "rollout_rs_threshold and rollout_rs_threshold_lower need rollout_rs: without it no token is "
            "rejected; set rollout_rs ('token', 'sequence' or verl's options), or drop them"
        )
    if rollout_is is None and rollout_is_threshold is not None:
        raise ValueError(
            f"rollout_is_threshold={rollout_is_threshold!r} needs rollout_is: without it no IS weight is "
            "truncated; set rollout_is ('token' or 'sequence'), or drop rollout_is_threshold"
        )
    rollout_is_threshold = 2.0 if rollout_is_threshold is None else rollout_is_threshold
    check_hparams("> 0", rollout_is_threshold=rollout_is_threshold)
    if rollout_is is not None and rollout_is_threshold < 1:
        raise ValueError(
            f"rollout_is_threshold={rollout_is_threshold!r} < 1 caps every weight below 1, so even a token whose "
            "sampler and trainer agree (ratio exactly 1, as on-policy without mismatch) has its loss scaled by "
            f"{rollout_is_threshold!r}; give a threshold >= 1 (verl's default 2.0)"
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
        keep = _rejection_keep(rollout_rs, rollout_rs_threshold, rollout_rs_threshold_lower, log_ratio, m)
        kept = m & keep
        dropped = (~keep & m).sum().to(weights.dtype)
        metrics["rollout_rs_masked_fraction"] = dropped / m.sum().clamp(min=1).to(weights.dtype)
    weights = torch.where(kept, weights, torch.zeros_like(weights))
    if kept.any():  # with no kept token there is no weight to describe: left out, never 0
        metrics["rollout_is_mean"] = weights[kept].mean()
        metrics["rollout_is_max"] = weights[kept].max()
    return weights.detach(), metrics


__all__ = ["DIVERGENCE_OPTIONS", "LEVELS", "MISMATCH_KEYS", "rollout_correction"]
