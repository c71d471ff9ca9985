"""The documented example plan, on small settings, from a user's repository: registered (checked and sized by
simulation), committed, run to its answer on the embedded task with kpo's trainer (start models built and checked,
runs trained in parallel workers, each recorded as it ends), reported; rerun, it trains nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from tests.compare.conftest import TOY_TASK

from kpo.compare.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_the_example_plan_registers_runs_and_reports(tmp_path, monkeypatch, capsys):
    plan = yaml.safe_load((ROOT / "examples/study/plan.yaml").read_text().replace("e-4", ".0e-4"))
    # small settings: the toy task, one cell, two arms, one look at 2 seeds, 2 generation batches of 2 steps a run
    plan["setup"] = {"batches": 2, "eval_n": 2, "eval_limit": 2,
                     "train_args": [*TOY_TASK, "--prompts-per-step", 8, "--num-generations", 4,
                                    "--cache-dir", str(tmp_path / "cache")]}
    plan["cells"] = {"toy": {"depth": 2, "lr": 1e-2}}
    plan["groups"] = {"stress": {"cells": ["toy"], "looks": [2]}}
    plan["arms"] = {k: plan["arms"][k] for k in ("GRPO", "KPO (matched)")}
    plan["questions"] = [plan["questions"][0], plan["questions"][2]]
    plan["sizing"] = {"effects": {"kpo_vs_grpo": {"mean": 0.1, "sd": 0.1}}, "sims": 100}
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "plan.yaml").write_text(yaml.safe_dump(plan))
    monkeypatch.chdir(repo)

    assert main(["study", "--plan", "plan.yaml", "--study", "study", "--register"]) == 0
    out = capsys.readouterr().out
    assert "at most 4 runs" in out and "commit it before the first run" in out
    assert main(["study", "--study", "study"]) == 2  # not committed: nothing trains
    assert "is not committed" in capsys.readouterr().err
    _git(repo, "add", "study/plan.json")
    _git(repo, "commit", "-qm", "the plan")

    assert main(["study", "--study", "study", "--runs", str(tmp_path / "runs"), "--jobs", "2"]) == 0
    report = json.loads((repo / "study/report.json").read_text())
    assert report["confirmatory"] and report["ended"] and report["runs"] == 4
    assert report["seeds"]["admitted"] == [100, 101]
    gate = report["questions"]["kpo_vs_grpo"]
    assert gate["verdict"] in ("decided", "undecided") and gate["looks"][0]["seeds"] == 2
    records = json.loads((repo / "study/runs.json").read_text())
    assert sorted(records) == ["toy/kpo-memorymatched-seed100", "toy/kpo-memorymatched-seed101",
                               "toy/vanilla-seed100", "toy/vanilla-seed101"]
    assert all(len(r["reward_by_batch"]) == 2 for r in records.values())
    assert {p.name for p in (repo / "study").glob("*.png")} >= {"collapse.png", "accuracy.png"}

    monkeypatch.setattr("kpo.compare.run.ProcessPoolExecutor", None)  # a rerun must train nothing
    assert main(["study", "--study", "study", "--runs", str(tmp_path / "runs")]) == 0
    assert json.loads((repo / "study/runs.json").read_text()) == records
