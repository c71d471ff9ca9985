"""IcePop's zero weights: kpo.policy_loss equals verl 0.9.1's own losses, value, gradient and clip metrics, when
the rollout IS weights come from verl's IcePop (``rollout_is="token"``, ``rollout_is_threshold="lower_upper"``:
a token whose ratio pi_old / pi_rollout lies outside the band gets weight 0 and stays in ``response_mask``).

verl counts such a token in every denominator (token-mean's token count, a row's token count, GSPO's sequence
ratio, the clip fraction and ppo_kl); so does kpo. KPO's filter observes it with weight 0 (docs/verl.md says
why), so its filtered ratios are those of the same batch without weights.

Needs verl 0.9.1 (``make test`` runs this file in .venv-verl); skipped otherwise.
"""

from __future__ import annotations

import pytest
import torch

rollout_corr_helper = pytest.importorskip(
    "verl.trainer.ppo.rollout_corr_helper",
    reason="verl 0.9.1 not installed: `make test` runs this file in .venv-verl",
)
from tests.losses.test_verl_parity import TOKEN_MODES, _compare, _config, _kpo, _verl  # noqa: E402

from kpo import policy_loss  # noqa: E402

BAND = "0.8_1.25"  # IcePop's band on pi_old / pi_rollout (verl's preset is 0.5_5.0)


def _icepop_batch(seed, B=6, T=11):
    """(log_prob, old_log_prob, advantages, response_mask, IcePop weights from verl's own function): about a
    quarter of the valid tokens get weight 0, and row 1 all of them (its sampler was far off)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 1.5  # log_prob and rollout stay <= 0
    lp = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old - 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout[1] = old[1] - 1.0  # pi_old / pi_rollout = e > 1.25 on every token of row 1
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    weights, _ = rollout_corr_helper.compute_rollout_correction_weights(
        old - rollout, mask.to(torch.float64), rollout_is="token", rollout_is_threshold=BAND
    )
    zero = mask & (weights == 0)
    assert zero[1][mask[1]].all() and 0.15 < zero.sum() / mask.sum() < 0.5, "the batch tests zero weights"
    return lp, old, adv, mask, weights


@pytest.mark.parametrize("mode", TOKEN_MODES)
def test_vanilla(mode):
    lp, old, adv, mask, w = _icepop_batch(0)
    hp = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0}
    _compare(
        _verl("vanilla", lp, old, adv, mask, mode, _config(**hp), w),
        _kpo("vanilla", lp, old, adv, mask, mode, w, **hp),
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_vanilla_on_one_of_two_ranks(mode):
    # verl's global counts are response_mask's: the zero-weight tokens and row are in them
    lp, old, adv, mask, w = _icepop_batch(1)
    config = _config(clip_ratio=0.2)
    info = {"dp_size": 2, "batch_num_tokens": 2 * int(mask.sum()) + 3, "global_batch_size": 13}
    config.global_batch_info.update(info)
    kw = {
        "dp_size": 2,
        "global_num_tokens": info["batch_num_tokens"],
        "global_num_seqs": 13,
        "clip_ratio": 0.2,
    }
    _compare(
        _verl("vanilla", lp, old, adv, mask, mode, config, w),
        _kpo("vanilla", lp, old, adv, mask, mode, w, **kw),
    )


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo(mode):
    # GSPO's sequence ratio averages the row's log-ratios over response_mask, zero-weight tokens included
    lp, old, adv, mask, w = _icepop_batch(2)
    lp = old + (lp - old) / 6  # GSPO's band is narrow: ratios near 1, some clipped
    hp = {"clip_ratio": 0.2, "clip_ratio_low": 0.003, "clip_ratio_high": 0.004}
    _compare(
        _verl("gspo", lp, old, adv, mask, mode, _config(**hp), w),
        _kpo("gspo", lp, old, adv, mask, mode, w, **hp),
    )


def test_geo_mean():
    # the row weight is the geometric mean of its weights, log(w + 1e-10) for a zero: verl's, as kpo's
    lp, old, adv, mask, w = _icepop_batch(3)
    hp = {"clip_ratio": 0.4, "clip_ratio_low": 0.3, "clip_ratio_high": 0.35}
    _compare(
        _verl("geo_mean", lp, old, adv, mask, "token-mean", _config(**hp), w),
        _kpo("geo_mean", lp, old, adv, mask, None, w, **hp),
    )


@pytest.mark.parametrize("name", ["kpo", "kpo_unclipped"])
def test_kpo_filter_observes_zero_weight_tokens(name):
    # The filter runs over response_mask whatever the weights: the filtered ratios are those of the unweighted
    # batch. And under token-sum the loss is linear in the weights: sum_t w_t l_t, where l_t, token t's loss,
    # is the loss with weight 1 on t and 0 on every other token (skipping the zeros would filter t alone).
    lp, old, adv, mask, w = _icepop_batch(4)
    hp = {"q": 1e-2}
    _, plain = policy_loss(
        name,
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="token-sum",
        **hp,
    )
    weighted_loss, weighted = policy_loss(
        name,
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="token-sum",
        rollout_is_weights=w,
        **hp,
    )
    for key in ("filtered_ratio_mean", "filtered_ratio_min", "filtered_ratio_max", "ratio_mean", "ppo_kl"):
        assert weighted[key] == plain[key], key
    per_token = torch.zeros_like(lp)
    for b, t in mask.nonzero().tolist():
        one = torch.zeros_like(lp)
        one[b, t] = 1.0
        per_token[b, t] = policy_loss(
            name,
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-sum",
            rollout_is_weights=one,
            **hp,
        )[0]
    torch.testing.assert_close(weighted_loss, (per_token * w).sum(), rtol=1e-12, atol=1e-14)
