"""kpo.train.sampler's pieces: the mismatch metrics by hand (against verl's own: tests/integrations), the
sampler's copy of the policy and its refresh, the FP8 grid."""

from __future__ import annotations

import math

import pytest
import torch

from generation.qwen3_model import random_qwen3
from kpo.generation.qwen3 import FP8_MAX, round_fp8
from kpo.train.sampler import RolloutSampler, mismatch_metrics, mismatch_sums


def _batch():
    """Row 0: log rho = log pi_trainer - log pi_rollout = [log 2, 0]; row 1: [log 0.5] then padding."""
    rollout = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.3]]))
    trainer = rollout + torch.log(torch.tensor([[2.0, 1.0], [0.5, 9.0]]))
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    return trainer, rollout, mask


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(mismatch_sums(*_batch()))
    # kl = mean(log pi_rollout - log pi_trainer) = -(log 2 + 0 + log 0.5) / 3 = 0
    assert m["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-7)
    # k3 = mean(rho - 1 - log rho) = ((2 - 1 - log 2) + 0 + (0.5 - 1 + log 2)) / 3 = 0.5 / 3
    assert m["rollout_corr/k3_kl"] == pytest.approx(0.5 / 3, rel=1e-6)
    # chi2 = mean(rho^2) - 1 = (4 + 1 + 0.25) / 3 - 1 = 0.75 (the padded token's rho = 9 is not counted)
    assert m["rollout_corr/chi2_token"] == pytest.approx(0.75, rel=1e-6)
    # per row mean log pi_rollout - mean log pi_trainer: -log(2) / 2 and +log 2; their mean: log(2) / 4
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(math.log(2) / 4, rel=1e-6)
    # a third row without a valid token counts as 0 in the mean over rows, as verl's batch mean: log(2) / 6
    trainer, rollout, mask = (torch.cat([t, t[:1]]) for t in _batch())
    mask[2] = False
    m = mismatch_metrics(mismatch_sums(trainer, rollout, mask))
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(math.log(2) / 6, rel=1e-6)
    assert m["rollout_corr/k3_kl"] == pytest.approx(0.5 / 3, rel=1e-6)  # token means: the row adds no token


def test_mismatch_sums_add_over_parts():
    trainer, rollout, mask = (
        torch.randn(6, 5, generator=torch.Generator().manual_seed(s)) for s in (0, 1, 2)
    )
    mask = mask > 0
    whole = mismatch_metrics(mismatch_sums(trainer, rollout, mask))
    parts = mismatch_metrics(
        mismatch_sums(trainer[:2], rollout[:2], mask[:2]) + mismatch_sums(trainer[2:], rollout[2:], mask[2:])
    )
    assert whole == pytest.approx(parts, rel=1e-12)
    assert mismatch_metrics(mismatch_sums(trainer, rollout, torch.zeros_like(mask))) == {}


def test_float32_samples_the_policy_itself():
    policy = random_qwen3()
    assert RolloutSampler("float32").model_for(policy, 0) is policy
    with pytest.raises(ValueError, match="float16"):
        RolloutSampler("float16")


def test_bf16_copy_is_refreshed_when_the_weights_change():
    policy = random_qwen3()
    sampler = RolloutSampler("bfloat16")
    copy = sampler.model_for(policy, 0)
    assert copy is not policy and next(copy.parameters()).dtype == torch.bfloat16
    for mine, theirs in zip(copy.parameters(), policy.parameters()):
        assert torch.equal(mine, theirs.to(torch.bfloat16))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    assert sampler.model_for(policy, 0) is copy and not torch.equal(  # same version: not refreshed
        next(copy.parameters()), next(policy.parameters()).to(torch.bfloat16)
    )
    sampler.model_for(policy, 1)
    for mine, theirs in zip(copy.parameters(), policy.parameters()):
        assert torch.equal(mine, theirs.to(torch.bfloat16))


def test_fp8_puts_the_blocks_projections_on_the_e4m3_grid():
    policy = random_qwen3()
    copy = RolloutSampler("float8").model_for(policy, 0)
    for name, w in copy.named_parameters():
        theirs = dict(policy.named_parameters())[name].to(torch.bfloat16)
        if ".layers." in name and "proj" in name:
            # one scale per output row (its max |w| / 448): w / scale is an e4m3 value, up to the bf16 rounding
            # of the dequantized weight (a relative 2^-9, far inside e4m3's spacing of 2^-4)
            scale = theirs.float().abs().amax(dim=1, keepdim=True) / FP8_MAX
            grid = w.float() / scale
            torch.testing.assert_close(grid.to(torch.float8_e4m3fn).float(), grid, rtol=2.0**-8, atol=0)
            assert not torch.equal(w, theirs), name
        else:  # embeddings and norms stay bf16
            assert torch.equal(w, theirs), name


def test_round_fp8_keeps_the_row_max_and_three_mantissa_bits():
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    y = round_fp8(x)
    assert torch.equal(round_fp8(y), y)  # already on the grid
    torch.testing.assert_close(y.abs().amax(dim=1), x.abs().amax(dim=1))
    # e4m3 keeps 3 mantissa bits: the relative error of a normal value is at most 2^-4
    normal = x.abs() > x.abs().amax(dim=1, keepdim=True) * 2.0**-6 / FP8_MAX * 448
    assert ((y - x).abs() <= x.abs() * 2.0**-4 * (1 + 1e-6))[normal].all()


def test_the_fp8_decoder_samples_a_nearby_distribution():
    from kpo.generation.qwen3 import Qwen3Decoder

    copy = RolloutSampler("float8").model_for(random_qwen3(), 0)
    ids = torch.randint(2, 16, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    plain = Qwen3Decoder(copy).prefill(ids, mask, 4)
    fp8 = Qwen3Decoder(copy, fp8=True).prefill(ids, mask, 4)
    assert not torch.equal(plain, fp8)
    assert (plain.softmax(-1) - fp8.softmax(-1)).abs().max() < 0.05


def test_a_lagging_sampler_holds_the_weights_of_k_batches_ago_and_restores_them():
    policy = random_qwen3()
    sampler = RolloutSampler("float32", lag=1)
    first = {n: p.detach().clone() for n, p in policy.named_parameters()}

    def step():
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.1)

    def held(model) -> dict:
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    copy = sampler.model_for(policy, 0)  # no batch before the first: its own weights
    assert copy is not policy and all(torch.equal(held(copy)[n], w) for n, w in first.items())
    step()
    second = held(policy)
    assert all(
        torch.equal(held(sampler.model_for(policy, 4))[n], w) for n, w in first.items()
    )  # one batch old
    step()
    assert all(torch.equal(held(sampler.model_for(policy, 8))[n], w) for n, w in second.items())
    assert sampler.model_for(policy, 8) is copy  # the same batch again (a redone one): the same weights
    # a checkpoint's state: another sampler loaded with it samples from the same weights
    restored = RolloutSampler("float32", lag=1)
    restored.load_state_dict(sampler.state_dict())
    assert all(torch.equal(held(restored.model_for(policy, 8))[n], w) for n, w in second.items())
    assert RolloutSampler("bfloat16").state_dict() == {}  # without lag nothing needs restoring


def test_a_lagging_sampler_keeps_lag_plus_one_weight_copies():
    # one float32 copy per generation batch, of the last lag + 1 batches only: in memory and in a checkpoint
    policy = random_qwen3()
    sampler = RolloutSampler("float32", lag=2)
    for version in range(0, 12, 2):  # 6 generation batches of 2 steps
        sampler.model_for(policy, version)
    assert [version for version, _ in sampler.history] == [6, 8, 10]
    assert {key.split("/")[0] for key in sampler.state_dict()} == {"6", "8", "10"}
