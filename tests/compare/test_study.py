"""The confirmatory study (kpo.compare.study, study_run, study_report): its tests against scipy/statsmodels, the
gatekept sequential decisions on hand-made data, the simulation that sized it, the seed rule, and the plan's
commit check. No training: the runner's pieces are driven with records and fake warm-start builders."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from kpo.compare.plan import CompareError
from kpo.compare.study import (
    ALPHA,
    QUESTIONS,
    _decide_many,
    _sign_flip_many,
    analyze,
    collapsed,
    design,
    gate_and_holm,
    sign_flip_p,
    simulate,
    simulation_inputs,
    spending,
)
from kpo.compare.study_report import batch_of_collapse, confirmatory
from kpo.compare.study_run import Study, _admit, _jobs, _run, _write_json, plan_commit, register, run_study

ROOT = Path(__file__).resolve().parents[2]
EXPLORATORY = ROOT / "docs/results/regimes/report.json"
COMMITTED_PLAN = ROOT / "docs/results/study/plan.json"


# ------------------------------------------------------------------ the tests and the spending
def test_spending_is_obrien_fleming_and_adds_to_alpha():
    # Lan-DeMets O'Brien-Fleming at t = 1/2: 2 - 2 Phi(1.959964 / sqrt(0.5)) = 2 - 2 Phi(2.771808) = 0.005575
    first, second = spending(0.05, (14, 28))
    assert first == pytest.approx(0.005575, abs=2e-6)
    assert first + second == pytest.approx(0.05, abs=1e-15)
    assert spending(0.05, (12,)) == [0.05]


def test_sign_flip_p_hand_cases_and_parity_with_the_vectorized_simulation():
    # five positive differences: 2 of the 32 sign patterns have |mean| >= the observed one -> p = 2/32
    assert sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    # mean 0 by construction: every pattern is at least as extreme -> p = 1
    assert sign_flip_p([1.0, -1.0]) == pytest.approx(1.0)
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0
    rng = np.random.default_rng(3)
    d = rng.normal(-0.03, 0.04, size=(40, 9))
    d[0, :] = 0.02  # ties in |d|: exactness of the comparison matters
    ours = _sign_flip_many(d)
    assert ours == pytest.approx([sign_flip_p(row) for row in d], abs=1e-12)


def test_vectorized_decisions_equal_the_gate_and_statsmodels_holm():
    rng = np.random.default_rng(5)
    p = {q.key: rng.uniform(0, 0.12, size=200) for q in QUESTIONS}
    many = _decide_many(p)
    assert 0 < sum(many["band_collapses"]) < 200  # the draws cover both decisions
    for i in range(200):
        rejected, _ = gate_and_holm({k: float(v[i]) for k, v in p.items()})
        assert rejected == {k: bool(v[i]) for k, v in many.items()}


def test_gate_closed_tests_no_family_member_and_adjusted_p_is_at_least_the_gates():
    p = {"grpo_collapses": 0.2, "band_collapses": 1e-6, "auto_collapses": 1e-6, "kpo_vs_gspo_depth4": 1e-6}
    rejected, adjusted = gate_and_holm(p)
    assert not any(rejected.values())
    assert all(adjusted[k] == 0.2 for k in p)
    # gate open: Holm over the three (3 x 0.01 = 0.03, 2 x 0.02 = 0.04, 1 x 0.04 = 0.04)
    rejected, adjusted = gate_and_holm({**p, "grpo_collapses": 0.001, "band_collapses": 0.01,
                                        "auto_collapses": 0.02, "kpo_vs_gspo_depth4": 0.04})
    assert all(rejected.values())
    assert adjusted["band_collapses"] == pytest.approx(0.03)
    assert adjusted["auto_collapses"] == pytest.approx(0.04)


def test_collapse_rules():
    assert collapsed(0.11, 0.23) and not collapsed(0.12, 0.23)  # half of 23% is 11.5%
    assert collapsed(0.04, 0.23, {"rule": "below_absolute", "value": 0.05})
    assert collapsed(0.22, 0.23, {"rule": "below_fraction_of_warm", "value": 1.0})
    with pytest.raises(ValueError, match="collapse rule"):
        collapsed(0.1, 0.2, {"rule": "median", "value": 1})


# ------------------------------------------------------------------ the simulation that sized the design
@pytest.fixture(scope="module")
def exploratory() -> dict:
    return json.loads(EXPLORATORY.read_text())


def test_simulation_family_wise_error_and_power(exploratory):
    """The design's error and power, 2000 simulated studies (a few seconds): family-wise error consistent with
    at most 5% under the global null and each partial null (a one-sided binomial test of the simulated count),
    power >= 90% at the exploratory map's effects and >= 50% at effects a third smaller, every question."""
    from scipy.stats import binomtest

    plan = json.loads(COMMITTED_PLAN.read_text())
    looks = {g: v["looks"] for g, v in plan["groups"].items()}
    sim = simulate(simulation_inputs(exploratory), looks, sims=2000, seed=11)
    for scenario, fwer in sim["fwer"].items():
        assert binomtest(round(fwer * 2000), 2000, ALPHA, alternative="greater").pvalue > 0.001, scenario
    assert min(sim["power"]["measured"].values()) >= 0.9
    assert min(sim["power"]["a third smaller"].values()) >= 0.5


def test_the_committed_plan_is_what_design_gives(exploratory):
    """plan.json was written by design() from the committed exploratory map: recomputed, everything but the
    registration time agrees (its simulation too: same seed)."""
    plan = json.loads(COMMITTED_PLAN.read_text())
    again = json.loads(json.dumps(design(exploratory)))
    assert {k: v for k, v in plan.items() if k != "registered"} == again


# ------------------------------------------------------------------ the analysis on hand-made data
def _plan(tmp_path: Path) -> dict:
    plan = json.loads(COMMITTED_PLAN.read_text())
    return plan


def _data(plan: dict, seeds: list[int], grpo_falls: int, band_falls: int = 0, auto_falls: int = 0,
          gap: float = -0.05, stress_seeds: int | None = None) -> dict:
    """Stress: GRPO / band / auto collapse (accuracy 0 against warm 0.2) in their first ``*_falls`` seeds of every
    cell, KPO never; stable: KPO = GSPO + gap + a small spread."""
    data: dict = {}
    stress = plan["groups"]["stress"]
    for cell in stress["cells"]:
        for arm in stress["arms"]:
            falls = {"GRPO": grpo_falls, "clip band": band_falls, "KPO (auto)": auto_falls}.get(arm, 0)
            data.setdefault(cell, {})[arm] = {
                s: (0.0 if i < falls else 0.5, 0.2) for i, s in enumerate(seeds[: stress_seeds or len(seeds)])
            }
    stable = plan["groups"]["stable"]
    for cell in stable["cells"]:
        data[cell] = {
            "GSPO": {s: (0.6, 0.2) for s in seeds},
            "KPO (matched)": {s: (0.6 + gap + 0.01 * ((i % 3) - 1), 0.2) for i, s in enumerate(seeds)},
        }
    return data


def test_a_look_is_taken_only_when_every_run_of_it_is_there(tmp_path):
    plan = _plan(tmp_path)
    seeds = list(range(8, 36))
    data = _data(plan, seeds, grpo_falls=10, band_falls=6, auto_falls=8)
    cell = plan["groups"]["stress"]["cells"][0]
    del data[cell]["GRPO"][seeds[3]]  # one run of the first look missing
    found = analyze(plan, data, seeds)
    assert found["looks"] == []
    assert all(q["verdict"] == "open" for q in found["questions"].values())
    assert found["next"] == {"stress": 14, "stable": 12}


def test_interim_decides_the_clear_questions_and_their_arms_stop(tmp_path):
    plan = _plan(tmp_path)
    seeds = list(range(8, 36))
    # 28 pairs at the interim (14 seeds x 2 cells): GRPO alone 20 -> p = 2 x 0.5^20, x 0.05/0.005575 -> 1.7e-5
    data = _data(plan, seeds, grpo_falls=10, band_falls=1, auto_falls=8, stress_seeds=14)
    found = analyze(plan, data, seeds)
    q = found["questions"]
    assert q["grpo_collapses"]["verdict"] == "yes" and q["grpo_collapses"]["decided_at_seeds"] == 14
    assert q["auto_collapses"]["verdict"] == "yes"
    assert q["kpo_vs_gspo_depth4"]["verdict"] == "yes"  # 12 seeds all below: p = 2 / 4096
    assert q["band_collapses"]["verdict"] == "open"
    assert found["next"] == {"stress": 28}
    assert found["active"] == {"stress": ["KPO (matched)", "clip band"]}  # GRPO and auto stop


def test_a_family_member_whose_looks_are_spent_stays_open_while_the_gate_is(tmp_path):
    plan = _plan(tmp_path)
    seeds = list(range(8, 36))
    # the interim: GRPO alone 2 of 28 pairs, the gate open; the stable cells' one look (12 seeds, all KPO below
    # GSPO: sign-flip p = 2 / 4096) is taken, but the gate can still open at 28 seeds and Holm then decide it
    found = analyze(plan, _data(plan, seeds, grpo_falls=1, stress_seeds=14), seeds)
    assert found["next"] == {"stress": 28}
    stable = found["questions"]["kpo_vs_gspo_depth4"]
    assert len(stable["looks"]) == 1 and stable["p_sequential"] < 0.001
    assert stable["verdict"] == "open" and "waits for the gate" in stable["answer"]
    # ... and GRPO collapses in every later seed: the gate opens at the last look (30 of 56 pairs GRPO alone, 0
    # KPO alone) and the stable question, its look long taken, is decided with it
    data = _data(plan, seeds, grpo_falls=1)
    for cell in plan["groups"]["stress"]["cells"]:
        for s in seeds[14:]:
            data[cell]["GRPO"][s] = (0.0, 0.2)
    found = analyze(plan, data, seeds)
    assert found["next"] is None and found["questions"]["grpo_collapses"]["decided_at_seeds"] == 28
    assert found["questions"]["grpo_collapses"]["verdict"] == "yes"
    assert found["questions"]["kpo_vs_gspo_depth4"]["verdict"] == "yes"


def test_direction_comes_from_the_look_that_rejected_and_undecided_at_the_cap(tmp_path):
    plan = _plan(tmp_path)
    seeds = list(range(8, 36))
    data = _data(plan, seeds, grpo_falls=10, band_falls=1, auto_falls=8)
    # after the interim, KPO collapses where auto does not in seeds 15-27: the auto question was decided at 14
    # seeds (auto collapses more) and keeps that direction whatever the last look shows
    for cell in plan["groups"]["stress"]["cells"]:
        for s in seeds[14:]:
            data[cell]["KPO (matched)"][s] = (0.0, 0.2)
    found = analyze(plan, data, seeds)
    auto = found["questions"]["auto_collapses"]
    assert auto["decided_at_seeds"] == 14 and auto["verdict"] == "yes"
    assert found["next"] is None  # the study ended
    band = found["questions"]["band_collapses"]
    assert band["verdict"] in ("no", "undecided")
    assert found["questions"]["grpo_collapses"]["verdict"] == "yes"


def test_gate_not_passed_leaves_every_family_member_undecided(tmp_path):
    plan = _plan(tmp_path)
    seeds = list(range(8, 36))
    found = analyze(plan, _data(plan, seeds, grpo_falls=0, band_falls=10, auto_falls=10, gap=-0.2), seeds)
    assert found["next"] is None
    assert {k: v["verdict"] for k, v in found["questions"].items()} == {k.key: "undecided" for k in QUESTIONS}
    assert found["questions"]["band_collapses"]["p_adjusted"] == 1.0


# ------------------------------------------------------------------ the runner's pieces
def _study(tmp_path: Path) -> Study:
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "plan.json").write_text(COMMITTED_PLAN.read_text())
    return Study(folder, tmp_path / "runs")


def test_register_writes_once(tmp_path, exploratory):
    path = register(tmp_path / "s", EXPLORATORY, sims=200)
    plan = json.loads(path.read_text())
    assert [q["key"] for q in plan["questions"]] == [q.key for q in QUESTIONS]
    with pytest.raises(CompareError, match="written once"):
        register(tmp_path / "s", EXPLORATORY, sims=200)


def test_a_seed_whose_warm_start_fails_is_dropped_and_the_next_takes_its_place(tmp_path, monkeypatch):
    study = _study(tmp_path)
    built = []

    def build(cfg, candidates):
        built.append(list(candidates))
        for s in candidates:  # the outcome file a finished warm start leaves
            folder = study.runs / f"warm_start-seed{s}"
            (folder / "expected.json").write_text(json.dumps({"mean": 0.2 + s / 1000, "per_problem": [0.2]}))
        return ["expected accuracy 0.0% (band 15.2-34.5%)" if s == 9 else None for s in candidates]

    assert _admit(study, 3, build) == [8, 10, 11]
    assert built == [[8, 9, 10], [11]]
    seeds = json.loads((study.folder / "seeds.json").read_text())
    assert seeds["dropped"] == [{"seed": 9, "reason": "expected accuracy 0.0% (band 15.2-34.5%)"}]
    assert seeds["warm"]["11"] == pytest.approx(0.211)
    assert _admit(study, 3, build) == [8, 10, 11] and len(built) == 2  # admitted seeds are kept


def test_recorded_runs_are_never_trained_again(tmp_path):
    study = _study(tmp_path)
    plan = study.plan
    seeds = list(range(8, 22))
    _write_json(study.folder / "seeds.json", {"admitted": seeds, "warm": {str(s): 0.2 for s in seeds}, "dropped": []})
    answer = analyze(plan, study.data(), seeds)
    planned = _jobs(study, answer, seeds)
    assert len(planned) == 14 * 2 * 4 + 12 * 2 * 2  # the first look: stress 14 seeds, stable 12
    records = {
        job.label: {"cell": cell.name, "arm": label, "seed": job.run.seed, "accuracy": 0.5, "warm": 0.2,
                    "reward_by_batch": [0.3, 0.4], "started": time.time()}
        for cell, label, job in planned[:10]
    }
    _write_json(study.folder / "runs.json", records)
    assert len(_jobs(study, analyze(plan, study.data(), seeds), seeds)) == len(planned) - 10
    assert all(job.label == f"{cell.name}/{_run(label, job.run.seed).name}" for cell, label, job in planned)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_a_study_runs_only_from_a_committed_plan_and_runs_before_it_are_not_confirmatory(tmp_path):
    study = _study(tmp_path)
    with pytest.raises(CompareError, match="is not committed"):
        run_study(study)
    _git(study.folder, "init", "-q")
    _git(study.folder, "add", "plan.json")
    _git(study.folder, "commit", "-qm", "plan")
    found = plan_commit(study.folder)
    assert found["commit"] and found["clean"]
    assert confirmatory(found, {"a": {"started": found["time"] + 5}})[0]
    ok, why = confirmatory(found, {"a": {"started": found["time"] - 60}})
    assert not ok and "before the plan's commit" in why
    (study.folder / "plan.json").write_text(COMMITTED_PLAN.read_text() + " ")
    assert not plan_commit(study.folder)["clean"]
    with pytest.raises(CompareError, match="differs from its committed version"):
        run_study(study)


def test_batch_of_collapse():
    assert batch_of_collapse([0.3, 0.4, 0.1, 0.0, 0.0]) == 3  # below 0.15 from the third batch on
    assert batch_of_collapse([0.3, 0.1, 0.4, 0.1]) == 4
    assert batch_of_collapse([0.3, 0.4, 0.5]) is None


def test_report_from_records_alone(tmp_path):
    """The report reads only the committed folder (plan, seeds, records): no run folders. Not committed here, so it
    is labelled exploratory, and the look it has not reached stays open."""
    study = _study(tmp_path)
    plan = study.plan
    seeds = list(range(8, 22))
    _write_json(study.folder / "seeds.json", {"admitted": seeds, "warm": {str(s): 0.2 for s in seeds},
                                              "dropped": [{"seed": 22, "reason": "expected accuracy 0.0%"}]})
    records = {}
    for group in plan["groups"].values():
        for cell in group["cells"]:
            for arm in group["arms"]:
                for i, s in enumerate(seeds[:3]):
                    acc = 0.0 if arm == "GRPO" and i == 0 else 0.5 + 0.01 * i
                    records[f"{cell}/{_run(arm, s).name}"] = {
                        "cell": cell, "arm": arm, "seed": s, "accuracy": acc, "warm": 0.2,
                        "reward_by_batch": [0.3, 0.1, 0.0] if acc == 0 else [0.3, 0.5], "started": time.time()}
    _write_json(study.folder / "runs.json", records)
    report_md = run_study(study, report_only=True)
    report = json.loads((study.folder / "report.json").read_text())
    assert report["study"] == "exploratory" and "not committed" in report["why"]
    assert report["runs"] == len(records) and report["hypotheses"] == 4
    assert report["seeds"]["drop_rate"] == pytest.approx(1 / 15)
    assert all(q["verdict"] == "open" for q in report["questions"].values())
    stress = report["descriptive"]["stress"]["cells"]["none-depth4-lr0.0005"]["GRPO"]
    assert stress["collapse"]["k"] == 1 and stress["batch_of_collapse"] == [2, None, None]
    text = report_md.read_text()
    assert "not confirmatory" in text and "22" in text
    # the plan's simulated error with its exact interval: 102 of 2000 studies (0.051) is [0.042, 0.062], so 5% is
    # inside it (Clopper-Pearson, scipy's binomtest)
    assert "| kpo_vs_gspo_depth4 null | 0.051 | [0.042, 0.062] |" in text
    assert {p.name for p in study.folder.glob("*.png")} == {"collapse.png", "time_to_collapse.png", "accuracy.png"}


def test_probability_of_improvement_is_mann_whitney_u_over_nm():
    from scipy.stats import mannwhitneyu

    from kpo.compare.study_report import probability_of_improvement

    rng = np.random.default_rng(2)
    xs = [rng.choice([0.0, 0.5, 0.6], size=7), rng.normal(0.5, 0.1, size=5)]
    ys = [rng.choice([0.0, 0.5, 0.6], size=6), rng.normal(0.45, 0.1, size=5)]
    expected = np.mean([mannwhitneyu(x, y).statistic / (x.size * y.size) for x, y in zip(xs, ys)])
    assert probability_of_improvement(xs, ys) == pytest.approx(expected, abs=1e-12)
    # hand case: X = [1, 2], Y = [2]: 1 < 2 (0), 2 = 2 (a half) -> 0.25
    assert probability_of_improvement([np.array([1.0, 2.0])], [np.array([2.0])]) == pytest.approx(0.25)


def test_seeds_needed_at_the_level_each_question_faces(tmp_path):
    """The gate is tested at the full 5%, a family member at Holm's first threshold (5% / 3): the seeds an undecided
    question would need are sized at those levels (the gate's were sized at 5% / 3 too)."""
    from kpo.compare.stats import discordance_seeds
    from kpo.compare.study_report import _seeds_needed

    plan = _plan(tmp_path)
    look = {"a_only": 7, "b_only": 2, "pairs": 28}  # 28 (cell, seed) pairs over the 2 stress cells
    gate = {"role": "primary", "kind": "collapse", "cells": ["a", "b"], "looks": [look]}
    band = {**gate, "role": "family"}
    assert _seeds_needed(gate, plan) == discordance_seeds(7, 2, 28, 2, 0.05)
    assert _seeds_needed(band, plan) == discordance_seeds(7, 2, 28, 2, 0.05 / 3)
    assert _seeds_needed(gate, plan) < _seeds_needed(band, plan)


def test_what_an_undecided_question_would_take_is_said_in_words(tmp_path):
    """The report says what deciding would take even where no number of seeds comes out: the study's own band
    question ended at 4 to 2 of 56 pairs, which needs more seeds than the search tries, and an effect of 0 needs
    none that would do; behind a closed gate the gate comes first."""
    from kpo.compare.stats import MOST_SEEDS
    from kpo.compare.study_report import _seeds_needed, _seeds_needed_words

    plan = _plan(tmp_path)
    band = {"role": "family", "kind": "collapse", "cells": ["a", "b"],
            "looks": [{"a_only": 4, "b_only": 2, "pairs": 56}]}
    assert _seeds_needed(band, plan) is None
    assert _seeds_needed_words(band, plan, None, True).startswith(f"more than {MOST_SEEDS} seeds per cell")
    tied = {**band, "looks": [{"a_only": 3, "b_only": 3, "pairs": 56}]}
    assert _seeds_needed_words(tied, plan, None, True).startswith("no number of seeds")
    lopsided = {**band, "looks": [{"a_only": 7, "b_only": 2, "pairs": 28}]}
    n = _seeds_needed(lopsided, plan)
    assert _seeds_needed_words(lopsided, plan, n, True).startswith(f"about {n} seeds per cell for 80% power at level 0.017")
    assert _seeds_needed_words(lopsided, plan, n, False).startswith(f"the gate's rejection first, then about {n}")
