"""Train/inference mismatch: TIS and MIS from rollout log-probs, precomputed weights, and how each loss family
uses them (per token, geometric mean per row for GMPO/HolderPO, folded into W for VESPO)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from kpo import policy_loss

LOG_HALF = math.log(0.5)


def _on_policy(rollout_ratios, adv=1.0):
    """One row, log_prob = old_log_prob = log 0.5 (r = 1); rollout log-probs so that pi_old/pi_rollout = given."""
    n = len(rollout_ratios)
    old = torch.full((1, n), LOG_HALF, dtype=torch.float64)
    lp = old.clone().requires_grad_()
    rollout = old - torch.log(torch.tensor([rollout_ratios], dtype=torch.float64))
    return lp, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, n, dtype=torch.bool), rollout


def _vanilla(lp, old, adv, mask, **kw):
    loss, metrics = policy_loss(
        "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **kw
    )
    loss.backward()
    return loss.item(), lp.grad, metrics


def test_token_tis_default():
    # Per-token loss -A r = -1; weights min([3, 0.5], 2) = [2, 0.5]; token-mean = (-2 - 0.5) / 2.
    lp, old, adv, mask, rollout = _on_policy([3.0, 0.5])
    loss, grad, m = _vanilla(lp, old, adv, mask, rollout_log_prob=rollout)
    assert loss == pytest.approx(-1.25)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -0.25]], dtype=torch.float64))
    assert m["rollout_is_mean"] == pytest.approx(1.25) and m["rollout_is_max"] == pytest.approx(2.0)


def test_no_valid_token_reports_no_rollout_weight_statistics():
    lp, old, adv, mask, rollout = _on_policy([3.0, 0.5])
    loss, grad, m = _vanilla(lp, old, adv, torch.zeros_like(mask), rollout_log_prob=rollout)
    assert loss == 0.0 and (grad == 0).all()
    assert not {"rollout_is_mean", "rollout_is_max", "ratio_mean", "ratio_min", "ratio_max"} & set(m), m


def test_sequence_tis():
    # Sequence weight 3 * 0.5 = 1.5 on both tokens -> loss -1.5; with threshold 1.2 -> -1.2.
    lp, old, adv, mask, rollout = _on_policy([3.0, 0.5])
    assert _vanilla(lp, old, adv, mask, rollout_log_prob=rollout, rollout_is="sequence")[0] == pytest.approx(
        -1.5
    )
    lp.grad = None
    loss = _vanilla(
        lp, old, adv, mask, rollout_log_prob=rollout, rollout_is="sequence", rollout_is_threshold=1.2
    )[0]
    assert loss == pytest.approx(-1.2)


def test_token_mis_removes_the_token_from_the_mask():
    # rollout_rs alone: no IS weight; the token with ratio 3 > 2 leaves the mask (verl): token-mean over the one
    # kept token = -1 / 1, and the dropped token gets no gradient.
    lp, old, adv, mask, rollout = _on_policy([3.0, 0.5])
    loss, grad, m = _vanilla(lp, old, adv, mask, rollout_log_prob=rollout, rollout_rs="token")
    assert loss == pytest.approx(-1.0)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1.0]], dtype=torch.float64))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(0.5)
    # A lower bound of 0.6 also drops the 0.5 token: nothing is left, the loss is 0.
    lp.grad = None
    loss = _vanilla(
        lp, old, adv, mask, rollout_log_prob=rollout, rollout_rs="token", rollout_rs_threshold_lower=0.6
    )[0]
    assert loss == 0.0


@pytest.mark.parametrize("name", ["gmpo", "holder", "vespo", "kpo", "kpo_unclipped", "gspo", "vanilla"])
def test_token_rejection_equals_the_loss_without_that_token(name):
    # Rejection is mask removal for every loss family: sequence-level losses form their row ratio without the
    # token (a weight of 0 in a geometric mean would instead scale the row by ~1e-10^(1/|y|)), and KPO's
    # filter skips it as a hole. Token 2's rollout ratio 3 > 2 rejects it; the others are kept.
    torch.manual_seed(0)
    old = torch.log(torch.rand(2, 5, dtype=torch.float64) * 0.8 + 0.1)
    lp0 = old + 0.05 * torch.randn(2, 5, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    rollout = old.clone()
    rollout[0, 2] = old[0, 2] - math.log(3.0)
    kept = mask.clone()
    kept[0, 2] = False
    results = []
    for kw, m in (({"rollout_log_prob": rollout, "rollout_rs": "token"}, mask), ({}, kept)):
        lp = lp0.clone().requires_grad_()
        loss, _ = policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=m, **kw)
        (grad,) = torch.autograd.grad(loss, lp)
        results.append((loss.detach(), grad))
    # rtol 1e-9: GMPO/HolderPO take the geometric mean of the kept weights (all 1) as verl does, log(w + 1e-10)
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-9, atol=1e-14)


def test_a_precomputed_zero_weight_keeps_its_token_and_kpo_observes_it():
    # IcePop's weight 0 (verl) or TRL's *_mask modes: the token stays in the mask, as both hosts keep it. One row,
    # kpo_unclipped with q = v = 1 (gains 1/2, 3/5, 8/13), A = 1, log-ratios z = [0, log 2, 0], weights [1, 0, 1].
    # The filter observes token 2: rho = [0, 3/5 log 2, (1 - 8/13) 3/5 log 2 = 3/13 log 2]. Token losses
    # -w exp(rho) = [-1, 0, -2^(3/13)], and the row mean counts all 3 tokens: (-1 - 2^(3/13)) / 3 = -0.72449.
    # (Skipping token 2, as a rejection does, would give rho_3 = 0 and (-1 - 1) / 2 = -1.)
    old = torch.full((1, 3), LOG_HALF, dtype=torch.float64)
    lp = (old + torch.tensor([[0.0, math.log(2.0), 0.0]], dtype=torch.float64)).requires_grad_()
    w = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    adv, mask = torch.ones(1, dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool)
    loss, metrics = policy_loss(
        "kpo_unclipped",
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        rollout_is_weights=w,
        q=1.0,
        v=1.0,
    )
    assert loss.item() == pytest.approx((-1 - 2 ** (3 / 13)) / 3, rel=1e-12)
    # d/d lp_t = -w_t exp(rho_t) / 3; none through the detached filter
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, torch.tensor([[-1 / 3, 0.0, -(2 ** (3 / 13)) / 3]], dtype=torch.float64))
    # the metrics count it too: ratio_max is token 2's r = 2, filtered_ratio_max its exp(3/5 log 2)
    assert metrics["ratio_max"] == pytest.approx(2.0)
    assert metrics["filtered_ratio_max"] == pytest.approx(2**0.6)


def test_sequence_mis_with_token_tis():
    # Sequence ratio 1.5: kept under 2, dropped under 1.4. Token TIS weights [2, 0.5] apply to kept rows.
    lp, old, adv, mask, rollout = _on_policy([3.0, 0.5])
    kw = {"rollout_log_prob": rollout, "rollout_is": "token", "rollout_rs": "sequence"}
    assert _vanilla(lp, old, adv, mask, **kw)[0] == pytest.approx(-1.25)
    lp.grad = None
    assert _vanilla(lp, old, adv, mask, **kw, rollout_rs_threshold=1.4)[0] == 0.0


def test_geo_rs_rejects_a_row_by_its_mean_log_ratio():
    # Geo-RS (verl's seq_mean_k1, "0.999_1.001"): keep a row when log 0.999 <= mean_t(-l_t) <= log 1.001,
    # l = log pi_old/pi_rollout; log 0.999 = -1.0005e-3.
    # Ratios [1.0004, 1.0004]: mean(-l) = -4.0e-4: kept, token-mean loss -A r = -1.
    # Ratios [1.003, 0.9995]: mean(-l) = -(2.9955e-3 - 5.001e-4) / 2 = -1.2477e-3 < -1.0005e-3: rejected, though
    # each token alone lies within 0.3% of 1; nothing is left, so the loss is 0.
    kw = {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"}
    for ratios, want_loss, want_fraction in (([1.0004, 1.0004], -1.0, 0.0), ([1.003, 0.9995], 0.0, 1.0)):
        lp, old, adv, mask, rollout = _on_policy(ratios)
        loss, _, m = _vanilla(lp, old, adv, mask, rollout_log_prob=rollout, **kw)
        assert loss == pytest.approx(want_loss) and m["rollout_rs_masked_fraction"] == want_fraction


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"rollout_rs": "seq_mean_k4", "rollout_rs_threshold": "0.01"},
            r"unknown option\(s\) \['seq_mean_k4'\]",
        ),
        ({"rollout_rs": "seq_mean_k3"}, "needs rollout_rs_threshold"),
        (
            {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.5},
            "no rollout_rs_threshold_lower",
        ),
        ({"rollout_rs": "token_k2,seq_max_k3", "rollout_rs_threshold": "1,2,3"}, "gives 3 thresholds for 2"),
        ({"rollout_rs": "token_k3", "rollout_rs_threshold": "0.5_2.0"}, "must be one positive upper bound"),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "lo_hi"}, "is not a number"),
        ({"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "2.0_0.5"}, "lower > upper"),
        ({"rollout_rs": "token", "rollout_rs_threshold": "0.5_2.0"}, "needs rollout_rs_threshold > 0"),
        ({"rollout_rs_threshold": 2.0}, "need rollout_rs"),
    ],
)
def test_bad_rejection_settings_name_the_fix(kw, message):
    lp, old, adv, mask, rollout = _on_policy([1.0, 1.0])
    with pytest.raises(ValueError, match=message):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_log_prob=rollout,
            **kw,
        )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        # every token rejected at the on-policy step (ratio 1): rollout_rs_masked_fraction 1.0, nothing trains
        (
            {"rollout_rs": "token", "rollout_rs_threshold": 0.5},
            "rollout_rs_threshold=0.5 < 1: it rejects every",
        ),
        ({"rollout_rs": "sequence", "rollout_rs_threshold": 0.99}, "rollout_rs_threshold=0.99 < 1"),
        ({"rollout_rs": "token", "rollout_rs_threshold_lower": 1.5}, "rollout_rs_threshold_lower=1.5 > 1"),
        (
            {"rollout_rs": "token_k1", "rollout_rs_threshold": "1.1_2.0"},
            "keeps ratios in [1.1, 2], which excludes 1",
        ),
        ({"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.5_0.9"}, "[0.5, 0.9], which excludes 1"),
        # every on-policy token's loss scaled by the threshold
        (
            {"rollout_is": "token", "rollout_is_threshold": 0.5},
            "rollout_is_threshold=0.5 < 1 caps every weight",
        ),
        ({"rollout_is": "sequence", "rollout_is_threshold": 0.9}, "rollout_is_threshold=0.9 < 1"),
        ({"rollout_is_threshold": 0.5}, "rollout_is_threshold=0.5 < 1"),  # the default token TIS
    ],
)
def test_bounds_that_exclude_a_ratio_of_1_are_refused(kw, message):
    lp, old, adv, mask, rollout = _on_policy([1.0, 1.0])  # sampler and trainer agree
    with pytest.raises(ValueError, match=re.escape(message)):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_log_prob=rollout,
            **kw,
        )


def test_bounds_at_1_keep_every_on_policy_token_at_weight_1():
    lp, old, adv, mask, rollout = _on_policy([1.0, 1.0])
    kw = {
        "rollout_is": "token",
        "rollout_is_threshold": 1.0,
        "rollout_rs": "token",
        "rollout_rs_threshold": 1.0,
    }
    loss, _, m = _vanilla(lp, old, adv, mask, rollout_log_prob=rollout, rollout_rs_threshold_lower=1.0, **kw)
    assert (
        loss == pytest.approx(-1.0) and m["rollout_rs_masked_fraction"] == 0.0 and m["rollout_is_max"] == 1.0
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        # a bare TypeError ("'>' not supported between instances of 'str' and 'int'") named no parameter
        ({"rollout_is_threshold": "2"}, "rollout_is_threshold must be a finite number > 0, got '2'"),
        (
            {"rollout_rs": "token", "rollout_rs_threshold_lower": "0.5"},
            "rollout_rs_threshold_lower must be a finite number >= 0, got '0.5'",
        ),
        (
            {"rollout_rs": "token", "rollout_rs_threshold": True},
            "rollout_rs_threshold must be a finite number > 0",
        ),
        # a threshold without its option did nothing (the rs ones were refused, this one was not)
        ({"rollout_rs": "token", "rollout_is_threshold": 3.0}, "rollout_is_threshold=3.0 needs rollout_is"),
        (
            {"rollout_is": "token", "rollout_rs_threshold_lower": 0.5},
            "rollout_rs_threshold_lower need rollout_rs",
        ),
    ],
)
def test_a_bad_threshold_names_its_keyword(kw, message):
    lp, old, adv, mask, rollout = _on_policy([1.0, 1.0])
    with pytest.raises(ValueError, match=re.escape(message)):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_log_prob=rollout,
            **kw,
        )


def test_precomputed_weights_and_errors():
    lp, old, adv, mask, rollout = _on_policy([3.0, 0.5])
    w = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    assert _vanilla(lp, old, adv, mask, rollout_is_weights=w)[0] == pytest.approx(-1.25)
    with pytest.raises(ValueError, match="not both"):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_log_prob=rollout,
            rollout_is_weights=w,
        )
    with pytest.raises(ValueError, match="need rollout_log_prob"):
        policy_loss(
            "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is="token"
        )
    with pytest.raises(ValueError, match="rollout_is must be one of"):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_log_prob=rollout,
            rollout_is="tok",
        )
    with pytest.raises(ValueError, match=r"rollout_is_weights is nan at row 0, position 1"):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_is_weights=torch.tensor([[1.0, math.nan]]).double(),
        )


def test_gmpo_and_holder_use_the_geometric_mean_of_row_weights():
    # r = 1 so rho = 1 and the row loss is -A = -1; weights [4, 1] -> geometric mean 2 -> loss -2;
    # weights [2, 0.5] -> geometric mean 1 -> loss -1.
    lp, old, adv, mask, _ = _on_policy([1.0, 1.0])
    for name in ("gmpo", "holder"):
        for w, want in (([4.0, 1.0], -2.0), ([2.0, 0.5], -1.0)):
            loss, _ = policy_loss(
                name,
                log_prob=lp,
                old_log_prob=old,
                advantages=adv,
                response_mask=mask,
                rollout_is_weights=torch.tensor([w], dtype=torch.float64),
            )
            assert loss.item() == pytest.approx(want, rel=1e-9), (name, w)


def test_vespo_folds_weights_into_w():
    # VESPO does not multiply the loss by the weights: they enter log W. With r = 1:
    # weights [2, 0.5] -> log W = log 2 + log 0.5 = 0 -> phi = 1 -> loss = -A mean(lp) = -log 0.5.
    # weights [e^0.1, e^0.1] -> log W = 0.2 -> phi = exp(3 + 2*0.2 - 3 e^0.2) (A > 0: k=2, lambda=3).
    lp, old, adv, mask, _ = _on_policy([1.0, 1.0])
    w1 = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    assert policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is_weights=w1
    )[0].item() == pytest.approx(-LOG_HALF)
    w2 = torch.full((1, 2), math.exp(0.1), dtype=torch.float64)
    phi = math.exp(3 + 0.4 - 3 * math.exp(0.2))
    loss = policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is_weights=w2
    )[0]
    assert loss.item() == pytest.approx(-phi * LOG_HALF, rel=1e-12)


def test_kpo_weights_multiply_the_token_loss():
    # r = 1 -> filtered ratio 1, loss -A per token; weights [2, 0.5] -> row mean (-2 - 0.5) / 2.
    lp, old, adv, mask, _ = _on_policy([1.0, 1.0])
    w = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    assert policy_loss(
        "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is_weights=w
    )[0].item() == pytest.approx(-1.25)
