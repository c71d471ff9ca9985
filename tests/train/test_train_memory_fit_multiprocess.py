"""kpo train with memory=auto on 2 processes (gloo; issue 46): the q a step's losses use is the fit of the
previous step's rows of both processes (the all-reduced likelihood), not of rank 0's half. One 2-process launch,
~20-40 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kpo.analysis.dumps import load_dump
from kpo.filter.fit import NotIdentified, fit_q
from kpo.protocol import on_policy_step

from .test_train_multiprocess import _run, _torchrun, _train_flags

pytestmark = pytest.mark.slow


def test_memory_auto_q_is_the_fit_of_both_processes_rows(tiny_config):
    config = tiny_config("auto2", loss="kpo", max_steps=4, dump_ratios_every=1)
    flags = [*_train_flags(config), "--loss", "kpo", "--loss-kwargs", "memory=auto", "--micro-batch-size", "2"]
    _run(_torchrun("-m", "kpo", "train", *flags))
    out = Path(config.output_dir)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["world_size"] for r in rows] == [2] * 4
    dumps = [load_dump(out / "ratios" / f"step_{r['step']:06d}.safetensors") for r in rows]  # both ranks' rows
    fitted = 0
    for before, row, previous in zip(dumps, rows[1:], rows):
        assert before.mask.shape[0] == 16  # 2 processes x 8 rows a step
        if on_policy_step(previous["step"], config.minibatches):  # not fitted (issue 54)
            assert row["kpo/q"] == previous["kpo/q"]
            continue
        try:
            q = fit_q(torch.as_tensor(before.log_ratio), torch.as_tensor(before.mask).bool())
        except NotIdentified:
            continue
        fitted += 1
        assert row["kpo/q"] == pytest.approx(q, rel=1e-6) and row["kpo/q_stale"] == 0.0
    assert fitted >= 1
    for row, dump in zip(rows, dumps):
        assert dump.meta_float("q") == pytest.approx(row["kpo/q"], rel=1e-12)
