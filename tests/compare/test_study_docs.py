"""The numbers docs/results/README.md (the results in detail) states about the first confirmatory study are the
study's own: read from docs/results/study/report.json (runs, questions) and plan.json (the simulation's power), not
written by hand."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from kpo.compare.study.report import _p, _pts

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "docs/results/study"
PAGE = ROOT / "docs/results/README.md"


def test_readme_states_the_study_as_its_report_and_plan_do():
    readme = " ".join(PAGE.read_text().split())
    report = json.loads((STUDY / "report.json").read_text())
    plan = json.loads((STUDY / "plan.json").read_text())
    recorded, at_most = map(int, re.search(r"(\d+) of at most (\d+) runs", readme).groups())
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


def test_readme_states_each_question_at_its_last_look_as_the_report_does():
    """Each question's numbers at its last look, in the plan's order: who alone collapsed (or the accuracy
    difference), the p at that look and the adjusted p; and no decision the report does not hold."""
    readme = " ".join(PAGE.read_text().split())
    report = json.loads((STUDY / "report.json").read_text())
    plan = json.loads((STUDY / "plan.json").read_text())
    if not report["looks"]:
        return
    at = readme.index("The confirmatory study")
    for key, q in report["questions"].items():
        if not q["looks"]:
            continue
        last = q["looks"][-1]
        if q["outcome"] == "collapse":
            pieces = [f"{last['a_only']} to {last['b_only']} of {last['pairs']}"]
        else:
            pieces = [f"{_pts(last['estimate'])} points [{_pts(last['low'])}, {_pts(last['high'])}] over "
                      f"{last['seeds']} seeds"]
        pieces += [f"p = {_p(last['p'])} at this look", f"adjusted p {_p(q['p_adjusted'])}"]
        for piece in pieces:  # each found after the one before: a number cannot be borrowed from another question
            found = readme.find(piece, at)
            assert found >= 0, f"README: {key}: {piece!r} not found after the question before it"
            at = found + len(piece)
    looks = [look for look in report["looks"] if look["group"] == "stress"]
    ordinal = ("first", "second", "third")[len(looks) - 1]
    assert f"At the {ordinal} look ({looks[-1]['seeds']} seeds in the stress cells" in readme
    assert ("The study has ended" in readme) == report["ended"]
    if not any(q["rejected"] for q in report["questions"].values()):
        assert "no question is decided" in readme
    else:
        assert "no question is decided" not in readme
        decided = sum(q["rejected"] for q in report["questions"].values())
        assert f"{decided} of the {report['hypotheses']} questions are decided" in readme
    for cited in re.findall(r"more than (\d+) seeds a cell", readme):  # what an undecided question would take
        assert any(q.get("seeds_needed_words", "").startswith(f"more than {cited} seeds per cell")
                   for q in report["questions"].values())
    if "under each of the plan's three other collapse rules too" in readme:  # the gate's sensitivity
        others = [s for s in report["sensitivity"]["collapse_rules"]
                  if not s["primary"] and s["question"] == "grpo_collapses"]
        assert len(others) == 3 and all(s["verdict"] == report["questions"]["grpo_collapses"]["verdict"] for s in others)
    if len(looks) == 1:
        assert f"the interim's level is {plan['groups']['stress']['spending'][0]:.2g}" in readme


def test_docs_compare_states_the_study_as_its_report_does():
    docs = " ".join((ROOT / "docs/compare.md").read_text().split())
    report = json.loads((STUDY / "report.json").read_text())
    ended = re.search(r"The study has ended \((\d+) runs, both looks", docs)
    assert bool(ended) == report["ended"]
    if ended:
        assert int(ended.group(1)) == report["runs"]
        assert [look["group"] for look in report["looks"]].count("stress") == 2


def test_the_repeated_runs_are_stated_as_the_report_tests_them():
    page = " ".join(PAGE.read_text().split())
    report = json.loads((STUDY / "report.json").read_text())
    without = report["sensitivity"]["without_repeats"]["kpo_vs_gspo_depth4"]
    seeds = sorted({r["seed"] for r in report["sensitivity"]["repeats"]})
    assert (f"seeds {seeds[0]}-{seeds[-1]} repeat the default compare's runs: its report tests that question without "
            f"them too, {without['seeds']} seeds, adjusted p {_p(without['p_adjusted'])}") in page


def test_the_second_study_is_stated_as_its_plan_and_calibration_say():
    """The filter-or-band section of docs/results/README.md: the gate's power from plan.json's simulation, the
    calibration's shares, scale and band from calibration.json."""
    page = " ".join(PAGE.read_text().split())
    folder = ROOT / "docs/results/filter-or-band"
    plan = json.loads((folder / "plan.json").read_text())
    calibration = json.loads((folder / "calibration.json").read_text())
    power = plan["simulation"]["power"]
    gate = next(q["key"] for q in plan["questions"] if q["role"] == "primary")
    assert (f"gate power {power['measured'][gate]:.2f} at the measured effect, {power['a third smaller'][gate]:.2f} "
            "at an effect a third smaller") in page  # fmt: skip
    assert plan["groups"]["stress"]["looks"] == [12, 24] and "Looks at 12 and 24 seeds" in page
    shares = calibration["shares"]
    assert f"KPO (matched) clips {100 * calibration['kpo_share']:.1f}% of off-policy tokens" in page
    assert f"the band at KPO's width only {100 * shares['band x1']['pooled']:.1f}%" in page
    assert f"the matching band is {calibration['scale']:.3f} of KPO's width" in page
    low, high = calibration["clip_ratio_low"], calibration["clip_ratio_high"]
    assert f"(clip_ratio_low {low:.2e}, clip_ratio_high {high:.2e})" in page


def test_the_second_study_states_each_question_as_its_report_does():
    """Each tested question of the filter-or-band study at the look that decided it (else its last): the estimate,
    interval and seeds, the p at that look and the adjusted p, in the plan's order; how many are decided, the runs,
    what an undecided one would need, and each arm's collapses over both cells."""
    page = " ".join(PAGE.read_text().split())
    report = json.loads((ROOT / "docs/results/filter-or-band/report.json").read_text())
    at = page.index("## Filter or band (the second study")
    assert (f"The study has ended: {report['runs']} of at most {report['runs_at_most']} runs" in page) == report["ended"]
    tested = {k: q for k, q in report["questions"].items() if q["role"] != "descriptive"}
    decided = sum(q["rejected"] for q in tested.values())
    assert f"{decided} of the {len(tested)} tested questions are decided" in page
    for key, q in tested.items():
        look = next(x for x in q["looks"] if x["seeds"] == q["decided_at_seeds"]) if q["rejected"] else q["looks"][-1]
        pieces = [f"{_pts(look['estimate'])} points [{_pts(look['low'])}, {_pts(look['high'])}] over {look['seeds']} "
                  "seeds", f"p = {_p(look['p'])} at this look", f"adjusted p {_p(q['p_adjusted'])}"]
        if q["verdict"] == "undecided":
            pieces.append(q["seeds_needed_words"].split(" for ")[0].replace(" per cell", " a cell"))
        for piece in pieces:
            found = page.find(piece, at)
            assert found >= 0, f"docs/results/README.md: {key}: {piece!r} not found after the question before it"
            at = found + len(piece)
    cells = report["descriptive"]["stress"]["cells"].values()
    plan = json.loads((ROOT / "docs/results/filter-or-band/plan.json").read_text())
    for arm in plan["arms"]:
        k, n = (sum(c[arm]["collapse"][x] for c in cells if arm in c) for x in ("k", "n"))
        assert f"{arm} {k} of {n}" in page
