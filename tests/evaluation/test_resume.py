from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kpo.evaluation import evaluate
from kpo.evaluation.cli import main as cli_main

pytestmark = pytest.mark.slow

ARGS = dict(n=4, ks=(1, 4), limit=16, batch_size=4, max_new_tokens=16)
TOTAL = 16 * 4


def _cli(model, cache, output=None):
    cmd = [
        sys.executable,
        "-m",
        "kpo.cli",
        "eval",
        "--model",
        str(model),
        "--data",
        "synthetic",
        "--n",
        "4",
        "--k",
        "1,4",
        "--limit",
        "16",
        "--batch-size",
        "4",
        "--max-new-tokens",
        "16",
        "--no-progress",
        "--cache",
        str(cache),
    ]
    return cmd + (["--output", str(output)] if output else [])


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_killed_run_resumes_to_the_uninterrupted_result(tiny_model, tmp_path, one_thread):
    cache = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        _cli(tiny_model, cache), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    # Kill it once two batches are durable, well before all samples are done.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if cache.exists() and len(cache.read_bytes().splitlines()) >= 8:
            break
        time.sleep(0.01)
    assert proc.poll() is None, (
        f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = len(cache.read_bytes().splitlines())
    assert 8 <= done_at_kill < TOTAL and done_at_kill % 4 == 0
    # Whole batches only (a multiple of the batch size), every line a complete record.
    assert all(json.loads(line)["completion"] is not None for line in cache.read_text().splitlines())

    # Rerun the same command (in this process: one interpreter start-up less) to completion.
    out = tmp_path / "resumed.json"
    assert cli_main(_cli(tiny_model, cache, out)[4:]) == 0
    resumed = json.loads(out.read_text())
    lines = cache.read_text().splitlines()
    assert len(lines) == TOTAL and len({(r["id"], r["sample"]) for r in map(json.loads, lines)}) == TOTAL

    fresh = evaluate(tiny_model, "synthetic", cache=tmp_path / "fresh.jsonl", show_progress=False, **ARGS)
    assert resumed["benchmarks"] == fresh["benchmarks"]
    assert resumed["macro"] == fresh["macro"]

    def completions(path):
        return {
            (r["id"], r["sample"]): r["completion"] for r in map(json.loads, path.read_text().splitlines())
        }

    assert completions(cache) == completions(tmp_path / "fresh.jsonl")
