from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kpo.compare import CompareConfig, Run
from kpo.compare.engines.kpo import train_argv
from kpo.train.flags import parse_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The train tests' toy (tests/train/conftest.py): a 1-layer model warm-started to a reward of about 0.6 on
# sums of two numbers up to 4, so advantages are not all zero and lr 1e-2 moves the ratios visibly.
# the toy task and model, as kpo train's (and kpo task's) flags; also tests/integrations/test_verl_compare.py's
TOY_TASK = (
    "--task",
    "chain",
    "--n-terms",
    "2",
    "--max-value",
    "4",
    "--tiny-hidden-size",
    "32",
    "--tiny-layers",
    "1",
    "--tiny-heads",
    "2",
    "--sft-examples",
    "12",
    "--sft-epochs",
    "300",
)
TOY_TRAIN = (*TOY_TASK, "--prompts-per-step", "8", "--num-generations", "4", "--learning-rate", "1e-2")


@pytest.fixture
def compare_config(tmp_path):
    """Factory of a toy CompareConfig (vanilla and kpo, one seed, 4 steps, no matched-memory arm, no ablations,
    no A/A arm, a 2-point memory sweep) in tmp_path."""

    def make(**overrides) -> CompareConfig:
        base = dict(
            out=str(tmp_path / "cmp"),
            methods=("vanilla", "kpo"),
            seeds=1,
            steps=4,
            minibatches=2,
            matched=False,
            ablations=False,
            aa_seeds=0,
            sweep_memory=("paper", "2"),
            sweep_seeds=1,
            eval_n=2,
            eval_limit=2,
            dump_every=1,
            jobs=2,
            train_args=(*TOY_TRAIN, "--cache-dir", str(tmp_path / "cache")),
        )
        return CompareConfig(**{**base, **overrides})

    return make


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test instead of training: for tests of what kpo compare must refuse before any run starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("kpo compare started training")

    monkeypatch.setattr("kpo.compare.run.ProcessPoolExecutor", refuse)


def write_fake_run(cfg: CompareConfig, run: Run, problems: int = 2) -> Path:
    """A run directory as a finished run leaves it (config.yaml, metrics.jsonl, eval.json), made with a
    CompareConfig; returns the folder. Its metrics rows and eval.json hold what the report reads (reward_mean,
    entropy; macro avg@n / pass@n, per-problem counts: half the samples right), so the report can be written
    untrained."""
    folder = Path(cfg.out) / "runs" / run.name
    folder.mkdir(parents=True, exist_ok=True)
    parse_args(train_argv(cfg, run, folder)).save_yaml(folder / "config.yaml")
    rows = [
        {"step": s, "reward_mean": 0.5, "entropy": 1.0, "clip_frac": 0.0, "pg_loss": 0.0}
        for s in range(1, (cfg.steps or 1) + 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    macro = {f"avg@{cfg.eval_n}": 0.5, f"pass@{cfg.eval_n}": 0.5, "mean_response_tokens": 3.0}
    per_problem = [{"id": f"test-{i:06d}", "correct": cfg.eval_n // 2} for i in range(problems)]
    results = {
        "params": {"n": cfg.eval_n},
        "benchmarks": {"synthetic": {"problems": problems, "per_problem": per_problem}},
        "macro": macro,
    }
    (folder / "eval.json").write_text(json.dumps(results))
    return folder


@pytest.fixture
def fake_done_run():
    """``write_fake_run``: ``make(cfg, run, problems=2) -> folder`` of a finished run, made untrained."""
    return write_fake_run
