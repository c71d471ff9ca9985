"""Hand-worked cases for every loss: inputs chosen so that each value and gradient can be done on paper
(arithmetic in the comments). Ratios are set directly: old_log_prob = log 0.5, log_prob = log 0.5 + log r (a
ratio above 2 takes old_log_prob = log 0.2, so that log_prob stays a log-probability, <= 0)."""

from __future__ import annotations

import math

import pytest
import torch

from kpo import policy_loss

LOG_HALF = math.log(0.5)
LOG_FIFTH = math.log(0.2)  # room for ratios up to 5


def _inputs(ratios, advantages, old_log_prob=LOG_HALF):
    """Rows of ratios (None = masked) -> log_prob (leaf), old_log_prob (``old_log_prob`` everywhere), advantages
    [B], mask."""
    T = max(len(r) for r in ratios)
    delta = torch.zeros(len(ratios), T, dtype=torch.float64)
    mask = torch.zeros(len(ratios), T, dtype=torch.bool)
    for b, row in enumerate(ratios):
        for t, r in enumerate(row):
            if r is not None:
                delta[b, t], mask[b, t] = math.log(r), True
    old = torch.full_like(delta, old_log_prob)
    lp = (old + delta).requires_grad_()
    return lp, old, torch.tensor(advantages, dtype=torch.float64), mask


def _run(name, ratios, advantages, old_log_prob=LOG_HALF, **kw):
    lp, old, adv, mask = _inputs(ratios, advantages, old_log_prob)
    loss, metrics = policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **kw)
    loss.backward()
    return loss.item(), lp.grad, metrics


def _grad(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_vanilla_clip_and_dual_clip():
    # eps = 0.2, c = 3, token-mean over 6 tokens.
    # A=+1: r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped, grad 0); r=0.5 -> max(-0.5, -0.8) = -0.5 (grad -r = -0.5);
    #       r=1 -> -1 (grad -1).
    # A=-1: r=4 -> max(4, 1.2) = 4 > c=3 -> dual clip 3 (grad 0); r=0.7 -> max(0.7, 0.8) = 0.8 (clipped, grad 0);
    #       r=1.1 -> 1.1 (grad +r = 1.1).
    # loss = (-1.2 - 0.5 - 1 + 3 + 0.8 + 1.1) / 6 = 2.2 / 6.
    loss, grad, m = _run("vanilla", [[1.5, 0.5, 1.0], [4.0, 0.7, 1.1]], [1.0, -1.0], LOG_FIFTH)
    assert loss == pytest.approx(2.2 / 6, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[0, -0.5 / 6, -1 / 6], [0, 0, 1.1 / 6]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 6)  # (A=+1, r=1.5) and (A=-1, r=0.7)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 6)  # (A=-1, r=4)
    # ppo_kl = mean(-log r) over the 6 tokens; ratio stats over valid tokens.
    want_kl = -sum(math.log(r) for r in [1.5, 0.5, 1.0, 4.0, 0.7, 1.1]) / 6
    assert m["ppo_kl"] == pytest.approx(want_kl)
    assert (m["ratio_min"], m["ratio_max"]) == pytest.approx((0.5, 4.0))


def test_vanilla_seq_mean_token_mean():
    # Row means: A=+1 row [1.5, masked, 1.0] -> (-1.2 - 1) / 2 = -1.1; A=-1 row [1.1] -> 1.1; mean = 0.
    loss, grad, _ = _run("grpo", [[1.5, None, 1.0], [1.1]], [1.0, -1.0], loss_agg_mode="seq-mean-token-mean")
    assert loss == pytest.approx(0.0, abs=1e-12)
    # grads: row 0 token 2: -1 / (2 rows * 2 tokens); row 1: +1.1 / (2 * 1).
    torch.testing.assert_close(grad, _grad([[0, 0, -0.25], [0.55, 0, 0]]))


def test_gspo_sequence_ratio_and_clip():
    # s = geometric mean of the row's ratios, eps = 0.05.
    # row 0, A=+1: [1.21, 1.0] -> s = sqrt(1.21) = 1.1 > 1.05: loss max(-1.1, -1.05) = -1.05 (grad 0)
    # row 1, A=-1: [0.81, 1.0] -> s = 0.9 < 0.95: loss max(0.9, 0.95) = 0.95 (grad 0)
    # row 2, A=+2: [1.02] -> s = 1.02 inside: loss -2.04, grad -A s = -2.04 with weight 1/(3 rows * 1 token)
    # seq-mean-token-mean: (-1.05 + 0.95 - 2.04) / 3.
    loss, grad, m = _run("gspo", [[1.21, 1.0], [0.81, 1.0], [1.02]], [1.0, -1.0, 2.0], clip_ratio=0.05)
    assert loss == pytest.approx((-1.05 + 0.95 - 2.04) / 3, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[0, 0], [0, 0], [-2.04 / 3, 0]]))
    assert m["pg_clipfrac"] == pytest.approx(4 / 5)
    assert (m["seq_ratio_min"], m["seq_ratio_max"]) == pytest.approx((0.9, 1.1))


def test_gspo_rejects_token_advantages_but_gspo_token_takes_them():
    lp, old, _, mask = _inputs([[1.0, 1.0]], [0.0])
    adv = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="row 0 varies.*gspo_token"):
        policy_loss("gspo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    # gspo_token: s = 1 for both tokens, loss = mean(-1*1, -2*1) = -1.5.
    loss, _ = policy_loss("gspo_token", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    assert loss.item() == pytest.approx(-1.5)


def test_gmpo_log_space_clip_by_sign():
    # eps = 0.4 in log space. row 0, A=+1: log r = [0.5, 0.1] -> capped at 0.4: [0.4, 0.1], rho = e^0.25
    # row 1, A=-1: log r = [-0.6, 0.2] -> floored at -0.4: [-0.4, 0.2], rho = e^-0.1
    # per-row loss -A rho; mean over 2 rows. Gradient only through unclipped tokens: -A rho / |y| / 2.
    loss, grad, m = _run(
        "gmpo", [[math.exp(0.5), math.exp(0.1)], [math.exp(-0.6), math.exp(0.2)]], [1.0, -1.0]
    )
    assert loss == pytest.approx((-math.exp(0.25) + math.exp(-0.1)) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[0, -math.exp(0.25) / 4], [0, math.exp(-0.1) / 4]]))
    assert m["pg_clipfrac"] == pytest.approx(1 / 4)  # the A>0 token at 0.5
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 4)  # the A<0 token at -0.6


def test_holder_power_means():
    # p = 2, eps = 0.2, A = +1 both rows.
    # row 0: [1.0, 1.4] -> s = sqrt((1 + 1.96) / 2) = sqrt(1.48) = 1.2166 > 1.2 -> loss -1.2, grad 0
    # row 1: [0.8, 1.0] -> s = sqrt((0.64 + 1) / 2) = sqrt(0.82) inside -> loss -sqrt(0.82)
    # ds/dlog r_t = s^(1-p) r_t^p / n = r_t^2 / (2 s); times -A and 1/2 for the mean over rows.
    s1 = math.sqrt(0.82)
    loss, grad, _ = _run("holder", [[1.0, 1.4], [0.8, 1.0]], [1.0, 1.0], p=2.0)
    assert loss == pytest.approx((-1.2 - s1) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[0, 0], [-0.64 / (2 * s1) / 2, -1 / (2 * s1) / 2]]))
    # p = -1 (harmonic): [0.8, 1.0] -> 1 / mean(1.25, 1) = 1 / 1.125; p = 0 (geometric): sqrt(0.8).
    assert _run("holder", [[0.8, 1.0]], [1.0], p=-1.0)[0] == pytest.approx(-1 / 1.125, rel=1e-12)
    assert _run("holder", [[0.8, 1.0]], [1.0], p=0.0)[0] == pytest.approx(-math.sqrt(0.8), rel=1e-12)
    # p = 1 (arithmetic): mean(0.9, 1.1) = 1.0.
    assert _run("holder", [[0.9, 1.1]], [1.0], p=1.0)[0] == pytest.approx(-1.0, rel=1e-12)


def test_sapo_gate():
    # gate f(r) = sigmoid(tau (r - 1)) * 4 / tau; tau = 1 for A > 0, 1.05 otherwise.
    # row 0, A=+1: r=1 -> f = 0.5 * 4 = 2; r=2 -> f = 4 sigmoid(1); row mean = -(2 + 4 sigmoid(1)) / 2
    # row 1, A=-1: r=1 -> f = 0.5 * 4 / 1.05; loss +f
    # gradient -A * 4 sigma (1 - sigma) * r, weighted 1/(2 rows * row length).
    sig1 = 1 / (1 + math.exp(-1))
    loss, grad, _ = _run("sapo", [[1.0, 2.0], [1.0]], [1.0, -1.0])
    assert loss == pytest.approx((-(2 + 4 * sig1) / 2 + 2 / 1.05) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-1 / 4, -4 * sig1 * (1 - sig1) * 2 / 4], [1 / 2, 0]]))


def test_sapo_refuses_other_aggregations():
    lp, old, adv, mask = _inputs([[1.0]], [1.0])
    with pytest.raises(ValueError, match="sapo.*seq-mean-token-mean"):
        policy_loss(
            "sapo",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
        )


def test_cispo_detached_clipped_weight():
    # defaults eps_low = 10 (no lower bound), eps_high = 0.2. A = +1, token-mean over 2 tokens.
    # r=1.5 -> w = 1.2, lp = log(0.75): loss -1.2 * lp, grad -1.2 / 2
    # r=0.5 -> w = 0.5, lp = log(0.25): loss -0.5 * lp, grad -0.5 / 2
    loss, grad, m = _run("cispo", [[1.5, 0.5]], [1.0])
    assert loss == pytest.approx((-1.2 * math.log(0.75) - 0.5 * math.log(0.25)) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-0.6, -0.25]]))
    assert m["pg_clipfrac"] == pytest.approx(0.5)


def test_aspo_flipped_ratio_and_soft_dual_clip():
    # eps = 0.2, c = 3, token-mean over 6 tokens.
    # A=+1: r=1.1 -> p = 1.1, loss -1/1.1, grad -1/r = -1/1.1
    #       r=1.5 -> p = 1.2 (clamped), loss -1/1.2, grad 0
    #       r=0.25 -> 1/p = 4 > 3: loss -3 lp, lp = log(0.2 * 0.25) = log(0.05), grad -3
    # A=-1: r=0.5 -> n = 0.8 (clamped), loss 0.8, grad 0
    #       r=4 -> n = 4 > 3: loss 3 lp, lp = log(0.2 * 4) = log 0.8, grad +3
    #       r=1.1 -> loss 1.1, grad +r = 1.1
    loss, grad, m = _run("aspo", [[1.1, 1.5, 0.25], [0.5, 4.0, 1.1]], [1.0, -1.0], LOG_FIFTH)
    total = -1 / 1.1 - 1 / 1.2 - 3 * math.log(0.05) + 0.8 + 3 * math.log(0.8) + 1.1
    assert loss == pytest.approx(total / 6, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-1 / 1.1 / 6, 0, -0.5], [0, 0.5, 1.1 / 6]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 6)  # r=1.5 and r=0.5 were clamped
    assert m["pg_clipfrac_lower"] == pytest.approx(2 / 6)  # both dual-clip branches


def test_aspo_entropy_selects_wide_bounds():
    # One row, A=+1, r = [1.3, 1.3, 1.3]; entropies [0, 0, 1]: the 0.8-quantile (linear) of [0, 0, 1] is
    # 0 + 0.6 * (1 - 0) = 0.6, so tokens 0, 1 (entropy 0 <= 0.6) use eps 0.2 (clamped at 1.2, grad 0) and
    # token 2 uses eps 0.4 (1.3 < 1.4: loss -1/1.3, grad -1/1.3).
    lp, old, adv, mask = _inputs([[1.3, 1.3, 1.3]], [1.0])
    ent = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    loss, _ = policy_loss(
        "aspo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, token_entropy=ent
    )
    loss.backward()
    assert loss.item() == pytest.approx((-2 / 1.2 - 1 / 1.3) / 3, rel=1e-12)
    torch.testing.assert_close(lp.grad, _grad([[0, 0, -1 / 1.3 / 3]]))


def test_ctpo_prefix_ratio_position_bounds():
    # cumprod, c_l = 0.025, c_h = 0.05, c_c = 0.05, power 0.5; token-mean over 4 tokens.
    # row 0, A=+1, log r = [0.03, 0.05, -0.2]: prefix S = [0.03, 0.08, -0.12]
    #   t=1: bounds [-0.025, 0.05], 0.03 inside -> loss -e^0.03, grad -e^0.03
    #   t=2: upper 0.05 sqrt2 < 0.08 -> loss max(-e^0.08, -e^(0.05 sqrt2)) = -e^(0.05 sqrt2), grad 0
    #   t=3: lower -0.025 sqrt3 > -0.12 -> max(-e^-0.12, -e^(-0.025 sqrt3)) = -e^-0.12, grad -e^-0.12
    # row 1, A=-1, log r = [0.2]: max(e^0.2, e^0.05) = e^0.2 > dual bound e^0.05 -> loss e^0.05, grad 0
    e = math.exp
    loss, grad, m = _run("ctpo", [[e(0.03), e(0.05), e(-0.2)], [e(0.2)]], [1.0, -1.0])
    want = (-e(0.03) - e(0.05 * math.sqrt(2)) - e(-0.12) + e(0.05)) / 4
    assert loss == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-e(0.03) / 4, 0, -e(-0.12) / 4], [0, 0, 0]]))
    assert m["pg_clipfrac"] == pytest.approx(1 / 4)  # t=2 of row 0 (row 1's clip branch is not the max)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 4)


def test_vespo_sequence_kernel():
    # row 0, A=+1 (k=2, lambda=3): log W = 0.1 + 0.1 = 0.2 -> phi = exp(3 + 2*0.2 - 3 e^0.2)
    # row 1, A=-1 (k=3, lambda=2): log W = 0 -> phi = exp(2 - 2) = 1
    # loss per token -phi A lp; token-mean over 3; grad -phi A / 3.
    phi = math.exp(3 + 0.4 - 3 * math.exp(0.2))
    loss, grad, m = _run("vespo", [[math.exp(0.1), math.exp(0.1)], [1.0]], [1.0, -1.0])
    lp0, lp1 = LOG_HALF + 0.1, LOG_HALF
    assert loss == pytest.approx((-2 * phi * lp0 + lp1) / 3, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-phi / 3, -phi / 3], [1 / 3, 0]]))
    assert m["phi_min"] == pytest.approx(phi) and m["phi_max"] == pytest.approx(1.0)


def test_kpo_filtered_ratio_with_large_q():
    # q = 1, v = 1, p0 = 0: K1 = 1/2 -> rho1 = z1/2; P1 = 1/2; P2- = 3/2, K2 = 0.6 -> rho2 = rho1 + 0.6 (z2 - rho1).
    # z = [0.2, -0.1]: rho = [0.1, 0.1 + 0.6 * (-0.2)] = [0.1, -0.02].
    # A=+1, eps 3e-4/4e-4: e^0.1 > 1.0004 -> loss -1.0004, grad 0; e^-0.02 < 0.9997 -> max(-e^-0.02, -0.9997)
    # = -e^-0.02, grad -e^-0.02 (through log_prob only). seq-mean-token-mean of one row: halves.
    loss, grad, m = _run("kpo", [[math.exp(0.2), math.exp(-0.1)]], [1.0], q=1.0)
    assert loss == pytest.approx((-1.0004 - math.exp(-0.02)) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[0, -math.exp(-0.02) / 2]]))
    assert m["filtered_ratio_mean"] == pytest.approx((math.exp(0.1) + math.exp(-0.02)) / 2, rel=1e-12)
    assert m["pg_clipfrac"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "mask_mode,rho3",
    [
        # hole skipped: token 3 is the 2nd observation: K = 0.6 -> rho3 = 0.1 + 0.6 (0.4 - 0.1) = 0.28
        ("skip", 0.1 + 0.6 * 0.3),
        # hole advances time: P- = 0.5 + 1 + 1 = 2.5, K = 2.5/3.5 -> rho3 = 0.1 + (5/7) 0.3
        ("advance", 0.1 + 5 / 7 * 0.3),
        # hole observed as 0: x = 0.1 - 0.6 * 0.1 = 0.04, P = 0.6; P- = 1.6, K = 1.6/2.6 -> 0.04 + (1.6/2.6) 0.36
        ("zero", 0.04 + 1.6 / 2.6 * 0.36),
    ],
)
def test_kpo_unclipped_mask_modes(mask_mode, rho3):
    # z = [0.2, hole, 0.4], q = v = 1: rho1 = 0.1. Loss -A mean(e^rho1, e^rho3), grad -A e^rho / 2.
    loss, grad, _ = _run(
        "kpo_unclipped", [[math.exp(0.2), None, math.exp(0.4)]], [1.0], q=1.0, mask_mode=mask_mode
    )
    assert loss == pytest.approx(-(math.exp(0.1) + math.exp(rho3)) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-math.exp(0.1) / 2, 0, -math.exp(rho3) / 2]]))


def test_kpo_filter_grad_flows_through_the_filter():
    # q = v = 1: rho1 = z1/2, rho2 = 0.4 rho1 + 0.6 z2 = 0.2 z1 + 0.6 z2. Unclipped, A = 1, mean of 2 tokens:
    # dL/dz1 = -(e^rho1 * 0.5 + e^rho2 * 0.2) / 2, dL/dz2 = -(e^rho2 * 0.6) / 2 (z = lp - old, so d/dlp = d/dz).
    z1, z2 = 0.2, -0.1
    r1, r2 = math.exp(z1 / 2), math.exp(0.2 * z1 + 0.6 * z2)
    loss, grad, _ = _run("kpo_unclipped", [[math.exp(z1), math.exp(z2)]], [1.0], q=1.0, filter_grad=True)
    assert loss == pytest.approx(-(r1 + r2) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-(0.5 * r1 + 0.2 * r2) / 2, -0.6 * r2 / 2]]))


def test_dppo_tv_mask_and_truncation():
    # p_old = 0.5, p = 0.5 r; thresholds 0.15 (defaults), c = 1.3, token-mean over 4 tokens.
    # A=+1: r=1.2 -> p - p_old = 0.1 <= 0.15 kept; r=1.5 -> 0.25 > 0.15 dropped.
    # A=-1: r=0.6 -> -0.2 < -0.15 dropped; r=1.5 -> 0.25 >= -0.15 kept, weight min(1.5, 1.3) = 1.3 (truncated).
    # L = -A sg(w) log p: (-1.2 log 0.6 + 1.3 log 0.75) / 4; gradient -A w / 4 on kept tokens.
    loss, grad, m = _run(
        "dppo_tv", [[1.2, 1.5], [0.6, 1.5]], [1.0, -1.0], clip_ratio_c=1.3, loss_agg_mode="token-mean"
    )
    assert loss == pytest.approx((-1.2 * math.log(0.6) + 1.3 * math.log(0.75)) / 4, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-1.2 / 4, 0], [0, 1.3 / 4]]))
    assert (m["pg_clipfrac"], m["pg_clipfrac_lower"]) == pytest.approx((2 / 4, 1 / 4))


def test_dppo_kl_keeps_moves_toward_the_old_policy():
    # A=+1, r=1.5: p = 0.75, KL(Bern(0.5) || Bern(0.75)) = 0.5 log(0.5/0.75) + 0.5 log(0.5/0.25) = 0.1438 > 0.05
    # and p > p_old: dropped. A=+1, r=0.6: p < p_old, kept whatever the KL. A=-1, r=0.6: p < p_old and
    # KL(0.5 || 0.3) = 0.5 log(0.5/0.3) + 0.5 log(0.5/0.7) = 0.0872 > 0.05: dropped.
    # Kept: -1 * 0.6 * log 0.3 over 3 tokens.
    loss, grad, m = _run("dppo_kl", [[1.5, 0.6], [0.6]], [1.0, -1.0], loss_agg_mode="token-mean")
    assert 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2.0) > 0.05
    assert loss == pytest.approx(-0.6 * math.log(0.3) / 3, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[0, -0.6 / 3], [0, 0]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)


def test_gpg_and_dro():
    # GPG: L = -A log p; one token, r = 2 (p = 1, log p = 0), A = 3: loss 0, gradient -3.
    loss, grad, _ = _run("gpg", [[2.0]], [3.0])
    assert loss == 0.0 and grad.item() == pytest.approx(-3.0)
    # DRO, beta = 0.5: L = -(A log p - 0.25 Delta^2), Delta = log 2, log p = 0: 0.25 (log 2)^2;
    # gradient -(A - beta Delta) = -(1 - 0.5 log 2).
    loss, grad, m = _run("dro", [[2.0]], [1.0], dro_beta=0.5)
    assert loss == pytest.approx(0.25 * math.log(2.0) ** 2, rel=1e-12)
    assert grad.item() == pytest.approx(-(1 - 0.5 * math.log(2.0)), rel=1e-12)
    assert m["ppo_kl"] == pytest.approx(-math.log(2.0))
    with pytest.raises(ValueError, match="dro_beta must be a finite number > 0"):
        _run("dro", [[2.0]], [1.0], dro_beta=0.0)


# Two rows, A = +1 and -1, ratios [1.1, 1] and [0.9, 1]: log p = log 0.55, log 0.5, log 0.45, log 0.5; mean A = 0,
# mean log p = log(0.061875) / 4 = -0.69526; cov = A (log p - mean): 0.0974, 0.0021, 0.1033, -0.0021.
COV_RATIOS, COV_ADV = [[1.1, 1.0], [0.9, 1.0]], [1.0, -1.0]


def test_clip_cov_zeroes_the_high_covariance_tokens():
    # Candidates in (0.05, 5), none clipped by PPO (0.9 and 1.1 lie in [0.8, 1.2]): tokens (0, 0) and (1, 0);
    # up to max(int(0.5 * 4), 1) = 2 may be zeroed, so both are. Left: -1 * 1 and +1 * 1 -> loss 0;
    # gradient -A r / 4 = -0.25 and +0.25 on them.
    loss, grad, m = _run("clip_cov", COV_RATIOS, COV_ADV, clip_cov_ratio=0.5, clip_cov_lb=0.05)
    assert loss == pytest.approx(0.0, abs=1e-15)
    torch.testing.assert_close(grad, _grad([[0, -0.25], [0, 0.25]]))
    assert m["pg_clipfrac"] == pytest.approx(0.5)


def test_kl_cov_penalizes_the_top_covariance_token():
    # k = max(1, int(4 * 0.25)) = 1: token (1, 0) (cov 0.1033). Its loss -A r + 0.5 |log 0.9| = 0.9 + 0.0527,
    # gradient -A r + 0.5 sign(log 0.9) = 0.9 - 0.5. The others -A r: -1.1, -1, +1. token-mean over 4.
    loss, grad, m = _run("kl_cov", COV_RATIOS, COV_ADV, kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    assert loss == pytest.approx((-1.1 - 1 + 0.9 + 0.5 * -math.log(0.9) + 1) / 4, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-1.1 / 4, -1 / 4], [0.4 / 4, 1 / 4]]))
    assert m["ppo_kl"] == pytest.approx((math.log(1.1) - math.log(0.9)) / 4)  # mean |Delta|
    assert m["pg_clipfrac"] == pytest.approx(1 / 4)


def test_minpro_prefix_minimum():
    # eps 0.2 / 0.28 (defaults). Row A=+1, ratios [0.5, 2, 1]: prefix minima 1, 0.5, 0.5; weights
    # clip(0.5) = 0.8, clip(0.5 * 2) = 1, clip(0.5 * 1) = 0.8. Row A=-1, ratios [2, hole, 0.9]: the hole is
    # skipped, minima 1, 2: weights clip(2) = 1.28, clip(2 * 0.9) = 1.28.
    # L = -w A log p, log p = log(0.5 r): (-0.8 log 0.25 - 0 - 0.8 log 0.5 + 1.28 * 0 + 1.28 log 0.45) / 5.
    loss, grad, m = _run("minpro", [[0.5, 2.0, 1.0], [2.0, None, 0.9]], [1.0, -1.0])
    want = (-0.8 * math.log(0.25) - 0.8 * math.log(0.5) + 1.28 * math.log(0.45)) / 5
    assert loss == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-0.8 / 5, -1 / 5, -0.8 / 5], [1.28 / 5, 0, 1.28 / 5]]))
    assert m["pg_clipfrac"] == pytest.approx(4 / 5)  # every weight but the 1.0
    # prefix minima over the 5 tokens: 1, 0.5, 0.5, 1, 2
    assert (
        m["prefix_min_ratio_mean"],
        m["prefix_min_ratio_min"],
        m["prefix_min_ratio_max"],
    ) == pytest.approx((5 / 5, 0.5, 2.0))


def test_cppo_position_weight_and_prefix_budget():
    # delta = 0.12, w_min = 0.5, delta_b = 0.02, D = |p - p_old| = 0.5 |r - 1|.
    # Row A=+1, ratios [1.2]*3 (every move away from 1): w = 1, 0.75, 0.5; Z = 0.1, 0.075, 0.05.
    #   t=1: c = min(0.12, 0.12) -> 0.1 kept; S = 0.1, W = 1.
    #   t=2: c = min(0.12, 0.12 + 0.02 - 0.1 = 0.04) -> 0.075 masked by the budget; S = 0.175, W = 1.75.
    #   t=3: c = 0.12 + 0.035 - 0.175 = -0.02 -> masked by the budget.
    # Row A=-1, ratios [1.3, 0.8]: t=1 moves r toward 1 (A (r - 1) = -0.3 <= 0): kept; S = 0.15, W = 1.
    #   t=2: w = 0.5, Z = 0.05, c = min(0.12, 0.12 + 0.02 - 0.15 = -0.01): masked by the budget.
    # L = -A r on kept tokens, token-mean over 5: (-1.2 + 1.3) / 5; gradient -A r / 5 there.
    kw = {"cppo_delta": 0.12, "cppo_w_min": 0.5, "cppo_delta_b": 0.02}
    loss, grad, m = _run("cppo", [[1.2, 1.2, 1.2], [1.3, 0.8]], [1.0, -1.0], **kw)
    assert loss == pytest.approx(0.1 / 5, rel=1e-10)
    torch.testing.assert_close(grad, _grad([[-1.2 / 5, 0, 0], [1.3 / 5, 0, 0]]))
    assert (m["pg_clipfrac"], m["cppo_budget_masked_fraction"]) == pytest.approx((3 / 5, 3 / 5))


def test_luspo_and_delta():
    # eps 0.2. Row A=+1, ratios [1.1, 1]: s = sqrt(1.1) in the band; row loss |y| (-s) = -2 sqrt(1.1), gradient -s
    # per token. Row A=-1, ratio [1.5]: max(1.5, 1.2) = 1.5, gradient +1.5. Mean over the 2 rows.
    loss, grad, _ = _run("luspo", [[1.1, 1.0], [1.5]], [1.0, -1.0], clip_ratio=0.2)
    s = math.sqrt(1.1)
    assert loss == pytest.approx((-2 * s + 1.5) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-s / 2, -s / 2], [1.5 / 2, 0]]))
    # delta = 1.3 caps the unclipped branch: max(1.3, 1.2) = 1.3, no gradient (TRL's two-sided clip).
    loss, grad, _ = _run("luspo", [[1.1, 1.0], [1.5]], [1.0, -1.0], clip_ratio=0.2, delta=1.3)
    assert loss == pytest.approx((-2 * s + 1.3) / 2, rel=1e-12)
    torch.testing.assert_close(grad, _grad([[-s / 2, -s / 2], [0, 0]]))


def test_vanilla_delta_and_trl_masks():
    # delta = 1.3, A=-1, r=1.5: max(-A min(r, 1.3), -A clip(r)) = max(1.3, 1.2) = 1.3, gradient 0 (dual clip c=3
    # above it); A=+1, r=1.5: max(-1.3, -1.2) = -1.2 as without delta.
    loss, grad, _ = _run("vanilla", [[1.5], [1.5]], [1.0, -1.0], delta=1.3)
    assert loss == pytest.approx((-1.2 + 1.3) / 2) and float(grad.abs().max()) == 0.0
    # Off-policy mask at 0.5: rows with A < 0 and mean(old - new log p) = -log 0.5 = 0.69 > 0.5 are dropped.
    # Row A=+1 [0.5, 0.5]: kept, -0.5 each (clip lower bound 0.8 is the smaller loss); row A=-1 [0.5, 0.5]:
    # dropped; row A=-1 [1]: mean 0, kept, loss 1. token-mean over 5: 0; gradients -0.5/5, -0.5/5, 1/5.
    loss, grad, m = _run(
        "vanilla", [[0.5, 0.5], [0.5, 0.5], [1.0]], [1.0, -1.0, -1.0], off_policy_mask_threshold=0.5
    )
    assert loss == pytest.approx(0.0, abs=1e-15)
    torch.testing.assert_close(grad, _grad([[-0.1, -0.1], [0, 0], [0.2, 0]]))
    assert m["off_policy_masked_fraction"] == pytest.approx(2 / 5)
    # Top-entropy mask, q = 0.5: the 0.5 quantile of entropies [0.1, 0.4, 0.2, 0.3] is 0.25, so tokens 2 and 4
    # are kept: (-1 - 1) / 4 = -0.5, gradient -1/4 on them.
    lp, old, adv, mask = _inputs([[1.0, 1.0, 1.0, 1.0]], [1.0])
    entropy = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=torch.float64)
    loss, m = policy_loss(
        "vanilla",
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        top_entropy_quantile=0.5,
        token_entropy=entropy,
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    torch.testing.assert_close(lp.grad, _grad([[0, -0.25, 0, -0.25]]))
    assert m["entropy_masked_fraction"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs token_entropy"):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            top_entropy_quantile=0.5,
        )
