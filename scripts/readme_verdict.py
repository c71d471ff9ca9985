"""Rewrite the README's verdict table from the studies' report.json (the rows tests/test_readme.py expects):

    .venv/bin/python scripts/readme_verdict.py    # after a study's report changed (scripts/update_study.sh runs it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kpo._files import replacing
from kpo.compare.study.report import verdict_rows

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("study", "filter-or-band")  # the table's order: tests/test_readme.py reads the same
HEADER = ["| question | answer | test | adjusted p | study |", "|---|---|---|---|---|"]


def main() -> int:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(HEADER[0]))
    except StopIteration:
        print(f"readme_verdict: no line of {readme} starts the table ({HEADER[0]})", file=sys.stderr)
        return 2
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rows = []
    for folder in STUDIES:
        report = ROOT / "docs/results" / folder / "report.json"
        if report.exists():
            rows += verdict_rows(json.loads(report.read_text()), f"docs/results/{folder}/report.md")
    with replacing(readme) as partial:
        partial.write_text("".join(lines[:start] + [line + "\n" for line in HEADER + rows] + lines[end:]))
    print(f"readme_verdict: {len(rows)} rows from {', '.join(STUDIES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
