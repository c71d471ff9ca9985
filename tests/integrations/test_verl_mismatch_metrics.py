"""kpo train's rollout_corr/* mismatch metrics equal verl 0.9.1's ``compute_offpolicy_metrics`` (runs in .venv-verl),
a row without a valid token included."""

from __future__ import annotations

import pytest
import torch

from kpo.train.sampler import mismatch_metrics, mismatch_sums

helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason="verl runs in .venv-verl")


def test_mismatch_metrics_equal_verls():
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(8, 12, generator=g, dtype=torch.float64) * 3
    trainer = rollout + 0.05 * torch.randn(8, 12, generator=g, dtype=torch.float64)
    mask = torch.rand(8, 12, generator=g) > 0.3
    mask[5] = False  # an empty row: verl's batch mean of log_ppl_diff counts it as 0
    verl = helper.compute_offpolicy_metrics(trainer, rollout, mask.double())
    ours = mismatch_metrics(mismatch_sums(trainer, rollout, mask))
    for key in ("kl", "k3_kl", "log_ppl_diff", "chi2_token"):
        # verl's per-row means divide by (tokens + 1e-8): a relative 1e-9 at 10 tokens a row
        assert ours[f"rollout_corr/{key}"] == pytest.approx(verl[key], rel=1e-7, abs=1e-12), key
