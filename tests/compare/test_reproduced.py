"""A recorded check: the committed reports of the exploratory regime map and of the default compare are
reproduced to the digit from the records they hold (each cell's and contrast's per-seed outcomes), by the tests
that decided them then. The map's (a Holm family of hypotheses over looks at 4 and 6 seeds: the exact McNemar test
on (cell, seed) pairs, the t-test on the seeds' mean differences where neither run collapsed, with its
non-inferiority or equivalence margin) are no longer kpo's, so the rule is written out here, from scipy and
statsmodels; the compare's contrasts and their Holm family are kpo.compare.contrasts'. Nothing trains; a change
that moves a committed answer fails here. (The first study's: tests/compare/test_study.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, ttest_1samp
from statsmodels.stats.multitest import multipletests

from kpo.compare.cell import Cell
from kpo.compare.contrasts import decide as decide_contrasts
from kpo.compare.contrasts import verdict
from kpo.compare.regimes import groups
from kpo.compare.stats import paired_accuracy

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
SHARES = {4: 0.1, 6: 0.2, 8: 0.7}  # the map's error at each look (weighted Bonferroni)
MARGIN = 0.05
# The map's questions then, in order: (key, kind, a, b, group), arms by the report's run labels.
GRPO, GSPO, KPO, AUTO = "vanilla", "gspo", "kpo (memory=matched)", "kpo (memory=auto)"
BAND = "vanilla (clip_ratio_low=0.0003, clip_ratio_high=0.0004)"
QUESTIONS = [
    ("grpo_collapses", "collapse", GRPO, KPO, "stress"), ("kpo_vs_grpo", "accuracy", KPO, GRPO, "stable"),
    ("kpo_vs_gspo", "accuracy", KPO, GSPO, "stable"), ("band_collapses", "collapse", BAND, KPO, "stress"),
    ("band_vs_kpo", "accuracy", BAND, KPO, "stress"), ("bf16_changes_kpo", "bf16", KPO, GRPO, "stable"),
    ("auto_vs_grpo", "accuracy", AUTO, GRPO, "stable"), ("auto_vs_gspo", "accuracy", AUTO, GSPO, "stable"),
    ("matched_vs_auto", "accuracy", KPO, AUTO, "stable"), ("auto_collapses", "collapse", AUTO, KPO, "stress"),
    ("band_collapses_auto", "collapse", BAND, AUTO, "stress"), ("band_vs_auto", "accuracy", BAND, AUTO, "stress"),
]


def _map_test(kind: str, a: str, b: str, data: dict, cells: list[Cell], seeds: int) -> dict[str, float | None]:
    """The map's test of one question at ``seeds`` seeds: {hypothesis: p}. ``data[cell][arm][seed]`` is
    (accuracy, collapsed)."""
    if kind == "collapse":  # exact McNemar: the discordant (cell, seed) pairs, a fair coin under the null
        pairs = [(data[c.name][a][s][1], data[c.name][b][s][1]) for c in cells for s in range(seeds)]
        only_a, only_b = sum(x and not y for x, y in pairs), sum(y and not x for x, y in pairs)
        return {"difference": binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0}
    by_seed: dict[int, list[float]] = {s: [] for s in range(seeds)}
    if kind == "accuracy":  # the pairs where neither run collapsed
        for c in cells:
            for s in range(seeds):
                (x, fx), (y, fy) = data[c.name][a][s], data[c.name][b][s]
                if not (fx or fy):
                    by_seed[s].append(x - y)
    else:  # bf16 - float32 of a - b at each depth, where none of the four runs collapsed
        base = {(c.depth, c.lr): c for c in cells if c.mismatch == "none"}
        for c in (c for c in cells if c.mismatch == "bf16" and (c.depth, c.lr) in base):
            for s in range(seeds):
                runs = [data[x.name][arm][s] for x in (c, base[c.depth, c.lr]) for arm in (a, b)]
                if not any(f for _, f in runs):
                    (a1, _), (b1, _), (a0, _), (b0, _) = runs
                    by_seed[s].append((a1 - b1) - (a0 - b0))
    means = np.array([np.mean(v) for v in by_seed.values() if v])
    if means.size < 2:
        return {"difference": None, "margin": None}
    above = ttest_1samp(means, -MARGIN, alternative="greater").pvalue
    below = ttest_1samp(means, MARGIN, alternative="less").pvalue
    return {"difference": ttest_1samp(means, 0.0).pvalue,
            "margin": above if kind == "accuracy" else max(above, below)}


def test_the_regime_maps_answers_from_its_per_seed_outcomes():
    report = json.loads((RESULTS / "regimes" / "report.json").read_text())
    data = {c["cell"]: {arm: list(zip(v["accuracy"], v["collapsed"])) for arm, v in c["arms"].items()}
            for c in report["cells"]}
    by_group = groups([Cell(c["mismatch"], c["depth"], c["lr"]) for c in report["cells"]])
    looks = [n for n in SHARES if n <= report["looks"][-1]["seeds"]["stable"]]
    assert report["looks"][-1]["seeds"] == {"stable": 6, "stress": 6} and looks == [4, 6]
    kinds = {"collapse": "collapse", "accuracy": "accuracy", "bf16": "interaction"}
    members, p_looks = [], {}
    for (key, kind, a, b, group), then in zip(QUESTIONS, report["questions"]):
        assert then["name"] == key
        found = [_map_test(kinds[kind], a, b, data, by_group[group], n) for n in looks]
        for look, again in zip(then["looks"], found):
            for h, p in again.items():
                assert look["p"][h] == pytest.approx(p, rel=1e-9, abs=1e-15), (key, h)
        for h in found[0]:
            ps = [f[h] / SHARES[n] for f, n in zip(found, looks) if f[h] is not None]
            p_looks[key, h] = min(1.0, min(ps)) if ps else 1.0
            assert then["p_looks"][h] == pytest.approx(p_looks[key, h], rel=1e-9), (key, h)
            members.append((key, h))
    adjusted = multipletests([p_looks[m] for m in members], method="holm")[1]
    assert len(members) == report["hypotheses"] == 20
    for (key, h), p in zip(members, adjusted):
        then = next(q for q in report["questions"] if q["name"] == key)
        assert then["p_adjusted"][h] == pytest.approx(p, rel=1e-9), (key, h)
    # decided as then: no hypothesis reaches 0.05 after Holm, so every question is undecided
    assert max(adjusted) == 1.0 and min(adjusted) > 0.05
    assert {q["verdict"] for q in report["questions"]} == {"undecided"}


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
    decided = decide_contrasts(again)
    assert {n: c["verdict"] for n, c in decided.items()} == {n: c["verdict"] for n, c in report["contrasts"].items()}
