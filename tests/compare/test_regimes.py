"""kpo compare regimes: the grid's cells and their compares, the plan, the settings it refuses, and the map written
from run folders made by the test (no training: kpo compare's own tests train): collapses with their exact
bounds, the per-cell contrasts and picks, and the questions answered as leads by a study's seed-level test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kpo.compare.cli import main
from kpo.compare.engines.kpo import train_argv
from kpo.compare.plan import CompareError
from kpo.compare.regimes.design import (
    AUTO,
    CLIP_BAND,
    GRPO,
    GSPO,
    KPO,
    QUESTIONS,
    REGIME_RULES,
    Cell,
    RegimeConfig,
    cell_entry,
    cell_runs,
)
from kpo.compare.regimes.plan import estimate_regimes
from kpo.compare.regimes.run import run_regimes
from kpo.train.flags import parse_args

PROBLEMS = 4


def test_cells_and_their_compares(tmp_path):
    cfg = RegimeConfig(out=str(tmp_path)).validate()
    assert [c.name for c in cfg.cells] == [
        f"{m}-depth{d}-lr{lr:g}" for m in ("none", "bf16") for d in (4, 16) for lr in (1e-4, 5e-4)
    ]
    deep = cfg.cell_config(Cell("bf16", 16, 5e-4), 4)
    # the same generation batches in every cell: depth 16 takes 4 times the steps of depth 4
    assert (deep.steps, deep.minibatches) == (16 * 20, 16)
    assert deep.train_args == ("--learning-rate", "0.0005", "--rollout-dtype", "bfloat16", "--ratio-anchor", "rollout")
    # every cell: GRPO, GSPO, KPO (matched), KPO (auto); the stress cells (lr 5e-4) also the clip band
    assert {r.arm for r in cell_runs(cfg, Cell("none", 4, 1e-4), 4)} == {GRPO, GSPO, KPO, AUTO}
    assert {r.arm for r in cell_runs(cfg, Cell("none", 4, 5e-4), 4)} == {GRPO, GSPO, KPO, AUTO, CLIP_BAND}
    assert len(cell_runs(cfg, Cell("none", 4, 5e-4), 6)) == 30
    only = RegimeConfig(out=str(tmp_path), cells_only=("fp8-depth4-lr0.001",)).validate()
    assert only.cells == [Cell("fp8", 4, 1e-3)] and only.group(only.cells[0]) == "stable"


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"mismatch": ("bf32",)}, "--mismatch \\['bf32'\\]: unknown"),
        ({"seeds": 0}, "--seeds=0: give >= 1 \\(the questions need 6 for a two-sided p below 0.05\\)"),
        ({"batches": 20, "curve_every": 3}, "--curve-every=3 must divide --batches=20"),
        ({"cells_only": ("none-d4",)}, "write MISMATCH-depthN-lrX"),
        ({"cells_only": ()}, "--cells: no cell named"),
        ({"cells_only": ("none-depth4-lr0.0001", "none-depth4-lr1e-4")}, "names none-depth4-lr0.0001 more than once"),
        ({"cells_only": ("none-depth0-lr0.0001",)}, "--cells: cell .none-depth0-lr0.0001.: depth .0. is not an integer >= 1"),
        ({"depth": (0,)}, "--depth must be integers >= 1"),
        # a cell's own settings cannot be overridden by `--` flags (one test per axis)
        ({"train_args": ("--learning-rate", "1e-3")}, "-- --learning-rate: every cell sets it .* use --lr"),
        ({"train_args": ("--rollout-dtype", "bfloat16")}, "-- --rollout-dtype: every cell sets it .* --mismatch"),
        ({"train_args": ("--ratio-anchor", "trainer")}, "-- --ratio-anchor: every cell sets it .* --mismatch"),
        ({"train_args": ("--minibatches", "2")}, "-- --minibatches: every cell sets it .* --depth"),
    ],
)
def test_bad_settings_name_the_fix(tmp_path, kw, message):
    with pytest.raises(CompareError, match=message):
        RegimeConfig(out=str(tmp_path), **kw).validate()


def test_the_plan_prints_runs_questions_and_rules_and_trains_nothing(tmp_path, capsys, no_training):
    assert main(["regimes", "--out", str(tmp_path / "map"), "--plan"]) == 0
    printed = capsys.readouterr().out
    # 4 stable cells x 4 arms + 4 stress cells x 5 arms, at 6 seeds
    assert "x 6 seeds = 216 runs of 20 generation batches" in printed
    # t_{5, 0.975} x 5.0 / sqrt(6) = 2.571 x 2.041
    assert "+-5.2 points (prior sd 5.0 points)" in printed
    for key, text, *_ in QUESTIONS:
        assert f"  {key}: {text}" in printed
    for rule in REGIME_RULES:
        assert f"  {rule}: " in printed
    assert not (tmp_path / "map").exists()


def test_a_one_seed_map_is_planned_and_reported_without_intervals(tmp_path):
    """A smoke map of one seed a cell: no planned half-width, and the report still renders."""
    from kpo.compare.regimes.report import render_map

    cfg = RegimeConfig(out=str(tmp_path), cells_only=("none-depth4-lr0.0001",), seeds=1).validate()
    plan = estimate_regimes(cfg)
    assert plan["cells"][0]["half_width"] is None and plan["runs"] == 4
    report = render_map(tmp_path, [], [], plan).read_text()
    assert "none (one seed a cell: no interval)" in report


# ------------------------------------------------------------------ the map on written run folders
def _write_model(folder: Path, accuracy: float) -> None:
    """A finished model's evaluations: every problem right with probability ``accuracy``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "expected.json").write_text(json.dumps({"mean": accuracy, "per_problem": [accuracy] * PROBLEMS}))
    per_problem = [{"correct": round(4 * accuracy)} for _ in range(PROBLEMS)]
    results = {
        "macro": {"avg@4": accuracy},
        "params": {"n": 4},
        "benchmarks": {"synthetic": {"problems": PROBLEMS, "per_problem": per_problem}},
    }
    (folder / "eval.json").write_text(json.dumps(results))


def _write_run(cfg: RegimeConfig, cell: Cell, run, accuracy: float) -> None:
    folder = Path(cfg.out) / cell.name / "runs" / run.name
    _write_model(folder, accuracy)
    (folder / "config.yaml").write_text("{}\n")
    rows = [
        {"step": s, "clip_frac": 0.1 if s % cell.depth == 1 else 0.3, "rollout_corr/k3_kl": 1e-4}
        | ({"kpo/memory_tokens": 100.0 * s} if run.arm == AUTO else {})
        for s in range(1, 2 * cell.depth + 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _finish(cfg, cell, seeds: int, accuracy: dict[str, list[float]]) -> None:
    for run in cell_runs(cfg, cell, seeds):
        if run.arm in accuracy:
            _write_run(cfg, cell, run, accuracy[run.arm][run.seed])


def _warm_starts(cfg, seeds: int, accuracy: float = 0.25) -> None:
    for seed in range(seeds):
        _write_model(Path(cfg.out) / f"warm_start-seed{seed}", accuracy)


def test_a_cell_collapses_contrasts_and_pick(tmp_path):
    cfg = RegimeConfig(out=str(tmp_path / "map"), cells_only=("none-depth4-lr0.0001", "none-depth4-lr0.0005"))
    cfg.validate()
    stress = cfg.cells[1]
    _warm_starts(cfg, 4)
    # vanilla ends below the warm start (0.25) in seeds 0 and 1; the band in seed 2; KPO never
    _finish(cfg, stress, 4, {
        GRPO: [0.0, 0.1, 0.6, 0.62],
        GSPO: [0.5, 0.5, 0.55, 0.5],
        KPO: [0.5, 0.52, 0.5, 0.51],
        AUTO: [0.4, 0.45, 0.48, 0.41],
        CLIP_BAND: [0.5, 0.5, 0.1, 0.5],
    })
    entry = cell_entry(cfg, stress, 4)
    grpo = entry["arms"][GRPO]
    assert grpo["collapsed"] == [True, True, False, False]
    # 2 of 4: the exact (Clopper-Pearson) 95% interval of the rate reaches 0.932
    assert grpo["collapse"]["k"] == 2 and grpo["collapse"]["upper95"] == pytest.approx(0.9324, abs=1e-4)
    # KPO - GRPO: a pair with a collapse, so the sign test (4 of 4 positive... 3 of 4: +0.5, +0.42, -0.1, -0.11)
    kpo_grpo = entry["contrasts"]["KPO (matched) - GRPO"]
    assert kpo_grpo["method"] == "sign" and kpo_grpo["low"] is None  # no median interval below 6 pairs
    # KPO (auto) - KPO (matched): no collapse in the pairs: the paired t-interval
    auto = entry["contrasts"]["KPO (auto) - KPO (matched)"]
    assert auto["method"] == "t" and auto["mean"] == pytest.approx(-0.0725) and auto["high"] < 0
    # fitted memories 100 x step at the off-policy steps 2-4 and 6-8 (steps 1 and 5 start a batch): medians 300, 700
    by_batch = entry["arms"][AUTO]["memory_tokens"]["by_batch"]
    assert by_batch == {
        1: {"at_bound": 0.0, "median_below_bound": pytest.approx(300.0), "steps": 12},  # 3 steps x 4 seeds
        2: {"at_bound": 0.0, "median_below_bound": pytest.approx(700.0), "steps": 12},
    }
    assert entry["arms"][KPO]["on_policy_clip_frac"] == pytest.approx(0.1)
    # the band collapsed alone in seed 2 only: one discordant pair; KPO (auto) has none with the band either
    assert "the clip band alone collapsed in 1 seed, KPO (matched) alone in 0" in entry["filter_or_band"][KPO]
    # the pick: every arm no other beats significantly (4 seeds, Bonferroni over 4 others: nothing is beaten
    # but KPO (auto), which KPO (matched) beats in every seed by a t-test)
    assert set(entry["pick"]) == {GRPO, GSPO, KPO, CLIP_BAND} or AUTO not in entry["pick"]


def test_neither_collapsed_says_collapses_cannot_tell(tmp_path):
    cfg = RegimeConfig(out=str(tmp_path / "map"), cells_only=("none-depth4-lr0.0001", "none-depth4-lr0.0005"))
    cfg.validate()
    _warm_starts(cfg, 4)
    _finish(cfg, cfg.cells[1], 4, {arm: [0.5, 0.55, 0.6, 0.52] for arm in (GRPO, GSPO, KPO, AUTO, CLIP_BAND)})
    text = cell_entry(cfg, cfg.cells[1], 4)["filter_or_band"][KPO]
    assert text.startswith("no seed where only one of the clip band and KPO (matched) collapsed")


def test_the_map_trains_its_seeds_and_answers_its_questions_as_leads(tmp_path, monkeypatch):
    """The runner on a 2-cell map whose runs 'train' instantly (their outcome written by a stand-in for
    train_jobs): every run of 6 seeds trained once, each question tested by a study's seed-level test, the report
    carrying the leads, each cell's collapse bounds and the pick set; a rerun trains nothing."""
    cells = ("none-depth4-lr0.0001", "none-depth4-lr0.0005")
    cfg = RegimeConfig(out=str(tmp_path / "map"), cells_only=cells, eval_limit=PROBLEMS)
    trained = []

    def fake_train(jobs, workers, on_done=None):
        for job in jobs:
            cell = Cell("none", 4, float(job.cfg.train_args[1]))
            drift = {GRPO: 0.0, GSPO: -0.01, KPO: -0.07, AUTO: -0.02, CLIP_BAND: -0.03}[job.run.arm]
            wobble = 0.01 * (job.run.seed % 3) + 0.004 * ((job.run.seed + len(job.run.arm)) % 2)
            _write_run(cfg, cell, job.run, 0.6 + drift + wobble)
            parse_args(train_argv(job.cfg, job.run, job.folder)).save_yaml(job.folder / "config.yaml")
            trained.append(job.run.name)
            on_done(job)

    monkeypatch.setattr("kpo.compare.run.train_jobs", fake_train)
    monkeypatch.setattr("kpo.compare.regimes.run.write_cell_report", lambda *a: None)
    _warm_starts(cfg, 6)
    report = run_regimes(cfg)
    found = json.loads((report.parent / "report.json").read_text())
    assert found["runs"] == len(trained) == 4 * 6 + 5 * 6  # the stable cell's 4 arms, the stress cell's 5
    answers = {a["key"]: a for a in found["questions"]}
    # KPO (matched) trails GRPO by 5.2-8.8 points in every seed of the stable cell: all 6 signs agree, so the
    # exact two-sided sign-flip p is 2 / 2^6
    kpo_grpo = answers["kpo_vs_grpo"]
    assert kpo_grpo["verdict"] == "lead" and kpo_grpo["look"]["p"] == pytest.approx(2 / 64)
    assert kpo_grpo["look"]["estimate"] < -0.05 and kpo_grpo["look"]["seeds"] == 6
    # nothing collapsed at the stress rate: no seed's count differs, p = 1
    assert answers["grpo_collapses"]["look"]["p"] == 1.0
    assert answers["bf16_changes_kpo"]["verdict"] == "not asked"  # no bf16 cell in this map
    stress = next(c for c in found["cells"] if c["group"] == "stress")
    # 0 of 6: the exact 95% interval of the collapse rate reaches 1 - 0.025^(1/6) = 0.459
    assert stress["arms"][GRPO]["collapse"]["k"] == 0
    assert stress["arms"][GRPO]["collapse"]["upper95"] == pytest.approx(1 - 0.025 ** (1 / 6))
    assert isinstance(stress["pick"], list) and stress["pick"]
    text = report.read_text()
    assert "## The questions (leads)" in text and "collapses cannot tell them apart" in text
    assert "exact sign-flip permutation test: KPO (matched) - GRPO " in text
    # a rerun trains nothing more: every run is reused
    run_regimes(cfg)
    assert len(trained) == 54
    # a run gone: --report writes the map as it stands, its questions pending, training nothing
    shutil.rmtree(Path(cfg.out) / cells[0] / "runs" / "vanilla-seed5")
    found = json.loads((run_regimes(cfg, report_only=True).parent / "report.json").read_text())
    assert len(trained) == 54 and found["runs"] == 53
    assert {a["key"]: a["verdict"] for a in found["questions"]}["kpo_vs_grpo"] == "pending"


def test_report_before_any_run_finished_says_so(tmp_path, no_training):
    cfg = RegimeConfig(out=str(tmp_path / "map"), cells_only=("none-depth4-lr0.0001",), eval_limit=PROBLEMS)
    cfg.validate()
    Path(cfg.out).mkdir()
    (Path(cfg.out) / "plan.json").write_text(json.dumps(estimate_regimes(cfg)))
    with pytest.raises(CompareError, match="no run has finished yet"):
        run_regimes(cfg, report_only=True)


# ------------------------------------------------------------------ --report: reads, never writes the plan
CELLS = ("none-depth4-lr0.0001", "none-depth4-lr0.0005")
FLAGS = ["--cells", ",".join(CELLS), "--seeds", "4", "--eval-limit", str(PROBLEMS)]


@pytest.fixture
def built_map(tmp_path):
    """A finished 2-cell map at one look of 4 seeds, written without training (plan.json, warm starts, runs with
    the config.yaml kpo train would write); returns its folder."""

    cfg = RegimeConfig(out=str(tmp_path / "map"), cells_only=CELLS, seeds=4, eval_limit=PROBLEMS)
    cfg.validate()
    _warm_starts(cfg, 4)
    for cell in cfg.cells:
        cell_cfg = cfg.cell_config(cell, 4)
        for run in cell_runs(cfg, cell, 4):
            _write_run(cfg, cell, run, 0.5 + 0.01 * run.seed)
            folder = Path(cfg.out) / cell.name / "runs" / run.name
            parse_args(train_argv(cell_cfg, run, folder)).save_yaml(folder / "config.yaml")
    (Path(cfg.out) / "plan.json").write_text(json.dumps(estimate_regimes(cfg), indent=2))
    return Path(cfg.out)


def _refused(capsys, argv: list[str]) -> str:
    """main's one error line for ``argv``, which it must refuse (exit 2)."""
    assert main(["regimes", *argv]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_report_with_other_flags_says_which_and_keeps_the_plan(built_map, capsys, no_training):
    plan = (built_map / "plan.json").read_bytes()
    # the map's own flags minus --cells and --seeds: the default grid, 6 seeds (main wrote its plan here)
    line = _refused(capsys, ["--out", str(built_map), "--eval-limit", str(PROBLEMS), "--report"])
    assert "plan.json fixes another design than these flags" in line
    assert "the cells (--mismatch, --depth, --lr, --cells): plan ['none-depth4-lr0.0001'" in line
    assert "--seeds: plan 4, flags 6" in line
    # training with other flags stops the same way
    _refused(capsys, ["--out", str(built_map), *FLAGS[:-2], "--eval-limit", "2"])
    assert (built_map / "plan.json").read_bytes() == plan
    # a map planned by a kpo with other rules (the sequential Holm design before this one) is not rewritten by
    # this one's
    older = json.loads(plan)
    older["rules"]["questions"] = "exact McNemar test on the (cell, seed) pairs, ..."
    (built_map / "plan.json").write_text(json.dumps(older))
    line = _refused(capsys, ["--out", str(built_map), *FLAGS, "--report"])
    assert "the rules (a map planned by another kpo: its report is as committed): questions differ" in line


def test_report_rewrites_the_map_and_never_the_plan(built_map, capsys, no_training, monkeypatch):
    monkeypatch.setattr("kpo.compare.regimes.run.write_cell_report", lambda *a: None)
    plan = (built_map / "plan.json").read_bytes()
    assert main(["regimes", "--out", str(built_map), *FLAGS, "--report"]) == 0
    assert (built_map / "plan.json").read_bytes() == plan
    found = json.loads((built_map / "report.json").read_text())
    assert found["runs"] == 4 * 4 + 5 * 4 and len(found["questions"]) == 12
    report = (built_map / "report.md").read_text()
    assert report.startswith("# kpo compare regimes: where does KPO help? (exploratory)")
    assert "(unadjusted: a lead)" in report


def test_report_needs_a_map_and_no_plan_flag(tmp_path, capsys, no_training):
    line = _refused(capsys, ["--out", str(tmp_path / "none"), *FLAGS, "--report"])
    assert "no map here (no plan.json)" in line and not (tmp_path / "none").exists()
    line = _refused(capsys, ["--out", str(tmp_path / "none"), *FLAGS, "--report", "--plan"])
    assert line == "  - --plan and --report: --plan prints the plan and stops, --report writes the map; give one"


@pytest.mark.parametrize(
    "tear, message",
    [
        (lambda m: (m / "plan.json").write_text('{"cells": [{"cell": "none-de'), "plan.json: not readable as JSON"),
        (lambda m: (m / "plan.json").write_text("[]"), "plan.json: not a regime map's plan"),
        (
            lambda m: (m / CELLS[0] / "runs" / "vanilla-seed2" / "eval.json").write_text('{"macro": {"avg@4": 0.'),
            "vanilla-seed2/eval.json: not readable as JSON",
        ),
        (
            lambda m: (m / CELLS[1] / "runs" / "gspo-seed1" / "config.yaml").write_text("learning_rate: [0.1\n"),
            "gspo-seed1/config.yaml: not valid YAML",
        ),
    ],
    ids=["truncated plan.json", "plan.json []", "truncated eval.json", "config.yaml not YAML"],
)
def test_a_torn_file_is_one_line(built_map, capsys, no_training, tear, message):
    tear(built_map)
    line = _refused(capsys, ["--out", str(built_map), *FLAGS, "--report"])
    assert message in line


# ------------------------------------------------------------------ the committed map, recomputed
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "regimes" / "report.json"


def _committed_cell(name: str) -> dict:
    cell = next(c for c in json.loads(COMMITTED.read_text())["cells"] if c["cell"] == name)
    return {arm: list(zip(v["accuracy"], v["collapsed"])) for arm, v in cell["arms"].items()}


def test_both_collapsed_is_a_tie_in_the_committed_map():
    """bf16-depth16-lr5e-4: KPO (auto) - GRPO, six pairs of collapsed runs (largest difference 0.06 points): sign
    p = 0.031 on main, no sign here."""
    from kpo.compare.regimes.design import describe_cell

    found = describe_cell(_committed_cell("bf16-depth16-lr0.0005"))
    auto = found["contrasts"]["KPO (auto) - GRPO"]
    assert max(abs(d) for d in auto["per_seed"]) < 0.001
    assert auto["method"] == "sign" and auto["ties"] == 6 and auto["p"] == 1.0


def test_the_pick_says_when_it_cannot_exclude_an_arm():
    from kpo.compare.regimes.design import describe_cell

    stress = describe_cell(_committed_cell("none-depth4-lr0.0005"))
    assert len(stress["pick"]) == 5
    assert "cannot exclude any arm" in stress["pick_note"] and "1/64 = 0.0156" in stress["pick_note"]
    assert "level 0.05 / 4 = 0.0125" in stress["pick_note"]
    assert describe_cell(_committed_cell("none-depth4-lr0.0001"))["pick_note"] is None
