"""Registry rules, hyperparameter checks, bad inputs, and rows without valid tokens."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import kpo
from kpo.losses import get_loss_spec, list_losses, policy_loss, register_loss

EXPECTED = {
    "vanilla",
    "grpo",
    "ppo",
    "gspo",
    "gspo_token",
    "gmpo",
    "geo_mean",
    "holder",
    "sapo",
    "cispo",
    "aspo",
    "ctpo",
    "vespo",
    "kpo",
    "kpo_unclipped",
    "dppo_tv",
    "dppo_kl",
    "clip_cov",
    "kl_cov",
    "gpg",
    "dro",
    "luspo",
    "minpro",
    "cppo",
}


def _batch(B=3, T=4, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64)
    lp = (old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(requires_grad)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2:] = False
    return lp, old, torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64), mask


def test_public_api_and_names():
    assert kpo.policy_loss is policy_loss and kpo.list_losses is list_losses
    assert set(list_losses()) == EXPECTED
    assert get_loss_spec("grpo") is get_loss_spec("vanilla") and get_loss_spec("geo_mean") is get_loss_spec(
        "gmpo"
    )


def test_the_tensors_are_keyword_only_so_the_log_probs_cannot_be_swapped_by_position():
    # verl's compute_policy_loss takes (old_log_prob, log_prob, ...): both are <= 0 [B, T] tensors, so a swap
    # by position would pass every check. Positions are refused, in one line that shows the call.
    lp, old, adv, mask = _batch()
    call = (
        r"policy_loss\('kpo', log_prob=\.\.\., old_log_prob=\.\.\., advantages=\.\.\., response_mask=\.\.\.\)"
    )
    for positional in ((old, lp, adv, mask), (lp,)):
        with pytest.raises(TypeError, match=call) as err:
            policy_loss("kpo", *positional)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="response_mask"):
        policy_loss("kpo", log_prob=lp, old_log_prob=old, advantages=adv)
    assert list(inspect.signature(policy_loss).parameters)[:5] == [
        "name",
        "log_prob",
        "old_log_prob",
        "advantages",
        "response_mask",
    ]
    assert all(
        inspect.signature(policy_loss).parameters[k].kind is inspect.Parameter.KEYWORD_ONLY
        for k in ("log_prob", "old_log_prob", "advantages", "response_mask")
    )


def test_unknown_name_lists_valid_names():
    lp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="unknown policy loss 'kpo2'.*gspo_token.*vanilla"):
        policy_loss("kpo2", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)


def test_unknown_hparam_lists_accepted_ones():
    lp, old, adv, mask = _batch()
    with pytest.raises(
        ValueError,
        match=r"'kpo' does not accept 'clip_ratio_hgih'.*clip_ratio_high=None.*q=None, memory=None",
    ):
        policy_loss(
            "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, clip_ratio_hgih=0.1
        )
    with pytest.raises(ValueError, match="'kpo_unclipped' does not accept 'clip_ratio'"):
        policy_loss(
            "kpo_unclipped", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, clip_ratio=0.2
        )


def test_duplicate_registration_is_an_error():
    with pytest.raises(ValueError, match="'gspo' is already registered"):
        register_loss("gspo")(lambda batch: None)
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_loss("my_new_loss", aliases=("grpo",))(lambda batch: None)
    assert "my_new_loss" not in list_losses()


def test_bad_hparam_values():
    lp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="clip_ratio_c.*> 1"):
        policy_loss(
            "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, clip_ratio_c=0.9
        )
    with pytest.raises(ValueError, match=r"q \(process noise\) must be > 0"):
        policy_loss("kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, q=0.0)
    with pytest.raises(ValueError, match="mask_mode"):
        policy_loss(
            "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, mask_mode="drop"
        )
    with pytest.raises(ValueError, match="ratio_mode"):
        policy_loss(
            "ctpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, ratio_mode="sum"
        )
    with pytest.raises(ValueError, match="unknown loss_agg_mode|aggregates with"):
        policy_loss(
            "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode="mean"
        )
    with pytest.raises(ValueError, match="'gmpo' aggregates with seq-mean"):
        policy_loss(
            "gmpo",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
        )
    # values that would otherwise slip through: NaN/inf or out-of-range hyperparameters of the soft and
    # position-adaptive losses (each would turn the loss into NaN, 0, or silently drop rows)
    bad = [
        ("vespo", {"k_pos": math.nan}, "k_pos must be a finite number > 0"),
        ("vespo", {"lambda_neg": -1.0}, "lambda_neg must be a finite number > 0"),
        ("sapo", {"tau_neg": math.inf}, "tau_neg must be a finite number > 0"),
        (
            "aspo",
            {"high_entropy_clip_ratio_low": -0.1},
            "high_entropy_clip_ratio_low must be a finite number >= 0",
        ),
        ("aspo", {"high_entropy_clip_ratio_high": math.nan}, "high_entropy_clip_ratio_high must be a finite"),
        ("ctpo", {"clip_ratio_la_power": math.nan}, "clip_ratio_la_power must be a finite number"),
        ("vanilla", {"clip_ratio_high": math.inf}, "clip_ratio_high must be a finite number >= 0"),
    ]
    for name, kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **kwargs)


@pytest.mark.parametrize("name", ["gspo", "kpo"])
def test_half_precision_log_probs_are_computed_in_float32(name):
    # A bf16 ratio moves in steps of ~0.004 near 1: GSPO's and KPO's 3e-4/4e-4 clip band cannot be resolved.
    # Every token's ratio is e^0.002 = 1.002 > 1 + 4e-4 with A = 1 > 0: all clipped, no gradient.
    old = -torch.rand(2, 64, generator=torch.Generator().manual_seed(0))
    lp = old.bfloat16().float().requires_grad_()  # values a bf16 model can output
    kw = {"q": 1.0} if name == "kpo" else {}  # kpo: the filtered ratio follows the token ratio closely
    want, want_m = policy_loss(
        name,
        log_prob=lp,
        old_log_prob=lp.detach() - 0.002,
        advantages=torch.ones(2),
        response_mask=torch.ones(2, 64),
        **kw,
    )
    half = lp.detach().bfloat16().requires_grad_()
    loss, m = policy_loss(
        name,
        log_prob=half,
        old_log_prob=lp.detach() - 0.002,
        advantages=torch.ones(2),
        response_mask=torch.ones(2, 64),
        **kw,
    )
    loss.backward()
    assert loss.dtype == torch.float32 and m["pg_clipfrac"] == want_m["pg_clipfrac"] == 1.0
    assert float(half.grad.abs().max()) == 0.0 and loss.item() == pytest.approx(want.item())


def test_fp16_log_ratios_above_11_stay_finite():
    # exp(12.5) overflows float16 (max 65504): computed in float32 the loss and gradient stay finite.
    lp = torch.full((1, 4), -0.5, dtype=torch.float16, requires_grad=True)
    old = torch.tensor([[-0.5, -0.5, -13.0, -0.5]], dtype=torch.float16)
    for name in ("vanilla", "aspo", "sapo"):
        lp.grad = None
        loss, m = policy_loss(
            name,
            log_prob=lp,
            old_log_prob=old,
            advantages=torch.tensor([0.0]),
            response_mask=torch.ones(1, 4),
        )
        loss.backward()
        assert math.isfinite(loss.item()) and bool(torch.isfinite(lp.grad).all()), name
        assert math.isfinite(m["ratio_max"]), name


def test_advantages_get_no_gradient():
    lp, old, adv, mask = _batch()
    adv = adv.clone().requires_grad_()
    for name in ("vanilla", "kpo", "gmpo", "vespo"):
        loss, _ = policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
        loss.backward()
        assert adv.grad is None, name


def test_filter_grad_must_be_a_bool_and_an_empty_batch_is_named():
    lp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="filter_grad must be True or False, got 'false'"):
        policy_loss(
            "kpo_unclipped",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            filter_grad="false",
        )
    with pytest.raises(ValueError, match=r"log_prob has shape \(0, 4\): an empty batch"):
        policy_loss(
            "vanilla", log_prob=lp[:0], old_log_prob=old[:0], advantages=adv[:0], response_mask=mask[:0]
        )
    with pytest.raises(ValueError, match=r"log_prob has shape \(3, 0\): an empty batch"):
        policy_loss(
            "gspo", log_prob=lp[:, :0], old_log_prob=old[:, :0], advantages=adv, response_mask=mask[:, :0]
        )


def test_negative_importance_weights_are_rejected_where_they_are():
    lp, old, adv, mask = _batch()
    w = torch.ones_like(old)
    w[2, 3] = -0.5  # would flip the sign of that token's loss
    with pytest.raises(ValueError, match=r"rollout_is_weights is -0.5 \(< 0\) at row 2, position 3"):
        policy_loss(
            "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is_weights=w
        )
    w[1, 3] = -1.0  # masked: never read
    w[2, 3] = 1.0
    policy_loss(
        "vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is_weights=w
    )


def test_shape_errors_name_the_tensor():
    lp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match=r"old_log_prob has shape \(3, 3\)"):
        policy_loss("vanilla", log_prob=lp, old_log_prob=old[:, :3], advantages=adv, response_mask=mask)
    with pytest.raises(ValueError, match=r"advantages has shape \(2,\)"):
        policy_loss("vanilla", log_prob=lp, old_log_prob=old, advantages=adv[:2], response_mask=mask)
    with pytest.raises(ValueError, match="log_prob must be a floating"):
        policy_loss("vanilla", log_prob=lp[0], old_log_prob=old, advantages=adv, response_mask=mask)
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1.*first 2.0 at index \(0, 0\)"):
        policy_loss("vanilla", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask.double() * 2)
    with pytest.raises(ValueError, match=r"rollout_log_prob has shape"):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_log_prob=old[:2],
        )


@pytest.mark.parametrize("field", ["old_log_prob", "rollout_log_prob"])
def test_integer_log_probs_are_refused_as_log_prob_is(field):
    """An int64 old_log_prob passed silently (cast to float), while an int log_prob was refused."""
    lp, old, adv, mask = _batch()
    tensors = {"old_log_prob": old, "rollout_log_prob": old.detach().clone()}
    tensors[field] = tensors[field].round().long()
    with pytest.raises(
        ValueError,
        match=f"{field} must be a floating tensor of log-probabilities, as log_prob is; got torch.int64",
    ):
        policy_loss(
            "vanilla",
            log_prob=lp,
            old_log_prob=tensors.pop("old_log_prob"),
            advantages=adv,
            response_mask=mask,
            **tensors,
        )


@pytest.mark.parametrize("field", ["log_prob", "old_log_prob", "advantages"])
def test_non_finite_valid_entries_name_row_and_position(field):
    lp, old, adv, mask = _batch(requires_grad=False)
    tensors = {
        "log_prob": lp.clone(),
        "old_log_prob": old.clone(),
        "advantages": adv[:, None].expand(3, 4).clone(),
    }
    tensors[field][2, 1] = math.nan
    with pytest.raises(ValueError, match=rf"{field} is nan at row 2, position 1"):
        policy_loss(
            "vanilla",
            log_prob=tensors["log_prob"],
            old_log_prob=tensors["old_log_prob"],
            advantages=tensors["advantages"],
            response_mask=mask,
        )


@pytest.mark.parametrize("field", ["log_prob", "old_log_prob", "rollout_log_prob"])
def test_a_log_prob_above_zero_names_row_and_position(field):
    """+5, a probability of e^5 (logits passed as log-probs), was accepted. A float32 log-softmax's rounding (a
    few 1e-6 above 0) passes, and so does anything on padding."""
    lp, old, adv, mask = _batch(requires_grad=False)
    tensors = {"log_prob": lp.clone(), "old_log_prob": old.clone(), "rollout_log_prob": old.clone()}

    def loss():
        return policy_loss(
            "vanilla",
            log_prob=tensors["log_prob"],
            old_log_prob=tensors["old_log_prob"],
            advantages=adv,
            response_mask=mask,
            **extra,
        )

    extra = {"rollout_log_prob": tensors["rollout_log_prob"]}
    tensors[field][1, 3] = 5.0  # padding
    tensors[field][0, 0] = 1e-5  # rounding
    loss()
    tensors[field][2, 1] = 5.0
    with pytest.raises(
        ValueError, match=rf"{field} is 5.0 \(> 0.0001: a probability above 1\) at row 2, position 1"
    ):
        loss()


def test_garbage_in_padding_is_ignored():
    # -inf log-probs and NaN advantages on masked tokens must not reach value or gradient.
    lp, old, adv, mask = _batch()
    adv_t = adv[:, None].expand(3, 4).clone()
    adv_t[1, 3] = math.nan
    lp_bad = lp.detach().clone()
    lp_bad[1, 2:] = -math.inf
    lp_bad.requires_grad_()
    for name in ["vanilla", "gspo_token", "gmpo", "holder", "sapo", "cispo", "aspo", "ctpo", "vespo", "kpo"]:
        loss, metrics = policy_loss(
            name, log_prob=lp_bad, old_log_prob=old, advantages=adv_t, response_mask=mask
        )
        loss.backward()
        assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values()), name
        assert torch.isfinite(lp_bad.grad).all() and (lp_bad.grad[1, 2:] == 0).all(), name
        lp_bad.grad = None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_empty_rows_contribute_nothing_and_never_nan(name):
    lp, old, adv, mask = _batch()
    mask_empty = torch.cat([mask, torch.zeros(1, 4, dtype=torch.bool)])
    lp2 = torch.cat([lp.detach(), torch.zeros(1, 4, dtype=torch.float64)]).requires_grad_()
    old2 = torch.cat([old, torch.zeros(1, 4, dtype=torch.float64)])
    adv2 = torch.cat([adv, torch.tensor([5.0], dtype=torch.float64)])
    loss, metrics = policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    loss2, metrics2 = policy_loss(
        name, log_prob=lp2, old_log_prob=old2, advantages=adv2, response_mask=mask_empty
    )
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-15)
    assert torch.isfinite(lp2.grad).all() and (lp2.grad[3] == 0).all()
    assert metrics2 == pytest.approx(metrics)
    # A batch with no valid token at all: loss 0, gradient 0, the fractions and ppo_kl 0, and no ratio
    # statistic (mean/min/max of nothing), where a 0.0 would read as "every ratio collapsed to 0".
    none = torch.zeros_like(mask)
    lp3 = lp.detach().clone().requires_grad_()
    loss3, metrics3 = policy_loss(name, log_prob=lp3, old_log_prob=old, advantages=adv, response_mask=none)
    loss3.backward()
    assert loss3.item() == 0.0 and (lp3.grad == 0).all()
    assert metrics3 == {"pg_loss": 0.0, "pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": 0.0}
    assert set(metrics) - set(metrics3) >= {"ratio_mean", "ratio_min", "ratio_max"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_float32_and_0_1_mask_and_advantage_shapes(name):
    lp, old, adv, mask = _batch()
    ref, _ = policy_loss(name, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    for a in (adv[:, None], adv[:, None].expand(3, 4)):
        assert policy_loss(name, log_prob=lp, old_log_prob=old, advantages=a, response_mask=mask.long())[
            0
        ].item() == pytest.approx(ref.item(), rel=1e-12)
    lp32 = lp.detach().float().requires_grad_()
    loss32, metrics32 = policy_loss(
        name, log_prob=lp32, old_log_prob=old.float(), advantages=adv.float(), response_mask=mask
    )
    loss32.backward()
    assert loss32.dtype == torch.float32 and torch.isfinite(lp32.grad).all()
    assert loss32.item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-6)
    assert all(isinstance(v, float) for v in metrics32.values())
