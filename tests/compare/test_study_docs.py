"""The README's numbers about the confirmatory study are the study's own: read from docs/results/study/report.json
(runs, questions) and plan.json (the simulation's power), not written by hand."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "docs/results/study"


def test_readme_states_the_study_as_its_report_and_plan_do():
    readme = " ".join((ROOT / "README.md").read_text().split())
    report = json.loads((STUDY / "report.json").read_text())
    plan = json.loads((STUDY / "plan.json").read_text())
    recorded, at_most = map(int, re.search(r"So far (\d+) of at most (\d+) runs are recorded", readme).groups())
    assert (recorded, at_most) == (report["runs"], report["runs_at_most"]) == (report["runs"], plan["runs_at_most"])
    assert f"asks {report['hypotheses']} questions" in readme
    power = plan["simulation"]["power"]
    measured, smaller = map(int, re.search(r"at least (\d+)% power at the exploratory map's effects and at least "
                                           r"(\d+)% at effects a third smaller", readme).groups())
    assert measured == math.floor(100 * min(power["measured"].values()))
    assert smaller == math.floor(100 * min(power["a third smaller"].values()))
    looks = plan["groups"]
    assert f"Looks at {looks['stress']['looks'][0]} and {looks['stress']['looks'][1]} seeds" in readme
    assert f"and {looks['stable']['looks'][0]} (stable cells)" in readme
    if not report["looks"]:
        assert "no look is taken" in readme
