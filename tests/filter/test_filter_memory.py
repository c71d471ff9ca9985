"""kpo.filter.memory: the steady-state gain and memory against the gain sequence and the filter itself."""

from __future__ import annotations

import math

import pytest
import torch

from kpo import filter_memory, kalman_filter, kalman_gains, matched_memory, q_for_memory
from kpo.filter.memory import steady_state_gain, steady_state_variance


@pytest.mark.parametrize("q", [1e-8, 1e-6, 1e-4, 1.024e-3, 1e-2, 1.0, 50.0])
@pytest.mark.parametrize("v", [1.0, 0.25])
def test_steady_state_gain_is_where_the_gains_converge(q, v):
    # the gains settle within a few memories (~sqrt(v/q) tokens); 400k tokens covers q/v >= 1e-8 (memory 1e4)
    gains = kalman_gains(400_000, q=q, v=v)
    assert float(gains[-1]) == pytest.approx(steady_state_gain(q, v), rel=1e-12)


def test_a_filter_started_in_steady_state_forgets_by_e_every_memory():
    q = q_for_memory(20.0)
    gain = steady_state_gain(q)
    # the steady-state posterior variance P = (1 - K)(P + q), i.e. P = (1 - K) q / K: start there and every
    # gain is K_inf
    p0 = steady_state_variance(q)
    assert p0 == pytest.approx((1 - gain) * q / gain, rel=1e-12)
    assert torch.allclose(
        kalman_gains(50, q=q, p0=p0), torch.full((50,), gain, dtype=torch.float64), rtol=1e-12
    )
    # an observation's weight in the filtered value then decays as (1 - K)^t = exp(-t / memory)
    z = torch.zeros(1, 81, dtype=torch.float64)
    z[0, 0] = 1.0
    out = kalman_filter(z, q=q, p0=p0)
    assert float(out[0, 20] / out[0, 0]) == pytest.approx(math.exp(-1.0), rel=1e-12)
    assert float(out[0, 80] / out[0, 0]) == pytest.approx(math.exp(-4.0), rel=1e-12)


def test_the_papers_filter_remembers_1000_tokens():
    # q/v = 1e-6: K_inf = 9.995e-4, memory -1/ln(1 - K_inf) = 1000.00004 tokens; KPO-unclipped's 1e-4: 100
    assert filter_memory(1e-6) == pytest.approx(1000.0, abs=1e-3)
    assert filter_memory(1e-4) == pytest.approx(100.0, abs=1e-3)
    # only q/v matters
    assert filter_memory(2e-6, 2.0) == pytest.approx(filter_memory(1e-6, 1.0), rel=1e-12)


@pytest.mark.parametrize("memory", [0.5, 1.0, 8.0, 31.25, 1000.0, 1e6])
def test_q_for_memory_inverts_filter_memory(memory):
    assert filter_memory(q_for_memory(memory)) == pytest.approx(memory, rel=1e-9)
    assert filter_memory(q_for_memory(memory, v=3.0), v=3.0) == pytest.approx(memory, rel=1e-9)


def test_matched_memory_keeps_the_papers_memory_to_length_ratio():
    # 1000 of 4096 tokens -> 31.25 of 128 and 125 of 512; at 128 tokens that is q/v ~ 1.02e-3 (METHODS: ~1.1e-3)
    assert matched_memory(128) == pytest.approx(31.25, rel=1e-6)
    assert matched_memory(512) == pytest.approx(125.0, rel=1e-6)
    assert q_for_memory(matched_memory(128)) == pytest.approx(1.024e-3, rel=1e-3)
    assert matched_memory(4096) == pytest.approx(filter_memory(1e-6), rel=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "31"])
def test_bad_memories_are_named(bad):
    with pytest.raises(ValueError, match="memory must be a finite number of tokens > 0"):
        q_for_memory(bad)
    with pytest.raises(ValueError, match="length must be a finite number of tokens > 0"):
        matched_memory(bad)
    with pytest.raises(ValueError, match="q"):
        steady_state_gain(-1.0)


@pytest.mark.parametrize("memory", [0.01, 0.0015])
def test_a_memory_below_a_token_gives_a_filter_that_follows_each_ratio(memory):
    """Below ~0.03 tokens 1 - gain rounded to 0 and q_for_memory divided by it (ZeroDivisionError, also through
    policy_loss("kpo", memory=...) and kpo train --loss-kwargs)."""
    import kpo

    q = q_for_memory(memory)
    assert math.isfinite(q) and steady_state_gain(q) == 1.0
    z = torch.tensor([[0.1, -0.2, 0.3]], dtype=torch.float64)
    assert torch.equal(kalman_filter(z, q=q), z)
    old = torch.full_like(z, -1.0)  # log-ratios z between log-probabilities
    loss, _ = kpo.policy_loss(
        "kpo",
        log_prob=old + z,
        old_log_prob=old,
        advantages=torch.ones(1),
        response_mask=torch.ones_like(z),
        memory=memory,
    )
    assert math.isfinite(float(loss))


def test_a_memory_whose_q_overflows_is_named():
    with pytest.raises(
        ValueError, match=r"memory=0\.001 tokens needs a q beyond float64's range; give memory >= 0\.0015"
    ):
        q_for_memory(0.001)
