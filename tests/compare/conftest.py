from __future__ import annotations

import os

import pytest

from kpo.compare import CompareConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The train tests' toy (tests/train/conftest.py): a 1-layer model warm-started to a reward of about 0.6 on
# sums of two numbers up to 4, so advantages are not all zero and lr 1e-2 moves the ratios visibly.
TOY_TRAIN = (
    "--n-terms", "2", "--max-value", "4", "--tiny-hidden-size", "32", "--tiny-layers", "1", "--tiny-heads", "2",
    "--sft-examples", "12", "--sft-epochs", "300", "--prompts-per-step", "8", "--num-generations", "4",
    "--learning-rate", "1e-2",
)  # fmt: skip


@pytest.fixture
def compare_config(tmp_path):
    """Factory of a toy CompareConfig (vanilla and kpo, one seed, 4 steps, a 2-point Q sweep) in tmp_path."""

    def make(**overrides) -> CompareConfig:
        base = dict(out=str(tmp_path / "cmp"), methods=("vanilla", "kpo"), seeds=1, steps=4, minibatches=2,
                    sweep_q=(1e-6, 1e-2), sweep_seeds=1, eval_n=2, eval_limit=2, dump_every=1, jobs=2,
                    train_args=(*TOY_TRAIN, "--cache-dir", str(tmp_path / "cache")))  # fmt: skip
        return CompareConfig(**{**base, **overrides})

    return make


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test instead of training: for tests of what kpo compare must refuse before any run starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("kpo compare started training")

    monkeypatch.setattr("kpo.compare.ProcessPoolExecutor", refuse)
