from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """One warm-start cache for the whole session (the first run builds the SFT model, later runs reuse it)."""
    return tmp_path_factory.mktemp("kpo-cache")


# The fields a tiny config sets (tiny_config_factory), as `kpo train` flags reproduce it.
TINY_FIELDS = (
    "output_dir",
    "cache_dir",
    "task",
    "n_terms",
    "max_value",
    "tiny_hidden_size",
    "tiny_layers",
    "tiny_heads",
    "sft_examples",
    "sft_epochs",
    "prompts_per_step",
    "num_generations",
    "minibatches",
    "max_steps",
    "learning_rate",
    "report_to",
)


def cli_flags(config, fields=TINY_FIELDS) -> list[str]:
    """``--field value`` for each of ``fields`` of ``config``: the command line that gives that config."""
    return [arg for key in fields for arg in (f"--{key.replace('_', '-')}", str(getattr(config, key)))]


def tiny_config_factory(cache, directory):
    """Factory of a seconds-long TrainConfig: a 1-layer, 32-wide model on sums of two numbers up to 4
    (warm-started to a reward of about 0.6, so advantages are not all zero), 8 prompts x 4 responses per
    generation batch, 2 optimizer steps per batch (the second off-policy), lr 1e-2 so ratios move visibly.
    Runs go to ``directory / name``, the warm start to ``cache``."""
    from kpo.train.config import TrainConfig

    def make(name: str = "run", **overrides) -> TrainConfig:
        fields = dict(
            output_dir=str(directory / name),
            cache_dir=str(cache),
            task="chain",
            n_terms=2,
            max_value=4,
            tiny_hidden_size=32,
            tiny_layers=1,
            tiny_heads=2,
            sft_examples=12,
            sft_epochs=300,
            prompts_per_step=8,
            num_generations=4,
            minibatches=2,
            max_steps=4,
            learning_rate=1e-2,
            progress=False,
            report_to="none",
        )
        fields.update(overrides)
        return TrainConfig(**fields)

    return make


@pytest.fixture
def tiny_config(tiny_cache, tmp_path):
    """:func:`tiny_config_factory` with runs in this test's tmp_path."""
    return tiny_config_factory(tiny_cache, tmp_path)


@pytest.fixture(scope="session")
def tiny_config_in(tiny_cache):
    """``tiny_config_in(directory)``: :func:`tiny_config_factory` for runs in ``directory``, for fixtures shared
    by several tests (a module's uninterrupted reference run)."""
    return lambda directory: tiny_config_factory(tiny_cache, directory)


def interrupt_line(stderr: str, sig: int, steps: int, resume: str) -> tuple[int, Path, str]:
    """(step, checkpoint, resume command) of the one line an interrupted ``kpo train`` ends with, checking that
    nothing else mentions the signal and no traceback was printed; ``resume`` is a regex of the command's
    start (``kpo train``, ``kpo launch --nproc-per-node 2 train``)."""
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    name = signal.Signals(sig).name
    lines = [line for line in stderr.splitlines() if name in line]
    assert len(lines) == 1 and stderr.rstrip().endswith(lines[0]), stderr
    found = re.fullmatch(
        rf"kpo train: interrupted by {name} at step (\d+)/{steps}, checkpoint saved in (\S+); resume with: "
        rf"({resume} .*)",
        lines[0],
    )
    assert found, lines[0]
    return int(found[1]), Path(found[2]), found[3]
