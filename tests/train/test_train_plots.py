from __future__ import annotations

import json

import pytest

from kpo.plots import load_metrics, plot_training_dynamics


def _run(offset: float, n: int = 6) -> list[dict]:
    return [{"step": s, "reward_mean": 0.1 * s + offset, "entropy": 1.0 - 0.1 * s, "clip_frac": 0.01 * s,
             "pg_loss": None if s == 3 else -0.01 * s} for s in range(1, n + 1)]


def test_one_run_from_a_run_dir(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _run(0.0)))
    assert load_metrics(tmp_path)[2]["pg_loss"] is None  # missing values are skipped when drawing
    out = plot_training_dynamics(tmp_path, tmp_path / "fig.png", title="one run")
    assert out.stat().st_size > 10_000


def test_several_methods_with_seed_bands(tmp_path):
    runs = {"kpo": [_run(0.0), _run(0.1), _run(0.2)], "vanilla": _run(-0.1)}
    out = plot_training_dynamics(runs, tmp_path / "cmp" / "fig.png", smooth=2)
    assert out.exists() and out.stat().st_size > 10_000


def test_bad_metrics_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        load_metrics(path)
    with pytest.raises(ValueError, match="smooth=0"):
        plot_training_dynamics([{"step": 1, "reward_mean": 0.0}], tmp_path / "x.png", smooth=0)
