"""SIGINT/SIGTERM during `kpo train`: a checkpoint at the last finished generation batch, one line, exit 130,
and a resume that repeats the uninterrupted run step for step (see kpo.train.interrupt).

The tiny runs (conftest.tiny_config_factory) have 2 optimizer steps per generation batch. In process, the signal
is sent from inside the run at a chosen point (the reward function runs while a batch is generated and scored;
the loss while the trainer trains on it); the command-line tests send real signals from outside."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kpo
from kpo.train import run as run_module
from kpo.train.trainer import KPOTrainer

from .conftest import cli_flags, interrupt_line

pytestmark = pytest.mark.slow

STEPS = 8  # the reference run; the command-line runs go this far too


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def _trajectory(rows: list[dict]) -> list[dict]:
    """Every metric but the wall-clock time."""
    return [{k: v for k, v in r.items() if k != "step_time"} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tiny_config_in, tmp_path_factory) -> list[dict]:
    """metrics.jsonl rows of the uninterrupted run of STEPS steps, seed 0."""
    from kpo.train import run_training

    return _rows(run_training(tiny_config_in(tmp_path_factory.mktemp("reference"))("full", max_steps=STEPS)))


def _signal_in_reward(monkeypatch, sig: int, at_batch: int) -> None:
    """Send ``sig`` to this process while the ``at_batch``-th generation batch is scored (1-based)."""
    reward, calls = run_module.synthetic_reward, []

    def signalling(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_batch:
            os.kill(os.getpid(), sig)
        return reward(*args, **kwargs)

    monkeypatch.setattr(run_module, "synthetic_reward", signalling)


def _signal_in_loss(monkeypatch, sig: int, at_step: int, times: int = 1) -> None:
    """Send ``sig`` ``times`` times while the loss of optimizer step ``at_step`` (1-based) is computed."""
    loss = KPOTrainer._compute_loss

    def signalling(self, model, inputs):
        if self.model.training and self.state.global_step + 1 == at_step:
            for _ in range(times):
                os.kill(os.getpid(), sig)
        return loss(self, model, inputs)

    monkeypatch.setattr(KPOTrainer, "_compute_loss", signalling)


def _resume(config) -> list[dict]:
    from kpo.train import run_training

    config.resume = True
    return _rows(run_training(config))


def test_signal_while_generating_abandons_the_batch(tiny_config, monkeypatch, uninterrupted, sigint_raises):
    """SIGINT while batch 3 is scored (steps 1-4 done): checkpoint-4 is written (save_steps 0 writes none before
    the end), metrics end at step 4, and the resumed run redoes batch 3 exactly as the uninterrupted run did."""
    from kpo.train import run_training
    from kpo.train.interrupt import TrainingInterrupted

    config = tiny_config("int", max_steps=STEPS)
    _signal_in_reward(monkeypatch, signal.SIGINT, at_batch=3)
    with pytest.raises(TrainingInterrupted) as caught:
        run_training(config)
    out = Path(config.output_dir)
    assert str(caught.value) == (
        f"interrupted by SIGINT at step 4/{STEPS}, checkpoint saved in {out}/checkpoint-4; "
        f"resume with: kpo train --config {out}/config.yaml --resume"
    )
    assert caught.value.checkpoint == out / "checkpoint-4"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the guard put it back

    monkeypatch.undo()
    resumed = _resume(config)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert _trajectory(resumed) == _trajectory(uninterrupted)  # bit for bit


def test_signal_while_training_finishes_the_batch(tiny_config, monkeypatch, uninterrupted):
    """SIGTERM during step 3, the first of batch 2: step 4 (the rest of batch 2) still trains, then the run stops
    where batch 3 would be generated; metrics.jsonl rows past the checkpoint (none here) would be dropped on
    resume, and the resumed run matches the uninterrupted one."""
    from kpo.train import run_training
    from kpo.train.interrupt import TrainingInterrupted

    config = tiny_config("term", max_steps=STEPS)
    _signal_in_loss(monkeypatch, signal.SIGTERM, at_step=3)
    with pytest.raises(
        TrainingInterrupted, match=rf"^interrupted by SIGTERM at step 4/{STEPS}, checkpoint saved"
    ):
        run_training(config)
    out = Path(config.output_dir)
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4]
    # a row past the checkpoint (as a crash between a step and its save leaves) is dropped on resume
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "reward_mean": -1.0}) + "\n")

    monkeypatch.undo()
    resumed = _resume(config)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert _trajectory(resumed) == _trajectory(uninterrupted)


def test_second_signal_stops_at_once_without_a_checkpoint(tiny_config, monkeypatch):
    from kpo.train import run_training
    from kpo.train.interrupt import TrainingInterrupted

    config = tiny_config("twice", max_steps=STEPS)
    _signal_in_loss(monkeypatch, signal.SIGINT, at_step=3, times=2)
    with pytest.raises(TrainingInterrupted) as caught:
        run_training(config)
    out = Path(config.output_dir)
    assert str(caught.value) == (
        f"stopped by a second SIGINT during step 3, without a checkpoint of it; no "
        f"checkpoint yet; start again with: kpo train --config {out}/config.yaml --overwrite"
    )
    assert caught.value.checkpoint is None and not list(out.glob("checkpoint-*"))
    assert [r["step"] for r in _rows(out)] == [1, 2]


def test_signal_in_the_first_batch_keeps_nothing(tiny_config, monkeypatch):
    """Nothing trained yet: no checkpoint-0, and the same command starts the run again."""
    from kpo.train import run_training
    from kpo.train.config import TrainConfig
    from kpo.train.interrupt import TrainingInterrupted

    config = tiny_config("first", max_steps=STEPS, overwrite=True)
    _signal_in_reward(monkeypatch, signal.SIGTERM, at_batch=1)
    with pytest.raises(
        TrainingInterrupted,
        match="in the first generation batch, before any step: nothing to keep; "
        r"start again with: kpo train --config \S+/config.yaml$",
    ):
        run_training(config)
    out = Path(config.output_dir)
    assert not list(out.glob("checkpoint-*")) and not (out / "metrics.jsonl").exists()
    # config.yaml holds the run, not what this command did to the directory: it resumes or reruns as printed
    saved = TrainConfig.from_yaml(out / "config.yaml")
    assert not saved.overwrite and not saved.resume


def _command(config) -> list[str]:
    """`kpo train` with every field of ``config`` as a flag (progress on: the bars' threads must stay quiet)."""
    return [sys.executable, "-m", "kpo.cli", "train", "--progress", "true", *cli_flags(config)]


def _env() -> dict:
    """This checkout's kpo first on the path, offline, one thread."""
    src = str(Path(kpo.__file__).resolve().parents[1])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_command_line_interrupt_and_resume(tiny_config, uninterrupted, sig):
    """`kpo train` signalled from outside once its first steps are logged: exit 130, no traceback, one line that
    ends with the command to resume; that command finishes the run with steps 1..STEPS once each and the
    uninterrupted run's metrics."""
    config = tiny_config("cli", max_steps=STEPS, report_to="tensorboard")
    metrics = Path(config.output_dir) / "metrics.jsonl"
    proc = subprocess.Popen(
        _command(config), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    step, checkpoint, command = interrupt_line(stderr, sig, STEPS, "kpo train")
    command = shlex.split(command)
    assert step % config.minibatches == 0 and step >= 2 and checkpoint.name == f"checkpoint-{step}"
    assert checkpoint.is_dir() and [r["step"] for r in _rows(config.output_dir)] == list(range(1, step + 1))

    resumed = subprocess.run(
        [sys.executable, "-m", "kpo.cli", *command[1:]],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    rows = _rows(config.output_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert _trajectory(rows) == _trajectory(uninterrupted)
