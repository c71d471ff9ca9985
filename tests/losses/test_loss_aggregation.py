"""Aggregation modes by hand, and invariance of the loss (and its gradient) under splitting a mini-batch into
micro-batches or data-parallel ranks when the global counts are passed (verl's global_batch_info)."""

from __future__ import annotations

import math

import pytest
import torch

from kpo.losses import aggregate, aggregate_entropy, entropy_from_logits, list_losses, policy_loss
from kpo.losses.aggregation import aggregate_sequences

# L = [[1, 2, 3], [4, x, x]] with mask [[1, 1, 1], [1, 0, 0]]; the masked entries hold garbage.
L = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]], dtype=torch.float64)
M = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode,want",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 10 / 4 tokens
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),  # row means 2 and 4
        ("seq-mean-token-sum", (6 + 4) / 2),  # row sums 6 and 4
        ("seq-mean-token-sum-norm", (6 + 4) / 2 / 3),  # / C, C defaults to T = 3
        ("token-sum", 10.0),
    ],
)
def test_modes_by_hand(mode, want):
    assert aggregate(L, M, mode).item() == pytest.approx(want)


def test_global_counts_and_dp_size():
    # token-mean with 8 global tokens over 2 ranks: 10 / 8 * 2.
    assert aggregate(L, M, "token-mean", global_num_tokens=8, dp_size=2).item() == pytest.approx(2.5)
    # seq-mean-token-sum-norm with C = 5 and 4 global sequences: 10 / 4 / 5.
    got = aggregate(L, M, "seq-mean-token-sum-norm", global_num_seqs=4, loss_scale_factor=5)
    assert got.item() == pytest.approx(0.5)
    # loss_scale_factor is ignored by the other modes (verl passes it always).
    assert aggregate(L, M, "token-mean", loss_scale_factor=5).item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="global_num_tokens.*required when dp_size > 1"):
        aggregate(L, M, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_num_seqs.*required when dp_size > 1"):
        aggregate_sequences(torch.ones(2), M, dp_size=2)
    with pytest.raises(ValueError, match="dp_size must be an int"):
        aggregate(L, M, "token-sum", dp_size=0)
    # a global count below this call's own count cannot be a count over the global mini-batch (clamping it
    # would silently scale the loss up); an infinite one would silently zero it
    n_local = int(M.sum())
    with pytest.raises(ValueError, match=f"global_num_tokens=0 is less than the {n_local} valid tokens"):
        aggregate(L, M, "token-mean", global_num_tokens=0)
    with pytest.raises(ValueError, match="global_num_seqs=1 is less than the 2 sequences"):
        aggregate(L, M, "seq-mean-token-mean", global_num_seqs=1)
    with pytest.raises(ValueError, match="global_num_tokens must be a finite count"):
        aggregate(L, M, "token-mean", global_num_tokens=math.inf)


def _batch(seed, B=6, T=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 1  # log_prob = old + noise stays <= 0
    lp = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[2, 1] = False  # a hole
    mask[4] = False  # an empty row
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return lp, old, adv, mask


def _loss_and_grad(name, lp, old, adv, mask, **kw):
    leaf = lp.clone().requires_grad_()
    loss, _ = policy_loss(name, log_prob=leaf, old_log_prob=old, advantages=adv, response_mask=mask, **kw)
    loss.backward()
    return loss.detach(), leaf.grad


def _modes(name):
    from kpo.losses import get_loss_spec

    return get_loss_spec(name).agg_modes


# clip_cov and kl_cov pick tokens by a covariance over the whole call, as verl does per micro-batch: a split
# batch picks per piece, so they are left out (kpo.losses.covariance).
WHOLE_CALL = ("clip_cov", "kl_cov")
CASES = [
    (n, m) for n in list_losses() for m in _modes(n) if n not in ("grpo", "ppo", "geo_mean", *WHOLE_CALL)
]


@pytest.mark.parametrize("name,mode", CASES)
def test_split_batch_equals_whole_batch(name, mode):
    """Gradient accumulation: sum of micro-batch losses with global counts == loss of the whole batch; and
    data parallelism: the mean over 2 ranks of (per-rank micro-batch sums) with dp_size=2 is the same."""
    lp, old, adv, mask = _batch(1)
    hp = {"q": 1e-3} if name.startswith("kpo") else {}
    whole, whole_grad = _loss_and_grad(name, lp, old, adv, mask, loss_agg_mode=mode, **hp)
    n_tok, n_seq = int(mask.sum()), int(mask.any(-1).sum())
    counts = {"global_num_tokens": n_tok, "global_num_seqs": n_seq}
    pieces = [slice(0, 1), slice(1, 4), slice(4, 6)]
    total, grad = 0.0, torch.zeros_like(lp)
    for s in pieces:
        loss, g = _loss_and_grad(name, lp[s], old[s], adv[s], mask[s], loss_agg_mode=mode, **counts, **hp)
        total, grad[s] = total + loss, g
    assert total.item() == pytest.approx(whole.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, whole_grad, rtol=1e-12, atol=1e-14)
    # Two ranks of three rows each, every rank scaled by dp_size = 2, gradients averaged over ranks.
    ranks = [slice(0, 3), slice(3, 6)]
    dp_total, dp_grad = 0.0, torch.zeros_like(lp)
    for s in ranks:
        loss, g = _loss_and_grad(
            name, lp[s], old[s], adv[s], mask[s], loss_agg_mode=mode, dp_size=2, **counts, **hp
        )
        dp_total, dp_grad[s] = dp_total + loss / 2, g / 2
    assert dp_total.item() == pytest.approx(whole.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(dp_grad, whole_grad, rtol=1e-12, atol=1e-14)


def test_entropy_from_logits_by_hand_and_aggregate():
    # Uniform over 4 tokens: H = log 4. Logits [0, log 3, -1e9, -1e9] -> p = [1/4, 3/4, 0, 0]:
    # H = -(1/4 log 1/4 + 3/4 log 3/4).
    log3 = math.log(3.0)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, log3, -1e9, -1e9]]], dtype=torch.float64)
    h_two = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.tensor([[math.log(4.0), h_two]], dtype=torch.float64)
    )
    # Temperature 2 on logits [0, 2 log 3] is the same two-token distribution.
    hot = torch.tensor([[[0.0, 2 * log3]]], dtype=torch.float64)
    assert entropy_from_logits(hot, temperature=2.0).item() == pytest.approx(h_two)
    # Masked aggregate: only the first token is valid.
    mask = torch.tensor([[True, False]])
    assert aggregate_entropy(entropy_from_logits(logits), mask).item() == pytest.approx(math.log(4.0))
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        entropy_from_logits(torch.zeros(2, 3))
