"""``kpo compare --engine verl``'s plan-time checks and its per-run settings, on verl's composed configuration
(Hydra, verl's config classes) without running main_ppo: a few seconds in all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")

from kpo.compare.engines import verl_cluster  # noqa: E402
from kpo.compare.engines.verl import (  # noqa: E402
    ACTOR,
    OWNED,
    VerlEngine,
    _has_weights,
    _run_env,
    attempt_rows,
)
from kpo.compare.engines.verl_job import PROBE_MARK  # noqa: E402
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
        ("data.train_batch_size=0", "data.train_batch_size=0: must be prompts per generation batch, an integer >= 1"),
        ("data.train_batch_size=-6", "data.train_batch_size=-6: must be prompts per generation batch"),
        ("data.train_batch_size=1.5", "data.train_batch_size=1.5: must be prompts per generation batch"),
        ("trainer.save_freq=abc", "trainer.save_freq=abc: must be an integer (verl's training steps between"),
        (f"{ACTOR}.optim.lr=abc", f"{ACTOR}.optim.lr=abc: verl's FSDPOptimizerConfig.lr takes a float, not str"),
        (f"{ACTOR}.optim.lr=nan", f"{ACTOR}.optim.lr=nan: must be a finite number > 0"),
        (f"{ACTOR}.optim.lr=-1e-6", f"{ACTOR}.optim.lr=-1e-06: must be a finite number > 0"),
        ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0: must be an integer >= 2 (a group advantage"),
        (f"{ACTOR}.ppo_epochs=0", f"{ACTOR}.ppo_epochs=0: must be passes over a generation batch, an integer >= 1"),
        (f"{ACTOR}.strategy=megatron", f"{ACTOR}.strategy=megatron: kpo compare runs verl's FSDP actor only"),
    ],
)
def test_a_value_verl_would_reject_stops_the_plan(override, reason):
    errors = [e for e in _errors(_cfg(override)) if "--eval-data" not in e]
    assert len(errors) == 1 and errors[0].startswith(reason), errors


def test_verl_s_own_check_is_shown_in_full():
    """Multi-line errors of the actor config classes (a field neither verl's nor kpo's actor config has) keep their
    reasons, each on one line."""
    cfg = _cfg(f"+{ACTOR}.not_a_field=1e-6", methods=("gspo",))
    gspo, kpo = VerlEngine().config_errors(cfg, plan_runs(cfg))
    for err, run in ((gspo, "gspo-seed0"), (kpo, "kpo-memorymatched-seed0")):
        assert err.startswith(f"run {run}: verl's configuration check: InstantiationException: Error in call")
        assert "unexpected keyword argument 'not_a_field'" in err and "\n" not in err


@pytest.mark.parametrize(
    "override, key",
    [
        (f"+{ACTOR}.q_min=1e-5", f"{ACTOR}.q_min"),  # the hand-copied list missed it: KPO (auto) changed silently
        (f"+{ACTOR}.steps_per_batch=3", f"{ACTOR}.steps_per_batch"),
        (f"{ACTOR}.policy_loss={{loss_mode:gspo}}", f"{ACTOR}.policy_loss.loss_mode"),
        ("data={seed:3}", "data.seed"),
        ("trainer.max_actor_ckpt_to_keep=5", "trainer.max_actor_ckpt_to_keep"),
    ],
)
def test_a_key_kpo_owns_is_refused_however_it_is_set(override, key):
    (err,) = [e for e in VerlEngine().flag_errors(_cfg(override)) if "--eval-data" not in e]
    assert key in err and "kpo compare sets" in err and "for every run; use " in err, err


def test_the_owned_keys_are_every_field_kpo_s_actor_config_adds():
    """Derived from the loss registry, as the plugin's KPOActorConfig: a keyword added to a loss is owned too."""
    import dataclasses

    from verl.workers.config import FSDPActorConfig

    from kpo.integrations.verl import KPOActorConfig

    verl_own = {f.name for f in dataclasses.fields(FSDPActorConfig)}
    added = {f"{ACTOR}.{f.name}" for f in dataclasses.fields(KPOActorConfig) if f.name not in verl_own}
    assert added <= set(OWNED)


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
    assert _run_env(tmp_path, run, 0)["TENSORBOARD_DIR"] == "/data/tb/vanilla-seed0"
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


def test_every_path_a_run_is_given_is_absolute_and_it_keeps_one_checkpoint(tmp_path, monkeypatch):
    """A relative --out resolved where kpo compare runs (the workers run elsewhere: issue 54), one checkpoint kept
    while it trains unless --keep all, and kpo's actor config told the steps of a generation batch."""
    monkeypatch.chdir(tmp_path)
    cfg = _cfg("trainer.rollout_data_dir=rollouts", methods=("kpo",), out="runs/cmp")
    run = plan_runs(cfg)[0]
    overrides = VerlEngine().overrides(cfg, run, Path(cfg.out) / "runs" / run.name)
    folder = tmp_path / "runs" / "cmp" / "runs" / run.name
    for expected in (f"trainer.default_local_dir={folder / 'checkpoints'}", f"hydra.run.dir={folder / 'hydra'}",
                     f"+{ACTOR}.dump_ratios_dir={folder / 'ratios'}",
                     f"trainer.rollout_data_dir={tmp_path / 'rollouts' / run.name}",
                     "trainer.max_actor_ckpt_to_keep=1", f"+{ACTOR}.steps_per_batch=2"):  # fmt: skip
        assert expected in overrides
    assert _run_env(folder, run, 1)["VERL_FILE_LOGGER_PATH"] == str(folder / "verl_metrics-1.jsonl")
    kept = VerlEngine().overrides(_cfg(methods=("kpo",), keep="all"), run, folder)
    assert not any("ckpt_to_keep" in o for o in kept)


def test_a_torn_last_metrics_line_is_skipped(tmp_path):
    """A kill (or a read) mid-write leaves the last line cut short: the run goes on, and the line is left out (it
    raised in kpo compare's loop, and a resumed run failed on it at every rerun: issue 54)."""
    path = tmp_path / "verl_metrics-0.jsonl"
    path.write_text('{"step": 1, "data": {"actor/pg_loss": 0.5}}\n{"step": 2, "data": {"actor/pg')
    rows, torn = attempt_rows(path)
    assert rows == [{"step": 1, "data": {"actor/pg_loss": 0.5}}] and torn == '{"step": 2, "data": {"actor/pg'
    assert VerlEngine().steps_done(_cfg(), tmp_path) == 2  # verl's step 1, of 2 optimizer steps
    path.write_text('{"step": 1, "da\n{"step": 2, "data": {}}\n')
    with pytest.raises(ValueError, match="line 1: not a JSON row"):
        attempt_rows(path)  # only the last line can be torn: an earlier one is not verl's writing


def test_the_cluster_recipe_s_compare_passes_kpo_s_flag_checks(tmp_path):
    """examples/verl/run_compare_on_cluster.sh compare: the command it runs (a stub kpo prints it) sets nothing kpo
    compare owns and names a runtime env kpo reads."""
    import subprocess

    from kpo.compare.cli import config_from_args
    from kpo.compare.engines.verl_cluster import runtime_env_errors

    stub = tmp_path / "bin" / "kpo"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nexec python3 -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}", "NNODES": "2", "JOBS": "3"}
    done = subprocess.run([str(ROOT / "examples" / "verl" / "run_compare_on_cluster.sh"), "compare", "--plan"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[0] == "compare" and "--plan" in argv
    cfg = config_from_args(argv[1:])
    assert (cfg.engine, cfg.jobs, cfg.ray_address) == ("verl", 3, "http://127.0.0.1:8265")
    assert [e for e in VerlEngine().flag_errors(cfg) if "--eval-data" not in e] == []
    assert runtime_env_errors(cfg, ("KPO_COMPARE_RUN",)) == []
    assert "trainer.nnodes=2" in cfg.train_args


# ------------------------------------------------------------------ the plan's check of a Ray cluster
class _Client:
    """Ray's JobSubmissionClient as the probe uses it: the probe job writes each node's file as ``nodes`` says
    (``wrote``: an error, or the file written; ``lock_taken``) and logs its findings."""

    def __init__(self, nodes: list[dict]):
        self.nodes = nodes

    def submit_job(self, *, entrypoint: str, runtime_env: dict) -> str:
        folder = Path(entrypoint.split("--dir ")[1].strip("'"))
        checks = []
        for n in self.nodes:
            if n.get("write", True):
                (folder / n["node"]).write_text(n["node"])
            checks.append({"node": n["node"], "host": n["node"], "wrote": n.get("error"), "lock_taken": n.get("lock", False)})
        resources = [{"node": n["node"], "resources": {"CPU": n["cpus"], "GPU": n["gpus"]}} for n in self.nodes]
        self.log = PROBE_MARK + json.dumps({"nodes": resources, "checks": checks}) + "\n"
        return "probe"

    def get_job_status(self, job: str) -> str:
        return "SUCCEEDED"

    def get_job_logs(self, job: str) -> str:
        return self.log


def _cluster_errors(tmp_path, monkeypatch, nodes: list[dict], gpus_per_node: int = 1) -> list[str]:
    monkeypatch.setattr(verl_cluster, "connect", lambda address: _Client(nodes))
    composed = {
        "trainer": {"nnodes": 1, "n_gpus_per_node": gpus_per_node, "use_v1": True},
        "transfer_queue": {"backend": {"SimpleStorage": {"num_data_storage_units": 2}}},
    }
    from omegaconf import OmegaConf

    cfg = CompareConfig(engine="verl", out=str(tmp_path / "out"), ray_address="http://head:8265")
    return verl_cluster.cluster_errors(cfg, OmegaConf.create(composed), tmp_path / "out")


def test_the_plan_passes_a_cluster_that_shares_out_and_has_a_run_s_resources(tmp_path, monkeypatch):
    assert _cluster_errors(tmp_path, monkeypatch, [{"node": "a" * 20, "cpus": 8, "gpus": 1}]) == []
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # the probe's folder is gone


def test_a_node_that_cannot_see_out_is_named(tmp_path, monkeypatch):
    nodes = [{"node": "a" * 20, "cpus": 8, "gpus": 1}, {"node": "b" * 20, "cpus": 8, "gpus": 1, "write": False}]
    (err,) = _cluster_errors(tmp_path, monkeypatch, nodes)
    assert err.startswith(f"--out {tmp_path / 'out'}: node {'b' * 20} ({'b' * 12}) cannot share it (its file is not")
    assert err.endswith("mount at the same path")


def test_a_cluster_too_small_for_one_run_is_refused(tmp_path, monkeypatch):
    gpus, cpus = _cluster_errors(tmp_path, monkeypatch, [{"node": "a" * 20, "cpus": 4, "gpus": 1}], gpus_per_node=2)
    assert "one run asks for 1 node(s) of 2 GPU(s)" in gpus and "the cluster has 0 such node(s)" in gpus
    assert "one run asks for 10 logical CPUs" in cpus and "the cluster has 4" in cpus


def test_flock_that_does_not_exclude_across_nodes_moves_runs_to_pid_files(tmp_path, monkeypatch, capsys):
    from kpo.compare import guards

    # set, so that monkeypatch restores it unset at the end, whatever the test turns on (delenv of an unset
    # variable records nothing to restore)
    monkeypatch.setenv(guards.PID_FILES_ENV, "0")
    nodes = [{"node": "a" * 20, "cpus": 8, "gpus": 1}, {"node": "b" * 20, "cpus": 8, "gpus": 1, "lock": True}]
    assert _cluster_errors(tmp_path, monkeypatch, nodes) == []
    assert "does not exclude across the cluster's nodes; each run is locked with an exclusive pid file" in (
        capsys.readouterr().out
    )
    assert guards._pid_files()




@pytest.mark.parametrize("status", ["RUNNING", "SUCCEEDED", "FAILED"])
def test_a_rerun_follows_a_running_job_reuses_a_finished_one_and_resumes_a_failed_one(tmp_path, monkeypatch, status):
    """The run's last Ray job (found by its recorded id): still running, it is followed to its end (a compare
    killed and rerun before the job's lease ran out); finished with the final weights, what it wrote is read; failed
    or stopped, the run resumes as a new attempt's job."""
    import kpo.compare.engines.verl as engine_module

    monkeypatch.setattr(engine_module, "cluster_address", lambda cfg: "http://head:8265")
    cfg, run, out = _cfg(), Run("vanilla", 0), tmp_path / "vanilla-seed0"
    engine = VerlEngine()
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"verl_config": CPU_YAML.read_text(),
                                              "overrides": list(engine.overrides(cfg, run, out))}))  # fmt: skip
    final = out / "checkpoints" / "global_step_2" / "actor" / "huggingface"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"x")
    rows = [{"step": s, "data": {"critic/score/mean": 0.5, "actor/pg_clipfrac": 0.1}} for s in (1, 2)]
    (out / "verl_metrics-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []

    class Jobs:
        def __init__(self, address: str, folder: Path):
            assert (address, folder) == ("http://head:8265", out)

        def ids(self) -> list[str]:
            return ["kpo-job-0"]

        def last(self) -> tuple[str, str]:
            return "kpo-job-0", status

        def follow(self, job: str) -> None:
            calls.append(f"follow {job}")

        def stop_live(self) -> None:
            calls.append("stop")

        def submit(self, command: list[str], env: dict) -> str:
            assert env["env_vars"]["VERL_FILE_LOGGER_PATH"] == str(out / "verl_metrics-1.jsonl")
            calls.append("submit")
            return "kpo-job-1"

    monkeypatch.setattr(engine_module, "RunJob", Jobs)
    assert engine.train(cfg, run, out, resume=True) == final
    assert calls == {"RUNNING": ["follow kpo-job-0"], "SUCCEEDED": [], "FAILED": ["stop", "submit", "follow kpo-job-1"]}[
        status
    ]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [2, 4]
