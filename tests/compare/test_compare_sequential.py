"""`kpo compare --max-seeds`: a first look at --seeds, a second at the cap only while a key contrast is
undecided, the error spent over the looks by O'Brien-Fleming. Fake finished runs (no training): a run's
held-out accuracy is set per seed, and the training of a look's runs is replaced by writing them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kpo.compare import CompareError, plan_runs, run_compare
from kpo.compare.cli import main
from kpo.compare.contrasts import decide, verdict
from kpo.compare.plan import at_look, estimate
from kpo.compare.report import write_report
from kpo.compare.stats import paired_accuracy, seeds_for_effect, spending

from .conftest import write_fake_run


def _finish(cfg, run, accuracy: float) -> None:
    """A finished run of ``run`` whose held-out avg@n is ``accuracy`` (a multiple of 1 / (2 eval_n): 2 problems)."""
    folder = write_fake_run(cfg, run, problems=2)
    results = json.loads((folder / "eval.json").read_text())
    right = round(accuracy * 2 * cfg.eval_n)
    counts = [min(right, cfg.eval_n), right - min(right, cfg.eval_n)]
    for problem, correct in zip(results["benchmarks"]["synthetic"]["per_problem"], counts):
        problem["correct"] = correct
    (folder / "eval.json").write_text(json.dumps(results))


def _no_figures(monkeypatch) -> None:
    """The report without its figures, which cost seconds and decide nothing."""
    monkeypatch.setattr("kpo.compare.report.plot_training_dynamics", lambda curves, path, smooth: path)
    monkeypatch.setattr("kpo.compare.report.plot_contrasts", lambda results, path: path)


def _config(compare_config, methods=("vanilla", "kpo"), **overrides):
    return compare_config(methods=methods, seeds=4, sweep_memory=(), eval_n=20, eval_limit=2, **overrides)


def _run(cfg, accuracy, monkeypatch) -> tuple[dict, list]:
    """run_compare on ``cfg`` with the first look's runs finished and every run it trains written at
    ``accuracy(run)``; returns (report.json, the runs it trained, in the order asked)."""
    for run in plan_runs(cfg):
        _finish(cfg, run, accuracy(run))
    trained = []

    def train(jobs, workers, on_done=None):
        for job in jobs:
            trained.append(job.run)
            _finish(job.cfg, job.run, accuracy(job.run))

    monkeypatch.setattr("kpo.compare.run.train_jobs", train)
    _no_figures(monkeypatch)
    report = run_compare(cfg)
    return json.loads((report.parent / "report.json").read_text()), trained


# kpo - vanilla per seed at look 1: +34 points, sd 4 (decided at alpha_1 = 0.0056); +5 points, sd 9 (undecided)
DECIDED = (0.300, 0.350, 0.400, 0.325)
UNDECIDED = (0.100, -0.050, 0.150, 0.000)


def test_max_seeds_equal_to_seeds_writes_the_single_look_report(compare_config, monkeypatch):
    """--max-seeds = --seeds is today's compare: the same plan and report, to the last digit, and no looks."""
    _no_figures(monkeypatch)
    texts, plans = [], []
    for max_seeds in (None, 4):
        cfg = _config(compare_config, max_seeds=max_seeds)
        runs = plan_runs(cfg)
        for run in runs:
            _finish(cfg, run, 0.5 + (DECIDED[run.seed] if run.method == "kpo" else 0.0))
        report = write_report(cfg, runs, cfg.out)
        texts.append([report.read_text(), (report.parent / "report.json").read_text()])
        plans.append(estimate(cfg))
    assert texts[0] == texts[1] and plans[0] == plans[1] and "looks" not in plans[0]
    found = json.loads(texts[0][1])
    assert "looks" not in found and "## Looks" not in texts[0][0]
    assert found["contrasts"]["kpo - vanilla"]["verdict"] == "better"
    assert "sequential" not in found["contrasts"]["kpo - vanilla"]


def test_a_contrast_decided_at_the_interim_stops_the_compare_there(compare_config, monkeypatch, capsys):
    cfg = _config(compare_config, max_seeds=8)
    found, trained = _run(cfg, lambda r: 0.5 + (DECIDED[r.seed] if r.method == "kpo" else 0.0), monkeypatch)
    assert trained == []  # no run of look 2 planned
    assert not any((Path(cfg.out) / "runs" / r.name).exists() for r in plan_runs(at_look(cfg, 8)) if r.seed >= 4)
    alpha_1, alpha_2 = spending(0.05, (4, 8))
    assert alpha_1 == pytest.approx(0.00557, abs=1e-5) and alpha_1 + alpha_2 == pytest.approx(0.05)
    assert found["looks"] == {
        "planned": [{"look": 1, "seeds": 4, "alpha": alpha_1}, {"look": 2, "seeds": 8, "alpha": alpha_2}],
        "taken": [4],
        "stopped": "every key contrast decided",
    }
    c = found["contrasts"]["kpo - vanilla"]
    [look] = c["sequential"]["looks"]
    assert look["p"] == pytest.approx(c["p"]) and look["p_look"] == pytest.approx(c["p"] * 0.05 / alpha_1)
    assert c["sequential"]["p_sequential"] == c["sequential"]["p_adjusted"] == pytest.approx(look["p_look"])
    assert c["sequential"]["decided_at"] == {"look": 1, "seeds": 4} and c["verdict"] == "better"
    # the plan, printed and in plan.json, gives the looks and their shares of the error before anything trains
    planned = json.loads((Path(cfg.out) / "plan.json").read_text())["looks"]
    assert [(p["seeds"], p["alpha"]) for p in planned] == [(4, alpha_1), (8, alpha_2)]
    assert "each key contrast's test spends 0.0056 at look 1 and 0.0444 at look 2" in capsys.readouterr().out
    text = (Path(cfg.out) / "report.md").read_text()
    assert "every key contrast was decided at look 1, so the compare stopped there" in text
    assert "| kpo - vanilla | " + f"{c['p']:.2g} / {look['p_look']:.2g} | - | " in text


def test_an_undecided_contrast_at_the_interim_trains_the_next_looks_runs(compare_config, monkeypatch):
    # an ablation and an A/A arm beside the key arms: they keep their seeds, so look 2 trains key runs only
    cfg = _config(compare_config, ("vanilla",), max_seeds=8, matched=True, ablations=True, ablation_arms=("paper_qv",),
                  ablation_seeds=2, aa_seeds=2)
    later = (0.050, -0.100, 0.100, 0.000)  # seeds 4-7: still undecided at the cap

    def accuracy(run):
        subject = run.method == "kpo" and run.loss_kwargs and not run.replica
        return 0.5 + ((UNDECIDED + later)[run.seed] if subject else 0.0)

    found, trained = _run(cfg, accuracy, monkeypatch)
    cap, first = plan_runs(at_look(cfg, 8)), plan_runs(cfg)
    assert trained == [r for r in cap if r not in first]
    assert {r.seed for r in trained} == {4, 5, 6, 7}
    assert {r.arm for r in trained} == {"vanilla", "kpo (memory=matched)"}
    assert found["looks"]["taken"] == [4, 8] and found["looks"]["stopped"] == "at the cap"
    name = "kpo (memory=matched) - vanilla"
    c = found["contrasts"][name]
    assert c["seeds"] == 8 and c["verdict"] == "undecided" and c["sequential"]["decided_at"] is None
    assert [x["seeds"] for x in c["sequential"]["looks"]] == [4, 8]
    # the ablation is read once, at look 1, at the full level
    [ablation] = [x for x in found["contrasts"].values() if x["kind"] == "ablation"]
    assert [(x["look"], x["alpha"]) for x in ablation["sequential"]["looks"]] == [(1, 0.05)]
    # undecided at the cap: the seeds an 80%-power t-test needs at the level it had (alpha_2 over Holm's 2)
    d = np.subtract(UNDECIDED + later, 0.0)
    level = spending(0.05, (4, 8))[1] / 2
    assert c["sequential"]["seeds_needed_level"] == pytest.approx(level)
    assert c["sequential"]["seeds_needed"] == seeds_for_effect(float(np.std(d, ddof=1)), float(d.mean()), level)


def _look(k: int, share: float, d) -> dict:
    """A key contrast read at look ``k`` (``share``: the look's alpha) from its per-seed differences ``d``, as
    the report reads it (t where no run collapsed, its interval at 1 - share)."""
    found = paired_accuracy(d, None, 1 - share)
    return {"kind": "key", **found, "verdict": verdict(found["low"], found["high"]), "look": k, "alpha": share}


def test_the_verdict_and_its_direction_come_from_the_deciding_look():
    """kpo - vanilla is decided at look 1 (+34 points); kpo - gspo is not, so look 2 is taken, where kpo falls
    80 points below vanilla. kpo - vanilla keeps its look-1 verdict, direction and numbers: once decided, a
    contrast is looked at no more."""
    alpha_1, alpha_2 = spending(0.05, (4, 8))
    per_look = [
        {"kpo - vanilla": _look(1, alpha_1, DECIDED), "kpo - gspo": _look(1, alpha_1, UNDECIDED)},
        {
            "kpo - vanilla": _look(2, alpha_2, DECIDED + (-0.8,) * 4),
            "kpo - gspo": _look(2, alpha_2, UNDECIDED + (0.05, -0.1, 0.1, 0.0)),
        },
    ]
    assert np.mean(per_look[1]["kpo - vanilla"]["per_seed"]) < 0
    results, stop = decide(per_look, sequential=True)
    decided = results["kpo - vanilla"]
    assert decided["verdict"] == "better" and decided["seeds"] == 4 and decided["holm_rejected"]
    assert decided["mean"] == pytest.approx(np.mean(DECIDED))
    assert decided["sequential"]["decided_at"] == {"look": 1, "seeds": 4}
    assert [x["look"] for x in decided["sequential"]["looks"]] == [1]
    other = results["kpo - gspo"]
    assert other["verdict"] == "undecided" and [x["look"] for x in other["sequential"]["looks"]] == [1, 2]
    assert other["sequential"]["p_sequential"] == min(x["p_look"] for x in other["sequential"]["looks"])
    assert not stop


def test_max_seeds_below_seeds_is_refused_in_one_line(compare_config, no_training, capsys, tmp_path):
    with pytest.raises(CompareError) as e:
        run_compare(_config(compare_config, max_seeds=3))
    assert e.value.errors == [
        "--max-seeds=3: below --seeds=4; give the cap the key arms' seeds may grow to, at least --seeds (or omit "
        "it for one look at 4 seeds)"
    ]
    assert main(["--out", str(tmp_path / "x"), "--seeds", "4", "--max-seeds", "3", "--plan"]) == 2
    assert "  - --max-seeds=3: below --seeds=4" in capsys.readouterr().err
