"""kpo compare regimes: the grid's cells and their compares, the plan, and the map's decisions (collapses, the
clip-band arm, the conclusions) on run folders written by the test (no training: kpo compare's own tests train)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpo.compare.cli import main
from kpo.compare.plan import CompareError
from kpo.compare.regimes import (
    CLIP_BAND,
    GRPO,
    GSPO,
    KPO,
    REGIME_RULES,
    Cell,
    RegimeConfig,
    cell_entry,
    cell_runs,
    needs_clip_band,
    write_regime_report,
)

PROBLEMS = 4


def test_cells_and_their_compares(tmp_path):
    cfg = RegimeConfig(out=str(tmp_path), seeds=2).validate()
    assert [c.name for c in cfg.cells] == [
        f"{m}-depth{d}-lr{lr:g}" for m in ("none", "bf16") for d in (4, 16) for lr in (1e-4, 5e-4)
    ]
    deep = cfg.cell_config(Cell("bf16", 16, 5e-4))
    # the same generation batches in every cell: depth 16 takes 4 times the steps of depth 4
    assert (deep.steps, deep.minibatches) == (16 * 20, 16)
    assert deep.train_args == (
        "--learning-rate",
        "0.0005",
        "--rollout-dtype",
        "bfloat16",
        "--ratio-anchor",
        "rollout",
    )
    assert {r.arm for r in cell_runs(cfg, Cell("none", 4, 1e-4), clip_band=False)} == {GRPO, GSPO, KPO}
    assert {r.arm for r in cell_runs(cfg, Cell("none", 4, 1e-4), clip_band=True)} == {
        GRPO,
        GSPO,
        KPO,
        CLIP_BAND,
    }
    assert RegimeConfig(out=str(tmp_path), cells_only=("fp8-depth4-lr0.001",)).validate().cells == [
        Cell("fp8", 4, 1e-3)
    ]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"mismatch": ("bf32",)}, "--mismatch \\['bf32'\\]: unknown"),
        ({"seeds": 1}, "--seeds=1: must be >= 2"),
        ({"batches": 20, "curve_every": 3}, "--curve-every=3 must divide --batches=20"),
        ({"cells_only": ("none-d4",)}, "write MISMATCH-depthN-lrX"),
        ({"depth": (0,)}, "--depth must be integers >= 1"),
    ],
)
def test_bad_settings_name_the_fix(tmp_path, kw, message):
    with pytest.raises(CompareError, match=message):
        RegimeConfig(out=str(tmp_path), **kw).validate()


def test_the_plan_prints_runs_widths_and_rules_and_trains_nothing(tmp_path, capsys, no_training):
    assert main(["regimes", "--out", str(tmp_path / "map"), "--seeds", "4", "--plan"]) == 0
    printed = capsys.readouterr().out
    assert "8 cells x (vanilla, GSPO, KPO matched) x 4 seeds = 96 runs of 20 generation batches" in printed
    # t_{3, 0.975} x 5.0 / sqrt(4) = 3.182 x 2.5
    assert "+-8.0 points (4 paired seeds, prior sd 5.0 points)" in printed
    for rule in REGIME_RULES:
        assert f"  {rule}: " in printed
    assert not (tmp_path / "map").exists()


# ------------------------------------------------------------------ decisions on written run folders
def _write_model(folder: Path, accuracy: float) -> None:
    """A finished model's evaluations: every problem right with probability ``accuracy``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "expected.json").write_text(
        json.dumps({"mean": accuracy, "per_problem": [accuracy] * PROBLEMS})
    )
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
        for s in range(1, 2 * cell.depth + 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _finish(cfg, cell, accuracy: dict[str, list[float]]) -> None:
    for run in cell_runs(cfg, cell, clip_band=CLIP_BAND in accuracy):
        if run.arm in accuracy:
            _write_run(cfg, cell, run, accuracy[run.arm][run.seed])


@pytest.fixture
def mapped(tmp_path):
    cfg = RegimeConfig(out=str(tmp_path / "map"), seeds=3, cells_only=("none-depth4-lr0.0005",)).validate()
    for seed in range(3):
        _write_model(tmp_path / "map" / f"warm_start-seed{seed}", 0.25)
    return cfg, cfg.cells[0]


def test_a_vanilla_collapse_that_kpo_survives_calls_for_the_clip_band(mapped):
    cfg, cell = mapped
    # vanilla ends below the warm start (0.25) in seeds 0 and 1; GSPO in seed 0 only; KPO never
    _finish(cfg, cell, {GRPO: [0.0, 0.1, 0.6], GSPO: [0.2, 0.5, 0.55], KPO: [0.5, 0.5, 0.5]})
    assert needs_clip_band(cfg, cell)
    entry = cell_entry(cfg, cell)
    assert entry["arms"][GRPO]["collapsed"] == [True, True, False]
    assert entry["survivors"] == [GSPO, KPO]  # GSPO survives seed 1, KPO both
    assert entry["contrasts"]["KPO - clip band"] is None and entry["conclusion"]["saved_by"] is None
    # the clip band collapses where KPO does not: the filter, not the band, saves KPO
    _finish(cfg, cell, {CLIP_BAND: [0.1, 0.4, 0.4]})
    entry = cell_entry(cfg, cell)
    assert entry["done"] and entry["conclusion"]["saved_by"] == "the filter"
    assert entry["contrasts"]["KPO - clip band"]["mean"] == pytest.approx((0.4 + 0.1 + 0.1) / 3)
    assert entry["arms"][KPO]["on_policy_clip_frac"] == pytest.approx(0.1)
    assert entry["arms"][KPO]["off_policy_clip_frac"] == pytest.approx(0.3)
    # KPO - GRPO per seed: +0.5, +0.4, -0.1; KPO - GSPO: +0.3, 0, -0.05
    assert entry["contrasts"]["KPO - GRPO"]["per_seed"] == pytest.approx([0.5, 0.4, -0.1])
    assert entry["conclusion"]["pick"] == KPO


def test_no_collapse_no_clip_band_and_the_map_is_written(mapped):
    cfg, cell = mapped
    _finish(cfg, cell, {GRPO: [0.6, 0.62, 0.64], GSPO: [0.6, 0.6, 0.6], KPO: [0.5, 0.51, 0.52]})
    assert not needs_clip_band(cfg, cell)
    entry = cell_entry(cfg, cell)
    # KPO - GRPO = -0.1, -0.11, -0.12: an interval below 0
    assert entry["contrasts"]["KPO - GRPO"]["verdict"] == "worse"
    assert entry["conclusion"]["kpo"] == "loses" and entry["conclusion"]["pick"] == GRPO
    report = write_regime_report(cfg)
    found = json.loads((report.parent / "report.json").read_text())
    assert [c["cell"] for c in found["cells"]] == [cell.name]
    text = report.read_text()
    assert "KPO loses (worse than GRPO or GSPO): none-depth4-lr0.0005." in text
    assert "GRPO collapsed in no cell" in text
    assert (report.parent / "regimes.png").stat().st_size > 0


def test_learning_curves_say_whether_kpo_is_slower_or_worse(tmp_path):
    cfg = RegimeConfig(
        out=str(tmp_path / "map"), seeds=3, batches=40, curve_every=20, cells_only=("none-depth4-lr0.0001",)
    ).validate()
    cell = cfg.cells[0]
    for seed in range(3):
        _write_model(tmp_path / "map" / f"warm_start-seed{seed}", 0.25)
    # checkpoints at 20 and 40 generation batches (steps 80, 160): KPO trails GRPO by about 10 points at 20 and
    # catches up by 40; GSPO stays below GRPO
    curves = {GRPO: (0.60, 0.70), GSPO: (0.55, 0.65), KPO: (0.50, 0.70)}
    _finish(cfg, cell, {arm: [b[1]] * 3 for arm, b in curves.items()})
    for run in cell_runs(cfg, cell, clip_band=False):
        wobble = 0.01 * run.seed  # seeds differ a little, so intervals have a width
        steps = {
            str(80 * (i + 1)): {"mean": acc + wobble, "per_problem": [acc + wobble] * PROBLEMS}
            for i, acc in enumerate(curves[run.arm])
        }
        folder = Path(cfg.out) / cell.name / "runs" / run.name
        (folder / "curve.json").write_text(json.dumps({"every": 80, "steps": steps}))
    curve = cell_entry(cfg, cell)["curve"]
    assert curve["batches"] == [20, 40] and curve["best_baseline"] == GRPO
    assert [p["verdict"] for p in curve["contrasts"]["KPO - GRPO"]] == ["worse", "equivalent"]
    assert curve["pace"] == "slower"
    report = write_regime_report(cfg).read_text()
    assert "KPO is **slower** against vanilla" in report and (Path(cfg.out) / "curves.png").exists()
