"""``kpo compare --engine verl`` and ``kpo compare regimes --engine verl`` on the CPU, every run verl's own
``python -m verl.trainer.main_ppo`` (v1 trainer) on the embedded toy task written as files by ``kpo task``, with the
CPU platform and transformers rollout of test_verl_e2e.py (``VERL_USE_EXTERNAL_MODULES``) and its recorder of the
loss calls, one folder per run (``KPO_VERL_CAPTURE_DIR={KPO_COMPARE_RUN}/capture``), in both ways main_ppo runs:

- **as jobs of a Ray cluster the test starts**, as a user starts one (``ray start --head``, token authentication
  on: :mod:`tests.integrations.ray_cluster`): a compare of 2 arms (verl's vanilla, KPO at the matched memory) x 1
  seed, 4 optimizer steps each (2 verl steps of 6 prompts x 8 samples, 2 mini-batches; verl's validation before
  training, a checkpoint every verl step), ``--jobs 2`` and a relative ``--out``, scored by kpo eval on the 2
  held-out problems. The cluster knows nothing of the test's setup: the CPU platform, the recorder and the
  repository reach the jobs through ``--ray-runtime-env``. It is killed with SIGKILL once both runs have
  checkpointed and logged their first verl step (no handler runs: the jobs' leases run out), a kill mid-write is
  left in one run's metrics file, and the compare is run again to the end, which resumes the runs. The cluster is
  stopped at the end, by the test.
- **as a child process**: the regime map then runs the cell those runs belong to (none-depth2-lr0.001), reusing
  them (a job's run and a child's are the same run) and training GSPO and KPO (auto), 2 at once.

About 1.5 minutes per main_ppo run on 2 shared cores, two at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")

from tests.compare.conftest import TOY_TASK as TASK_FLAGS  # noqa: E402 - the toy task, as kpo task's flags
from tests.integrations.ray_cluster import LocalCluster, leftovers  # noqa: E402
from tests.integrations.verl_loss_capture import CAPTURE_DIR_ENV, load_calls  # noqa: E402

from kpo.cli import main as kpo_main  # noqa: E402
from kpo.filter.memory import matched_memory  # noqa: E402
from kpo.losses import policy_loss  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL_MODULES = ",".join(
    f"tests.integrations.{m}" for m in ("verl_cpu_platform", "verl_cpu_rollout", "verl_loss_capture")
)
MINIBATCHES, STEPS, RESPONSE = 2, 4, 12  # RESPONSE: cpu_tiny.yaml's data.max_response_length, kpo task's for the toy
CELL = (
    "none-depth2-lr0.001"  # the regime cell the compare's runs belong to: what the compare sets as the user
)
CELL_SETTINGS = (
    "actor_rollout_ref.rollout.dtype=float32",
    "algorithm.rollout_correction.bypass_mode=false",
    "actor_rollout_ref.actor.optim.lr=0.001",
)
RUNS = ("vanilla-seed0", "kpo-memorymatched-seed0")
RUN_TIMEOUT_S = 1500
LEASE_S = 10  # how long the jobs outlive the killed compare (kpo's default: 60)
CPU_YAML = ROOT / "examples" / "verl" / "cpu_tiny.yaml"
# what the jobs need of the test's setup: the repository's test modules, the CPU platform, the recorder
TEST_ENV = {
    "PYTHONPATH": str(ROOT),
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": EXTERNAL_MODULES,
    CAPTURE_DIR_ENV: "{KPO_COMPARE_RUN}/capture",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "disabled",
}
ENV = {**os.environ, **TEST_ENV, "RAY_USAGE_STATS_ENABLED": "0"}
ENV["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def cpu_config(task: dict[str, Path]) -> list[str]:
    """A user's verl configuration for the CPU: examples/verl/cpu_tiny.yaml (test_verl_e2e.py's settings, less
    what kpo compare sets) and the validation file verl opens."""
    return ["--verl-config", str(CPU_YAML), "--", f"data.val_files={task['test']}", "trainer.save_freq=1"]


def kpo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kpo", *args]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("task")
    flags = ["--n-train", "12", "--n-test", "2", "--", *TASK_FLAGS, "--cache-dir", str(out / "cache")]
    assert kpo_main(["task", "--out", str(out / "files"), *flags]) == 0
    return {
        "model": out / "files" / "model",
        "train": out / "files" / "train.parquet",
        "test": out / "files" / "test.parquet",
    }


def compare_argv(task: dict[str, Path], out: str, *cluster: str) -> list[str]:
    return kpo_command(
        "compare", "--engine", "verl", "--model", str(task["model"]), "--dataset", str(task["train"]),
        "--eval-data", str(task["test"]), "--methods", "vanilla", "--no-ablations", "--aa-seeds", "0",
        "--seeds", "1", "--steps", str(STEPS), "--minibatches", str(MINIBATCHES), "--dump-every", "1",
        "--eval-n", "2", "--out", out, *cluster, *cpu_config(task), *CELL_SETTINGS,
    )  # fmt: skip


def _checkpoints(run: Path) -> list[Path]:
    """The run's checkpoints on disk: verl's global_step_N/actor folders."""
    return sorted((run / "checkpoints").glob("global_step_*/actor"))


def _bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` still there as it is read: verl removes an older checkpoint while a
    newer one is written, so a folder or file may go mid-walk (what is gone no longer takes space)."""
    total = 0
    for root, _, files in os.walk(folder):  # os.walk skips a folder removed before it is listed
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def _watched(argv: list[str], env: dict, cwd: Path, log: Path, runs: Path, until=None) -> dict:
    """Run kpo compare, looking at its runs' checkpoints every half second, until it ends or ``until()`` holds
    (then SIGKILL it): {"code", "most" (run -> the most checkpoints seen at once), "bytes" (the most bytes of
    checkpoints seen at once)}."""
    most, peak = {}, 0
    with open(log, "w") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=sink, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-6000:]
            for run in runs.glob("*-seed0"):
                held = _checkpoints(run)
                most[run.name] = max(most.get(run.name, 0), len(held))
                peak = max(peak, sum(_bytes(c) for c in held))
            if until is not None and until():
                os.kill(proc.pid, signal.SIGKILL)  # kpo compare alone: its workers die with it
                break
            time.sleep(0.5)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"code": code, "most": most, "bytes": peak, "output": log.read_text()}


@pytest.fixture(scope="module")
def compare(task, tmp_path_factory) -> dict:
    """The compare on a local Ray cluster: killed with SIGKILL once both runs have checkpointed and logged their
    first verl step, then run to the end: {"out", "killed" (the first attempt), "left" (the compare's Ray jobs and
    live actors once the kill's leases ran out), "rerun" (the second attempt), "stopped" (the cluster's processes
    that had to be killed at its stop)}."""
    work = tmp_path_factory.mktemp("verl-compare")  # kpo compare's working directory
    out = work / "runs" / CELL
    runtime_env = work / "runtime_env.yaml"
    runtime_env.write_text(json.dumps({"env_vars": TEST_ENV}))
    cluster = LocalCluster(tmp_path_factory.mktemp("ray"), cpus=32, gpus=2)
    try:
        env = {**ENV, **{k: cluster.env[k] for k in ("PATH", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")},
               "KPO_RAY_LEASE_SECONDS": str(LEASE_S)}  # fmt: skip
        argv = compare_argv(
            task, f"runs/{CELL}", "--jobs", "2", "--ray-address", cluster.address, "--ray-runtime-env", str(runtime_env)
        )

        def both_checkpointed() -> bool:  # verl saves a step's checkpoint before it logs the step's row
            rows = [out / "runs" / name / "verl_metrics-0.jsonl" for name in RUNS]
            return all(p.exists() and "actor/pg_clipfrac" in p.read_text() for p in rows)

        killed = _watched(argv, env, work, work / "killed.log", out / "runs", until=both_checkpointed)
        # the jobs' leases run out: main_ppo stops, and Ray ends its actors
        deadline = time.monotonic() + LEASE_S + 180
        while (left := leftovers(cluster, "kpo-"))["alive"] or any(
            s in ("PENDING", "RUNNING") for s in left["jobs"].values()
        ):
            assert time.monotonic() < deadline, left
            time.sleep(2)
        # a kill mid-write leaves the last line of a metrics file cut short
        with open(out / "runs" / RUNS[1] / "verl_metrics-0.jsonl", "a") as f:
            f.write('{"step": 2, "data": {"actor/pg_cl')
        rerun = _watched(argv, env, work, work / "rerun.log", out / "runs")
        auth = _without_the_token(cluster.address, work)
    finally:
        stopped = cluster.stop()
    assert rerun["code"] == 0, rerun["output"][-8000:]
    return {
        "out": out, "killed": killed, "left": left, "rerun": rerun, "stopped": stopped, "cluster": cluster, "auth": auth
    }  # fmt: skip


def _without_the_token(address: str, home: Path) -> dict[str, str]:
    """What kpo says of the cluster where Ray finds no token (``missing``) and where it finds a wrong one
    (``refused``): its one line each."""
    said = {}
    env = {k: v for k, v in ENV.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(home)}
    code = (
        "from kpo.compare.engines.verl_cluster import ClusterError, connect\n"
        f"try:\n    connect({address!r})\nexcept ClusterError as e:\n    print(e)"
    )
    for case, extra in (("missing", {}), ("refused", {"RAY_AUTH_TOKEN": "0" * 64})):
        done = subprocess.run([sys.executable, "-c", code], env=env | extra, capture_output=True, text=True, timeout=120)
        said[case] = done.stdout.strip()
    return said


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_a_sigkilled_compare_leaves_no_job_and_its_rerun_trains_every_step(compare):
    out = compare["out"]
    assert compare["killed"]["code"] == -signal.SIGKILL
    # Ray's own state: every job of the compare ended (its lease ran out), and none of their actors lives on
    assert compare["left"]["alive"] == [] and len(compare["left"]["jobs"]) >= 2
    assert set(compare["left"]["jobs"].values()) <= {"FAILED", "STOPPED", "SUCCEEDED"}
    rerun = compare["rerun"]["output"]
    for name in RUNS:  # each run resumed from its checkpoint, or had finished before the kill
        folder = out / "runs" / name
        assert f"resuming {name} from its checkpoint" in rerun or "1 already done" in rerun, rerun[-3000:]
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        # one row per verl step, each with its training metrics: none lost to the kill
        assert [r["step"] for r in rows] == [2, 4] and all(0 <= r["reward_mean"] <= 1 for r in rows)
        assert all(r["clip_frac"] is not None for r in rows)
        assert json.loads((folder / "eval.json").read_text())["benchmarks"]["test"]["problems"] == 2
        assert len(json.loads((folder / "ray-jobs.json").read_text())) >= 1
    torn = (out / "runs" / RUNS[1] / "log.txt").read_text()
    assert "verl_metrics-0.jsonl: its last line is cut short" in torn and "skipped" in torn
    # the cluster stopped itself at the end: nothing of it had to be killed
    assert compare["stopped"] == [] and compare["cluster"].head.returncode is not None


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_ray_s_token_authentication_stays_on_and_is_named_when_missing_or_refused(compare):
    missing, refused = compare["auth"]["missing"], compare["auth"]["refused"]
    assert missing.startswith(f"--ray-address {compare['cluster'].address}: the cluster asks for Ray's authentication")
    assert "none is here where Ray looks (RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token)" in missing
    assert refused.startswith(f"--ray-address {compare['cluster'].address}: the cluster refused the Ray token found")
    assert "\n" not in missing + refused


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_a_run_holds_one_checkpoint_while_it_trains_within_the_planned_disk(compare):
    """verl keeps a run's last checkpoint (trainer.max_actor_ckpt_to_keep=1), removing it once the next is written
    whole (two at once while it writes), and the rerun removes the killed attempt's older ones: the plan's disk per
    run bounds what was seen at once."""
    for attempt in ("killed", "rerun"):
        assert compare[attempt]["most"] and max(compare[attempt]["most"].values()) <= 2, compare[attempt]["most"]
    planned = re.search(r"disk per run: at most ([\d.]+) (kB|MB|GB) while it trains", compare["killed"]["output"])
    assert planned, compare["killed"]["output"][-3000:]
    limit = float(planned[1]) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[planned[2]]
    # two runs at once: the most seen together is at most twice one run's
    assert 0 < max(compare[a]["bytes"] for a in ("killed", "rerun")) <= 2 * limit
    assert "each run a job of the Ray cluster at" in compare["killed"]["output"]


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_the_report_pairs_the_arms_by_seed_on_held_out_problems(compare):
    out = compare["out"]
    report = json.loads((out / "report.json").read_text())
    contrast = report["contrasts"]["kpo (memory=matched) - vanilla"]
    assert contrast["seeds"] == 1 and len(contrast["per_seed"]) == 1
    assert "held-out avg@2 over the 2 problems of test" in (out / "report.md").read_text()
    for name in RUNS:
        logged = (out / "runs" / name / "verl_metrics-0.jsonl").read_text().splitlines()
        # the start model's validation, verl's step 0, stays in verl's own file
        assert json.loads(logged[0])["step"] == 0 and all(k.startswith("val-") for k in json.loads(logged[0])["data"])
        # --keep's default: the final checkpoint's Hugging Face weights alone stay
        kept = {p.parent for p in (out / "runs" / name / "checkpoints").rglob("*") if p.is_file()}
        assert kept == {out / "runs" / name / "checkpoints" / "global_step_2" / "actor" / "huggingface"}
    assert re.search(r"; disk [\d.]+ [kMG]B written, [\d.]+ [kMG]B kept", compare["rerun"]["output"])
    # the arms of a seed trained on the same prompts: the seed, not the arm, sets verl's data order and sampling;
    # every path the jobs were given is absolute (--out was relative)
    settings = [json.loads((out / "runs" / name / "run.json").read_text())["overrides"] for name in RUNS]
    assert all("data.seed=0" in o and "actor_rollout_ref.rollout.seed=0" in o for o in settings)
    assert all(f"trainer.default_local_dir={out / 'runs' / n / 'checkpoints'}" in o for n, o in zip(RUNS, settings))


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
@pytest.mark.parametrize("arm", ["vanilla", "kpo-memorymatched"])
def test_each_run_trained_on_its_arm_s_loss(compare, arm):
    memory = matched_memory(RESPONSE)
    calls = load_calls(compare["out"] / "runs" / f"{arm}-seed0" / "capture")  # the runtime env reached the actors
    (rank,) = calls
    # one call per optimizer step (one micro-batch each); a resumed run also has its killed attempt's calls of
    # the verl step it redid
    assert STEPS <= len(calls[rank]) <= STEPS + MINIBATCHES
    for call in calls[rank]:
        if arm == "vanilla":  # verl's own vanilla at its paper clip range
            assert call["loss_mode"] == "vanilla" and call["loss_agg_mode"] == "token-mean"
            assert (call["config"]["clip_ratio_low"], call["config"]["clip_ratio_high"]) == (0.2, 0.2)
            continue
        # kpo's loss at the matched memory, the paper's band: kpo.policy_loss on the recorded batch, bit for bit
        assert call["loss_mode"] == "kpo" and call["config"]["memory"] == pytest.approx(memory)
        info = call["global_batch_info"]
        loss, _ = policy_loss(
            "kpo", log_prob=call["log_prob"], old_log_prob=call["old_log_prob"], advantages=call["advantages"],
            response_mask=call["response_mask"],
            loss_agg_mode=call["loss_agg_mode"], clip_ratio_low=3e-4, clip_ratio_high=4e-4,
            memory=call["config"]["memory"], global_num_tokens=info["batch_num_tokens"],
            global_num_seqs=info["global_batch_size"], dp_size=info["dp_size"],
        )  # fmt: skip
        assert call["loss_agg_mode"] == "seq-mean-token-mean" and torch.equal(loss, call["loss"])


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_kpo_analyze_reads_a_verl_run_s_ratio_dumps(compare, tmp_path):
    run = compare["out"] / "runs" / "kpo-memorymatched-seed0"  # resumed: its dumps from both attempts
    dumps = sorted(p.name for p in (run / "ratios").iterdir())
    assert dumps == [f"step_{s:06d}-rank0.safetensors" for s in range(1, STEPS + 1)]
    assert kpo_main(["analyze", str(run), "--out", str(tmp_path / "analysis"), "--off-policy-only"]) == 0
    table2 = json.loads((tmp_path / "analysis" / "table2.json").read_text())
    assert table2  # the off-policy mini-batches' raw and filtered ratios (the on-policy ones are exactly 1)


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_a_one_cell_regime_map_on_verl_reuses_the_compare_s_runs(compare, task, tmp_path_factory):
    """The child-process path (no cluster): the cell's other arms are main_ppo children, 2 at once."""
    out = tmp_path_factory.mktemp("verl-regimes")
    for name in RUNS:  # copies keep their files' times
        shutil.copytree(compare["out"] / "runs" / name, out / CELL / "runs" / name)
    stamp = {name: (out / CELL / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in RUNS}
    argv = kpo_command(
        "compare", "regimes", "--engine", "verl", "--model", str(task["model"]), "--dataset", str(task["train"]),
        "--eval-data", str(task["test"]), "--cells", CELL, "--seeds", "1",
        "--batches", str(STEPS // MINIBATCHES), "--jobs", "2",
        "--eval-n", "2", "--out", str(out), *cpu_config(task),
    )  # fmt: skip
    env = {k: v for k, v in ENV.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    # the compare's runs (jobs of the cluster) have the cell's settings: reused; GSPO and KPO (auto) trained on
    # verl (one seed: a smoke map)
    assert {name: (out / CELL / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in RUNS} == stamp
    assert all((out / CELL / "runs" / name / "eval.json").exists() for name in ("gspo-seed0", "kpo-memoryauto-seed0"))
    found = json.loads((out / "report.json").read_text())
    assert found["ended"] and found["runs"] == 4  # recorded: the map is a study whose plan its flags made
    arms = found["descriptive"]["stable"]["cells"][CELL]
    assert set(arms) == {"GRPO", "GSPO", "KPO (matched)", "KPO (auto)"}
    assert all(len(a["accuracy"]) == 1 for a in arms.values())
    assert all(q["looks"][-1]["seeds"] == 1 for q in found["questions"].values())


@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_a_study_on_verl_records_the_same_runs_and_reports(compare, task, tmp_path):
    """``kpo compare study`` with ``engine: verl``: a plan of the compare's cell, its two arms and one seed, registered
    (every (cell, arm)'s runs checked by the verl engine), then run: its runs have the compare's settings (the verl
    engine says nothing changed), so they are reused, recorded and reported, and the study trains nothing (the
    machinery is the one every engine shares; the compare above trained these runs on verl)."""
    import yaml

    from kpo.compare.engines import engine_of
    from kpo.compare.study.run import Study

    plan = {
        "title": "a study on verl",
        "setup": {"engine": "verl", "model": str(task["model"]), "dataset": str(task["train"]),
                  "eval_data": [str(task["test"])], "verl_config": str(CPU_YAML), "batches": STEPS // MINIBATCHES,
                  "eval_n": 2, "train_args": cpu_config(task)[3:]},
        "arms": {"GRPO": {"loss": "vanilla"}, "KPO (matched)": {"loss": "kpo", "loss_kwargs": {"memory": "matched"}}},
        "cells": {CELL: {"depth": MINIBATCHES, "lr": 1e-3}},
        "groups": {"one": {"cells": [CELL], "looks": [1]}},
        "questions": [{"key": "kpo_vs_grpo", "text": "Is KPO more accurate than GRPO?", "outcome": "accuracy",
                       "a": "KPO (matched)", "b": "GRPO", "group": "one", "role": "primary"}],
        "seeds": {"first": 0},
        "sizing": {"effects": {"kpo_vs_grpo": {"mean": 0.1, "sd": 0.1}}, "sims": 100},
    }  # fmt: skip
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    study, runs = tmp_path / "study", tmp_path / "runs"
    assert kpo_main(["compare", "study", "--plan", str(tmp_path / "plan.yaml"), "--study", str(study), "--register"]) == 0
    for name in RUNS:  # copies keep their files' times
        shutil.copytree(compare["out"] / "runs" / name, runs / CELL / "runs" / name)
    stamp = {name: (runs / CELL / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in RUNS}
    s = Study(study, runs)
    for arm in plan["arms"]:
        job = s.job(CELL, arm, 0)
        assert engine_of(job.cfg).changed(job.cfg, job.run, job.folder) == [], arm  # the same runs
    assert kpo_main(["compare", "study", "--study", str(study), "--runs", str(runs), "--allow-uncommitted"]) == 0
    assert {name: (runs / CELL / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in RUNS} == stamp
    report = json.loads((study / "report.json").read_text())
    assert report["ended"] and report["runs"] == 2 and report["study"] == "exploratory"  # not committed: said so
    (look,) = report["questions"]["kpo_vs_grpo"]["looks"]
    assert look["seeds"] == 1 and look["test"] == "exact sign-flip permutation test"
