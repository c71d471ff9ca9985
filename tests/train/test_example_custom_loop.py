"""examples/custom_loop.py runs end to end: a GRPO-style loop around kpo.policy_loss without TRL (on the tests'
seconds-long warm start; the example's default is the embedded 128-token task's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kpo.train.run import model_path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_loop.py"


def run_example(*flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *flags], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def toy_flags(tiny_config_in, tmp_path_factory):
    config = tiny_config_in(tmp_path_factory.mktemp("example"))()
    task = ["--task", config.task, "--n-terms", str(config.n_terms), "--max-value", str(config.max_value)]
    return ["--model", str(model_path(config)), *task, "--prompts", "8", "--group", "4", "--lr", "1e-2"]


@pytest.mark.parametrize("loss", ["kpo", "gspo"])
def test_the_loop_trains_with_any_registered_loss(toy_flags, loss):
    out = run_example(*toy_flags, "--loss", loss, "--steps", "8", "--minibatches", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    steps = re.findall(r"^step +(\d+)/8  reward (\S+)  loss (\S+)  clip (\S+)", out.stdout, re.M)
    assert [int(s[0]) for s in steps] == list(range(1, 9)), out.stdout
    # Steps 1, 3, 5, 7 open a generation batch: on-policy, ratio exactly 1 (the first minibatch of each batch).
    on_policy = re.findall(r"^step +[1357]/8 .* ratio max (\S+)", out.stdout, re.M)
    assert on_policy == ["1.0000"] * 4, out.stdout
    assert any(float(s[2]) != 0.0 for s in steps), "every loss was 0: nothing to learn from"
    assert re.search(rf"^done: {loss}, 8 steps", out.stdout, re.M), out.stdout


def test_bad_settings_are_an_error_that_says_why(toy_flags):
    out = run_example(*toy_flags, "--steps", "7", "--minibatches", "2")
    assert out.returncode == 2 and "multiples of --minibatches" in out.stderr, out.stderr
    out = run_example(*toy_flags, "--loss-kwargs", "memory")
    assert out.returncode == 2 and "expected KEY=VALUE" in out.stderr, out.stderr
    out = run_example(
        *toy_flags, "--loss", "kpo", "--loss-kwargs", "qq=1", "--steps", "2", "--minibatches", "2"
    )
    assert out.returncode != 0 and "qq" in out.stderr, out.stderr[-2000:]
