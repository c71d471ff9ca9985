"""A recorded check: the committed reports of the exploratory regime map and of the default compare are
reproduced to the digit from the records they hold (each cell's and contrast's per-seed outcomes), by the tests
that decided them then (kpo.compare.questions for the map's questions, kpo.compare.contrasts for the compare's
contrasts and their Holm family). Nothing trains; a change to those tests that moves a committed answer fails
here. (The first study's: tests/compare/test_study.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpo.compare.contrasts import decide as decide_contrasts
from kpo.compare.contrasts import verdict
from kpo.compare.questions import decide as decide_questions
from kpo.compare.regimes import QUESTIONS, Cell
from kpo.compare.stats import paired_accuracy

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_the_regime_maps_answers_from_its_per_seed_outcomes():
    report = json.loads((RESULTS / "regimes" / "report.json").read_text())
    data = {c["cell"]: {arm: list(zip(v["accuracy"], v["collapsed"])) for arm, v in c["arms"].items()}
            for c in report["cells"]}
    cells = [Cell(c["mismatch"], c["depth"], c["lr"]) for c in report["cells"]]
    found = decide_questions(QUESTIONS, data, cells, report["looks"][-1]["seeds"])
    assert len(found) == len(report["questions"])
    for again, then in zip(found, report["questions"]):
        for key in ("name", "verdict", "answer", "p_looks", "p_adjusted"):
            assert again[key] == then[key], (then["name"], key)
        assert [look["p"] for look in again["looks"]] == [look["p"] for look in then["looks"]], then["name"]


def test_the_default_compares_contrasts_from_their_per_seed_differences():
    """No run of the default compare collapsed, so each contrast is the paired t over its seeds; the key and
    ablation contrasts' verdicts are Holm's over those five (one look)."""
    report = json.loads((RESULTS / "compare" / "report.json").read_text())
    again = {}
    for name, c in report["contrasts"].items():
        found = paired_accuracy(c["per_seed"], [False] * c["seeds"])
        for key in ("mean", "low", "high"):
            assert found[key] == pytest.approx(c[key], rel=1e-12, abs=1e-15), (name, key)
        again[name] = {"kind": c["kind"], "seeds": c["seeds"], **found, "verdict": verdict(found["low"], found["high"])}
    decided, _ = decide_contrasts([again], sequential=False)
    assert {n: c["verdict"] for n, c in decided.items()} == {n: c["verdict"] for n, c in report["contrasts"].items()}
