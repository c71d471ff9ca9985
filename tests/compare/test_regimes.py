"""kpo compare regimes: the grid as a study's plan, the settings it refuses, and the map run through the study's
machinery on runs that 'train' instantly (kpo compare's own tests train): one look at the map's seeds, the seed as
the unit, Holm over the questions, records that survive the run folders, a plan fixed before the first run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kpo.compare.cli import main
from kpo.compare.outcome import load_outcome
from kpo.compare.plan import CompareError
from kpo.compare.regimes import QUESTIONS, RegimeConfig, map_plan
from kpo.compare.regimes.design import ARMS, AUTO, CLIP_BAND, GRPO, GSPO, KPO
from kpo.compare.study.plan import cell_config, group_arms

from .conftest import write_fake_run

PROBLEMS = 4


def test_the_grid_is_a_study_plan(tmp_path):
    plan = map_plan(RegimeConfig(out=str(tmp_path)).validate())
    assert list(plan["cells"]) == [
        f"{m}-depth{d}-lr{lr:g}" for m in ("none", "bf16") for d in (4, 16) for lr in (1e-4, 5e-4)
    ]
    # every cell: GRPO, GSPO, KPO (matched), KPO (auto); the stress cells (lr 5e-4) also the clip band
    assert group_arms(plan, "stable") == [GRPO, GSPO, KPO, AUTO]
    assert group_arms(plan, "stress") == [GRPO, GSPO, KPO, AUTO, CLIP_BAND]
    assert {g: v["looks"] for g, v in plan["groups"].items()} == {"stable": [6], "stress": [6]}
    assert plan["runs_at_most"] == 4 * 4 * 6 + 4 * 5 * 6 == 216
    assert [q["key"] for q in plan["questions"]] == [q[0] for q in QUESTIONS]
    assert all(q["role"] == "family" and q["test"] == "sign-flip" for q in plan["questions"])
    bf16 = next(q for q in plan["questions"] if q["key"] == "bf16_changes_kpo")
    assert bf16["cells"] == ["bf16-depth4-lr0.0001", "bf16-depth16-lr0.0001"]
    assert bf16["versus"] == ["none-depth4-lr0.0001", "none-depth16-lr0.0001"]
    # the same generation batches in every cell: depth 16 takes 4 times the steps of depth 4
    deep = cell_config(plan, "bf16-depth16-lr0.0005", KPO, tmp_path)
    assert (deep.steps, deep.minibatches) == (16 * 20, 16)
    assert deep.train_args == ("--learning-rate", "0.0005", "--rollout-dtype", "bfloat16", "--ratio-anchor", "rollout")
    # one learning rate: stable cells only, and no bf16 question without a float32 cell of its depth
    only = map_plan(RegimeConfig(out=str(tmp_path), cells_only=("fp8-depth4-lr0.001",)).validate())
    assert list(only["groups"]) == ["stable"] and CLIP_BAND not in only["arms"]
    assert "bf16_changes_kpo" not in {q["key"] for q in only["questions"]}


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"mismatch": ("bf32",)}, "--mismatch \\['bf32'\\]: unknown"),
        ({"seeds": 0}, "--seeds=0: give >= 1 \\(the questions need 6 for a two-sided p below 0.05\\)"),
        ({"batches": 0}, "--batches=0: must be >= 1"),
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
        map_plan(RegimeConfig(out=str(tmp_path), **kw).validate())


def test_the_plan_prints_the_questions_and_trains_nothing(tmp_path, capsys, no_training):
    assert main(["regimes", "--out", str(tmp_path / "map"), "--plan"]) == 0
    printed = capsys.readouterr().out
    assert "regime map: 8 cells x 6 seeds, at most 216 runs of 20 generation batches, about " in printed
    # kpo compare's cost model: a run of 20 batches is 20 x 4 x 0.97 s + 256 problems x 4 samples x 9 ms + 20 s
    # = 106.8 s; 216 runs and 6 warm starts of 240 s on --jobs 2
    assert main(["regimes", "--out", str(tmp_path / "map"), "--plan", "--jobs", "2"]) == 0
    assert f"about {(216 * 106.816 + 6 * 240) / 2 / 60:.0f} min on 2 worker(s)" in capsys.readouterr().out
    for key, text, *_ in QUESTIONS:
        assert f"  {key}: {text}" in printed
    assert "collapse: final accuracy below its warm start's" in printed
    assert not (tmp_path / "map").exists()


# ------------------------------------------------------------------ the map, run as a study
CELLS = ("none-depth4-lr0.0001", "none-depth4-lr0.0005")
DRIFT = {GRPO: 0.0, GSPO: -0.01, KPO: -0.07, AUTO: -0.02, CLIP_BAND: -0.03}


def _write_model(folder: Path, accuracy: float) -> None:
    """A finished model's exact evaluation (expected.json): the outcome the study records."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "expected.json").write_text(json.dumps({"mean": accuracy, "per_problem": [accuracy] * PROBLEMS}))


@pytest.fixture
def instant(monkeypatch):
    """Runs and warm starts that 'train' instantly: each run scores 0.6 + its arm's drift + a seed's wobble (KPO
    (matched) 5.2-8.8 points under GRPO in every seed); returns the names trained, in order."""
    trained = []

    def build(cfg, candidates):
        for seed in candidates:
            _write_model(Path(cfg.out).parent / f"warm_start-seed{seed}", 0.25)
        return [None] * len(candidates)

    def train(jobs, workers, on_done=None):
        for job in jobs:
            write_fake_run(job.cfg, job.run, PROBLEMS)
            wobble = 0.01 * (job.run.seed % 3) + 0.004 * ((job.run.seed + len(job.run.arm)) % 2)
            arm = next(label for label, arm in ARMS.items() if arm == (job.run.method, job.run.loss_kwargs))
            _write_model(job.folder, 0.6 + DRIFT[arm] + wobble)
            trained.append(job.label)
            on_done(job)

    monkeypatch.setattr("kpo.compare.study.run._build_in_pool", build)
    monkeypatch.setattr("kpo.compare.run.train_jobs", train)
    return trained


def test_the_map_runs_as_a_study_and_resumes_from_its_records(tmp_path, instant, capsys):
    out = tmp_path / "map"
    flags = ["--out", str(out), "--cells", ",".join(CELLS), "--eval-limit", str(PROBLEMS)]
    assert main(["regimes", *flags]) == 0
    assert len(instant) == 4 * 6 + 5 * 6  # the stable cell's 4 arms, the stress cell's 5, at 6 seeds
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["ended"] and report["study"] == "exploratory" and report["runs"] == 54
    answers = report["questions"]
    assert "bf16_changes_kpo" not in answers  # no bf16 cell in this map
    # KPO (matched) trails GRPO by 5.2-8.8 points in every seed of the stable cell: all 6 signs agree, so the
    # exact two-sided sign-flip p is 2 / 2^6 = 0.031; Holm over the map's 12 questions adjusts it
    look = answers["kpo_vs_grpo"]["looks"][-1]
    assert look["p"] == pytest.approx(2 / 64) and look["estimate"] < -0.05 and look["seeds"] == 6
    assert answers["kpo_vs_grpo"]["p_adjusted"] > 2 / 64
    # nothing collapsed at the stress rate: no seed's count differs, p = 1
    assert answers["grpo_collapses"]["looks"][-1]["p"] == 1.0
    stress = report["descriptive"]["stress"]["cells"]["none-depth4-lr0.0005"]
    # 0 of 6: the exact 95% interval of the collapse rate reaches 1 - 0.025^(1/6) = 0.459
    assert stress[GRPO]["collapse"]["k"] == 0
    assert stress[GRPO]["collapse"]["upper95"] == pytest.approx(1 - 0.025 ** (1 / 6))
    assert "(not confirmatory)" in (out / "report.md").read_text()
    # the records are the map: a rerun trains nothing, and --report rewrites it with its run folders gone
    plan = (out / "plan.json").read_bytes()
    assert main(["regimes", *flags]) == 0 and len(instant) == 54
    for cell in CELLS:
        shutil.rmtree(out / cell)
    assert main(["regimes", *flags, "--report"]) == 0 and len(instant) == 54
    assert json.loads((out / "report.json").read_text())["questions"] == answers
    assert (out / "plan.json").read_bytes() == plan
    assert load_outcome(out / "warm_start-seed0")["mean"] == 0.25


def _refused(capsys, argv: list[str]) -> str:
    """main's one error line for ``argv``, which it must refuse (exit 2)."""
    assert main(["regimes", *argv]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_another_design_in_the_map_s_folder_is_refused_and_its_plan_kept(tmp_path, capsys, no_training):
    out = tmp_path / "map"
    line = _refused(capsys, ["--out", str(out), "--cells", CELLS[0], "--report"])
    assert "no map here (no plan.json)" in line and not out.exists()
    line = _refused(capsys, ["--out", str(out), "--report", "--plan"])
    assert line == "  - --plan and --report: --plan prints the plan and stops, --report writes the map; give one"
    cfg = RegimeConfig(out=str(out), cells_only=CELLS, seeds=4)
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(map_plan(cfg.validate()), indent=2))
    plan = (out / "plan.json").read_bytes()
    line = _refused(capsys, ["--out", str(out), "--cells", ",".join(CELLS), "--report"])  # 6 seeds, not 4
    assert "plan.json is another map (groups differ from these flags')" in line
    line = _refused(capsys, ["--out", str(out), "--seeds", "4", "--report"])  # the default grid's 8 cells
    assert "(cells, groups, questions differ" in line
    assert (out / "plan.json").read_bytes() == plan
    (out / "plan.json").write_text('{"questions": [')
    assert "plan.json: the plan does not parse" in _refused(capsys, ["--out", str(out), "--report"])
    # a map of the kpo before maps were studies: its plan (cells, seeds, batches, questions, rules) is not continued
    shutil.copy(Path(__file__).parents[2] / "docs" / "results" / "regimes" / "plan.json", out / "plan.json")
    assert "a map planned before maps were studies" in _refused(capsys, ["--out", str(out), "--report"])


def test_a_map_started_meanwhile_by_another_command_is_not_overwritten(tmp_path, capsys, monkeypatch, no_training):
    """Two commands on one new folder: the second to take the lock finds the first one's plan.json and stops, naming
    what differs, instead of replacing the plan the first one's runs read."""
    import contextlib

    import kpo.compare.run

    out = tmp_path / "map"
    theirs = json.dumps(map_plan(RegimeConfig(out=str(out), cells_only=CELLS, seeds=4).validate()), indent=2)
    lock = kpo.compare.run.holding

    @contextlib.contextmanager
    def raced(folder, what):
        out.mkdir(exist_ok=True)
        (out / "plan.json").write_text(theirs)  # written by the other command between our check and our lock
        with lock(folder, what):
            yield

    monkeypatch.setattr(kpo.compare.run, "holding", raced)
    line = _refused(capsys, ["--out", str(out), "--cells", ",".join(CELLS)])  # 6 seeds, not 4
    assert "plan.json is another map (groups differ from these flags')" in line
    assert (out / "plan.json").read_text() == theirs
