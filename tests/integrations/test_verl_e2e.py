"""verl's own training loop with kpo's loss, on the CPU: ``python -m verl.trainer.main_ppo`` trains the embedded
tiny model for 2 GRPO steps on the embedded task, four times (:data:`RUNS`):

- ``kpo-1-icepop``: loss_mode=kpo on 1 worker, verl's default trainer (v1, on TransferQueue), a bfloat16
  sampler that returns its own log-probs, and verl's rollout correction with token-level IcePop weights;
- ``kpo-2-bypass``: loss_mode=kpo on 2 workers, v1, the bfloat16 sampler's log-probs as the PPO anchor (verl's
  bypass mode, so KPO filters log pi_theta / pi_rollout);
- ``kpo-1-legacy``: loss_mode=kpo on 1 worker, verl's legacy trainer (``trainer.use_v1=False``), kept while
  verl ships it.

Each takes 1.5 minutes on 2 shared cores (docs/verl.md has the measures) and at most 5.3 GiB (2 workers), two at
a time; the warm start adds 10-25 s.

What runs is verl's stock driver, Ray worker groups, FSDP2 actor (gloo process group), agent loop, reward loop,
TransferQueue (v1) and naive weight sync; kpo adds only what a CPU lacks, through verl's
``VERL_USE_EXTERNAL_MODULES`` hook (each module's docstring says what and why): a CPU platform
(:mod:`tests.integrations.verl_cpu_platform`), a transformers rollout in place of vLLM
(:mod:`tests.integrations.verl_cpu_rollout`), and a recorder of every policy-loss call inside the workers and of
every response the sampler returns (:mod:`tests.integrations.verl_loss_capture`). The data is written by the test
(:mod:`tests.integrations.verl_cpu_task`); nothing is downloaded.

Every run is checked for: both steps finish; the gradient norm is above 0 at each step and the saved weights
differ from the warm start; ``actor/filtered_ratio_mean`` (only kpo's loss emits it) is logged exactly when
loss_mode=kpo; every loss verl computed equals ``kpo.policy_loss`` recomputed on the recorded batch, and the
``actor/pg_loss`` verl logged is those losses aggregated as verl aggregates them. Per run, what it adds: on 2
workers, each mini-batch's loss is the loss of the two ranks' halves put back together; with IcePop, the weights
reaching kpo's loss are the ones verl's driver computed and logged, some of them 0, and kpo's loss function on
that batch equals verl's vanilla with the same weights; in bypass mode, every row's anchor is the sampler's own
log-probs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl", reason="verl not installed: `make test` runs this file in .venv-verl")

from tests.integrations.verl_cpu_rollout import NAME as ROLLOUT  # noqa: E402
from tests.integrations.verl_cpu_task import TASK, compute_score, prepare  # noqa: E402
from tests.integrations.verl_loss_capture import CAPTURE_DIR_ENV, load_calls, load_samples  # noqa: E402
from tests.losses.test_verl_parity import _config  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from kpo.losses import policy_loss  # noqa: E402
from kpo.testbed.tiny import context_length  # noqa: E402

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
# IcePop's band: a token whose trainer/sampler ratio pi_old / pi_rollout lies outside it gets weight 0. Tight,
# so that the bfloat16 sampler's mismatch with the trainer puts some tokens outside (ratios 0.992-1.008 measured;
# verl's preset is 0.5_5.0).
ICEPOP = (0.995, 1.005)
# v1's TransferQueue starts 8 storage units by default, each asking Ray for 1 CPU pinned to the node: with too
# few logical CPUs the last unit never starts and the run waits forever (docs/verl.md: the CPU rule).
STORAGE_UNITS = 2
RAY_CPUS = 16
TIMEOUT_S = 480  # under pytest-timeout's 600 s, so the run is stopped here, with its processes


@dataclass(frozen=True)
class Config:
    """One main_ppo run: the loss, its workers, and what it sets beyond the settings every run shares."""

    id: str
    loss: str
    workers: int
    legacy: bool = False  # trainer.use_v1=False (else verl's default, the v1 trainer)
    rollout_dtype: str = "float32"  # the hf_cpu sampler's dtype (actor_rollout_ref.rollout.dtype)
    correction: tuple[tuple[str, str], ...] = ()  # algorithm.rollout_correction.<key>=<value>; () = off


KPO_ICEPOP = Config(
    "kpo-1-icepop",
    "kpo",
    1,
    rollout_dtype="bfloat16",
    correction=(("rollout_is", "token"), ("rollout_is_threshold", "'{}_{}'".format(*ICEPOP))),
)
KPO_BYPASS = Config("kpo-2-bypass", "kpo", 2, rollout_dtype="bfloat16", correction=(("bypass_mode", "true"),))
KPO_LEGACY = Config("kpo-1-legacy", "kpo", 1, legacy=True)
# verl's own vanilla loss on 1 worker, v1, runs in tests/integrations/test_verl_compare.py (kpo compare's GRPO arm)
RUNS = [KPO_ICEPOP, KPO_BYPASS, KPO_LEGACY]


@dataclass
class Run:
    config: Config
    log: str
    metrics: list[dict]  # verl's file logger: one {"step", "data"} row per step
    calls: dict[int, list[dict]]  # rank -> recorded policy-loss calls (verl_loss_capture)
    samples: list[dict]  # every response the sampler returned (verl_loss_capture.load_samples)
    checkpoint: Path  # the actor's HF weights after the last step


def overrides(paths: dict[str, Path], out: Path, config: Config) -> list[str]:
    """main_ppo's Hydra overrides for one run (``paths``: verl_cpu_task.prepare's)."""
    mini_batch = PROMPTS // MINI_BATCHES * SAMPLES  # sequences
    workers = config.workers
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
        f"actor_rollout_ref.actor.policy_loss.loss_mode={config.loss}",
        f"actor_rollout_ref.actor.optim.lr={LR}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS // MINI_BATCHES}",
        # one micro-batch per mini-batch and worker: each recorded call is one rank's share of one mini-batch
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini_batch // workers}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={PROMPTS * SAMPLES // workers}",
        f"actor_rollout_ref.rollout.name={ROLLOUT}",
        f"actor_rollout_ref.rollout.dtype={config.rollout_dtype}",
        f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={ROOT / 'tests' / 'integrations' / 'verl_cpu_task.py'}",
        f"reward.custom_reward_function.name={compute_score.__name__}",
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
        f"trainer.experiment_name={config.id}",
        f"transfer_queue.backend.SimpleStorage.num_data_storage_units={STORAGE_UNITS}",
        # Ray counts one fake GPU per worker (verl's pools ask for GPUs; PlatformCPU.ray_resource_name); more
        # logical CPUs than cores so the driver, storage units, workers, servers and loop workers all get
        # scheduled
        f"ray_kwargs.ray_init.num_cpus={RAY_CPUS}",
        f"+ray_kwargs.ray_init.num_gpus={workers}",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]
    if config.legacy:
        args.append("trainer.use_v1=False")
    if config.correction:
        # rollout correction reads the sampler's own log-probs
        args.append("actor_rollout_ref.rollout.calculate_log_probs=True")
        args += [f"algorithm.rollout_correction.{key}={value}" for key, value in config.correction]
    if config.loss == "kpo":
        args.append("actor_rollout_ref.actor._target_=kpo.integrations.verl.KPOActorConfig")
        args += [f"{'+' if key == 'q' else ''}actor_rollout_ref.actor.{key}={v}" for key, v in KPO.items()]
    return args


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("verl-task")
    return prepare(out, tmp_path_factory.mktemp("kpo-cache"), n_train=12, n_val=2)


def _main_ppo(task: dict[str, Path], out: Path, config: Config) -> Run:
    """verl's main_ppo with ``config``, in ``out``."""
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
    env.pop("RAY_ADDRESS", None)  # each run starts its own Ray
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(task, out, config)]
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
        pytest.fail(f"main_ppo ({config.id}) ran past {TIMEOUT_S} s:\n{log[-6000:]}")
    (out / "main_ppo.log").write_text(log)
    assert proc.returncode == 0, f"main_ppo ({config.id}) failed:\n{log[-6000:]}"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return Run(
        config,
        log,
        rows,
        load_calls(out / "capture"),
        load_samples(out / "capture"),
        out / "checkpoints" / f"global_step_{STEPS}" / "actor" / "huggingface",
    )


@pytest.fixture(scope="module")
def main_ppo(task, tmp_path_factory):
    """``main_ppo(config)``: the :class:`Run` of verl's main_ppo with that :class:`Config`. Every run of
    :data:`RUNS` starts with the module, two at a time (a run spends much of its time in Ray's and verl's waits, so
    two share 2 cores well), and a test waits for the run it asks for."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=2)
    futures = {c: pool.submit(_main_ppo, task, tmp_path_factory.mktemp(f"main_ppo-{c.id}"), c) for c in RUNS}
    try:
        yield lambda config: futures[config].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def expected_loss(call: dict, loss: str) -> tuple[torch.Tensor, dict[str, float]]:
    """``kpo.policy_loss`` on one recorded call, with the settings this test passed to verl, verl's rollout IS
    weights and verl's global batch counts (the mapping kpo documents for verl: batch_num_tokens ->
    global_num_tokens, ...)."""
    info = call["global_batch_info"]
    return policy_loss(
        loss,
        log_prob=call["log_prob"],
        old_log_prob=call["old_log_prob"],
        advantages=call["advantages"],
        response_mask=call["response_mask"],
        loss_agg_mode=call["loss_agg_mode"],
        **(KPO if loss == "kpo" else VANILLA),
        rollout_is_weights=call["rollout_is_weights"],
        global_num_tokens=info["batch_num_tokens"],
        global_num_seqs=info["global_batch_size"],
        dp_size=info["dp_size"],
    )


def verl_vanilla(call: dict, dtype: torch.dtype | None = None) -> torch.Tensor:
    """verl 0.9.1's own vanilla loss on one recorded call, its log-probs cast to ``dtype`` (None: as recorded),
    with the call's rollout IS weights and global batch info."""
    config = _config(**VANILLA)
    config.global_batch_info.update(call["global_batch_info"])
    loss, _ = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=call["old_log_prob"].to(dtype or call["old_log_prob"].dtype),
        log_prob=call["log_prob"].to(dtype or call["log_prob"].dtype),
        advantages=call["advantages"],
        response_mask=call["response_mask"],
        loss_agg_mode=call["loss_agg_mode"],
        config=config,
        rollout_is_weights=call["rollout_is_weights"],
    )
    return loss


def mini_batch_calls(run: Run, step: int, mini_batch: int) -> list[dict]:
    """Every rank's recorded call for mini-batch ``mini_batch`` of step ``step`` (both from 0), rank order."""
    return [run.calls[rank][step * MINI_BATCHES + mini_batch] for rank in range(run.config.workers)]


def step_calls(run: Run, step: int) -> list[dict]:
    """Every call of step ``step``: its mini-batches on every rank, together the step's whole batch."""
    return [c for m in range(MINI_BATCHES) for c in mini_batch_calls(run, step, m)]


def verl_aggregate(values: list[list[float]]) -> float:
    """verl's value of a loss metric for one step from per-call values [mini_batch][rank]: mean over
    data-parallel ranks (``Metric.aggregate_dp``; one micro-batch each), then over mini-batches (the trainer)."""
    return sum(sum(ranks) / len(ranks) for ranks in values) / len(values)


def pad_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The rows of [B_i, T_i] tensors in one [sum B_i, max T_i] tensor, right-padded with 0 (False): the v1
    trainer pads each rank's micro-batch only to its own longest response."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])


@pytest.mark.parametrize("config", RUNS, ids=lambda c: c.id)
def test_main_ppo_trains_two_steps(main_ppo, task, config):
    from safetensors.torch import load_file

    run = main_ppo(config)
    assert [row["step"] for row in run.metrics] == list(range(1, STEPS + 1))
    for row in run.metrics:
        assert row["data"]["actor/grad_norm"] > 0, row["data"]
        # kpo's loss emits filtered_ratio_*; verl's vanilla does not: the metric says whose loss ran
        assert ("actor/filtered_ratio_mean" in row["data"]) == (config.loss == "kpo")
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


@pytest.mark.parametrize("config", RUNS, ids=lambda c: c.id)
def test_verl_trained_on_kpo_policy_loss(main_ppo, config):
    run = main_ppo(config)
    loss = config.loss
    assert sorted(run.calls) == list(range(config.workers))
    assert [len(calls) for calls in run.calls.values()] == [STEPS * MINI_BATCHES] * config.workers
    settings = KPO if loss == "kpo" else VANILLA
    for calls in run.calls.values():
        for call in calls:
            assert call["loss_mode"] == loss and call["loss_agg_mode"] == "token-mean"
            # the Hydra overrides reached the worker's actor config
            assert {k: call["config"][k] for k in settings} == settings
            assert call["global_batch_info"]["dp_size"] == config.workers
            # verl passes IS weights exactly when rollout correction computes them
            assert (call["rollout_is_weights"] is not None) == ("rollout_is" in dict(config.correction))
            loss_value, metrics = expected_loss(call, loss)
            if loss == "kpo":
                # verl called kpo's function: the same value, bit for bit, and the same metrics
                assert torch.equal(loss_value, call["loss"])
                assert {f"actor/{k}": v for k, v in metrics.items() if k != "pg_loss"} == call["metrics"]
            else:
                # verl's own vanilla is the same method as kpo's (kpo.integrations.verl.VERL_EQUIVALENTS). The v1
                # trainer hands it bfloat16 log-probs and it computes its ratios in bfloat16 (docs/verl.md);
                # kpo computes in float32 at least, as verl's vanilla does on the same log-probs in float32.
                assert torch.equal(verl_vanilla(call), call["loss"])
                torch.testing.assert_close(
                    loss_value, verl_vanilla(call, torch.float32), rtol=1e-5, atol=1e-7
                )
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
    run = main_ppo(KPO_BYPASS)
    for step in range(STEPS):
        for m in range(MINI_BATCHES):
            calls = mini_batch_calls(run, step, m)
            whole = {
                key: pad_cat([c[key] for c in calls])
                for key in ("log_prob", "old_log_prob", "advantages", "response_mask")
            }
            loss_value, _ = policy_loss(
                "kpo",
                log_prob=whole["log_prob"],
                old_log_prob=whole["old_log_prob"],
                advantages=whole["advantages"],
                response_mask=whole["response_mask"],
                loss_agg_mode="token-mean",
                **KPO,
            )
            assert calls[0]["global_batch_info"]["batch_num_tokens"] == int(whole["response_mask"].sum())
            # float32 sums taken in another order (per rank, then across ranks) differ in the last digits: CI saw
            # a 3.9e-6 relative difference. A wrong split is off by a factor (dp_size, or another token count).
            torch.testing.assert_close(loss_value, sum(c["loss"] for c in calls) / 2, rtol=2e-5, atol=1e-8)


def test_icepop_weights_reach_kpo_loss(main_ppo):
    # verl's driver computes the IcePop weights once per step on the whole batch and logs their statistics;
    # the step's calls hold that whole batch, so the weights kpo's loss received must give the same numbers.
    run = main_ppo(KPO_ICEPOP)
    low, high = ICEPOP
    zeros = 0
    for step, row in enumerate(run.metrics):
        calls = step_calls(run, step)
        mask = torch.cat([c["response_mask"].flatten() for c in calls])
        w = torch.cat([c["rollout_is_weights"].flatten() for c in calls])[mask]
        logged = row["data"]
        assert float(w.mean()) == pytest.approx(logged["rollout_corr/rollout_is_mean"], rel=1e-6)
        assert float(w.max()) == logged["rollout_corr/rollout_is_max"]
        # IcePop: a weight is 0 (out of band, and the token stays in response_mask) or its ratio, in the band
        assert float((w == 0).float().mean()) == pytest.approx(logged["rollout_corr/rollout_is_oob_ratio"])
        assert bool(((w == 0) | ((w >= low) & (w <= high))).all())
        zeros += int((w == 0).sum())
        # the bfloat16 sampler is a real mismatch: weights other than 1 inside the band too
        assert bool(((w != 0) & (w != 1)).any())
    assert zeros > 0, "no token fell outside IcePop's band: nothing tested the zero weights"
    # kpo's function with verl's weights equals verl's vanilla on the same batch (in float32: verl's own
    # arithmetic on the v1 trainer's bfloat16 log-probs is bfloat16's)
    for calls in run.calls.values():
        for call in calls:
            torch.testing.assert_close(
                expected_loss(call, "vanilla")[0], verl_vanilla(call, torch.float32), rtol=1e-5, atol=1e-7
            )


def test_bypass_mode_anchors_kpo_on_the_sampler(main_ppo):
    # bypass_mode: old_log_prob is the sampler's own log-probs, so KPO filters log pi_theta / pi_rollout. Every
    # row's anchor is exactly one response's log-probs as the sampler returned them (each response once).
    run = main_ppo(KPO_BYPASS)
    calls = [c for rank in run.calls.values() for c in rank]
    anchors = Counter(
        tuple(row[mask].tolist()) for c in calls for row, mask in zip(c["old_log_prob"], c["response_mask"])
    )
    sampled = Counter(tuple(torch.tensor(s["log_probs"]).tolist()) for s in run.samples)
    assert anchors == sampled and sum(anchors.values()) == STEPS * PROMPTS * SAMPLES
    # So the first mini-batch of a step, on-policy in verl's default (decoupled) mode where every ratio is
    # exactly 1, carries the mismatch: the filter sees log pi_theta / pi_rollout (|z| < 0.01 measured).
    for step in range(STEPS):
        for c in mini_batch_calls(run, step, 0):
            z = (c["log_prob"].float() - c["old_log_prob"].float())[c["response_mask"]]
            assert float((z != 0).float().mean()) > 0.9 and float(z.abs().max()) < 0.1, z
