"""Every relative link in README.md and the docs resolves: the file exists and, for ``file#anchor``, the file has
a heading with that anchor (GitHub's rule: lower case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: ``## Train: `kpo train` `` -> ``train-kpo-train``."""
    text = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


def test_anchor_follows_githubs_rule():
    assert anchor("Train: `kpo train`") == "train-kpo-train"
    assert anchor("The embedded testbed: a task where KPO's filter acts") == (
        "the-embedded-testbed-a-task-where-kpos-filter-acts"
    )
    assert anchor("Regenerating docs/results") == "regenerating-docsresults"


def test_the_docs_exist_and_link_somewhere():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/filter.md", "docs/losses.md", "docs/compare.md"} <= names, names
    assert links(ROOT / "README.md"), "README.md links to nothing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not files
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(
                f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})"
            )
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{target} (no heading #{frag} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: " + "; ".join(broken)
