"""A study's own files are inputs like any other, checked whenever read: the plan a user writes (every problem at
once, one line each, nothing trained), plan.json (version 2, or the first study's version 1 as registered), and
the records, seeds.json and runs.json. Each case here is one a new user's tries reached a traceback, a loop or a
silently moved answer with, before these checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from kpo.compare.plan import CompareError
from kpo.compare.study.plan import load_plan, normalize, plan_errors, read_plan_file, run_name
from kpo.compare.study.records import read_records, read_seeds, records_errors, seeds_errors

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/study/plan.yaml"
FIRST_STUDY = ROOT / "docs/results/study"


@pytest.fixture
def raw() -> dict:
    return yaml.safe_load(EXAMPLE.read_text().replace("3e-4", "3.0e-4").replace("4e-4", "4.0e-4").replace("5e-4", "5.0e-4"))


def _errors(raw: dict) -> list[str]:
    return plan_errors(raw)


def test_the_documented_example_is_a_valid_plan(raw):
    assert _errors(raw) == []
    assert read_plan_file(EXAMPLE) == raw  # YAML's 5e-4 (no dot) read as a number, as a user means it
    plan = normalize(raw)
    assert plan["questions"][0]["cells"] == plan["groups"]["stress"]["cells"]  # a question's cells: its group's
    assert plan["groups"]["stress"]["spending"] == "obrien-fleming"


@pytest.mark.parametrize(
    "edit, expected",
    [
        # a question of a group that does not exist; of an arm that does not exist; outcome "speed"
        (lambda r: r["questions"][0].update(group="nowhere"), "group 'nowhere' is not one of the groups"),
        (lambda r: r["questions"][0].update(a="PPO"), "a 'PPO' is not one of the arms"),
        (lambda r: r["questions"][0].update(outcome="speed"), "outcome 'speed' is not one of"),
        # a question's cells outside its group (the old study looped for ever on it)
        (lambda r: r["questions"][0].update(cells=["none-depth4-lr0.0001"]), "cells must be some of its group's"),
        # versus: the contrast in other cells of the group, as many of them, none of its own
        (lambda r: r["questions"][1].update(versus=["none-depth4-lr0.0005"]), "versus: as many of its group's cells"),
        (lambda r: r["questions"][1].update(cells=["bf16-depth4-lr0.0005"], versus=["bf16-depth4-lr0.0005"]),
         "versus: as many of its group's cells"),
        (lambda r: r["questions"][1].update(cells=["bf16-depth4-lr0.0005"], versus=["fp8-depth4-lr0.0005"]),
         "versus: as many of its group's cells"),
        (lambda r: r.update(questions=[]), "questions: none"),
        (lambda r: r["questions"][1].update(role="primary"), "2 primaries"),
        (lambda r: r["questions"].append(dict(r["questions"][1], key="again")), "asks what 'filter_vs_band' asks"),
        (lambda r: r["questions"][1].update(key="kpo_vs_grpo"), "key 'kpo_vs_grpo' used twice"),
        (lambda r: r["groups"]["stress"].update(looks=[20, 10]), "must grow"),
        (lambda r: r["groups"]["stress"].update(looks=[10, 10]), "must grow"),
        (lambda r: r["groups"]["stress"].update(spending=[0.05]), "one positive share of alpha per look (2)"),
        (lambda r: r["groups"]["stress"].update(spending=[0.01, 0.06]), "adds up to 0.07, not alpha 0.05"),
        (lambda r: r.update(alpha=0.1) or r["groups"]["stress"].update(spending=[0.01, 0.04]), "not alpha 0.1"),
        (lambda r: r["groups"]["stress"].update(looks="anytime"), "needs max_seeds"),
        (lambda r: r.update(collapse={"rule": "median", "value": 1}), "rule 'median' is not one of"),
        (lambda r: r.update(alpha=1.5), "alpha 1.5"),
        (lambda r: r["cells"]["none-depth4-lr0.0005"].update(depth=0), "depth 0"),
        (lambda r: r["cells"].update({"bad name/x": {"depth": 4, "lr": 1e-4}}), "a folder name"),
        (lambda r: r["arms"]["GRPO"].update(loss="grpoo"), "loss 'grpoo' is not one of kpo's"),
        (lambda r: r["arms"].update({"GRPO again": {"loss": "vanilla"}}), "the same run as arm 'GRPO'"),
        (lambda r: r["questions"][0].update(margin=0.05, alternative="two-sided"), "a margin tests one side"),
        (lambda r: r["questions"][0].update(test="mcnemar-pairs"), "sign-flip (the seed as the unit)"),
        (lambda r: r.update(sizing={"sims": 100_000_000}), "from 100 to 100000"),
        (lambda r: r.update(speed=3), "unknown key 'speed'"),
    ],
)
def test_a_plan_that_makes_no_sense_is_refused_in_one_line(raw, edit, expected):
    edit(raw)
    errors = _errors(raw)
    assert any(expected in e for e in errors), errors
    assert all("\n" not in e for e in errors)


def test_every_problem_is_listed_at_once(raw):
    raw["alpha"] = 2
    raw["questions"][0]["a"] = "PPO"
    raw["groups"]["stress"]["looks"] = [20, 10]
    assert len(_errors(raw)) >= 3


def test_no_primary_is_a_holm_family_and_unused_pieces_are_named(raw):
    raw["questions"][0]["role"] = "family"
    assert _errors(raw) == []
    raw["arms"]["GSPO"] = {"loss": "gspo"}
    raw["cells"]["lonely"] = {"depth": 4, "lr": 1e-4}
    errors = _errors(raw)
    assert any("arm 'GSPO': no question reads it" in e for e in errors)
    assert any("cell 'lonely': in no group" in e for e in errors)


def test_files_that_are_not_plans(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes("title: caf\xe9\n".encode("latin-1"))
    with pytest.raises(CompareError, match="not UTF-8"):
        read_plan_file(tmp_path / "latin1.yaml")
    (tmp_path / "twice.yaml").write_text("title: a\ntitle: b\n")
    with pytest.raises(CompareError, match="written twice"):
        read_plan_file(tmp_path / "twice.yaml")
    (tmp_path / "twice.json").write_text('{"title": "a", "title": "b"}')
    with pytest.raises(CompareError, match="written twice"):
        read_plan_file(tmp_path / "twice.json")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(CompareError, match="not a mapping"):
        read_plan_file(tmp_path / "list.yaml")
    with pytest.raises(CompareError, match="no such plan file"):
        read_plan_file(tmp_path / "missing.yaml")
    # a regime map's report is not a plan
    with pytest.raises(CompareError, match="not a study's plan"):
        load_plan(ROOT / "docs/results/regimes/report.json")


def test_the_first_study_is_read_as_it_was_registered():
    plan = load_plan(FIRST_STUDY / "plan.json")
    assert plan["version"] == 1
    tests = {q["key"]: q["test"] for q in plan["questions"]}
    assert tests == {"grpo_collapses": "mcnemar-pairs", "band_collapses": "mcnemar-pairs",
                     "auto_collapses": "mcnemar-pairs", "kpo_vs_gspo_depth4": "sign-flip"}
    # its records' keys are the run names the plan gives
    records = json.loads((FIRST_STUDY / "runs.json").read_text())
    assert all(k == f"{r['cell']}/{run_name(plan, r['arm'], r['seed'])}" for k, r in records.items())


# ------------------------------------------------------------------ records
@pytest.fixture
def first() -> tuple[dict, dict, dict]:
    plan = load_plan(FIRST_STUDY / "plan.json")
    seeds = json.loads((FIRST_STUDY / "seeds.json").read_text())
    records = json.loads((FIRST_STUDY / "runs.json").read_text())
    return plan, seeds, records


def test_the_first_studys_records_are_valid(first):
    plan, seeds, records = first
    assert seeds_errors(seeds, plan) == [] and records_errors(records, plan, seeds) == []
    assert read_records(FIRST_STUDY, plan, read_seeds(FIRST_STUDY, plan)) == records


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda s: s["admitted"].append(8), "each seed once, in ascending order"),
        (lambda s: s["admitted"].reverse(), "each seed once, in ascending order"),  # reopened an ended study
        (lambda s: s["dropped"].append({"seed": 8, "reason": "x"}), "both admitted and dropped"),
        (lambda s: s["admitted"].remove(20) or s["warm"].pop("20"), "the plan takes them in order from 8"),
        (lambda s: s["warm"].update({"8": 1.5}), "warm: each admitted seed's"),
        (lambda s: s.update(admitted=["8"]), "admitted: a list of seeds"),
    ],
)
def test_seeds_json_that_the_seed_rule_does_not_allow(first, edit, expected):
    plan, seeds, _ = first
    edit(seeds)
    assert any(expected in e for e in seeds_errors(seeds, plan))


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].pop("accuracy"), "holds accuracy"),
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].update(accuracy="0.7"), "not a fraction"),
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].update(accuracy=float("nan")), "not a fraction"),
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].update(seed="10"), "not an admitted seed"),
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].update(seed=31), "not an admitted seed"),  # the dropped one
        (lambda r: r.update({"x/gspo-seed10": dict(r["bf16-depth4-lr0.0001/gspo-seed10"])}), "its key should be"),
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].update(arm="GRPO"), "does not run in cell"),
        (lambda r: r["bf16-depth4-lr0.0001/gspo-seed10"].update(warm=0.9), "not seed 10's warm start"),
    ],
)
def test_runs_json_that_does_not_match_the_plan_and_seeds(first, edit, expected):
    plan, seeds, records = first
    edit(records)
    assert any(expected in e for e in records_errors(records, plan, seeds))


def test_a_record_written_twice_by_a_merge_is_refused_when_read(first, tmp_path):
    plan, seeds, records = first
    (tmp_path / "seeds.json").write_text(json.dumps(seeds))
    key = "bf16-depth4-lr0.0001/gspo-seed10"
    text = json.dumps(records)
    twice = text[:-1] + f', "{key}": ' + json.dumps(records[key]) + "}"  # a key written twice in one file
    (tmp_path / "runs.json").write_text(twice)
    with pytest.raises(CompareError, match="written twice"):
        read_records(tmp_path, plan, read_seeds(tmp_path, plan))
    seeds_twice = copy.deepcopy(seeds)
    seeds_twice["admitted"].insert(0, 8)
    (tmp_path / "seeds.json").write_text(json.dumps(seeds_twice))
    with pytest.raises(CompareError, match="restore it from git"):
        read_seeds(tmp_path, plan)
