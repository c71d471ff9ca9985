"""Same loss, gradient and clip metrics as verl 0.9.1 for the methods verl has (vanilla, gspo, geo_mean, sapo,
cispo), including verl's forced aggregations, rollout IS weights and global batch info.

Needs verl 0.9.1 (``make test`` runs this file in .venv-verl, built by scripts/install_verl_cpu.sh); skipped
otherwise.
"""

from __future__ import annotations

import pytest
import torch

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl 0.9.1 not installed: `make test` runs this file in .venv-verl",
)
from verl.workers.config import ActorConfig  # noqa: E402

from kpo import policy_loss  # noqa: E402

TOKEN_MODES = [
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
]


def _batch(seed, B=6, T=11, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    # 4 x scale below 0: log_prob = old + noise stays a log-probability (<= 0)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 4 * scale
    lp = old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # right padding, as verl's response_mask
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0] = 0.0  # a zero advantage (sign 0 for GMPO, tau_neg for SAPO)
    weights = torch.rand(B, T, generator=g, dtype=torch.float64) * 1.5 + 0.25
    return lp, old, adv, mask, weights


def _config(**kw):
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)


def _verl(name, lp, old, adv, mask, mode, config, weights):
    leaf = lp.clone().requires_grad_()
    fn = core_algos.get_policy_loss_fn(name)
    loss, metrics = fn(
        old_log_prob=old,
        log_prob=leaf,
        advantages=adv[:, None].expand_as(lp),
        response_mask=mask,
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=weights,
    )
    loss.backward()
    return loss.item(), leaf.grad, {k.removeprefix("actor/"): v for k, v in metrics.items()}


def _kpo(name, lp, old, adv, mask, mode, weights, **kw):
    leaf = lp.clone().requires_grad_()
    loss, metrics = policy_loss(
        name,
        log_prob=leaf,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        rollout_is_weights=weights,
        **kw,
    )
    loss.backward()
    return loss.item(), leaf.grad, metrics


def _compare(verl_out, kpo_out):
    (lv, gv, mv), (lk, gk, mk) = verl_out, kpo_out
    assert lk == pytest.approx(lv, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(gk, gv, rtol=1e-9, atol=1e-12)
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):  # verl averages the clip indicators in float32
        assert mk[key] == pytest.approx(mv[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("use_weights", [False, True])
@pytest.mark.parametrize("mode", TOKEN_MODES)
def test_vanilla(mode, use_weights):
    lp, old, adv, mask, w = _batch(0, scale=0.6)
    w = w if use_weights else None
    hp = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0}
    cfg = _config(**hp)
    _compare(
        _verl("vanilla", lp, old, adv, mask, mode, cfg, w), _kpo("vanilla", lp, old, adv, mask, mode, w, **hp)
    )


def test_vanilla_metrics_with_log_ratios_beyond_20():
    # verl clamps log r to +-20 before its ratio and ppo_kl: tokens at +25 and -30 enter ppo_kl as -20 and +20.
    lp, old, adv, mask, _ = _batch(0)
    old[1, 0] = -26.0  # room for a log-probability 25 above it
    lp[1, 0], lp[2, 0] = old[1, 0] + 25.0, old[2, 0] - 30.0
    hp = {"clip_ratio": 0.2}
    _compare(
        _verl("vanilla", lp, old, adv, mask, "token-mean", _config(**hp), None),
        _kpo("vanilla", lp, old, adv, mask, "token-mean", None, **hp),
    )


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo(mode):
    lp, old, adv, mask, w = _batch(1, scale=0.05)
    hp = {"clip_ratio": 0.2, "clip_ratio_low": 0.003, "clip_ratio_high": 0.004}
    for weights in (None, w):
        _compare(
            _verl("gspo", lp, old, adv, mask, mode, _config(**hp), weights),
            _kpo("gspo", lp, old, adv, mask, mode, weights, **hp),
        )


def test_geo_mean():
    lp, old, adv, mask, w = _batch(2, scale=0.5)
    hp = {"clip_ratio": 0.4, "clip_ratio_low": 0.3, "clip_ratio_high": 0.35}
    for weights in (None, w):
        _compare(
            _verl("geo_mean", lp, old, adv, mask, "token-mean", _config(**hp), weights),
            _kpo("geo_mean", lp, old, adv, mask, None, weights, **hp),
        )


def test_sapo():
    lp, old, adv, mask, w = _batch(3, scale=0.6)
    hp = {"tau_pos": 1.0, "tau_neg": 1.05}
    for weights in (None, w):
        _compare(
            _verl("sapo", lp, old, adv, mask, "token-mean", _config(**hp), weights),  # verl ignores the mode
            _kpo("sapo", lp, old, adv, mask, None, weights, **hp),
        )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_cispo(mode):
    lp, old, adv, mask, w = _batch(4, scale=0.5)
    hp = {"clip_ratio": 0.2, "clip_ratio_low": 10.0, "clip_ratio_high": 0.2}
    for weights in (None, w):
        _compare(
            _verl("cispo", lp, old, adv, mask, mode, _config(**hp), weights),
            _kpo("cispo", lp, old, adv, mask, mode, weights, **hp),
        )


@pytest.mark.parametrize("mode", TOKEN_MODES)
def test_global_batch_info_passes_straight_through(mode):
    """A micro-batch on one of 2 ranks, with verl's global_batch_info mapped onto kpo's keywords."""
    lp, old, adv, mask, _ = _batch(5, scale=0.6)
    cfg = _config(clip_ratio=0.2)
    info = {"dp_size": 2, "batch_num_tokens": 100, "global_batch_size": 24, "loss_scale_factor": 32}
    cfg.global_batch_info.update(info)
    kw = {
        "dp_size": 2,
        "global_num_tokens": 100,
        "global_num_seqs": 24,
        "loss_scale_factor": 32,
        "clip_ratio": 0.2,
    }
    _compare(
        _verl("vanilla", lp, old, adv, mask, mode, cfg, None),
        _kpo("vanilla", lp, old, adv, mask, mode, None, **kw),
    )
