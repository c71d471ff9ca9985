"""``kpo compare --engine verl`` and ``kpo compare regimes --engine verl`` on the CPU: every run is verl's own
``python -m verl.trainer.main_ppo`` (v1 trainer) on the embedded toy task written as files by ``kpo task``, with
the CPU platform and transformers rollout of test_verl_e2e.py (``VERL_USE_EXTERNAL_MODULES``) and its recorder of
the loss calls, one folder per run (``KPO_VERL_CAPTURE_DIR={KPO_COMPARE_RUN}/capture``).

One compare of 2 arms (verl's vanilla, KPO at the matched memory) x 1 seed, 4 optimizer steps each (2 verl
steps of 6 prompts x 8 samples, 2 mini-batches; verl's validation before training, a checkpoint every verl step),
scored by kpo eval on the 2 held-out problems, is run once for the module: killed (SIGTERM) once its second run
has checkpointed and logged its first verl step, then run again to the end, which resumes that run (whose
validation before training logs at the checkpointed step). The regime map then runs
the cell those runs belong to (none-depth2-lr0.001): it reuses them and trains GSPO (and the clip band, if GRPO
collapsed in a seed where KPO or GSPO did not). About 1.5 minutes per main_ppo run on 2 shared cores.
"""

from __future__ import annotations

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
RUN_TIMEOUT_S = 1500
CPU_YAML = ROOT / "examples" / "verl" / "cpu_tiny.yaml"


def cpu_config(task: dict[str, Path]) -> list[str]:
    """A user's verl configuration for the CPU: examples/verl/cpu_tiny.yaml (test_verl_e2e.py's settings, less
    what kpo compare sets) and the validation file verl opens."""
    return ["--verl-config", str(CPU_YAML), "--", f"data.val_files={task['test']}", "trainer.save_freq=1"]


def kpo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kpo", *args]


ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": EXTERNAL_MODULES,
    CAPTURE_DIR_ENV: "{KPO_COMPARE_RUN}/capture",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "disabled",
}


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


def compare_argv(task: dict[str, Path], out: Path) -> list[str]:
    return kpo_command(
        "compare", "--engine", "verl", "--model", str(task["model"]), "--dataset", str(task["train"]),
        "--eval-data", str(task["test"]), "--methods", "vanilla", "--no-ablations", "--aa-seeds", "0",
        "--seeds", "1", "--steps", str(STEPS), "--minibatches", str(MINIBATCHES), "--dump-every", "1",
        "--eval-n", "2", "--out", str(out), *cpu_config(task), *CELL_SETTINGS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def compare(task, tmp_path_factory) -> dict:
    """The compare, killed once its second run has checkpointed and logged its first verl step, then run to the
    end: {"out", "killed" (the first attempt's exit status), "stamps" (the first run's files after the kill),
    "rerun" (the second's output), "second" (the resumed run's folder)}."""
    out = tmp_path_factory.mktemp("verl-compare") / CELL
    runs = out / "runs"
    first, second = runs / "vanilla-seed0", runs / "kpo-memorymatched-seed0"
    log = out.parent / "killed.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(compare_argv(task, out), env=ENV, start_new_session=True, stdout=sink, stderr=sink)
    try:
        deadline = time.time() + RUN_TIMEOUT_S
        # verl saves a step's checkpoint before it logs the step's row: both are there once the row is
        first_rows = second / "verl_metrics-0.jsonl"
        while not (first_rows.exists() and "actor/pg_clipfrac" in first_rows.read_text()):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-6000:]
            time.sleep(1)
        os.kill(proc.pid, signal.SIGTERM)
        killed = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stamps = {p.name: p.stat().st_mtime_ns for p in first.iterdir() if p.is_file()}
    rerun = subprocess.run(
        compare_argv(task, out), env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-6000:]
    return {"out": out, "killed": killed, "stamps": stamps, "rerun": rerun.stdout, "second": second}


@pytest.mark.timeout(RUN_TIMEOUT_S * 2)
def test_a_kill_during_the_second_run_keeps_the_first(compare):
    out = compare["out"]
    assert compare["killed"] == 130  # kpo's status for an interrupt
    assert "2 runs, 1 already done" in compare["rerun"], compare["rerun"][-3000:]
    assert "resuming kpo-memorymatched-seed0 from its checkpoint" in compare["rerun"]
    first = out / "runs" / "vanilla-seed0"
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir() if p.is_file()} == compare["stamps"]
    # the interrupted main_ppo took every process of its run with it
    import psutil

    alive = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if str(compare["second"]) in " ".join(p.info["cmdline"] or [])
    ]
    assert alive == []


@pytest.mark.timeout(RUN_TIMEOUT_S * 2)
def test_the_report_pairs_the_arms_by_seed_on_held_out_problems(compare):
    out = compare["out"]
    report = json.loads((out / "report.json").read_text())
    contrast = report["contrasts"]["kpo (memory=matched) - vanilla"]
    assert contrast["seeds"] == 1 and len(contrast["per_seed"]) == 1
    assert "held-out avg@2 over the 2 problems of test" in (out / "report.md").read_text()
    for name in ("vanilla-seed0", "kpo-memorymatched-seed0"):
        results = json.loads((out / "runs" / name / "eval.json").read_text())
        assert results["benchmarks"]["test"]["problems"] == 2 and results["params"]["n"] == 2
        rows = [json.loads(line) for line in (out / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        # one row per verl step, each with its training metrics (the start model's validation, verl's step 0,
        # stays in verl's own file)
        assert [r["step"] for r in rows] == [2, 4] and all(0 <= r["reward_mean"] <= 1 for r in rows)
        logged = (out / "runs" / name / "verl_metrics-0.jsonl").read_text().splitlines()
        assert json.loads(logged[0])["step"] == 0 and all(k.startswith("val-") for k in json.loads(logged[0])["data"])
        # --keep's default: the final checkpoint's Hugging Face weights alone stay
        kept = {p.parent for p in (out / "runs" / name / "checkpoints").rglob("*") if p.is_file()}
        assert kept == {out / "runs" / name / "checkpoints" / "global_step_2" / "actor" / "huggingface"}
    assert re.search(r"; disk [\d.]+ [kMG]B written, [\d.]+ [kMG]B kept", compare["rerun"])  # as each finished
    # the resumed run: its first attempt's training row at the checkpointed step kept its metrics, and gained the
    # validation the second attempt logged there
    second = compare["second"]
    assert len(list(second.glob("verl_metrics-*.jsonl"))) == 2
    resumed = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert resumed[0]["clip_frac"] is not None and any(k.startswith("val-core/") for k in resumed[0])
    # the arms of a seed trained on the same prompts: the seed, not the arm, sets verl's data order and sampling
    settings = [json.loads((out / "runs" / f"{arm}-seed0" / "run.json").read_text())["overrides"]
                for arm in ("vanilla", "kpo-memorymatched")]  # fmt: skip
    assert all("data.seed=0" in o and "actor_rollout_ref.rollout.seed=0" in o for o in settings)


@pytest.mark.timeout(RUN_TIMEOUT_S * 2)
@pytest.mark.parametrize("arm", ["vanilla", "kpo-memorymatched"])
def test_each_run_trained_on_its_arm_s_loss(compare, arm):
    memory = matched_memory(RESPONSE)
    calls = load_calls(compare["out"] / "runs" / f"{arm}-seed0" / "capture")
    (rank,) = calls
    # one call per optimizer step (one micro-batch each); the resumed run also has its killed attempt's calls
    # of the verl step it redid
    resumed = arm == "kpo-memorymatched"
    assert STEPS <= len(calls[rank]) <= STEPS + MINIBATCHES if resumed else len(calls[rank]) == STEPS
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


@pytest.mark.timeout(RUN_TIMEOUT_S * 2)
def test_kpo_analyze_reads_a_verl_run_s_ratio_dumps(compare, tmp_path):
    run = compare["out"] / "runs" / "kpo-memorymatched-seed0"  # resumed: its dumps from both attempts
    dumps = sorted(p.name for p in (run / "ratios").iterdir())
    assert dumps == [f"step_{s:06d}-rank0.safetensors" for s in range(1, STEPS + 1)]
    assert kpo_main(["analyze", str(run), "--out", str(tmp_path / "analysis"), "--off-policy-only"]) == 0
    table2 = json.loads((tmp_path / "analysis" / "table2.json").read_text())
    assert table2  # the off-policy mini-batches' raw and filtered ratios (the on-policy ones are exactly 1)


@pytest.mark.timeout(RUN_TIMEOUT_S * 2)
def test_a_one_cell_regime_map_on_verl_reuses_the_compare_s_runs(compare, task, tmp_path_factory):
    out = tmp_path_factory.mktemp("verl-regimes")
    reused = ("vanilla-seed0", "kpo-memorymatched-seed0")
    for name in reused:  # copies keep their files' times
        shutil.copytree(compare["out"] / "runs" / name, out / CELL / "runs" / name)
    stamp = {name: (out / CELL / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in reused}
    argv = kpo_command(
        "compare", "regimes", "--engine", "verl", "--model", str(task["model"]), "--dataset", str(task["train"]),
        "--eval-data", str(task["test"]), "--cells", CELL, "--seeds", "1", "--max-seeds", "1",
        "--batches", str(STEPS // MINIBATCHES),
        "--eval-n", "2", "--out", str(out), *cpu_config(task),
    )  # fmt: skip
    done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    # the compare's runs have the cell's settings: reused; GSPO and KPO (auto) trained on verl (one seed: a
    # smoke map, its cells only; the questions are answered from 4 seeds)
    assert {
        name: (out / CELL / "runs" / name / "metrics.jsonl").stat().st_mtime_ns for name in reused
    } == stamp
    assert all((out / CELL / "runs" / name / "eval.json").exists() for name in ("gspo-seed0", "kpo-memoryauto-seed0"))
    found = json.loads((out / "report.json").read_text())
    (cell,) = found["cells"]
    assert cell["done"] and set(cell["arms"]) == {"vanilla", "gspo", "kpo (memory=matched)", "kpo (memory=auto)"}
    assert cell["metric"].startswith("held-out avg@2")
    # verl's rows are generation batches: no on/off-policy split, and KPO (auto)'s memory from the plugin's
    # actor/kpo/memory_tokens (memory.png's data), its off-policy steps' fit in each of the 2 batches
    auto = cell["arms"]["kpo (memory=auto)"]
    assert auto["on_policy_clip_frac"] is None and auto["clip_frac"] is not None
    assert set(auto["memory_tokens"]["by_batch"]) == {"1", "2"}
    assert {q["verdict"] for q in found["questions"]} <= {"pending", "not asked"}
