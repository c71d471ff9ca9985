"""Every loss against its float64 loop reference (tests/losses/reference.py): value and autograd gradient,
over odd lengths, masks with holes, an empty row, token- and sequence-level advantages."""

from __future__ import annotations

import pytest
import torch

from kpo import policy_loss
from kpo.losses import reference as ref


def _batch(seed, B=5, T=7, scale=0.3, token_adv=False):
    """Log-probs <= 0 (probabilities, as ``policy_loss`` requires), log-ratios of about ``scale``."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * scale
    lp = (-lp.abs()).requires_grad_()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False  # right padding
    mask[2, 2] = False  # a hole inside a response
    mask[3] = False  # an empty row
    adv = torch.randn(B, T if token_adv else 1, generator=g, dtype=torch.float64).squeeze(-1)
    return lp, old, adv, mask


def _check(name, ref_fn, seed=0, ref_kw=None, token_adv=False, scale=0.3, **hp):
    lp, old, adv, mask = _batch(seed, token_adv=token_adv, scale=scale)
    loss, _ = policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **hp)
    loss.backward()
    want_loss, want_grad = ref_fn(lp.detach(), old, adv, mask, **(ref_kw or {}))
    assert loss.item() == pytest.approx(want_loss, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(lp.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"])
def test_vanilla(seed, mode):
    _check(
        "vanilla",
        ref.vanilla,
        seed,
        {"mode": mode, "low": 0.2, "high": 0.28, "c": 1.5},
        loss_agg_mode=mode,
        clip_ratio_high=0.28,
        clip_ratio_c=1.5,
        scale=0.5,
    )


def test_vanilla_token_advantage():
    _check("grpo", ref.vanilla, 3, token_adv=True, scale=0.5)


@pytest.mark.parametrize("seed", [0, 1])
def test_gspo(seed):
    _check(
        "gspo",
        ref.gspo,
        seed,
        {"low": 0.02, "high": 0.03},
        clip_ratio_low=0.02,
        clip_ratio_high=0.03,
        scale=0.1,
    )
    _check("gspo", ref.gspo, seed)  # paper bounds: nearly every row clipped


def test_gspo_token_with_token_advantage():
    _check("gspo_token", ref.gspo, 2, {"low": 0.05, "high": 0.05}, token_adv=True, clip_ratio=0.05, scale=0.1)


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo(seed):
    _check(
        "gmpo", ref.gmpo, seed, {"low": 0.3, "high": 0.2}, clip_ratio_low=0.3, clip_ratio_high=0.2, scale=0.4
    )


@pytest.mark.parametrize("p", [2.0, 1.0, 0.5, 0.0, -1.0])
def test_holder(p):
    _check("holder", ref.holder, 4, {"p": p, "low": 0.05, "high": 0.05}, p=p, clip_ratio=0.05, scale=0.15)


@pytest.mark.parametrize("seed", [0, 1])
def test_sapo(seed):
    _check("sapo", ref.sapo, seed, {"tau_pos": 1.0, "tau_neg": 1.05}, scale=0.5)


def test_cispo():
    _check(
        "cispo", ref.cispo, 5, {"low": 0.1, "high": 0.2}, clip_ratio_low=0.1, clip_ratio_high=0.2, scale=0.4
    )


@pytest.mark.parametrize("with_entropy", [False, True])
def test_aspo(with_entropy):
    lp, old, adv, mask = _batch(6, scale=0.8)
    entropy = torch.rand(lp.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    kw = {"token_entropy": entropy} if with_entropy else {}
    loss, _ = policy_loss(
        "aspo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, clip_ratio_c=1.8, **kw
    )
    loss.backward()
    want_loss, want_grad = ref.aspo(
        lp.detach(), old, adv, mask, entropy=entropy if with_entropy else None, c=1.8
    )
    assert loss.item() == pytest.approx(want_loss, rel=1e-10)
    torch.testing.assert_close(lp.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("ratio_mode,power", [("cumprod", 0.5), ("geomean", -0.5), ("cumprod", 1.0)])
def test_ctpo(ratio_mode, power):
    _check(
        "ctpo",
        ref.ctpo,
        7,
        {"ratio_mode": ratio_mode, "power": power},
        ratio_mode=ratio_mode,
        clip_ratio_la_power=power,
        scale=0.2,
    )


def test_vespo():
    _check("vespo", ref.vespo, 8, scale=0.1)


@pytest.mark.parametrize("mask_mode", ["skip", "advance", "zero"])
def test_kpo(mask_mode):
    # A larger q lets the filtered ratio leave the clip band, so both branches are exercised.
    _check(
        "kpo",
        ref.kpo,
        9,
        {"q": 1e-2, "mask_mode": mask_mode, "low": 3e-3, "high": 4e-3},
        q=1e-2,
        mask_mode=mask_mode,
        clip_ratio_low=3e-3,
        clip_ratio_high=4e-3,
    )


def test_kpo_unclipped():
    _check("kpo_unclipped", ref.kpo, 10, {"q": 1e-4, "clipped": False})


@pytest.mark.parametrize("kind", ["tv", "kl"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_dppo(kind, mode):
    bounds = {"tv": (0.08, 0.05), "kl": (0.02, 0.01)}[kind]
    _check(
        f"dppo_{kind}",
        ref.dppo,
        11,
        {"mode": mode, "low": bounds[0], "high": bounds[1], "c": 1.3, "kind": kind},
        loss_agg_mode=mode,
        clip_ratio_low=bounds[0],
        clip_ratio_high=bounds[1],
        clip_ratio_c=1.3,
        scale=0.6,
    )


def test_gpg_and_dro():
    _check("gpg", ref.gpg, 12, scale=0.5)
    _check(
        "dro",
        ref.dro,
        12,
        {"beta": 0.4, "mode": "seq-mean-token-mean"},
        loss_agg_mode="seq-mean-token-mean",
        dro_beta=0.4,
    )


def test_clip_cov_every_candidate_picked():
    kw = {"ratio": 1.0, "lb": 0.05, "ub": 3.0, "high": 0.28}
    _check(
        "clip_cov",
        ref.clip_cov,
        13,
        kw,
        clip_cov_ratio=1.0,
        clip_cov_lb=0.05,
        clip_cov_ub=3.0,
        clip_ratio_high=0.28,
        scale=0.5,
    )


@pytest.mark.parametrize("token_adv", [False, True])
def test_kl_cov(token_adv):
    _check(
        "kl_cov",
        ref.kl_cov,
        14,
        {"ratio": 0.15, "coef": 0.6},
        token_adv=token_adv,
        kl_cov_ratio=0.15,
        ppo_kl_coef=0.6,
        scale=0.5,
    )


@pytest.mark.parametrize("seed", [15, 16])
def test_minpro(seed):
    _check(
        "minpro",
        ref.minpro,
        seed,
        {"low": 0.1, "high": 0.15},
        clip_ratio_low=0.1,
        clip_ratio_high=0.15,
        scale=0.3,
    )


@pytest.mark.parametrize("quantile", [None, 0.9])
def test_cppo(quantile):
    # Wide log-ratios and a small budget: the token threshold, the prefix budget and the "toward 1" rule all act.
    kw = {"delta": 0.1, "w_min": 0.6, "delta_b": 0.02, "quantile": quantile}
    _check(
        "cppo",
        ref.cppo,
        17,
        kw,
        cppo_delta=0.1,
        cppo_w_min=0.6,
        cppo_delta_b=0.02,
        cppo_budget_quantile=quantile,
        scale=0.8,
    )


@pytest.mark.parametrize("cap", [None, 1.05])
def test_luspo(cap):
    _check(
        "luspo",
        ref.luspo,
        18,
        {"low": 0.05, "high": 0.04, "cap": cap},
        clip_ratio_low=0.05,
        clip_ratio_high=0.04,
        delta=cap,
        scale=0.1,
    )


def test_vanilla_delta_and_trl_masks():
    lp, old, adv, mask = _batch(19, scale=0.6, token_adv=True)
    entropy = torch.rand(lp.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    keep_off = ref.off_policy_keep(lp.detach(), old, adv, mask, 0.05)
    keep_ent = ref.high_entropy_keep(entropy, mask, 0.6)
    keep = [[x and y for x, y in zip(a, b)] for a, b in zip(keep_off, keep_ent)]
    assert 0 < sum(map(sum, keep)) < int(mask.sum())  # both masks drop something
    hp = {
        "delta": 1.3,
        "off_policy_mask_threshold": 0.05,
        "top_entropy_quantile": 0.6,
        "token_entropy": entropy,
    }
    loss, _ = policy_loss(
        "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, clip_ratio_c=1.5, **hp
    )
    loss.backward()
    want_loss, want_grad = ref.vanilla(lp.detach(), old, adv, mask, c=1.5, cap=1.3, keep=keep)
    assert loss.item() == pytest.approx(want_loss, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(lp.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)


def test_off_policy_mask_reads_rollout_log_prob_when_given():
    lp, old, adv, mask = _batch(20, scale=0.3)
    rollout = -(
        old + 0.8 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ).abs()
    valid = int(mask.sum())
    dropped = {}
    for source, extra in (("old", {}), ("rollout", {"rollout_log_prob": rollout})):
        keep = ref.off_policy_keep(lp.detach(), old, adv, mask, 0.02, rollout=extra.get("rollout_log_prob"))
        _, metrics = policy_loss(
            "sapo",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            off_policy_mask_threshold=0.02,
            **extra,
        )
        want = sum(1 for b, row in enumerate(keep) for t, k in enumerate(row) if mask[b, t] and not k) / valid
        assert metrics["off_policy_masked_fraction"] == pytest.approx(want), source
        dropped[source] = want
    assert dropped["old"] != dropped["rollout"]  # the two references drop different rows here
