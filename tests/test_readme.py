"""The README is a front door a newcomer reads in five minutes: at most 200 lines and about 1,200 words, the two
commands first, and a verdict table whose rows are the studies' own: each tested question's answer, test and
adjusted p read from its study's report.json (kpo.compare.study.report.verdict_rows), never typed by hand."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

from kpo.compare.study.report import verdict_rows

ROOT = Path(__file__).resolve().parents[1]
STUDIES = runpy.run_path(str(ROOT / "scripts/readme_verdict.py"))["STUDIES"]  # the script that writes the table
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_opens_with_its_two_commands():
    assert len(README.splitlines()) <= 200
    assert len(README.split()) <= 1300
    first = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first] == [["make", "demo"], ["make", "test"]]


def test_the_verdict_table_is_the_studies_reports():
    table = README.split("## The verdict", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    expected = []
    for folder in STUDIES:
        report = ROOT / "docs/results" / folder / "report.json"
        if report.exists():
            expected += verdict_rows(json.loads(report.read_text()), f"docs/results/{folder}/report.md")
    assert rows == expected
    assert len(expected) >= 4
