"""`kpo compare` end to end at toy size: every report section appears, and a rerun trains nothing."""

from __future__ import annotations

import json

import pytest

from kpo.compare import CompareConfig, plan_runs, run_compare, sweep_runs

pytestmark = pytest.mark.slow

# The train tests' toy (tests/train/conftest.py): a 1-layer model warm-started to a reward of about 0.6 on
# sums of two numbers up to 4, so advantages are not all zero and lr 1e-2 moves the ratios visibly.
TOY_TRAIN = (
    "--n-terms", "2", "--max-value", "4", "--tiny-hidden-size", "32", "--tiny-layers", "1", "--tiny-heads", "2",
    "--sft-examples", "12", "--sft-epochs", "300", "--prompts-per-step", "8", "--num-generations", "4",
    "--learning-rate", "1e-2",
)  # fmt: skip


def _config(tmp_path, **kw) -> CompareConfig:
    base = dict(out=str(tmp_path / "cmp"), methods=("vanilla", "kpo"), seeds=1, steps=4, minibatches=2,
                sweep_q=(1e-6, 1e-2), sweep_seeds=1, eval_n=2, eval_limit=2, dump_every=1, jobs=2,
                train_args=(*TOY_TRAIN, "--cache-dir", str(tmp_path / "cache")))  # fmt: skip
    return CompareConfig(**{**base, **kw})


def test_plan_reuses_the_kpo_run_at_the_default_q(tmp_path):
    cfg = _config(tmp_path, seeds=2, sweep_seeds=None)
    names = [r.name for r in plan_runs(cfg)]
    # 2 methods x 2 seeds, plus the sweep's Q=1e-2 run per seed; Q=1e-6 is kpo's default, i.e. the kpo run.
    assert names == [
        "vanilla-seed0",
        "kpo-seed0",
        "vanilla-seed1",
        "kpo-seed1",
        "kpo-q0.01-seed0",
        "kpo-q0.01-seed1",
    ]
    assert [r.name for r in sweep_runs(cfg)[1e-6]] == ["kpo-seed0", "kpo-seed1"]


def test_quick_mode_shrinks_the_budget():
    cfg = CompareConfig(quick=True)
    assert (cfg.steps, cfg.sweep_seeds, cfg.eval_n) == (120, 1, 4)


def test_compare_writes_every_section_and_resumes(tmp_path, capsys):
    cfg = _config(tmp_path)
    report = run_compare(cfg)
    text = report.read_text()
    for section in ("## Claims", "## Figure 3 analog", "## Table 1 analog", "## Figure 4 analog",
                    "## Table 2 analog", "**Table 1:", "**Figure 3:", "**Figure 4:"):  # fmt: skip
        assert section in text, section
    for png in ("figure3_dynamics.png", "figure4_qv_sweep.png"):
        assert (report.parent / png).stat().st_size > 1000
    data = json.loads((report.parent / "report.json").read_text())
    assert set(data["table1"]["rows"]) == {"vanilla", "kpo"}
    assert set(data["sweep"]) == {"1e-06", "0.01"}
    # Table 2 comes from real off-policy ratios: the second mini-batch of each generation batch moved them.
    assert set(data["table2"]) == {"vanilla", "kpo"}
    assert data["table2"]["kpo"]["before"]["prop_on"] < 1.0
    out = capsys.readouterr().out
    assert "3 runs, 0 already done" in out

    runs = tmp_path / "cmp" / "runs"
    stamps = {p: p.stat().st_mtime_ns for p in runs.glob("*/metrics.jsonl")}
    assert len(stamps) == 3
    run_compare(cfg)
    assert "3 runs, 3 already done" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/metrics.jsonl")} == stamps


def test_unknown_method_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="unknown policy loss 'nope'"):
        run_compare(_config(tmp_path, methods=("vanilla", "nope")))
    assert not (tmp_path / "cmp" / "runs").exists()
