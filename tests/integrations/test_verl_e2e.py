"""verl's own training loop with kpo's loss, on the CPU: ``python -m verl.trainer.main_ppo`` trains the embedded
tiny model for 2 GRPO steps on the embedded task, with ``policy_loss.loss_mode=kpo`` on 1 and on 2 workers and
with verl's ``vanilla`` on 1: 3 runs of about a minute each on 2 cores (55 s, 66 s and 54 s measured beside
other work), about 4.5 GB of memory at most (2 workers), plus ~10 s for the warm start.

What runs is verl's stock driver, Ray worker groups, FSDP2 actor (gloo process group), agent loop, reward loop
and naive weight sync; kpo adds only what a CPU lacks, through verl's
``VERL_USE_EXTERNAL_MODULES`` hook (each module's docstring says what and why): a CPU platform (:mod:`tests.integrations.verl_cpu_platform`), a
transformers rollout in place of vLLM (:mod:`tests.integrations.verl_cpu_rollout`), and a recorder of every policy-loss call inside
the workers (:mod:`tests.integrations.verl_loss_capture`). The data is written by the test
(:mod:`tests.integrations.verl_cpu_task`); nothing is downloaded.

Each run is checked for: both steps finish; the gradient norm is above 0 at each step and the saved weights
differ from the warm start; ``actor/filtered_ratio_mean`` (only kpo's loss emits it) is logged exactly when
loss_mode=kpo; every loss verl computed equals ``kpo.policy_loss`` recomputed on the recorded batch, and the
``actor/pg_loss`` verl logged is those losses aggregated as verl aggregates them (mean over data-parallel
ranks, then over mini-batches); on 2 workers, that per-mini-batch value is the loss of the two ranks' halves put
back together.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")

from tests.integrations.verl_cpu_rollout import NAME as ROLLOUT  # noqa: E402
from tests.integrations.verl_cpu_task import TASK, compute_score, prepare  # noqa: E402
from tests.integrations.verl_loss_capture import CAPTURE_DIR_ENV, load_calls  # noqa: E402

from kpo.losses import policy_loss  # noqa: E402
from kpo.train.tiny import context_length  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Imported by `import verl` in the driver and in every Ray worker; the platform first (it wraps a verl function
# before verl's workers import it).
EXTERNAL_MODULES = ",".join(
    f"tests.integrations.{m}" for m in ("verl_cpu_platform", "verl_cpu_rollout", "verl_loss_capture")
)
PROMPTS = 6  # per step (the train split has 12 problems: one epoch is 2 steps)
SAMPLES = 8  # GRPO group size: with a warm-start reward of ~0.3-0.6 a group of 8 is all-equal rarely
MINI_BATCHES = 2  # the second is off-policy, so kpo's filter sees ratios other than 1
STEPS = 2
LR = 1e-3
KPO = {"q": 1e-4, "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}  # KPO-unclipped's Q, KPO's clip range
VANILLA = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}  # verl's defaults
RUNS = [("kpo", 1), ("kpo", 2), ("vanilla", 1)]
TIMEOUT_S = 480  # under pytest-timeout's 600 s, so the run is stopped here, with its processes


@dataclass
class Run:
    loss: str
    workers: int
    log: str
    metrics: list[dict]  # verl's file logger: one {"step", "data"} row per step
    calls: dict[int, list[dict]]  # rank -> recorded policy-loss calls (verl_loss_capture)
    checkpoint: Path  # the actor's HF weights after the last step


def overrides(paths: dict[str, Path], out: Path, loss: str, workers: int) -> list[str]:
    """main_ppo's Hydra overrides for one run (``paths``: verl_cpu_task.prepare's)."""
    mini_batch = PROMPTS // MINI_BATCHES * SAMPLES  # sequences
    args = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        f"data.train_batch_size={PROMPTS}",
        f"data.max_prompt_length={TASK.max_prompt_chars()}",
        f"data.max_response_length={context_length(TASK) - TASK.max_prompt_chars()}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={paths['model']}",
        # no flash-attn, no varlen unpadding, no recomputation on a CPU
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # FSDP2: verl's FSDP1 hard-codes sync_module_states=True, which needs a GPU
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}",
        f"actor_rollout_ref.actor.optim.lr={LR}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS // MINI_BATCHES}",
        # one micro-batch per mini-batch and worker: each recorded call is one rank's share of one mini-batch
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini_batch // workers}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={PROMPTS * SAMPLES // workers}",
        f"actor_rollout_ref.rollout.name={ROLLOUT}",
        f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={ROOT / 'tests' / 'integrations' / 'verl_cpu_task.py'}",
        f"reward.custom_reward_function.name={compute_score.__name__}",
        # the legacy trainer: v1 needs a TransferQueue deployment
        "trainer.use_v1=False",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={workers}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.project_name=kpo",
        f"trainer.experiment_name={loss}_{workers}",
        # Ray counts one fake GPU per worker (verl's pools ask for GPUs; PlatformCPU.ray_resource_name); more
        # logical CPUs than cores so the driver, workers, servers and loop workers all get scheduled
        "ray_kwargs.ray_init.num_cpus=8",
        f"+ray_kwargs.ray_init.num_gpus={workers}",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]
    settings = KPO if loss == "kpo" else {}
    if settings:
        args.append("actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig")
    for key, value in settings.items():
        args.append(f"{'+' if key == 'q' else ''}actor_rollout_ref.actor.{key}={value}")
    return args


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("verl-task")
    return prepare(out, tmp_path_factory.mktemp("kpo-cache"), n_train=12, n_val=2)


@pytest.fixture(scope="module")
def main_ppo(task, tmp_path_factory):
    """``main_ppo(loss, workers)``: the :class:`Run` of verl's main_ppo with that loss on that many workers
    (each configuration runs once per module)."""
    runs: dict[tuple[str, int], Run] = {}

    def run(loss: str, workers: int) -> Run:
        if (loss, workers) not in runs:
            out = tmp_path_factory.mktemp(f"main_ppo-{loss}-{workers}")
            (out / "capture").mkdir()
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                "VERL_PLATFORM": "cpu",
                "VERL_USE_EXTERNAL_MODULES": EXTERNAL_MODULES,
                CAPTURE_DIR_ENV: str(out / "capture"),
                "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"),
                "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
                "RAY_USAGE_STATS_ENABLED": "0",
                "WANDB_MODE": "disabled",
            }
            cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(task, out, loss, workers)]
            # its own session, so a run past the timeout is stopped with every process Ray started for it
            proc = subprocess.Popen(
                cmd,
                cwd=out,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                log, _ = proc.communicate(timeout=TIMEOUT_S)
            except BaseException as err:  # the timeout, or pytest stopping: leave no Ray processes behind
                os.killpg(proc.pid, signal.SIGKILL)
                log, _ = proc.communicate()
                if not isinstance(err, subprocess.TimeoutExpired):
                    raise
                pytest.fail(f"main_ppo ({loss}, {workers} workers) ran past {TIMEOUT_S} s:\n{log[-6000:]}")
            (out / "main_ppo.log").write_text(log)
            assert proc.returncode == 0, f"main_ppo ({loss}, {workers} workers) failed:\n{log[-6000:]}"
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            runs[loss, workers] = Run(
                loss,
                workers,
                log,
                rows,
                load_calls(out / "capture"),
                out / "checkpoints" / f"global_step_{STEPS}" / "actor" / "huggingface",
            )
        return runs[loss, workers]

    return run


def expected_loss(call: dict, loss: str) -> tuple[torch.Tensor, dict[str, float]]:
    """``kpo.policy_loss`` on one recorded call, with the settings this test passed to verl and verl's global
    batch counts (the mapping kpo documents for verl: batch_num_tokens -> global_num_tokens, ...)."""
    info = call["global_batch_info"]
    return policy_loss(
        loss,
        call["log_prob"],
        call["old_log_prob"],
        call["advantages"],
        call["response_mask"],
        loss_agg_mode=call["loss_agg_mode"],
        **(KPO if loss == "kpo" else VANILLA),
        global_num_tokens=info["batch_num_tokens"],
        global_num_seqs=info["global_batch_size"],
        dp_size=info["dp_size"],
    )


def mini_batch_calls(run: Run, step: int, mini_batch: int) -> list[dict]:
    """Every rank's recorded call for mini-batch ``mini_batch`` of step ``step`` (both from 0), rank order."""
    return [run.calls[rank][step * MINI_BATCHES + mini_batch] for rank in range(run.workers)]


def verl_aggregate(values: list[list[float]]) -> float:
    """verl's value of a loss metric for one step from per-call values [mini_batch][rank]: mean over
    data-parallel ranks (``Metric.aggregate_dp``; one micro-batch each), then over mini-batches (the trainer)."""
    return sum(sum(ranks) / len(ranks) for ranks in values) / len(values)


@pytest.mark.parametrize(("loss", "workers"), RUNS)
def test_main_ppo_trains_two_steps(main_ppo, task, loss, workers):
    from safetensors.torch import load_file

    run = main_ppo(loss, workers)
    assert [row["step"] for row in run.metrics] == list(range(1, STEPS + 1))
    for row in run.metrics:
        assert row["data"]["actor/grad_norm"] > 0, row["data"]
        # kpo's loss emits filtered_ratio_*; verl's vanilla does not: the metric says whose loss ran
        assert ("actor/filtered_ratio_mean" in row["data"]) == (loss == "kpo")
        assert 0 <= row["data"]["critic/score/mean"] <= 1
    # verl saves the HF weights in bf16: compare with the warm start rounded the same way
    before, after = (
        load_file(task["model"] / "model.safetensors"),
        load_file(run.checkpoint / "model.safetensors"),
    )
    assert set(after) <= set(before)
    changed = sum(int((after[k].float() != before[k].to(after[k].dtype).float()).sum()) for k in after)
    total = sum(after[k].numel() for k in after)
    assert changed > total / 2, f"{changed} of {total} weights moved in {STEPS} steps"


@pytest.mark.parametrize(("loss", "workers"), RUNS)
def test_verl_trained_on_kpo_policy_loss(main_ppo, loss, workers):
    run = main_ppo(loss, workers)
    assert sorted(run.calls) == list(range(workers))
    assert [len(calls) for calls in run.calls.values()] == [STEPS * MINI_BATCHES] * workers
    settings = KPO if loss == "kpo" else VANILLA
    for calls in run.calls.values():
        for call in calls:
            assert call["loss_mode"] == loss and call["loss_agg_mode"] == "token-mean"
            # the Hydra overrides reached the worker's actor config
            assert {k: call["config"][k] for k in settings} == settings
            assert call["global_batch_info"]["dp_size"] == workers
            loss_value, metrics = expected_loss(call, loss)
            if loss == "kpo":
                # verl called kpo's function: the same value, bit for bit, and the same metrics
                assert torch.equal(loss_value, call["loss"])
                assert {f"actor/{k}": v for k, v in metrics.items() if k != "pg_loss"} == call["metrics"]
            else:
                # verl's own vanilla is the same method as kpo's (kpo.integrations.verl.VERL_EQUIVALENTS)
                torch.testing.assert_close(loss_value, call["loss"], rtol=1e-5, atol=1e-7)
    for step, row in enumerate(run.metrics):
        per_call = [[float(c["loss"]) for c in mini_batch_calls(run, step, m)] for m in range(MINI_BATCHES)]
        assert row["data"]["actor/pg_loss"] == pytest.approx(verl_aggregate(per_call), rel=1e-6, abs=1e-9)
        if loss == "kpo":
            filtered = [
                [c["metrics"]["actor/filtered_ratio_mean"] for c in mini_batch_calls(run, step, m)]
                for m in range(MINI_BATCHES)
            ]
            assert row["data"]["actor/filtered_ratio_mean"] == pytest.approx(
                verl_aggregate(filtered), rel=1e-9
            )


def test_two_workers_split_the_loss_of_the_whole_mini_batch(main_ppo):
    # Each rank's loss is its tokens' sum over the global token count, times dp_size (kpo's reading of verl's
    # global_batch_info); verl averages them over ranks. So the mean of the two ranks' losses is the token-mean
    # loss of the mini-batch put back together, computed on one process without any global counts.
    run = main_ppo("kpo", 2)
    for step in range(STEPS):
        for m in range(MINI_BATCHES):
            calls = mini_batch_calls(run, step, m)
            whole = {
                key: torch.cat([c[key] for c in calls])
                for key in ("log_prob", "old_log_prob", "advantages", "response_mask")
            }
            loss_value, _ = policy_loss(
                "kpo",
                whole["log_prob"],
                whole["old_log_prob"],
                whole["advantages"],
                whole["response_mask"],
                loss_agg_mode="token-mean",
                **KPO,
            )
            assert calls[0]["global_batch_info"]["batch_num_tokens"] == int(whole["response_mask"].sum())
            torch.testing.assert_close(loss_value, sum(c["loss"] for c in calls) / 2, rtol=1e-6, atol=1e-8)
