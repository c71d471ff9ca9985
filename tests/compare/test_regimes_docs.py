"""The counts docs/results/README.md and docs/compare.md state about the exploratory regime map are report.json's: its
hypotheses (the Holm family's size, and the thresholds divided by it), its runs and seeds a cell, and the pairs its
questions read. Text only: nothing runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.loads((ROOT / "docs" / "results" / "regimes" / "report.json").read_text())
QUESTIONS = {q["name"]: q for q in REPORT["questions"]}


def _section(path: str, start: str, end: str) -> str:
    text = (ROOT / path).read_text()
    return text[text.index(start) : text.index(end, text.index(start))]


SECTIONS = {
    "docs/results/README.md": _section("docs/results/README.md", "## The exploratory regime map (ended at its second look)", "\n- The first map"),
    "docs/compare.md": _section("docs/compare.md", "## The regime map: `kpo compare regimes`", "### Slower or worse?"),
}


@pytest.mark.parametrize("doc", SECTIONS)
def test_hypotheses_and_runs_are_report_jsons(doc):
    text = " ".join(SECTIONS[doc].split())  # a number and its noun may sit on two lines
    stated = [int(n) for n in re.findall(r"(\d+) hypotheses", text)]
    assert stated and set(stated) == {REPORT["hypotheses"]}
    # Holm's thresholds are divided by the family's size
    divisors = [int(n) for n in re.findall(r"0\.05 (?:x 70% )?/ (\d+) = ", text)]
    assert divisors and set(divisors) == {REPORT["hypotheses"]}
    seeds = REPORT["looks"][-1]["seeds"]["stable"]
    assert re.findall(r"(\d+) runs, (\d+) seeds a cell", text) == [(str(REPORT["runs"]), str(seeds))]


def test_the_pairs_are_report_jsons():
    readme = " ".join(SECTIONS["docs/results/README.md"].split())
    collapse = QUESTIONS["grpo_collapses"]["last"]
    assert re.findall(r"in (\d+) of the (\d+) \(cell, seed\) pairs", readme) == [
        (str(collapse["a_only"]), str(collapse["pairs"]))
    ]
    docs = " ".join(SECTIONS["docs/compare.md"].split())
    assert re.findall(r"exact McNemar, (\d+) pairs", docs) == [str(collapse["pairs"])]
    survivors = [
        (str(q["last"]["pairs"]), str(q["last"]["pairs"] + q["last"]["excluded_by_collapse"]))
        for q in (QUESTIONS["band_vs_kpo"], QUESTIONS["band_vs_auto"])
    ]
    assert re.findall(r"paired t, (\d+) of (\d+) pairs", docs) == survivors
