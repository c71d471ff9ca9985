"""kpo train with memory=auto (issue 46): one q per optimizer step, fitted on the whole previous step (every
micro-batch, every process; a generation batch's first, on-policy step is not fitted: issue 54) and recorded as used, even with micro-batches of one row, where a response that
ends at its first token used to stop the run ("fit_q needs at least 2 valid tokens"). ~15-25 s: a tiny run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kpo.analysis.dumps import load_dump
from kpo.filter.fit import NotIdentified, fit_q
from kpo.protocol import on_policy_step

pytestmark = pytest.mark.slow


def test_memory_auto_is_one_q_per_step_fitted_on_the_previous_whole_step(tiny_config):
    from kpo.train import run_training

    config = tiny_config(
        "auto",
        loss="kpo",
        loss_kwargs={"memory": "auto"},
        micro_batch_size=1,
        dump_ratios_every=1,
        max_steps=4,
        save_steps=2,
    )
    out = Path(run_training(config))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    dumps = [load_dump(out / "ratios" / f"step_{r['step']:06d}.safetensors") for r in rows]
    for row, dump in zip(rows, dumps):
        assert dump.meta_float("q") == pytest.approx(row["kpo/q"], rel=1e-12)  # the q the losses used
        assert row["kpo/memory_tokens"] > 0 and row["kpo/q_stale"] in (0.0, 1.0)
    fitted = 0
    for before, (row, previous) in zip(dumps, zip(rows[1:], rows)):
        if on_policy_step(previous["step"], config.minibatches):  # a generation batch's first step: not fitted
            assert (row["kpo/q"], row["kpo/q_stale"]) == (previous["kpo/q"], previous["kpo/q_stale"])
            continue
        try:
            q = fit_q(torch.as_tensor(before.log_ratio), torch.as_tensor(before.mask).bool())
        except NotIdentified:  # that step's ratios were all 1: the q before it stays
            assert row["kpo/q"] == previous["kpo/q"] and row["kpo/q_stale"] == 1.0
            continue
        fitted += 1
        assert row["kpo/q"] == pytest.approx(q, rel=1e-6) and row["kpo/q_stale"] == 0.0
        assert row["kpo/q_low"] <= row["kpo/q"] <= row["kpo/q_high"]
    assert fitted >= 1 and math.isfinite(rows[-1]["kpo/q"])
    # a checkpoint keeps the q the next step filters with, so a resumed run filters as the uninterrupted one
    saved = json.loads((out / "checkpoint-2" / "memory_fit.json").read_text())
    assert saved["fit"][0] == rows[2]["kpo/q"] and saved["stale"] == bool(rows[2]["kpo/q_stale"])
