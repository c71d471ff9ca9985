"""`kpo compare` end to end at toy size: every report section appears, and a rerun trains nothing."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kpo.compare import CompareError, plan_runs, run_compare, sweep_runs

pytestmark = pytest.mark.slow


def test_plan_reuses_the_kpo_run_at_the_default_q(compare_config):
    cfg = compare_config(seeds=2, sweep_seeds=None)
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


def test_compare_writes_every_section_and_resumes(compare_config, tmp_path, capsys):
    cfg = compare_config()
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
    # Other settings into the same --out: the finished runs are not reused, and nothing is overwritten.
    with pytest.raises(
        CompareError, match=r"run vanilla-seed0 \(.*\) was made with other settings: max_steps: 4 -> 6"
    ):
        run_compare(replace(cfg, steps=6))
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/metrics.jsonl")} == stamps
