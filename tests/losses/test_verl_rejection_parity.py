"""``rollout_rs`` with verl's divergence options keeps exactly the tokens verl 0.9.1's
``compute_rollout_rejection_mask`` keeps (every option, combined options, per-option thresholds, holes)."""

from __future__ import annotations

import pytest
import torch

rollout_corr_helper = pytest.importorskip(
    "verl.trainer.ppo.rollout_corr_helper",
    reason="verl 0.9.1 not installed: `make test` runs this file in .venv-verl",
)

from kpo.losses.mismatch import DIVERGENCE_OPTIONS, rollout_correction  # noqa: E402

# thresholds where each statistic keeps some tokens and rejects others at log-ratio scale 0.3 (seq_sum sums ~7)
SPECS = {"k1": "0.95_1.08", "k2": "0.04", "k3": "0.05"}
SPECS |= {"seq_sum_k1": "0.5_2.0", "seq_sum_k2": "0.3", "seq_sum_k3": "0.3"}
SPECS |= {"seq_max_k2": "0.15", "seq_max_k3": "0.2"}


def _batch(seed, B=64, T=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    rollout = old - 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.8  # holes inside rows
    mask[0] = False  # an empty row
    return old, rollout, mask


def _kept(old, rollout, mask, rollout_rs, threshold):
    weights, metrics = rollout_correction(
        old, rollout, mask, rollout_rs=rollout_rs, rollout_rs_threshold=threshold
    )
    return weights > 0, metrics


def _verl_kept(old, rollout, mask, rollout_rs, threshold):
    kept, metrics = rollout_corr_helper.compute_rollout_rejection_mask(
        old - rollout, mask.to(torch.float64), rollout_rs=rollout_rs, rollout_rs_threshold=threshold
    )
    return kept.bool(), metrics


@pytest.mark.parametrize("option", DIVERGENCE_OPTIONS)
def test_each_option_keeps_what_verl_keeps(option):
    old, rollout, mask = _batch(0)
    spec = SPECS.get(option, SPECS[option[-2:]])
    kept, metrics = _kept(old, rollout, mask, option, spec)
    want, verl_metrics = _verl_kept(old, rollout, mask, option, spec)
    assert (
        0 < int(kept.sum()) < int(mask.sum())
    )  # the threshold splits the batch: the comparison means something
    assert torch.equal(kept, want)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(verl_metrics["rollout_rs_masked_fraction"])


def test_combined_options_with_per_option_thresholds():
    # every option must pass; one threshold per option, in order (a single k1 number u means 1/u_u)
    old, rollout, mask = _batch(1)
    for rs, spec in (("token_k1,seq_mean_k3", "1.3,0.05"), ("seq_max_k2,seq_sum_k1", "0.3,0.6_1.8")):
        kept, _ = _kept(old, rollout, mask, rs, spec)
        want, _ = _verl_kept(old, rollout, mask, rs, spec)
        assert 0 < int(kept.sum()) < int(mask.sum())
        assert torch.equal(kept, want), rs
