"""`kpo train` on 2 processes on this CPU (gloo; the code path NCCL takes on GPUs): rank 0 writes each metrics row
once, loss metrics and ratio dumps cover every rank, one optimizer step on a fixed batch equals the one-process
step, and an interrupt sent to the launcher stops both ranks at one generation-batch boundary.

The tests start real processes (torchrun, or kpo's own launcher): ~15-20 s a launch on 2 idle cores. The tiny
runs are conftest.tiny_config_factory's (8 prompts x 4 responses, 2 optimizer steps per generation batch): each
rank generates 4 of the 8 groups of a batch and trains on half of its 16 rows at each of the 2 steps."""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import cli_flags, interrupt_line
from .test_train_interrupt import _env, _rows, _trajectory

pytestmark = pytest.mark.slow

PROCS = 2
STEPS = 6  # 3 generation batches: a signal after the first row lands before the last one trains
TIMEOUT_S = 600


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(PROCS), *args]


def _launch(*args: str) -> list[str]:
    return [sys.executable, "-m", "kpo", "launch", "--nproc-per-node", str(PROCS), *args]


def _train_flags(config) -> list[str]:
    return [*cli_flags(config), "--progress", "false", "--dump-ratios-every", str(config.dump_ratios_every)]


def _run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def two_processes(tiny_config_in, tmp_path_factory):
    """The uninterrupted 2-process run, `torchrun --nproc_per_node 2 -m kpo train`, STEPS steps, a ratio dump
    at every step, with a warm-start cache of its own: rank 0 builds the warm start while rank 1 waits."""
    directory = tmp_path_factory.mktemp("two")
    config = tiny_config_in(directory)(
        "full", max_steps=STEPS, dump_ratios_every=1, cache_dir=str(directory / "cache")
    )
    done = _run(_torchrun("-m", "kpo", "train", *_train_flags(config)))
    (directory / "stdout.txt").write_text(done.stdout)
    return config


def test_several_processes_abandon_a_batch_where_they_agree(monkeypatch):
    """The guard of one of 2 processes: a signal during generation does not leave it (the other process is still
    generating, and TRL gathers across them): the batch is abandoned once generated and scored; one while
    training stops before the next batch. A process that received nothing stops with the others (here the other
    process received SIGTERM: the max over ranks is 15)."""
    from kpo import _distributed
    from kpo.train.interrupt import AbandonBatch, InterruptGuard

    others = {"signal": 0}  # what the other process passes to the agreement
    monkeypatch.setattr(_distributed, "max_over_ranks", lambda value: max(value, others["signal"]))
    generated = []
    with InterruptGuard(processes=2) as guard:
        with pytest.raises(AbandonBatch), guard.generation():
            signal.raise_signal(signal.SIGINT)  # recorded, not raised: the generation goes on
            generated.append(1)
        assert generated == [1] and guard.received == "SIGINT"

    guard = InterruptGuard(processes=2)
    with guard:
        signal.raise_signal(signal.SIGTERM)  # while training on a batch: nothing happens there
    with pytest.raises(AbandonBatch), guard.generation():  # the agreement before the next batch
        generated.append(2)
    assert generated == [1] and guard.received == "SIGTERM"

    quiet = InterruptGuard(processes=2)
    others["signal"] = signal.SIGTERM.value
    with pytest.raises(AbandonBatch), quiet.generation():
        generated.append(3)
    assert generated == [1] and quiet.received == "SIGTERM"


def test_rank_0_builds_the_warm_start_of_one_process(two_processes, tiny_config):
    """The warm start's SFT runs as one process in rank 0 (a Trainer there would otherwise join the launched
    processes and train data-parallel, a different model under the same cache key): bit for bit the one built
    here in one process."""
    from kpo.train.run import model_path

    here = model_path(tiny_config())
    one = (here / "model.safetensors").read_bytes()
    assert (Path(two_processes.cache_dir) / here.name / "model.safetensors").read_bytes() == one
    assert (Path(two_processes.output_dir) / "warm_start" / "model.safetensors").read_bytes() == one


def test_rank_0_writes_each_row_once_with_the_world_size(two_processes):
    stdout = (Path(two_processes.output_dir).parent / "stdout.txt").read_text()
    assert stdout.count("kpo train: done.") == 1, stdout  # rank 0 alone says where the files are
    rows = _rows(two_processes.output_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["world_size"] == PROCS for r in rows)
    # each checkpoint holds both ranks' generators (what a resume on 2 processes needs)
    ckpt = Path(two_processes.output_dir) / f"checkpoint-{STEPS}"
    assert sorted(p.name for p in ckpt.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]


def test_dumps_hold_every_rank_and_loss_metrics_are_gathered(two_processes):
    """Each step's dump holds its whole mini-batch (16 = 8 rows per rank); the step's ratio_mean/min/max in
    metrics.jsonl are those of all 16 rows (token-weighted mean), not of rank 0's 8."""
    from safetensors import safe_open

    rows = _rows(two_processes.output_dir)
    told_apart = 0
    for row in rows:
        path = Path(two_processes.output_dir) / "ratios" / f"step_{row['step']:06d}.safetensors"
        with safe_open(str(path), "pt") as f:
            z, mask = f.get_tensor("log_ratio").double(), f.get_tensor("mask").bool()
        assert z.shape[0] == 16
        ratio = z.exp()
        everyone = ratio[mask]
        assert row["ratio_mean"] == pytest.approx(everyone.mean().item(), rel=1e-5)
        assert row["ratio_max"] == pytest.approx(everyone.max().item(), rel=1e-5)
        assert row["ratio_min"] == pytest.approx(everyone.min().item(), rel=1e-5)
        rank_0 = ratio[:8][mask[:8]]
        told_apart += not math.isclose(rank_0.mean().item(), everyone.mean().item(), rel_tol=1e-4)
    # off-policy steps (2, 4, 6) have ratios != 1, where rank 0's rows alone give another mean
    assert told_apart >= 1


def test_one_step_on_a_fixed_batch_equals_one_process(tiny_config, tmp_path, monkeypatch):
    """From the same warm start and the same generated batch (tests/train/fixed_batch.py), one optimizer step
    on 2 processes (DDP: each rank's gradient of its half, averaged) gives the weights of 1 process within
    float32 summation-order error, and the same gathered rewards and loss metrics. token-mean aggregation makes
    pg_loss non-zero (responses of two lengths), so a rank-0-only value would differ."""
    from safetensors.torch import load_file

    from kpo.train import run_training
    from kpo.train.trainer import KPOTrainer

    from . import fixed_batch

    settings = dict(max_steps=1, minibatches=1, loss_agg_mode="token-mean")
    two = tiny_config("two", **settings)
    two.save_yaml(tmp_path / "two.yaml")
    _run(_torchrun(str(Path(fixed_batch.__file__)), str(tmp_path / "two.yaml")))
    monkeypatch.setattr(KPOTrainer, "_generate_single_turn", fixed_batch.fixed_responses)
    one = run_training(tiny_config("one", **settings))

    start = load_file(str(one / "warm_start" / "model.safetensors"))
    w1 = load_file(str(one / "final" / "model.safetensors"))
    w2 = load_file(str(Path(two.output_dir) / "final" / "model.safetensors"))
    # AdamW's first step moves a weight by about lr = 1e-2; float32 weights of size ~1 resolve ~1e-7
    assert max((w1[k] - start[k]).abs().max().item() for k in w1) > 5e-3
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
    (r1,), (r2,) = _rows(one), _rows(two.output_dir)
    assert (r1["world_size"], r2["world_size"]) == (1, PROCS)
    assert r1["reward_mean"] == r2["reward_mean"] == 0.5  # rewards 1, 0, 1, 0 in every group, gathered
    assert r1["response_length"] == r2["response_length"] == 2.5
    assert abs(r1["pg_loss"]) > 1e-3
    for key in ("pg_loss", "entropy", "grad_norm", "reward_std"):
        assert r2[key] == pytest.approx(r1[key], rel=1e-5), key


def test_resume_refuses_another_number_of_processes(tiny_config):
    """A checkpoint of 2 processes (rng_state_0/1.pth) resumed on 1 would leave the trajectory (each process
    samples with its own generator): refused before anything loads."""
    from kpo.train import ConfigError, run_training
    from kpo.train.checkpoints import mark_complete

    config = tiny_config("moved", max_steps=4, resume=True)
    ckpt = Path(config.output_dir) / "checkpoint-2"
    ckpt.mkdir(parents=True)
    for name in ("rng_state_0.pth", "rng_state_1.pth"):
        (ckpt / name).touch()
    mark_complete(ckpt)
    config.save_yaml(Path(config.output_dir) / "config.yaml")
    with pytest.raises(
        ConfigError, match=r"checkpoint-2 was written by 2 process\(es\) and this run has 1; "
    ):
        run_training(config)


def test_an_error_of_rank_0_alone_ends_every_rank_with_its_status(tiny_config):
    """--resume of a run without a checkpoint: rank 0 alone checks output_dir (rank 1 waits for it), finds the
    ConfigError and tells rank 1, which exits quietly with status 2; the error is said once."""
    config = tiny_config("nothing", resume=True)
    Path(config.output_dir).mkdir(parents=True)
    config.save_yaml(Path(config.output_dir) / "config.yaml")
    done = subprocess.run(
        _launch("train", *_train_flags(config), "--resume"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("resume: no complete checkpoint-* in") == 1, done.stderr


def test_interrupting_the_launcher_stops_every_rank_at_one_boundary(two_processes, tiny_config):
    """`kpo launch --nproc-per-node 2 train`, Ctrl-C'd once its first row is logged: exit 130,
    rank 0's one line (no traceback, rank 1 silent), one checkpoint at a generation-batch boundary written by
    both ranks; the command in the line resumes on 2 processes and repeats the uninterrupted run."""
    config = tiny_config("int", max_steps=STEPS, dump_ratios_every=1)
    metrics = Path(config.output_dir) / "metrics.jsonl"
    proc = subprocess.Popen(
        _launch("train", *_train_flags(config)),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    sig = signal.SIGINT  # SIGTERM takes the same path (the launcher forwards both; kpo.train.interrupt)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130, stderr
    step, checkpoint, command = interrupt_line(
        stderr, sig, STEPS, f"kpo launch --nproc-per-node {PROCS} train"
    )
    assert step % config.minibatches == 0 and 0 < step < STEPS
    assert [p.name for p in Path(config.output_dir).glob("checkpoint-*")] == [checkpoint.name]
    assert sorted(p.name for p in checkpoint.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert [r["step"] for r in _rows(config.output_dir)] == list(range(1, step + 1))

    _run([sys.executable, "-m", "kpo", *shlex.split(command)[1:]])
    rows = _rows(config.output_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert _trajectory(rows) == _trajectory(_rows(two_processes.output_dir))  # bit for bit


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the launched process of ``rank`` (a child of the launcher with RANK=rank)."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    for pid in children:
        if f"RANK={rank}" in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0"):
            return int(pid)
    raise AssertionError(f"no rank {rank} among {children}")


def test_a_killed_rank_is_named_and_the_run_resumes(two_processes, tiny_config):
    """`kill -9` of rank 1 once checkpoint-2 is complete (what the out-of-memory killer does): the launcher names
    it and its signal in one line, after rank 0's one line (no traceback), and exits 137; the same command with
    --resume continues from the last complete checkpoint and repeats the uninterrupted run."""
    from kpo.train.checkpoints import RECORD

    config = tiny_config("killed", max_steps=STEPS, dump_ratios_every=1)
    first = Path(config.output_dir) / "checkpoint-2" / RECORD
    command = _launch("train", *_train_flags(config), "--save-steps", "2")
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not first.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    pid = _rank_pid(proc, 1)
    os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 128 + signal.SIGKILL and "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("kpo ")]
    assert lines == [
        "kpo train: rank 0 of 2 stopped: another rank of this run ended, so an exchange with it failed (the "
        "launcher names it and why)",
        f"kpo launch: rank 1 of 2 (pid {pid}) was killed by SIGKILL (what the kernel's out-of-memory killer "
        "sends: see dmesg), and the other ranks stopped; continue the run with the same command and --resume "
        "(from its last complete checkpoint)",
    ], stderr

    resumed = _run([*command, "--resume"])
    assert "kpo train: resuming from checkpoint-" in resumed.stderr
    rows = _rows(config.output_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert _trajectory(rows) == _trajectory(_rows(two_processes.output_dir))
