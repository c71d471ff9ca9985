"""An engine is one class: a fake trainer, defined in this file alone and installed as a plug-in (a ``kpo.engines``
entry point of a small package's metadata), runs a two-arm ``kpo compare`` and a one-cell regime map end to end
(the plan, the workers, the scoring, the report and the map) without kpo's trainer, and a spawned worker finds it
by name as kpo compare's do. kpo eval is replaced by a stand-in that scores a model by its folder's name: KPO's
runs get every sample right, the others half, the start model none."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

import kpo.compare.engines
import kpo.compare.run
from kpo.compare import CompareConfig, CompareError, run_compare
from kpo.compare.contract import STEP_ROWS
from kpo.compare.engines import engine_names, engine_of
from kpo.compare.regimes import RegimeConfig, map_plan, run_regimes
from kpo.compare.study.plan import cell_config

PROBLEMS = 2


class FakeEngine:
    """Trains nothing: a run's final model is an empty folder, its metrics a constant row per optimizer step, its
    configuration one line; a regime cell's settings are its own ``key=value`` words."""

    rows = STEP_ROWS

    def flag_errors(self, cfg) -> list[str]:
        return [f"--minibatches={cfg.minibatches}: the fake engine takes 2"] if cfg.minibatches != 2 else []

    def data_errors(self, cfg) -> list[str]:
        return []

    def config_errors(self, cfg, runs) -> list[str]:
        return []

    def plan_lines(self, cfg) -> list[str]:
        return []

    def cell_settings(self, cell) -> tuple[str, ...]:
        return (f"sampler={cell.mismatch}", f"lr={cell.lr!r}")

    def cell_errors(self, cell, train_args) -> list[str]:
        return []

    def workers(self, cfg) -> int | None:
        return 2

    def embedded(self, cfg) -> bool:
        return False

    def embedded_task(self, cfg):
        return None

    def eval_settings(self, cfg) -> dict:
        return {"prompt_template": "{problem}", "max_new_tokens": 4, "backend": "transformers"}

    def shared_start(self, cfg) -> bool:
        return True

    def start_model(self, cfg, seed: int) -> Path:
        path = Path(cfg.out) / "start"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def train(self, cfg, run, out: Path, resume: bool) -> Path:
        (out / "final").mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(f"trainer: fake\nmethod: {run.method}\n")
        rows = [{"step": s, "reward_mean": 0.5, "entropy": 1.0, "clip_frac": 0.0} for s in range(1, cfg.steps + 1)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return out / "final"

    def prune(self, cfg, out: Path) -> None:
        pass

    def trained(self, cfg, out: Path) -> bool:
        return (out / "metrics.jsonl").exists() and (out / "final").is_dir()

    def resumable(self, cfg, run, out: Path) -> bool:
        return False

    def changed(self, cfg, run, out: Path) -> list[str]:
        return []

    def steps_done(self, cfg, out: Path) -> int:
        path = out / "metrics.jsonl"
        return sum(1 for _ in path.open()) if path.exists() else 0

    def run_settings(self, cfg, run) -> dict:
        return {"method": run.method, "seed": run.seed, "steps": cfg.steps, "settings": list(cfg.train_args)}


def fake_evaluate(model, data, *, n, output, **settings) -> dict:
    """kpo eval's stand-in: every problem of ``data`` (one file of PROBLEMS) answered right n, n / 2 or 0 times."""
    name = Path(model).parent.name if Path(model).name == "final" else Path(model).name
    right = n if name.startswith("kpo") else 0 if name == "start" else n // 2
    per_problem = [{"id": f"p{i}", "correct": right} for i in range(PROBLEMS)]
    results = {
        "params": {"n": n},
        "benchmarks": {Path(data[0]).stem: {"problems": PROBLEMS, "per_problem": per_problem}},
        "macro": {f"avg@{n}": right / n, f"pass@{n}": float(right > 0), "mean_response_tokens": 3.0},
    }
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(results))
    return results


def install_fake_engine(monkeypatch, root: Path) -> None:
    """A package's metadata under ``root`` (on sys.path) whose ``kpo.engines`` entry point ``fake`` is FakeEngine,
    as ``pip install`` of a package declaring it would leave; kpo's engine registry as it was before it."""
    info = root / "kpo_fake_engine-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kpo-fake-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kpo.engines]\nfake = tests.compare.test_fake_engine:FakeEngine\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(kpo.compare.engines, "_ENGINES", dict(kpo.compare.engines._ENGINES))


def _engine_type(name: str) -> str:
    """Worker: the class of the engine ``--engine name`` runs, found in this process alone."""
    return type(engine_of(CompareConfig(engine=name))).__name__


def test_an_installed_engine_is_found_by_name_in_a_spawned_worker(monkeypatch, tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    install_fake_engine(monkeypatch, tmp_path / "site")
    assert "fake" in engine_names() and "fake" not in kpo.compare.engines._ENGINES  # listed before it is loaded
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(_engine_type, "fake").result() == "FakeEngine"
    (tmp_path / "site/kpo_fake_engine-1.0.dist-info/entry_points.txt").write_text("[kpo.engines]\nfake = nowhere:X\n")
    with pytest.raises(ValueError, match="its entry point nowhere:X does not load"):
        engine_of(CompareConfig(engine="fake"))


@pytest.fixture
def fake_engine(monkeypatch, tmp_path):
    """The fake engine installed as ``fake`` for this test alone, kpo eval replaced by a stand-in (its runs in
    workers forked from this process, where the stand-in is); returns the held-out benchmark file."""
    install_fake_engine(monkeypatch, tmp_path / "site")
    monkeypatch.setattr(kpo.compare.run, "get_context", lambda method: multiprocessing.get_context("fork"))
    monkeypatch.setattr("kpo.evaluation.evaluate", fake_evaluate)
    monkeypatch.setattr("kpo.compare.report.plot_training_dynamics", lambda curves, path, smooth: path)
    monkeypatch.setattr("kpo.compare.report.plot_contrasts", lambda results, path: path)
    problems = tmp_path / "held_out.jsonl"
    problems.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(PROBLEMS)))
    return problems


def test_a_registered_engine_runs_a_two_arm_compare(fake_engine, tmp_path):
    assert "fake" in engine_names()
    cfg = CompareConfig(
        out=str(tmp_path / "cmp"), engine="fake", methods=("vanilla", "kpo"), seeds=2, steps=4, minibatches=2,
        matched=False, ablations=False, aa_seeds=0, eval_n=2, eval_data=(str(fake_engine),), dump_every=1,
    )  # fmt: skip
    report = run_compare(cfg)
    found = json.loads((report.parent / "report.json").read_text())
    assert found["contrasts"]["kpo - vanilla"]["mean"] == pytest.approx(0.5)  # 1.0 - 0.5 at both seeds
    # the engine's own check runs with the comparison's, before anything trains
    with pytest.raises(CompareError, match="--minibatches=4: the fake engine takes 2"):
        CompareConfig(out=str(tmp_path / "other"), engine="fake", minibatches=4, eval_data=(str(fake_engine),)).validate()
    # and so does every engine's: --keep was checked by kpo's and verl's engines alone, never a plug-in's
    with pytest.raises(CompareError, match="--keep nope: unknown; use hf"):
        CompareConfig(out=str(tmp_path / "other"), engine="fake", keep="nope", eval_data=(str(fake_engine),)).validate()


def test_a_registered_engine_runs_a_one_cell_map(fake_engine, tmp_path):
    cfg = RegimeConfig(
        out=str(tmp_path / "map"), engine="fake", cells_only=("none-depth2-lr0.0001",), seeds=1,
        batches=2, eval_n=2, eval_data=(str(fake_engine),),
    )  # fmt: skip
    report = run_regimes(cfg)
    found = json.loads((report.parent / "report.json").read_text())
    assert found["ended"] and found["runs"] == 4
    arms = found["descriptive"]["stable"]["cells"]["none-depth2-lr0.0001"]
    assert {arm: a["accuracy"] for arm, a in arms.items()} == {
        "GRPO": [0.5], "GSPO": [0.5], "KPO (matched)": [1.0], "KPO (auto)": [1.0],
    }  # fmt: skip
    # the cell's settings are the engine's own words, its steps its batches x its depth
    cell = cell_config(map_plan(cfg), "none-depth2-lr0.0001", "GRPO", tmp_path)
    assert cell.train_args == ("sampler=none", "lr=0.0001") and cell.steps == 4


def test_an_unknown_engine_is_one_line_naming_the_known_ones(tmp_path):
    with pytest.raises(CompareError) as e:
        CompareConfig(out=str(tmp_path), engine="nope").validate()
    assert e.value.errors == [f"--engine='nope': unknown; use one of {', '.join(engine_names())}"]
