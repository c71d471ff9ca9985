from __future__ import annotations

import json

import numpy as np
import pytest

from kpo.train.metrics import load_metrics
from kpo.train.plots import (
    _figure,
    auto_window,
    plot_training_dynamics,
    seed_band,
    training_figure,
)


def _run(offset: float, n: int = 6) -> list[dict]:
    return [
        {
            "step": s,
            "reward_mean": 0.1 * s + offset,
            "entropy": 1.0 - 0.1 * s,
            "clip_frac": 0.01 * s,
            "pg_loss": None if s == 3 else -0.01 * s,
        }
        for s in range(1, n + 1)
    ]


def _ys(line) -> np.ndarray:
    return np.asarray(line.get_ydata(), dtype=float)


def test_one_run_from_a_run_dir(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _run(0.0)))
    assert load_metrics(tmp_path)[2]["pg_loss"] is None  # missing values are skipped when drawing
    fig = training_figure(tmp_path, title="one run", smooth=1)
    reward, entropy, clip, loss = fig.axes
    # one run, raw: each panel's line is the logged values, step by step (pg_loss has no step 3)
    np.testing.assert_allclose(_ys(reward.lines[0]), [0.1 * s for s in range(1, 7)])
    np.testing.assert_allclose(loss.lines[0].get_xdata(), [1, 2, 4, 5, 6])
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "mean reward per completion",
        "policy entropy (nats per token)",
        "share of valid tokens clipped",
        "loss per optimizer step (no unit)",
    ]
    assert clip.get_ylim()[0] == 0.0 and not reward.collections  # a floor at 0; no band for one run
    assert plot_training_dynamics(tmp_path, tmp_path / "fig.png").stat().st_size > 10_000


def test_several_methods_with_seed_bands():
    runs = {"kpo": [_run(0.0), _run(0.1), _run(0.2)], "vanilla": [_run(-0.1)]}
    fig = training_figure(runs, smooth=2)
    reward = fig.axes[0]
    (band,) = reward.collections  # kpo's three seeds; vanilla has one run, so no band
    _, mean, lo, hi = seed_band(runs["kpo"], "reward_mean", smooth=2)
    band_ys = band.get_paths()[0].vertices[:, 1]
    # the band spans exactly the smoothed seeds' min..max at every step
    assert (
        np.isin(np.round(lo, 9), np.round(band_ys, 9)).all()
        and np.isin(np.round(hi, 9), np.round(band_ys, 9)).all()
    )
    assert band_ys.min() == pytest.approx(lo.min()) and band_ys.max() == pytest.approx(hi.max())
    smoothed, faint = reward.lines[:2]
    np.testing.assert_allclose(_ys(smoothed), mean)
    np.testing.assert_allclose(_ys(faint), seed_band(runs["kpo"], "reward_mean")[1])  # the raw mean, faint
    assert faint.get_alpha() < 0.5 and smoothed.get_label() == "kpo"
    assert "trailing mean over 2 steps" in fig.legends[0].get_title().get_text()


def test_a_metric_nobody_logged_and_a_constant_line_are_said_in_the_panel():
    rows = [{"step": s, "reward_mean": 0.5, "clip_frac": 0.0} for s in range(1, 5)]
    fig = training_figure({"kpo": [rows]}, smooth=1)
    texts = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes}
    assert texts["entropy"] == ["not logged: kpo"]
    assert texts["reward mean"] == ["every value is 0.5"] and texts["clip fraction"] == ["every value is 0"]


def test_the_default_window_is_a_twentieth_of_the_run():
    assert [auto_window(n) for n in (1, 20, 60, 200)] == [1, 1, 3, 10]
    fig = training_figure([{"step": s, "reward_mean": float(s)} for s in range(1, 61)])
    assert "trailing mean over 3 steps" in fig.legends[0].get_title().get_text()


# Two seeds: A logs reward at steps 1, 2, 4 (step 3 missing, NaN counts as missing), B at steps 1, 2, 3.
SEED_A = [
    {"step": 1, "reward_mean": 1.0},
    {"step": 2, "reward_mean": 2.0},
    {"step": 3, "reward_mean": float("nan")},
    {"step": 4, "reward_mean": 6.0},
]
SEED_B = [{"step": 1, "reward_mean": 3.0}, {"step": 2, "reward_mean": 4.0}, {"step": 3, "reward_mean": 5.0}]


def test_seed_band_is_the_mean_and_min_max_over_the_seeds_that_logged_a_step():
    steps, mean, lo, hi = seed_band([SEED_A, SEED_B], "reward_mean")
    assert steps.tolist() == [1, 2, 3, 4]
    # step 1: (1 + 3) / 2; step 3: only B; step 4: only A.
    np.testing.assert_allclose(mean, [2.0, 3.0, 5.0, 6.0])
    np.testing.assert_allclose(lo, [1.0, 2.0, 5.0, 6.0])
    np.testing.assert_allclose(hi, [3.0, 4.0, 5.0, 6.0])


def test_seed_band_smooths_each_seed_by_a_trailing_mean_first():
    _, mean, lo, hi = seed_band([SEED_A, SEED_B], "reward_mean", smooth=2)
    # Window of 2 steps, finite values only. A: 1, (1+2)/2, 2 (step 3 missing), 6 (step 3 missing);
    # B: 3, (3+4)/2, (4+5)/2, 5 (B has no step 4).
    np.testing.assert_allclose(lo, [1.0, 1.5, 2.0, 5.0])
    np.testing.assert_allclose(hi, [3.0, 3.5, 4.5, 6.0])
    np.testing.assert_allclose(mean, [2.0, 2.5, 3.25, 5.5])


@pytest.mark.parametrize("smooth", [1, 3])
def test_seed_band_of_a_metric_nobody_logged_is_empty(smooth):
    steps, mean, lo, hi = seed_band([SEED_A, SEED_B], "entropy", smooth=smooth)
    assert steps.size == mean.size == lo.size == hi.size == 0


def test_bad_metrics_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        load_metrics(path)
    with pytest.raises(ValueError, match="smooth=0"):
        plot_training_dynamics([{"step": 1, "reward_mean": 0.0}], tmp_path / "x.png", smooth=0)


@pytest.mark.parametrize("runs", [{"kpo": [_run(0.0)]}, {"Q/V=1e-06": [_run(0.0), _run(0.1)]}])
def test_one_line_is_labelled_too(runs):
    fig = _figure({label: list(group) for label, group in runs.items()}, smooth=2)
    (legend,) = fig.legends  # one legend for the four panels, below them
    assert [t.get_text() for t in legend.get_texts()] == list(runs)
