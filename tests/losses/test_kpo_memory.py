"""KPO's memory keyword: memory=M filters exactly as q=q_for_memory(M); q and memory together are refused."""

from __future__ import annotations

import math

import pytest
import torch

from kpo import filter_memory, kalman_filter, policy_loss, q_for_memory
from kpo.losses.kpo import filter_settings


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 40, generator=g, dtype=torch.float64) - 0.25  # log_prob = old + noise stays <= 0
    lp = (old + 0.05 * torch.randn(3, 40, generator=g, dtype=torch.float64)).requires_grad_()
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1, 30:] = False
    return lp, old, torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64), mask


@pytest.mark.parametrize("loss", ["kpo", "kpo_unclipped"])
def test_memory_is_the_q_it_names(loss):
    lp, old, adv, mask = _batch()
    by_memory, m1 = policy_loss(
        loss, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory=12.0
    )
    (g1,) = torch.autograd.grad(by_memory, lp)
    by_q, m2 = policy_loss(
        loss, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, q=q_for_memory(12.0)
    )
    (g2,) = torch.autograd.grad(by_q, lp)
    assert by_memory.item() == by_q.item() and torch.equal(g1, g2) and m1 == m2
    # and not the paper's q: a 12-token memory moves the filtered ratio further than a 1000-token one
    _, paper = policy_loss(loss, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    assert m1["filtered_ratio_max"] > paper["filtered_ratio_max"]


def test_q_and_memory_together_are_refused():
    lp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match=r"give q or memory, not both \(got q=0.001, memory=12"):
        policy_loss(
            "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, q=1e-3, memory=12.0
        )
    with pytest.raises(ValueError, match="memory must be a finite number of tokens > 0"):
        policy_loss("kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory=0.0)


def test_filter_settings_resolve_q_per_loss():
    assert filter_settings("kpo", {})["q"] == 1e-6
    assert filter_settings("kpo_unclipped", {})["q"] == 1e-4
    assert filter_settings("kpo", {"memory": 12.0, "v": 2.0}) == {
        "q": q_for_memory(12.0, 2.0),
        "v": 2.0,
        "p0": 0.0,
        "x0": 0.0,
        "mask_mode": "skip",
    }
    # a loss without a filter: KPO's paper settings, whatever its own kwargs
    assert filter_settings("gspo", {"clip_ratio_low": 3e-4}) == {
        "q": 1e-6,
        "v": 1.0,
        "p0": 0.0,
        "x0": 0.0,
        "mask_mode": "skip",
    }


def test_p0_steady_is_the_constant_gain_moving_average():
    from kpo.filter.memory import steady_state_gain, steady_state_variance

    lp, old, adv, mask = _batch()
    q = q_for_memory(8.0)
    steady, m1 = policy_loss(
        "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory=8.0, p0="steady"
    )
    (g1,) = torch.autograd.grad(steady, lp)
    by_number, m2 = policy_loss(
        "kpo",
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        memory=8.0,
        p0=steady_state_variance(q),
    )
    (g2,) = torch.autograd.grad(by_number, lp)
    assert steady.item() == by_number.item() and torch.equal(g1, g2) and m1 == m2
    # a constant gain K: the first filtered value is K z_1, where the ramp from p0 = 0 starts at K_1 = q/(q+v)
    z = (lp - old).detach()[:1, :1]
    k = steady_state_gain(q)
    assert filter_settings("kpo", {"memory": 8.0, "p0": "steady"})["p0"] == steady_state_variance(q)
    assert kalman_filter(z, q=q, p0=steady_state_variance(q)).item() == pytest.approx(k * z.item(), rel=1e-12)
    # and it differs from the ramp: p0 = 0 starts far below K_inf (K_1 = 0.0154 vs 0.1175 at memory 8)
    ramp, m3 = policy_loss(
        "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory=8.0
    )
    assert m3["filtered_ratio_max"] != m1["filtered_ratio_max"] and ramp.item() != steady.item()
    with pytest.raises(ValueError, match="p0='stable': give a variance >= 0 or 'steady'"):
        policy_loss("kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, p0="stable")


@pytest.mark.parametrize("loss", ["kpo", "kpo_unclipped"])
def test_auto_memory_is_the_fixed_q_loss_at_the_fitted_q(loss):
    from kpo.filter.fit import fit_q

    lp, old, adv, mask = _batch()
    auto, metrics = policy_loss(
        loss, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory="auto"
    )
    (g_auto,) = torch.autograd.grad(auto, lp)
    q = fit_q((lp - old).detach(), mask)
    fixed, _ = policy_loss(loss, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, q=q)
    (g_fixed,) = torch.autograd.grad(fixed, lp)
    assert torch.isfinite(auto) and auto.item() == fixed.item() and torch.equal(g_auto, g_fixed)
    assert metrics["kpo/q"] == q and metrics["kpo/memory_tokens"] == pytest.approx(filter_memory(q))


def test_auto_memory_refuses_an_x0_whose_likelihood_overflows():
    """It returned a loss (19602.5 in a TRL run) with only numpy's overflow warning, the fit silently stale."""
    lp, old, adv, mask = _batch()
    # log-ratios of about 0.01 at x0 = 1e308: (0.01 - 1e308)^2 = 1e616, past float64's 1.8e308
    with pytest.raises(ValueError, match=r"^the likelihood of q overflows float64 with x0=1e\+308, p0=0.0: "):
        policy_loss(
            "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory="auto", x0=1e308
        )
    # 1e150: (1e150)^2 = 1e300 fits, and the fit runs
    _, metrics = policy_loss(
        "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory="auto", x0=1e150
    )
    assert math.isfinite(metrics["kpo/q"])


def test_auto_memory_on_policy_and_bounds():
    lp, old, adv, mask = _batch()
    # ratios exactly 1: nothing to fit and the filtered ratio is 1 whatever q; the paper's q, marked stale
    on_policy, metrics = policy_loss(
        "kpo",
        log_prob=old.clone().requires_grad_(),
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        memory="auto",
    )
    assert torch.isfinite(on_policy) and metrics["filtered_ratio_max"] == 1.0
    assert (metrics["kpo/q"], metrics["kpo/q_stale"]) == (1e-6, 1.0)
    _, bounded = policy_loss(
        "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory="auto", q_max=1e-5
    )
    assert bounded["kpo/q"] <= 1e-5
    with pytest.raises(ValueError, match="apply only with memory='auto'"):
        policy_loss(
            "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory=12.0, q_min=1e-6
        )
    with pytest.raises(ValueError, match="0 < q_min < q_max"):
        policy_loss(
            "kpo",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            memory="auto",
            q_min=1.0,
            q_max=0.1,
        )
    with pytest.raises(ValueError, match=r"memory='matched'.*kpo.matched_memory"):
        policy_loss(
            "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory="matched"
        )
