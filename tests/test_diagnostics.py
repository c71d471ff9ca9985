"""kpo.diagnostics: every statistic on hand-worked sequences, edge cases, and the vectorized path vs the loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kpo.diagnostics import (
    STAT_KEYS,
    run_lengths,
    sample_dynamics,
    token_dynamics,
    window_stats,
)
from kpo.diagnostics.reference import token_dynamics_reference

NAN = float("nan")

# Case A, one response of 7 valid tokens:
#   z      = [0, .5, .5, -.2, 0, 0, .3]
#   states = [on, up, up, down, on, on, up]     (eps 0: on iff z == 0)
Z_A = [0.0, 0.5, 0.5, -0.2, 0.0, 0.0, 0.3]


def test_public_api_keys_and_types():
    import kpo

    out = kpo.token_dynamics(torch.tensor([Z_A]), torch.ones(1, 7, dtype=torch.bool))
    assert list(out) == list(STAT_KEYS)
    assert all(type(v) is float for v in out.values())


def test_case_a_window_50():
    out = token_dynamics(np.array(Z_A), np.ones(7))
    # 3 up, 1 down, 3 on of 7 tokens.
    assert out["prop_up"] == pytest.approx(3 / 7, abs=1e-15)
    assert out["prop_down"] == pytest.approx(1 / 7, abs=1e-15)
    assert out["prop_on"] == pytest.approx(3 / 7, abs=1e-15)
    # runs: on(1) up(2) down(1) on(2) up(1) -> up (2+1)/2, down 1, on (1+2)/2
    assert out["runlen_up"] == pytest.approx(1.5, abs=1e-15)
    assert out["runlen_down"] == pytest.approx(1.0, abs=1e-15)
    assert out["runlen_on"] == pytest.approx(1.5, abs=1e-15)
    # n = 7 < 50: the whole sequence; changes on->up, up->down, down->on, on->up = 4 of 6 pairs
    assert out["switch_freq"] == pytest.approx(4 / 6, abs=1e-15)
    # mean 1.1/7; mean of squares (.25+.25+.04+.09)/7 = .09; var = .09 - (1.1/7)^2 = 0.0653061224...
    assert out["global_var"] == pytest.approx(0.09 - (1.1 / 7) ** 2, rel=1e-12)
    # fewer than 50 tokens: local variance falls back to the whole sequence
    assert out["local_var"] == pytest.approx(out["global_var"], rel=1e-12)


def test_case_a_window_3_full_windows_only():
    out = token_dynamics(np.array(Z_A), None, window=3)
    # full windows [0,.5,.5] and [-.2,0,0]; the 7th token (.3) is after the last full window and unused.
    # switches: [on,up,up] 1 change / 2, [down,on,on] 1 / 2 -> mean 0.5
    assert out["switch_freq"] == pytest.approx(0.5, abs=1e-15)
    # window 1: mean 1/3, mean sq .5/3 -> var 1/6 - 1/9 = 1/18
    # window 2: mean -.2/3, mean sq .04/3 -> var .04/3 - .04/9 = .08/9
    assert out["local_var"] == pytest.approx((1 / 18 + 0.08 / 9) / 2, rel=1e-12)
    # the global variance still uses all 7 tokens
    assert out["global_var"] == pytest.approx(0.09 - (1.1 / 7) ** 2, rel=1e-12)


def test_run_lengths_pooled_case_a():
    runs = run_lengths(
        np.array([Z_A, [0.1, 0.2, 0.0, 0.0, 0, 0, 0]]), np.array([[1] * 7, [1, 1, 1, 0, 0, 0, 0]])
    )
    # row 0: on(1) up(2) down(1) on(2) up(1); row 1 (3 valid): up(2) on(1). Runs never cross rows.
    assert runs["up"].tolist() == [2, 1, 2]
    assert runs["down"].tolist() == [1]
    assert runs["on"].tolist() == [1, 2, 1]


@pytest.mark.parametrize(
    ("x", "lf_cutoff", "expected"),
    [
        # impulse: |X_k|^2 = 1 for every k; n = 8, k_c = floor(.25*8) = 2, band {0,1,2,6,7} -> 5/8
        ([1, 0, 0, 0, 0, 0, 0, 0], 0.25, 5 / 8),
        ([-2, 0, 0, 0, 0, 0, 0, 0], 0.25, 5 / 8),  # scale and sign do not matter
        # alternating signs: all energy at k = n/2 = 2; k_c = 1, band {0,1,3} -> 0
        ([1, -1, 1, -1], 0.25, 0.0),
        # constant: all energy at k = 0 -> 1 (the mean is kept, so a constant is the lowest frequency)
        ([0.3, 0.3, 0.3, 0.3], 0.25, 1.0),
        # 2 + impulse-like: X = (5, 1, 1, 1) -> |X|^2 = (25, 1, 1, 1), total 28 = 4 * (4+1+1+1); band {0,1,3} -> 27/28
        ([2, 1, 1, 1], 0.25, 27 / 28),
        # cos(2 pi 3 t / 8): energy only at k = 3 and 5; k_c = floor(.3*8) = 2, band {0,1,2,6,7} -> 0
        ([math.cos(2 * math.pi * 3 * t / 8) for t in range(8)], 0.3, 0.0),
        # same with k_c = floor(.4*8) = 3: band {0..3, 5..7} holds both -> 1
        ([math.cos(2 * math.pi * 3 * t / 8) for t in range(8)], 0.4, 1.0),
        # k_c = 0: band {0} only; x = (1, 1, 0): X_0 = 2, total = 3 * 2 = 6 -> 4/6
        ([1, 1, 0], 0.1, 4 / 6),
    ],
)
def test_low_frequency_ratio_hand_cases(x, lf_cutoff, expected):
    out = token_dynamics(np.array(x, dtype=np.float64), None, lf_cutoff=lf_cutoff)
    assert out["lfr"] == pytest.approx(expected, abs=1e-12)


def test_holes_empty_rows_and_left_out_states():
    nan = float("nan")
    z = np.array(
        [
            [0.1, nan, 0.1, -0.1, 0.0],  # mask [1,0,1,1,0]: valid values (.1, .1, -.1): up up down
            [0.0, 0.0, 0.0, 0.0, 0.0],  # all on
            [nan, nan, nan, nan, nan],  # no valid token: left out of everything
        ]
    )
    m = np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.uint8)
    per = sample_dynamics(z, m)
    assert per["n_valid"].tolist() == [3, 5, 0]
    assert all(math.isnan(per[k][2]) for k in STAT_KEYS)
    out = token_dynamics(z, m)
    # props averaged over the 2 non-empty rows: up (2/3 + 0)/2, down (1/3 + 0)/2, on (0 + 1)/2
    assert out["prop_up"] == pytest.approx(1 / 3, abs=1e-15)
    assert out["prop_down"] == pytest.approx(1 / 6, abs=1e-15)
    assert out["prop_on"] == pytest.approx(0.5, abs=1e-15)
    # run lengths: only rows having the state count: up 2 and down 1 (row 0), on 5 (row 1)
    assert (out["runlen_up"], out["runlen_down"], out["runlen_on"]) == (2.0, 1.0, 5.0)
    # switch: row 0 the hole is closed, up,up,down -> 1 change / 2 pairs; row 1: 0 -> mean .25
    assert out["switch_freq"] == pytest.approx(0.25, abs=1e-15)
    # lfr: row 1 has no energy (left out); row 0: n = 3, k_c = 0, X_0 = .1, total = 3 * .03 -> .01/.09 = 1/9
    assert out["lfr"] == pytest.approx(1 / 9, rel=1e-12)
    # row 0: mean .1/3, mean sq .01 -> var .01 - .01/9 = .08/9; row 1: 0 -> mean .04/9
    assert out["global_var"] == pytest.approx(0.04 / 9, rel=1e-12)
    assert out["local_var"] == pytest.approx(0.04 / 9, rel=1e-12)


def test_single_token_and_all_empty():
    out = token_dynamics(np.array([[0.3]]), np.array([[1]]))
    # one up token: prop 1, one run of 1, switch 0 (n <= 1), lfr 1 (k_c = 0, band {0} = the whole spectrum), var 0
    expected = (1.0, 0.0, 0.0, 1.0, NAN, NAN, 0.0, 1.0, 0.0, 0.0)
    np.testing.assert_array_equal(list(out.values()), expected)  # NaN == NaN here
    empty = token_dynamics(np.zeros((2, 4)), np.zeros((2, 4), dtype=bool))
    assert all(math.isnan(v) for v in empty.values())


def test_all_on_row():
    out = token_dynamics(np.zeros((1, 120)), None)
    # 120 exact zeros: all on, one run of 120, no switch, no energy (lfr left out -> NaN), no variance
    assert (out["prop_on"], out["runlen_on"], out["switch_freq"]) == (1.0, 120.0, 0.0)
    assert math.isnan(out["runlen_up"]) and math.isnan(out["runlen_down"]) and math.isnan(out["lfr"])
    assert (out["global_var"], out["local_var"]) == (0.0, 0.0)


def test_on_band_thresholds():
    # r = 1.0002 (on), 1.0005 (up), 0.9996 (down), 0.9998 (on), exactly 1 + 4e-4 (on: the band is closed),
    # exactly 1 - 3e-4 (on)
    z = np.log1p(np.array([2e-4, 5e-4, -4e-4, -2e-4, 4e-4, -3e-4]))
    per = sample_dynamics(z, None, eps_low=3e-4, eps_high=4e-4)
    assert per["prop_up"][0] == pytest.approx(1 / 6) and per["prop_down"][0] == pytest.approx(1 / 6)
    # the same values with exact on (eps 0): nothing is on
    assert sample_dynamics(z, None)["prop_on"][0] == 0.0


def test_ratio_signal():
    # r = (1, 2): variance of the ratio .25; of the log-ratio (0, log 2): (log 2 / 2)^2
    z = np.array([0.0, math.log(2.0)])
    assert token_dynamics(z, None, signal="ratio")["global_var"] == pytest.approx(0.25, rel=1e-12)
    assert token_dynamics(z, None)["global_var"] == pytest.approx((math.log(2) / 2) ** 2, rel=1e-12)


def test_window_stats_hand_case():
    z = np.array(
        [
            [0.1, 0.0, 0.0, 0.0, -0.1, 0.2],  # windows of 2: [up,on] .5, [on,on] 0, [down,up] 1
            [0.3, 0.1, 0.2, 0.0, 0.0, 0.0],  # 3 valid: one full window [up,up] 1; the third token unused
            [0.5, 0.0, 0.0, 0.0, 0.0, 0.0],  # 1 valid: no full window
        ]
    )
    m = np.array([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    w = window_stats(z, m, window=2, max_windows=2)  # at most 2 windows per sample: row 0's third is dropped
    assert w["count"].tolist() == [2, 1]
    # window 0: (.5, 1) -> mean .75, population var .0625; window 1: row 0 only -> 0, var 0
    np.testing.assert_allclose(w["mean"], [0.75, 0.0], atol=1e-15)
    np.testing.assert_allclose(w["var"], [0.0625, 0.0], atol=1e-15)
    assert np.isnan(w["freq"][1, 1]) and np.isnan(w["freq"][2]).all()
    # no sample with a full window: empty curves, not NaN-filled ones
    short = window_stats(z, m, window=7)
    assert short["mean"].shape == (0,) and short["freq"].shape == (3, 0)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(window=1), "window must be an integer >= 2"),
        (dict(lf_cutoff=0.6), "lf_cutoff must be in"),
        (dict(eps_low=1.0), "eps_low must be in"),
        (dict(signal="prob"), "signal must be one of"),
    ],
)
def test_bad_options(bad, message):
    with pytest.raises(ValueError, match=message):
        token_dynamics(np.zeros(4), None, **bad)


def test_bad_inputs_name_the_place():
    z = np.zeros((2, 3))
    z[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"row 1, position 2"):
        token_dynamics(z, np.ones((2, 3)))
    token_dynamics(z, np.array([[1, 1, 1], [1, 1, 0]]))  # NaN at a masked position is fine
    with pytest.raises(ValueError, match=r"mask shape \(2, 2\) does not match log_ratio shape \(2, 3\)"):
        token_dynamics(z, np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"mask must be bool or 0/1; row 0, position 1 holds 2"):
        token_dynamics(np.zeros((1, 3)), np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match=r"shape \[B, T\] or \[T\]"):
        token_dynamics(np.zeros((1, 2, 3)), None)


def _random_batch(rng, B, T):
    z = rng.standard_t(3, size=(B, T)) * 0.3
    z[rng.random((B, T)) < 0.4] = 0.0  # exact "on" tokens
    z[rng.random((B, T)) < 0.2] *= 1e-3  # values inside and near the on band
    n = rng.integers(0, T + 1, size=B)
    m = (np.arange(T)[None, :] < n[:, None]) & (rng.random((B, T)) < 0.85)  # right padding and holes
    z[~m] = np.nan
    return z, m


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(eps_low=3e-4, eps_high=4e-4),
        dict(eps_low=0.1, eps_high=0.2, window=7, lf_cutoff=0.23),
        dict(signal="ratio", window=2, lf_cutoff=0.5),
        dict(lf_cutoff=0.0, window=13),
    ],
)
def test_vectorized_matches_loop_reference(kw):
    rng = np.random.default_rng(1234)
    for B, T in [(1, 1), (3, 2), (17, 64), (9, 301)]:
        z, m = _random_batch(rng, B, T)
        fast = sample_dynamics(z, m, **kw)
        ref = token_dynamics_reference(z, m, **kw)
        for key in STAT_KEYS:
            np.testing.assert_allclose(
                fast[key], ref[key], rtol=1e-9, atol=1e-13, err_msg=f"{key} {B}x{T} {kw}"
            )


def test_long_rows_lfr_matches_numpy_fft():
    # Bluestein with per-row n must match numpy's FFT of each row's own length, also for long rows.
    rng = np.random.default_rng(7)
    lengths = [4096, 4095, 3001, 97, 5000]
    T = max(lengths)
    z = np.zeros((len(lengths), T))
    m = np.arange(T)[None, :] < np.array(lengths)[:, None]
    z[m] = rng.normal(0.05, 0.3, size=int(m.sum()))
    lfr = sample_dynamics(z, m, lf_cutoff=0.07)["lfr"]
    for b, n in enumerate(lengths):
        power = np.abs(np.fft.fft(z[b, :n])) ** 2
        kc = math.floor(0.07 * n)
        expected = (power[: kc + 1].sum() + power[n - kc :].sum()) / power.sum()
        assert lfr[b] == pytest.approx(expected, rel=1e-10)


def test_torch_float32_input_matches_float64():
    rng = np.random.default_rng(3)
    z, m = _random_batch(rng, 6, 80)
    z = np.where(m, z, 0.0).astype(np.float32)
    a = token_dynamics(torch.from_numpy(z), torch.from_numpy(m))
    b = token_dynamics(z.astype(np.float64), m.astype(np.uint8))
    assert a.keys() == b.keys()
    for key in a:
        assert (math.isnan(a[key]) and math.isnan(b[key])) or a[key] == b[key]


@pytest.mark.parametrize(
    ("fn", "bad", "message"),
    [
        (token_dynamics, dict(window=50.0), "window must be an integer >= 2.*got float 50.0"),
        (window_stats, dict(window=50.0), "window must be an integer >= 2.*got float 50.0"),
        (window_stats, dict(max_windows=80.0), "max_windows must be an integer >= 1.*got float 80.0"),
        (window_stats, dict(window=True), "window must be an integer.*got bool True"),
    ],
)
def test_window_sizes_must_be_integers(fn, bad, message):
    # A float window sizes a reshape: 50.0 must fail the check, not crash inside numpy.
    with pytest.raises(TypeError, match=message):
        fn(np.zeros((2, 120)), None, **bad)


def test_window_sizes_accept_numpy_integers():
    w = window_stats(np.zeros((2, 120)), None, window=np.int64(50), max_windows=np.int32(1))
    assert w["count"].tolist() == [2]
    assert token_dynamics(np.zeros(120), None, window=np.int64(50))["switch_freq"] == 0.0
