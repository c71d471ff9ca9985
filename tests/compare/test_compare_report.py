"""The report of `kpo compare` written from fake finished runs (no training): a section or claim without data
says why in one line instead of leaving an empty header."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kpo.analysis import write_dump
from kpo.compare import plan_runs
from kpo.compare.claims import _entropy_claim, _figure3_claim
from kpo.compare.report import reward_summary, write_report
from kpo.losses.kpo import filter_settings


def _section(text: str, title: str) -> str:
    """The body of the report section whose header starts with ``title`` (up to the next header)."""
    return re.search(rf"^## {re.escape(title)}.*?\n(.*?)(?=^## )", text, re.S | re.M).group(1)


def _report(cfg, fake_done_run) -> str:
    runs = plan_runs(cfg)
    for run in runs:
        fake_done_run(cfg, run)
    return write_report(cfg, runs, cfg.out).read_text()


def test_table2_without_dumps_says_why(compare_config, fake_done_run):
    text = _report(compare_config(methods=("kpo",), sweep_memory=()), fake_done_run)
    table = _section(text, "Table 2 analog")
    assert "| kpo | no ratio dump in its runs (runs/*/ratios is missing or empty) |" in table, table


def test_table2_with_only_on_policy_dumps_says_why(compare_config, fake_done_run):
    cfg = compare_config(methods=("kpo",), sweep_memory=())
    text_dir = cfg.out
    runs = plan_runs(cfg)
    for run in runs:
        write_dump(
            fake_done_run(cfg, run) / "ratios" / "step_000001.safetensors",
            np.full((2, 3), 0.01),
            np.ones((2, 3), dtype=bool),
            step=1,
            settings=filter_settings("kpo", {}),
            loss="kpo",
            on_policy=True,
        )
    table = _section(write_report(cfg, runs, text_dir).read_text(), "Table 2 analog")
    assert (
        "| kpo | no off-policy token in the dumps (each dumped step is the first, on-policy step of its "
        in table
    )


def test_claims_without_vanilla_say_what_is_missing(compare_config, fake_done_run):
    text = _report(compare_config(methods=("kpo", "gspo"), sweep_memory=()), fake_done_run)
    claims = _section(text, "Claims")
    assert (
        "**Figure 3: GRPO collapses while KPO keeps rising** — not tested: --methods has no vanilla" in claims
    )
    # every claim is listed, tested or not
    assert len([line for line in claims.splitlines() if line.startswith("- **")]) == 5, claims


def _rows(rewards) -> list[dict]:
    return [{"step": s, "reward_mean": float(r), "entropy": 1.0} for s, r in enumerate(rewards, start=1)]


def test_figure3_reads_a_noisy_rising_curve_as_rising_and_a_drop_as_collapse():
    steps = np.arange(200)
    rng = np.random.default_rng(0)

    def rising(sd: float) -> list[dict]:  # rewards 0.2 -> 0.7 with noise (sd 0.1: a mean of 32 0/1 rewards)
        return _rows(0.2 + 0.5 * steps / 200 + rng.normal(0, sd, 200))

    # A peak over 5-step windows against a 20-step final mean read such curves as collapsed, or never rising.
    collapse = _rows(np.where(steps < 100, 0.2 + 0.5 * steps / 100, 0.7 - 0.6 * (steps - 100) / 100))
    for vanilla, kpo, expected in [
        ([collapse], [rising(0.05) for _ in range(10)], "kpo still rising in 10/10 seeds"),
        ([rising(0.1) for _ in range(20)], [collapse], "vanilla collapsed in 0/20 seeds"),
    ]:
        groups = {
            "vanilla": [{"summary": reward_summary(rows), "n": 2, "counts": [1, 1]} for rows in vanilla],
            "kpo": [{"summary": reward_summary(rows), "n": 2, "counts": [1, 1]} for rows in kpo],
        }
        line = _figure3_claim(["vanilla", "kpo"], groups, "kpo")
        assert expected in line and "vanilla collapsed in 0/1" not in line, line


def test_one_seed_shows_no_spread_and_the_table1_claim_says_so(compare_config, fake_done_run):
    text = _report(compare_config(seeds=1, sweep_memory=()), fake_done_run)
    table = _section(text, "Table 1 analog")
    assert "| vanilla | 1 | 50.0 (1 seed) | 50.0 (1 seed) | [50.0, 50.0] | - | 3.0 (1 seed) |" in table, table
    assert "± 0.0" not in text
    [claim] = [line for line in _section(text, "Claims").splitlines() if line.startswith("- **Table 1:")]
    assert "one seed: the interval covers the problems only" in claim, claim
    # every fake run scores 1 of 2 on each problem: the paired difference is 0 on every problem, a point
    assert "kpo - vanilla +0.0 [+0.0, +0.0] (equivalent; one seed" in claim, claim


def _entropy_rows(first: float, final: float) -> list[dict]:
    return [{"step": s, "reward_mean": 0.5, "entropy": first if s <= 10 else final} for s in range(1, 101)]


@pytest.mark.parametrize(
    "vanilla_final, kpo_final, verdict",
    [
        (
            0.05,
            0.5,
            "holds: vanilla's final entropy fell to at most 0.1 of its first in 1/1 seeds, kpo's stayed "
            "above that in 1/1",
        ),
        # 0.1 of the first is a collapse (the rule is <=); kpo collapsing too breaks the claim
        (
            0.1,
            0.1,
            "does not hold: vanilla's final entropy fell to at most 0.1 of its first in 1/1 seeds, kpo's "
            "stayed above that in 0/1",
        ),
        (0.2, 0.5, "does not hold: vanilla's final entropy fell to at most 0.1 of its first in 0/1 seeds"),
    ],
)
def test_entropy_collapse_claim(vanilla_final, kpo_final, verdict):
    groups = {
        m: [{"summary": reward_summary(_entropy_rows(1.0, final)), "n": 2, "counts": [1, 1]}]
        for m, final in (("vanilla", vanilla_final), ("kpo", kpo_final))
    }
    line = _entropy_claim(["vanilla", "kpo"], groups, "kpo")
    assert line.startswith("- **Figure 3: GRPO's entropy collapses while KPO's does not** — " + verdict), line


def test_warm_start_row_and_its_difference_are_reported(compare_config, fake_done_run):
    cfg = compare_config(seeds=1, sweep_memory=())
    runs = plan_runs(cfg)
    for run in runs:
        fake_done_run(cfg, run)
    warm = Path(cfg.out) / "runs" / "warm_start-seed0"
    warm.mkdir(parents=True)
    # the warm start gets 0 of 2 samples right on both problems; every fake run gets 1 of 2
    (warm / "eval.json").write_text(
        json.dumps(
            {
                "params": {"n": 2},
                "macro": {"avg@2": 0.0, "pass@2": 0.0, "mean_response_tokens": 3.0},
                "benchmarks": {"synthetic": {"problems": 2, "per_problem": [{"id": "a", "correct": 0}] * 2}},
            }
        )
    )
    text = write_report(cfg, runs, cfg.out).read_text()
    table = _section(text, "Table 1 analog")
    assert (
        "| warm start (no RL) | 1 | 0.0 (1 seed) | 0.0 (1 seed) | [0.0, 0.0] | - | 3.0 (1 seed) | - | - |"
        in table
    )
    # kpo 50% against the warm start's 0%, on every problem: +50 points, with no spread to widen the interval
    contrasts = _section(text, "Paired contrasts")
    assert "| kpo - warm start | warm | 1 | +50.0 | t over problems | [+50.0, +50.0] | - | 0.0 | - | - | - | better |" in contrasts, (
        contrasts
    )


def test_figure_headings_say_the_curves_are_trailing_means(compare_config, fake_done_run):
    text = _report(compare_config(), fake_done_run)
    for figure in ("## Figure 3 analog", "## Figure 4 analog"):
        [heading] = [line for line in text.splitlines() if line.startswith(figure)]
        assert "(5-step trailing means; mean over seeds, band = min-max)" in heading, heading


def test_a_pair_where_both_runs_collapsed_is_a_tie_in_the_compare_report():
    """kpo compare's contrasts as the map's: two collapsed runs' accuracies differ by noise, so their pair is a tie
    of the sign test, not a sign (six pairs, all both collapsed, a hair apart: p = 1, not 2/64)."""
    from kpo.compare.contrasts import contrast

    def entry(mean):
        return {"outcome": {"per_problem": [mean, mean]}}

    warm = {s: entry(0.2) for s in range(6)}
    a = [entry(0.0005 * (s + 1)) for s in range(6)]
    b = [entry(0.0) for _ in range(6)]
    found = contrast(a, b, warm)
    assert found["method"] == "sign" and found["p"] == 1.0
