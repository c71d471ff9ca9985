"""`kpo compare` end to end at toy size: every report section appears, and a rerun trains nothing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kpo.compare import CompareError, plan_runs, run_compare, sweep_runs

pytestmark = pytest.mark.slow


def test_plan_reuses_the_kpo_runs_at_the_paper_and_matched_points(compare_config):
    cfg = compare_config(seeds=2, sweep_seeds=None, matched=True, sweep_memory=("paper", "matched", "2"))
    names = [r.name for r in plan_runs(cfg)]
    # 3 arms (vanilla, kpo, kpo at the matched memory) x 2 seeds, plus the sweep's memory-2 run per seed; the
    # paper and matched points are the arms' runs.
    assert names == [
        "vanilla-seed0",
        "kpo-seed0",
        "kpo-memorymatched-seed0",
        "vanilla-seed1",
        "kpo-seed1",
        "kpo-memorymatched-seed1",
        "kpo-memory2-seed0",
        "kpo-memory2-seed1",
    ]
    assert [r.name for r in sweep_runs(cfg)["paper"]] == ["kpo-seed0", "kpo-seed1"]
    assert [r.arm for r in plan_runs(cfg)[:3]] == ["vanilla", "kpo", "kpo (memory=matched)"]
    # one sweep seed: the extra points run at seed 0 only
    assert [r.name for r in sweep_runs(replace(cfg, sweep_seeds=1))["2"]] == ["kpo-memory2-seed0"]


def test_compare_writes_every_section_and_resumes(compare_config, tmp_path, capsys):
    cfg = compare_config()
    report = run_compare(cfg)
    text = report.read_text()
    for section in (
        "## Claims",
        "## Figure 3 analog",
        "## Table 1 analog",
        "## Figure 4 analog",
        "## Table 2 analog",
        "**Table 1:",
        "**Figure 3:",
        "**Figure 4:",
    ):
        assert section in text, section
    for png in ("figure3_dynamics.png", "figure4_memory_sweep.png"):
        assert (report.parent / png).stat().st_size > 1000
    data = json.loads((report.parent / "report.json").read_text())
    assert set(data["table1"]["rows"]) == {"warm start (no RL)", "vanilla", "kpo"}
    assert set(data["sweep"]) == {"paper", "2"}
    assert data["sweep"]["paper"]["memory"] == pytest.approx(1000.0, rel=1e-6)
    assert data["sweep"]["2"]["memory"] == pytest.approx(2.0)
    # the warm start was evaluated on the same problems as the runs
    warm = json.loads((tmp_path / "cmp" / "runs" / "warm_start-seed0" / "eval.json").read_text())
    assert warm["benchmarks"]["synthetic"]["problems"] == 2
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
    # Other settings into the same --out: the finished runs are not reused, and nothing is overwritten.
    with pytest.raises(
        CompareError, match=r"run vanilla-seed0 \(.*\) was made with other settings: max_steps: 4 -> 6"
    ):
        run_compare(replace(cfg, steps=6))
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/metrics.jsonl")} == stamps


def test_default_design_pairs_every_arm_with_kpo_at_the_matched_memory(compare_config):
    from kpo.compare.engines.kpo import train_argv
    from kpo.compare.plan import contrasts, estimate
    from kpo.train.flags import parse_args

    cfg = compare_config(seeds=3, matched=True, ablations=True, ablation_seeds=2, aa_seeds=1, sweep_memory=())
    runs = plan_runs(cfg)
    # seed by seed: the 2 methods, KPO (matched), the 3 ablations and the A/A replica at seed 0; seed 1 without
    # the replica; seed 2 only the methods and KPO (matched)
    assert [r.name for r in runs] == [
        "vanilla-seed0",
        "kpo-seed0",
        "kpo-memorymatched-seed0",
        "vanilla-clip_ratio_low0.0003-clip_ratio_high0.0004-seed0",
        "kpo-memorymatched-p0steady-seed0",
        "kpo-memorymatched-seed0-replica1",
        "vanilla-seed1",
        "kpo-seed1",
        "kpo-memorymatched-seed1",
        "vanilla-clip_ratio_low0.0003-clip_ratio_high0.0004-seed1",
        "kpo-memorymatched-p0steady-seed1",
        "vanilla-seed2",
        "kpo-seed2",
        "kpo-memorymatched-seed2",
    ]
    # kpo at the paper's Q/V is one of --methods here, so the ablation of that name is not run twice
    assert sum(r.arm == "kpo" for r in runs) == 3
    # the replica starts from its seed's warm start with another RL seed
    replica = parse_args(train_argv(cfg, runs[5], Path("x")))
    original = parse_args(train_argv(cfg, runs[2], Path("x")))
    assert (replica.seed, replica.warm_start_seed, original.seed, original.warm_start_seed) == (1000, 0, 0, 0)
    assert replica.resolved_loss_kwargs() == original.resolved_loss_kwargs()
    # what the report decides on, over the seeds both arms ran
    got = {c.name: (c.seeds, c.kind) for c in contrasts(cfg)}
    assert got == {
        "kpo (memory=matched) - vanilla": (3, "key"),
        "kpo (memory=matched) - kpo": (3, "key"),
        "kpo (memory=matched) - vanilla (clip_ratio_low=0.0003, clip_ratio_high=0.0004)": (2, "ablation"),
        "kpo (memory=matched) - kpo (memory=matched, p0=steady)": (2, "ablation"),
        "kpo (memory=matched) A/A replica 1 - kpo (memory=matched)": (1, "aa"),
    }
    # the plan's half-width: t_{S-1, 0.975} x sd / sqrt(S); 3 seeds: 4.302653 x 7 / sqrt(3) = 17.39 points
    est = estimate(cfg, diff_sd=7.0)
    assert est["runs"] == 14
    assert est["contrasts"]["kpo (memory=matched) - vanilla"]["half_width"] == pytest.approx(17.389, abs=1e-3)
    assert est["contrasts"]["kpo (memory=matched) A/A replica 1 - kpo (memory=matched)"]["half_width"] is None
    # a run's time: its generation batches at 4 x 0.97 s each whatever their depth, so 80 steps at depth 16 (5
    # batches) cost a quarter of the training time of 80 steps at depth 4 (20 batches): 20 x 3.88 - 5 x 3.88 = 58.2 s
    shallow, deep = (estimate(replace(cfg, steps=80, minibatches=m))["seconds_per_run"] for m in (4, 16))
    assert shallow - deep == pytest.approx(58.2)
