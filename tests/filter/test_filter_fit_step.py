"""memory="auto" at cluster settings (issue 46): one q per optimizer step whatever the micro-batch size and the
number of processes, the fit under the filter's own p0 / x0 / mask mode, and batches that do not identify q
(too few tokens, a flat likelihood, extreme scales) answered the same way every time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kpo.filter.fit import Likelihood, NotIdentified, StepFit, check_bounds, fit_q, local_level_loglik
from kpo.losses import policy_loss

from .test_filter_fit import holes, simulate


def _steps(z, mask, rows_per_micro_batch, fit):
    """Feed one optimizer step's rows to ``fit`` in micro-batches and end the step."""
    for first in range(0, z.shape[0], rows_per_micro_batch):
        fit.add(z[first : first + rows_per_micro_batch], mask[first : first + rows_per_micro_batch])
    fit.finish()
    return fit.q


def test_one_q_per_step_whatever_the_micro_batch_size():
    z, mask = simulate(1e-2, 16, 128, seed=4), holes(16, 128)
    whole = fit_q(z, mask)
    by_2 = _steps(z, mask, 2, StepFit(fallback_q=1e-6))
    by_8 = _steps(z, mask, 8, StepFit(fallback_q=1e-6))
    assert by_2 == pytest.approx(whole, rel=1e-9) and by_8 == pytest.approx(whole, rel=1e-9)


def _two_ranks(rank: int, init: str, z, mask, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        half = z.shape[0] // 2
        rows = slice(rank * half, (rank + 1) * half)
        fit = StepFit(fallback_q=1e-6)
        out[rank] = _steps(z[rows], mask[rows], 2, fit)
    finally:
        dist.destroy_process_group()


def test_one_q_on_one_and_on_two_processes(tmp_path):
    """Each of 2 gloo processes holds half the rows: the step's sums are all-reduced, and both get the q of
    the whole batch in one process."""
    import torch.multiprocessing as mp

    z, mask = simulate(1e-2, 8, 128, seed=5), holes(8, 128)
    out = mp.Manager().dict()
    mp.spawn(_two_ranks, args=(f"file://{tmp_path / 'store'}", z, mask, out), nprocs=2, join=True)
    assert out[0] == out[1] == pytest.approx(_steps(z, mask, 8, StepFit(fallback_q=1e-6)), rel=1e-9)


def test_step_fit_lags_by_one_step_and_keeps_the_last_q_where_a_step_identifies_none():
    fit = StepFit(fallback_q=3e-4)
    assert fit.q == 3e-4 and fit.metrics()["kpo/q_stale"] == 1.0 and "kpo/q_low" not in fit.metrics()
    z, mask = simulate(1e-2, 8, 128, seed=6), holes(8, 128)
    q = _steps(z, mask, 4, fit)  # what step 2 filters with
    metrics = fit.metrics()
    assert metrics["kpo/q_stale"] == 0.0 and metrics["kpo/q_low"] <= q <= metrics["kpo/q_high"]
    # an on-policy step (ratios 1) and a step of one token per row: no q; the last fit stays, marked stale
    for z_bad, mask_bad in ((torch.zeros(4, 8), torch.ones(4, 8)), (torch.randn(4, 8), torch.eye(4, 8))):
        _steps(z_bad, mask_bad.bool(), 2, fit)
        assert fit.q == q and fit.metrics()["kpo/q_stale"] == 1.0 and fit.reason
    state = fit.state_dict()
    again = StepFit(fallback_q=1.0)
    again.load_state_dict(state)
    assert again.metrics() == fit.metrics()


def _loop_loglik(z, mask, q, p0, x0, mode):
    """The concentrated log-likelihood token by token, for any p0, x0 and mask mode (V = 1 while filtering)."""
    squares = log_f = 0.0
    n = 0
    for zrow, mrow in zip(z.tolist(), mask.tolist()):
        last = max((t for t, m in enumerate(mrow) if m), default=-1)
        x, p = x0, p0
        for t, (zt, valid) in enumerate(zip(zrow, mrow)):
            if t > last:
                break
            if not valid and mode == "skip":
                continue
            if not valid and mode == "advance":
                p += q
                continue
            zt = zt if valid else 0.0  # zero: a hole is an observation of 0
            f = p + q + 1.0
            e = zt - x
            squares, log_f, n = squares + e * e / f, log_f + math.log(f), n + 1
            x += (p + q) / f * e
            p = (p + q) / f
    return -0.5 * (n * math.log(2.0 * math.pi * squares / n) + n + log_f)


@pytest.mark.parametrize("mode", ["skip", "advance", "zero"])
@pytest.mark.parametrize("p0, x0", [(0.0, 0.0), (0.5, 0.3)])
def test_the_likelihood_is_the_filters_at_its_p0_x0_and_mask_mode(mode, p0, x0):
    z, mask = simulate(1e-2, 4, 40, seed=7), holes(4, 40)
    mask[:, 5:7] = False
    mask[1, :3] = False  # holes before a row's first token too
    for q in (1e-3, 0.2):
        ours = local_level_loglik(z, mask, q=q, p0=p0, x0=x0, mask_mode=mode)
        assert ours == pytest.approx(_loop_loglik(z, mask, q, p0, x0, mode), rel=1e-10)


def test_the_fit_is_under_the_losses_filter_settings():
    """A shifted start (x0) or a steady p0 is a different model, fitted as such; the loss passes its own."""
    z, mask = simulate(1e-2, 16, 64, seed=8) + 0.5, holes(16, 64)
    assert fit_q(z, mask, x0=0.5) != fit_q(z, mask)
    steady = fit_q(z, mask, p0="steady")
    assert steady != fit_q(z, mask)
    lp = (z - 20.0).requires_grad_()
    old = torch.full_like(z, -20.0)
    adv = torch.ones(16, dtype=torch.float64)
    _, metrics = policy_loss(
        "kpo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, memory="auto", p0="steady"
    )
    assert metrics["kpo/q"] == pytest.approx(steady, rel=1e-12)


def test_a_flat_likelihood_is_not_identified_and_the_loss_says_what_it_used():
    """One valid token per row: l(q) does not depend on q, and rounding used to pick 1e-8, 0.46, 10 or 100."""
    for seed in range(4):
        torch.manual_seed(seed)
        with pytest.raises(NotIdentified, match="flat in q over 1e-08..100"):
            fit_q(torch.randn(8, 1))
    lp = torch.full((8, 1), -5.0, dtype=torch.float64, requires_grad=True)
    _, metrics = policy_loss(
        "kpo",
        log_prob=lp,
        old_log_prob=torch.randn(8, 1, dtype=torch.float64) - 5.0,
        advantages=torch.ones(8),
        response_mask=torch.ones(8, 1, dtype=torch.bool),
        memory="auto",
    )
    assert (metrics["kpo/q"], metrics["kpo/q_stale"]) == (1e-6, 1.0)


def test_one_valid_token_never_stops_the_loss():
    """--micro-batch-size 1 with a response that ends at its first token: the old fit raised 'needs at least 2
    valid tokens' and killed the run."""
    lp = torch.full((1, 4), -1.0, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, False, False]])
    loss, metrics = policy_loss(
        "kpo_unclipped",
        log_prob=lp,
        old_log_prob=torch.full((1, 4), -1.2, dtype=torch.float64),
        advantages=torch.ones(1),
        response_mask=mask,
        memory="auto",
    )
    assert torch.isfinite(loss) and metrics["kpo/q_stale"] == 1.0


def test_booleans_are_not_bounds():
    for bounds in ((True, 2), (1e-8, True)):
        with pytest.raises(ValueError, match="must be a number > 0, got bool True"):
            check_bounds(bounds)
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    with pytest.raises(ValueError, match="q_max must be a number > 0, got bool True"):
        policy_loss(
            "kpo",
            log_prob=lp,
            old_log_prob=lp.detach() - 0.1,
            advantages=torch.ones(2),
            response_mask=torch.ones(2, 3, dtype=torch.bool),
            memory="auto",
            q_max=True,
        )


def test_extreme_scales_are_refused_or_not_identified_in_one_line():
    z = simulate(1e-2, 4, 64, seed=3)
    with pytest.raises(ValueError, match=r"log_ratio reaches \|.*e\+155\| at a valid token, beyond 1e\+140"):
        fit_q(z * 1e155)
    with pytest.raises(NotIdentified, match="0 to float64 precision"):
        fit_q(z * 1e-160)
    assert fit_q(z * 1e-100) == pytest.approx(fit_q(z * 1e-90), rel=1e-6)  # scale-free in between


@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64])
def test_a_non_float_log_ratio_is_named_by_its_dtype(dtype):
    with pytest.raises(TypeError, match=f"got dtype {dtype}"):
        fit_q(torch.zeros(2, 3, dtype=dtype))


def test_likelihood_grid_reduce_sees_the_same_values_in_any_split():
    """The reduce hook gets the step's pieces; summing two halves' pieces is the whole's."""
    z, mask = simulate(1e-1, 6, 64, seed=9), holes(6, 64)
    calls = []
    whole = Likelihood().add(z, mask).fit(lambda v: calls.append(v) or v)
    assert whole.low <= whole.q <= whole.high and calls and all(isinstance(c, np.ndarray) for c in calls)


@pytest.mark.parametrize("mode", ["skip", "advance", "zero"])
def test_the_compiled_token_loop_and_the_scan_give_the_same_sums(mode):
    """Two ways to the likelihood's pieces: numba's loop over tokens (the fast path) and the filter's scan (where
    numba is absent)."""
    from kpo.filter import fit

    if fit._compiled_sums is None:
        pytest.skip("numba is not installed: only the scan path exists")
    z, mask = simulate(1e-2, 6, 50, seed=10), holes(6, 50)
    mask[2, :4] = False
    part = fit._Part(*fit._prepared(z, mask), mode)
    for q, p0, x0 in ((1e-3, 0.0, 0.0), (0.3, 0.7, -0.2)):
        compiled = part.pieces(q, p0, x0)
        assert compiled == pytest.approx(part.pieces(q, p0, x0, compiled=False), rel=1e-10)


def _batches_with_noisy_on_policy_steps(noise: float) -> list[float]:
    """The q of each of 6 optimizer steps (3 generation batches of 2 steps) of a StepFit that knows the batches,
    the on-policy steps' log-ratios i.i.d. noise of sd ``noise`` (two computations of one policy on a GPU)."""
    fit = StepFit(fallback_q=1e-6, steps_per_batch=2)
    g = torch.Generator().manual_seed(3)
    qs = []
    for step in range(6):
        z = simulate(1e-2, 8, 64, seed=20 + step)
        if step % 2 == 0:
            z = noise * torch.randn(z.shape, generator=g, dtype=torch.float64)
        qs.append(fit.q)
        _steps(z, holes(8, 64), 4, fit)
    return qs


def test_a_generation_batch_s_on_policy_step_is_not_fitted():
    """Issue 54: i.i.d. noise of 1e-3 on the on-policy step fitted q = 1e-8 and filtered the next, off-policy step
    with it. With the steps of a batch known, the on-policy steps are not fitted: noise there changes no q, and
    each off-policy step's fit is the q of the next batch."""
    clean, noisy = _batches_with_noisy_on_policy_steps(0.0), _batches_with_noisy_on_policy_steps(1e-3)
    assert noisy == clean
    assert clean[:2] == [1e-6, 1e-6]  # nothing fitted before the first off-policy step ends
    assert clean[2] == clean[3] == fit_q(simulate(1e-2, 8, 64, seed=21), holes(8, 64))
    # without the batches, a q fitted to the noise is what the step after it filters with
    fit = StepFit(fallback_q=1e-6)
    _steps(1e-3 * torch.randn(8, 64, dtype=torch.float64), holes(8, 64), 4, fit)
    assert not fit.stale and fit.q != 1e-6


def _sequence_parallel(rank: int, init: str, z, mask, out) -> None:
    """One of 4 processes, a (dp 2, sp 2) mesh: ranks 2d and 2d + 1 hold the same rows (data-parallel rank d's
    half), as verl's Ulysses ranks do after gathering their log-probs."""
    import torch.distributed as dist

    from kpo._distributed import DataParallelSum, mesh_position

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=4)
    try:
        dp_rank, _ = mesh_position(2)
        rows = slice(dp_rank * 4, dp_rank * 4 + 4)
        fit = StepFit(fallback_q=1e-6, reduce=DataParallelSum(2))
        _steps(z[rows], mask[rows], 2, fit)
        out[rank] = tuple(fit.fit)
    finally:
        dist.destroy_process_group()


def test_sequence_parallel_ranks_count_their_rows_once(tmp_path):
    """The likelihood's sums over the data-parallel group only: the fit and its interval are those of the
    whole batch in one process (summed over all 4, each token counted twice, the interval narrowed)."""
    import torch.multiprocessing as mp

    z, mask = simulate(1e-2, 8, 128, seed=5), holes(8, 128)
    out = mp.Manager().dict()
    mp.spawn(_sequence_parallel, args=(f"file://{tmp_path / 'store'}", z, mask, out), nprocs=4, join=True)
    whole = Likelihood().add(z, mask).fit()
    for rank in range(4):
        assert out[rank] == pytest.approx(tuple(whole), rel=1e-9)
