"""verl 0.9.1's dppo_tv, dppo_kl, clip_cov, kl_cov, gpg and dro against kpo's losses of the same names: loss,
gradient and every metric verl reports, on random batches, with and without rollout IS weights.

Needs verl 0.9.1 (``make test`` runs this file in .venv-verl); skipped otherwise.
"""

from __future__ import annotations

import pytest
import torch

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl 0.9.1 not installed: `make test` runs this file in .venv-verl",
)
from tests.losses.test_verl_parity import _kpo, _verl  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.config.actor import PolicyLossConfig  # noqa: E402

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _batch(seed, B=6, T=9, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2.5
    # a log-probability (<= 0): DPPO reads the probabilities themselves
    lp = -(old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).abs()
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = 1.5 * torch.randn(B, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    weights = torch.rand(B, T, generator=g, dtype=torch.float64) + 0.5
    return lp, old, adv, mask, weights


def _config(policy_loss_kw=None, **kw):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(**(policy_loss_kw or {})),
        **kw,
    )


def _compare(verl_out, kpo_out):
    (lv, gv, mv), (lk, gk, mk) = verl_out, kpo_out
    assert lk == pytest.approx(lv, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(gk, gv, rtol=1e-9, atol=1e-12)
    for key, value in mv.items():  # every metric verl reports; verl averages its indicators in float32
        assert mk[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo(name, mode):
    lp, old, adv, mask, w = _batch(0)
    hp = {"clip_ratio": 0.2, "clip_ratio_low": 0.08, "clip_ratio_high": 0.05, "clip_ratio_c": 1.3}
    if name == "dppo_kl":
        hp |= {"clip_ratio_low": 0.02, "clip_ratio_high": 0.01}
    for weights in (None, w):
        out_kpo = _kpo(name, lp, old, adv, mask, mode, weights, **hp)
        _compare(_verl(name, lp, old, adv, mask, mode, _config(**hp), weights), out_kpo)
    # the thresholds bite: some tokens are dropped and some kept ratios are truncated at c
    assert 0 < out_kpo[2]["pg_clipfrac"] < 1 and out_kpo[2]["pg_clipfrac_lower"] > 0


def test_dppo_default_truncation_is_verls_config_value():
    # verl reads clip_ratio_c from the actor config (3.0 unless set); kpo's default 1e4 is the DPPO recipe's,
    # so a verl run equals kpo's with clip_ratio_c=3.0 passed.
    lp, old, adv, mask, _ = _batch(1, scale=1.5)
    tv = {"clip_ratio_low": 0.1, "clip_ratio_high": 0.1}  # verl's ActorConfig sets both (0.2) itself
    _compare(
        _verl("dppo_tv", lp, old, adv, mask, "token-mean", _config(**tv), None),
        _kpo("dppo_tv", lp, old, adv, mask, "token-mean", None, clip_ratio_c=3.0, **tv),
    )


@pytest.mark.parametrize("mode", MODES)
def test_clip_cov_when_every_candidate_is_picked(mode):
    # clip_cov_ratio = 1: up to every valid token may be zeroed, more than there are candidates, so verl's
    # torch.randperm order does not matter and both pick every candidate.
    lp, old, adv, mask, w = _batch(2)
    hp = {"clip_ratio": 0.2, "clip_ratio_high": 0.28}
    cov_kw = {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.2, "clip_cov_ub": 2.0}
    for weights in (None, w):
        out_kpo = _kpo("clip_cov", lp, old, adv, mask, mode, weights, **hp, **cov_kw)
        _compare(_verl("clip_cov", lp, old, adv, mask, mode, _config(cov_kw, **hp), weights), out_kpo)
    assert 0 < out_kpo[2]["pg_clipfrac"] < 1  # candidates exist and not every token is one


def test_clip_cov_random_subset_follows_the_generator():
    # Fewer picks than candidates: verl draws torch.randperm from the default generator; kpo from the
    # generator passed, so the same seed picks the same tokens, and another seed other tokens.
    lp, old, adv, mask, _ = _batch(3)
    cov_kw = {"clip_cov_ratio": 0.04, "clip_cov_lb": 0.05, "clip_cov_ub": 5.0}  # 2 of ~35 tokens
    torch.manual_seed(11)
    verl_out = _verl("clip_cov", lp, old, adv, mask, "token-mean", _config(cov_kw), None)
    same = _kpo(
        "clip_cov",
        lp,
        old,
        adv,
        mask,
        "token-mean",
        None,
        generator=torch.Generator().manual_seed(11),
        **cov_kw,
    )
    _compare(verl_out, same)
    all_kw = cov_kw | {"clip_cov_ratio": 1.0}
    picked_all = _kpo("clip_cov", lp, old, adv, mask, "token-mean", None, **all_kw)[2]["pg_clipfrac"]
    assert 0 < same[2]["pg_clipfrac"] < picked_all  # a strict subset of the candidates
    draws = {
        tuple(
            _kpo(
                "clip_cov",
                lp,
                old,
                adv,
                mask,
                "token-mean",
                None,
                generator=torch.Generator().manual_seed(s),
                **cov_kw,
            )[1]
            .ne(0)
            .flatten()
            .tolist()
        )
        for s in range(6)
    }
    assert len(draws) > 1


@pytest.mark.parametrize("mode", MODES)
def test_kl_cov(mode):
    lp, old, adv, mask, w = _batch(4)
    cov_kw = {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.7}
    for weights in (None, w):
        _compare(
            _verl("kl_cov", lp, old, adv, mask, mode, _config(cov_kw), weights),
            _kpo("kl_cov", lp, old, adv, mask, mode, weights, **cov_kw),
        )


def test_kl_cov_defaults_are_verls():
    lp, old, adv, mask, _ = _batch(5, B=8, T=12)
    _compare(
        _verl("kl_cov", lp, old, adv, mask, "token-mean", _config(), None),
        _kpo("kl_cov", lp, old, adv, mask, "token-mean", None),
    )


@pytest.mark.parametrize("mode", MODES)
def test_gpg_and_dro(mode):
    lp, old, adv, mask, w = _batch(6)
    for weights in (None, w):
        _compare(
            _verl("gpg", lp, old, adv, mask, mode, _config(), weights),
            _kpo("gpg", lp, old, adv, mask, mode, weights),
        )
        _compare(
            _verl("dro", lp, old, adv, mask, mode, _config({"dro_beta": 0.3}), weights),
            _kpo("dro", lp, old, adv, mask, mode, weights, dro_beta=0.3),
        )


def test_global_batch_info_passes_straight_through():
    lp, old, adv, mask, _ = _batch(7)
    cfg = _config(clip_ratio_low=0.1, clip_ratio_high=0.1)
    cfg.global_batch_info.update({"dp_size": 2, "batch_num_tokens": 90, "global_batch_size": 20})
    kw = {
        "dp_size": 2,
        "global_num_tokens": 90,
        "global_num_seqs": 20,
        "clip_ratio": 0.1,
        "clip_ratio_c": 3.0,
    }
    for mode in ("token-mean", "seq-mean-token-mean"):
        _compare(
            _verl("dppo_tv", lp, old, adv, mask, mode, cfg, None),
            _kpo("dppo_tv", lp, old, adv, mask, mode, None, **kw),
        )
