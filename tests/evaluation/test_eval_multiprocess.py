"""`kpo eval` on 2 processes (python -m kpo.launch): each samples and grades its share of the problems, the
graded problems are gathered, and the numbers are those of one process (a sample does not depend on where it
ran). The model is the train tests' tiny warm start (tests/train/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kpo.evaluation import evaluate

from .test_resume import _env

pytestmark = pytest.mark.slow

# 5 problems: 3 on rank 0, 2 on rank 1. Terms up to 9 (the warm start learnt sums of terms up to 4, and this
# task's test split has 2 problems of those): about 1 sample in 20 is right, so the numbers are not all 0.
N, LIMIT = 4, 5
TASK = {"kind": "chain", "n_terms": 2, "max_value": 9}


def _samples(cache) -> list[tuple[str, int, str]]:
    return sorted(
        (r["id"], r["sample"], r["completion"]) for r in map(json.loads, cache.read_text().splitlines())
    )


def test_two_processes_shard_the_problems_and_match_one(tmp_path, one_thread):
    from kpo.train.config import TrainConfig
    from kpo.train.run import model_path

    tiny = dict(tiny_hidden_size=32, tiny_layers=1, tiny_heads=2, sft_examples=12, sft_epochs=300)
    model = model_path(TrainConfig(cache_dir=str(tmp_path), task="chain", n_terms=2, max_value=4, **tiny))
    one = evaluate(
        model,
        "synthetic",
        n=N,
        ks=(1, N),
        limit=LIMIT,
        synthetic_kw=TASK,
        show_progress=False,
        output=tmp_path / "one.json",
    )
    task = [arg for key, value in TASK.items() for arg in ("--task", f"{key}={value}")]
    command = [sys.executable, "-m", "kpo.launch", "--nproc-per-node", "2", "eval", "--model", str(model)]
    command += ["--data", "synthetic", "--n", str(N), "--k", f"1,{N}", "--limit", str(LIMIT), *task]
    command += ["--no-progress", "--output", str(tmp_path / "two.json")]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("| synthetic |") == 1  # rank 0 alone prints the table

    two = json.loads((tmp_path / "two.json").read_text())
    assert two["benchmarks"] == one["benchmarks"] and two["macro"] == one["macro"]
    assert 0 < one["benchmarks"]["synthetic"][f"avg@{N}"] < 1
    # every sample generated once, by one of the processes, and the same as one process drew
    assert _samples(tmp_path / "two.generations.jsonl") == _samples(tmp_path / "one.generations.jsonl")
    assert len(_samples(tmp_path / "two.generations.jsonl")) == N * LIMIT
