"""`kpo compare` end to end at toy size: every report section appears, and a rerun trains nothing."""

from __future__ import annotations

import json
from dataclasses import replace

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
