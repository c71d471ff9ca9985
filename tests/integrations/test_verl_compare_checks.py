"""``kpo compare --engine verl``'s plan-time checks and its per-run settings, on verl's composed configuration
(Hydra, verl's config classes) without running main_ppo: a few seconds in all."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")

from kpo.compare.engines.verl import ACTOR, VerlEngine, _env, _has_weights  # noqa: E402
from kpo.compare.plan import CompareConfig, Run, plan_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU_YAML = ROOT / "examples" / "verl" / "cpu_tiny.yaml"


def _cfg(*overrides: str, verl_config: Path = CPU_YAML, **kw) -> CompareConfig:
    kw.setdefault("methods", ("vanilla",))
    return CompareConfig(
        engine="verl", verl_config=str(verl_config), seeds=1, steps=4, minibatches=2, ablations=False, aa_seeds=0,
        eval_data=("held_out.parquet",), train_args=overrides, **kw,
    )  # fmt: skip


def _errors(cfg: CompareConfig) -> list[str]:
    return VerlEngine().flag_errors(cfg) + VerlEngine().config_errors(cfg, plan_runs(cfg))


@pytest.mark.parametrize(
    "override, reason",
    [
        ("data.train_batch_size=0", "--minibatches=2: must divide data.train_batch_size=0"),
        (f"{ACTOR}.optim.lr=abc", f"{ACTOR}.optim.lr=abc: verl's FSDPOptimizerConfig.lr takes a float, not str"),
        (f"{ACTOR}.ppo_epochs=0", f"{ACTOR}.ppo_epochs=0: must be >= 1"),
        (f"{ACTOR}.strategy=megatron", f"{ACTOR}.strategy=megatron: kpo compare runs verl's FSDP actor only"),
    ],
)
def test_a_value_verl_would_reject_stops_the_plan(override, reason):
    errors = [e for e in _errors(_cfg(override)) if "--eval-data" not in e]
    assert len(errors) == 1 and errors[0].startswith(reason), errors


def test_verl_s_own_check_is_shown_in_full():
    """Multi-line errors of the actor config classes (kpo's q_min: GSPO's actor config has no such field, and the
    matched-memory KPO run fits no q) keep their reasons, each on one line."""
    cfg = _cfg(f"+{ACTOR}.q_min=1e-6", methods=("gspo",))
    gspo, kpo = VerlEngine().config_errors(cfg, plan_runs(cfg))
    assert gspo.startswith("run gspo-seed0: verl's configuration check: InstantiationException: Error in call")
    assert "unexpected keyword argument 'q_min'" in gspo  # the reason, after the first line of verl's message
    assert kpo.startswith("run kpo-memorymatched-seed0:") and "they apply only with memory='auto'" in kpo
    assert "\n" not in gspo + kpo


def test_a_key_kpo_owns_is_refused_from_the_yaml_as_from_the_command_line(tmp_path):
    yaml = tmp_path / "mine.yaml"
    yaml.write_text(CPU_YAML.read_text().replace("  max_response_length: 12", "  max_response_length: 12\n  seed: 7"))
    (err,) = [e for e in _errors(_cfg(verl_config=yaml)) if "data.seed" in e]
    assert err == f"--verl-config {yaml}: sets data.seed (7); kpo compare sets it for every run: remove it there and use --seeds"
    (err,) = [e for e in _errors(_cfg("data.seed=7")) if "data.seed" in e]
    assert err == "-- data.seed=...: kpo compare sets it for every run; use --seeds instead"


def test_each_run_writes_its_own_folders_and_is_scored_at_its_response_budget(tmp_path, monkeypatch):
    cfg = _cfg("trainer.rollout_data_dir=/data/rollouts", "trainer.validation_data_dir=/data/val",
               "trainer.experiment_name=mine")  # fmt: skip
    assert _errors(cfg) == []  # the experiment's name is the user's: each run's is it plus the run's name
    run = Run("vanilla", 0)
    overrides = VerlEngine().overrides(cfg, run, tmp_path)
    for expected in ("trainer.rollout_data_dir=/data/rollouts/vanilla-seed0",
                     "trainer.validation_data_dir=/data/val/vanilla-seed0",
                     "trainer.experiment_name=mine-vanilla-seed0"):  # fmt: skip
        assert expected in overrides
    monkeypatch.setenv("TENSORBOARD_DIR", "/data/tb")
    assert _env(tmp_path, run, 0)["TENSORBOARD_DIR"] == "/data/tb/vanilla-seed0"
    assert VerlEngine().eval_settings(cfg)["max_new_tokens"] == 12  # cpu_tiny.yaml's data.max_response_length


def test_the_final_check_wants_weights_not_a_config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not _has_weights(tmp_path)  # verl writes config.json (and the tokenizer) without hf_model
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert _has_weights(tmp_path)


@pytest.mark.parametrize("keep", ["hf", "all", "none"])
def test_keep_leaves_the_final_hugging_face_weights(tmp_path, keep):
    cfg = _cfg(keep=keep)  # 4 steps of 2 mini-batches: verl's final checkpoint is global_step_2
    files = ["latest_checkpointed_iteration.txt"] + [
        f"global_step_{s}/actor/{name}"
        for s in (1, 2)
        for name in ("model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "huggingface/model.safetensors")
    ]
    for name in files:
        (tmp_path / "checkpoints" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "checkpoints" / name).write_text("x")
    VerlEngine().prune(cfg, tmp_path)
    left = sorted(str(p.relative_to(tmp_path / "checkpoints")) for p in tmp_path.rglob("*") if p.is_file())
    assert left == {"all": sorted(files), "hf": ["global_step_2/actor/huggingface/model.safetensors"], "none": []}[keep]
