"""Every loss against its float64 loop reference (tests/losses/reference.py): value and autograd gradient,
over odd lengths, masks with holes, an empty row, token- and sequence-level advantages."""

from __future__ import annotations

import pytest
import torch

from kpo import policy_loss
from kpo.losses import reference as ref


def _batch(seed, B=5, T=7, scale=0.3, token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * scale).requires_grad_()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False  # right padding
    mask[2, 2] = False  # a hole inside a response
    mask[3] = False  # an empty row
    adv = torch.randn(B, T if token_adv else 1, generator=g, dtype=torch.float64).squeeze(-1)
    return lp, old, adv, mask


def _check(name, ref_fn, seed=0, ref_kw=None, token_adv=False, scale=0.3, **hp):
    lp, old, adv, mask = _batch(seed, token_adv=token_adv, scale=scale)
    loss, _ = policy_loss(name, lp, old, adv, mask, **hp)
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
    loss, _ = policy_loss("aspo", lp, old, adv, mask, clip_ratio_c=1.8, **kw)
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
