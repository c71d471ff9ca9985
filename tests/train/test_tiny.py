"""The embedded model's context follows the task, a warm-start example that does not fit is an error, and a
--model run without --dataset says it trains on the embedded task."""

from __future__ import annotations

import pytest

from kpo.testbed.task import TaskConfig
from kpo.testbed.tiny import _check_fits, build_tokenizer, context_length
from kpo.train.config import TrainConfig


def test_context_follows_the_task():
    # running, 128 terms: 130-token prompt + 128-token response + 4 slack + end token = 263 -> 272 (16s)
    assert context_length(TaskConfig()) == 272
    assert context_length(TaskConfig(n_terms=512)) == 1040  # 514 + 512 + 4 + 1 = 1031 -> 1040
    # the chain task: "19+19=" + "38" + 4 + 1 = 13 -> 16
    assert context_length(TaskConfig(kind="chain")) == 16
    shape = TrainConfig().tiny_shape()
    assert (shape.max_position_embeddings, shape.num_layers) == (272, 2)
    assert TrainConfig(task="chain").tiny_shape().num_layers == 4
    assert TrainConfig(tiny_layers=3).tiny_shape().num_layers == 3


def test_an_example_longer_than_the_context_is_an_error():
    tokenizer = build_tokenizer()
    rows = [{"prompt": "12=", "completion": "3"}, {"prompt": "1234567=", "completion": "1368"}]
    _check_fits(rows[:1], tokenizer, 5)  # 3 + 1 + end = 5 tokens: fits exactly
    with pytest.raises(
        ValueError,
        match=r"warm-start example 1 \('1234567='\.\.\.\) is 13 tokens with its end "
        r"token, longer than the model's context of 12",
    ):
        _check_fits(rows, tokenizer, 12)


def test_a_model_without_a_dataset_is_said_once(tmp_path):
    from kpo.train.run import notices

    assert notices(TrainConfig()) == []
    assert notices(TrainConfig(model=str(tmp_path), dataset=str(tmp_path / "d.jsonl"))) == []
    [line] = notices(TrainConfig(model=str(tmp_path)))
    assert line == (
        f"--model {tmp_path} without --dataset trains it on the embedded running task (n_terms=128, "
        "max_value=9), whose prompts are digits; pass --dataset FILE to train on a math dataset"
    )


def test_the_warm_start_band_scales_with_the_teacher():
    from kpo.testbed.tiny import SFT_PRESETS, accuracy_band

    # 0.99^128 = 0.2762: the band 0.55x-1.25x of it is 15.2%-34.5%
    low, high = accuracy_band(TaskConfig(), SFT_PRESETS["running"])
    assert (low, high) == pytest.approx((0.55 * 0.99**128, 1.25 * 0.99**128)) and 0.15 < low < high < 0.35
    # 8 terms: 0.99^8 = 0.923; the top is capped at 1
    assert accuracy_band(TaskConfig(n_terms=8), SFT_PRESETS["running"])[1] == 1.0
    assert SFT_PRESETS["chain"].band is None  # many right answers: no exact check


def test_a_warm_start_that_fails_its_check_trains_another_round_then_is_refused(tmp_path, monkeypatch):
    import json

    import kpo.testbed.tiny as tiny

    task = TaskConfig(n_terms=3)
    shape = tiny.TinyModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=16
    )
    sft = tiny.SFTSettings(
        n_examples=16, epochs=1, batch_size=16, band=(0.5, 1.0), min_position_accuracy=0.9, max_rounds=3
    )
    seen = []

    def fake_check(model, tokenizer, task_, sft_, seed):
        seen.append(seed)
        ok = len(seen) == 2  # the second round passes
        return {
            "expected_accuracy": 0.1,
            "band": [0.5, 1.0],
            "min_position_accuracy": 0.5,
            "worst_position": 0,
            "ok": ok,
        }

    monkeypatch.setattr(tiny, "check_warm_start", fake_check)
    path = tiny.warm_start(task, shape, sft, seed=4, cache_dir=tmp_path, progress=False)
    record = json.loads((path / "kpo_sft.json").read_text())
    assert seen == [4, 4] and record["rounds"] == 2 and len(record["train_losses"]) == 2
    assert [c["ok"] for c in record["checks"]] == [False, True]
    # each round trains on problems of its own
    assert tiny.sft_problems(task, 16, 4, 0) != tiny.sft_problems(task, 16, 4, 1)

    seen.clear()
    monkeypatch.setattr(tiny, "check_warm_start", lambda *a: {**fake_check(*a), "ok": False})
    with pytest.raises(
        RuntimeError,
        match=r"the warm start of seed 5 failed its check after 3 SFT rounds: "
        r"expected accuracy 10.0% \(band 50.0-100.0%\), least position accuracy 0.5000 at "
        r"response token 0 \(floor 0.9\)\. Nothing was cached",
    ):
        tiny.warm_start(task, shape, sft, seed=5, cache_dir=tmp_path, progress=False)
    assert len(seen) == 3 and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.slow
def test_a_real_warm_start_that_falls_short_is_retrained_into_its_band(tmp_path):
    import json
    from dataclasses import replace

    import kpo.testbed.tiny as tiny

    # 8 terms and 100-step rounds (3200 problems of 32): round 1 leaves the rule unlearnt (measured: 0.0% expected,
    # least position 0.15), round 2 half-learnt (16.6%), round 3 in the band 0.55-1.25 x 0.99^8 = 50.8-100%
    # (88.2%, least position 0.98). The full-size warm start's rounds are the same mechanism at 400 steps.
    task = TaskConfig(n_terms=8)
    shape = tiny.TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=32
    )
    sft = replace(tiny.SFT_PRESETS["running"], n_examples=3200)
    path = tiny.warm_start(task, shape, sft, seed=0, cache_dir=tmp_path, progress=False)
    checks = json.loads((path / "kpo_sft.json").read_text())["checks"]
    low, high = tiny.accuracy_band(task, sft)
    assert not checks[0]["ok"] and checks[-1]["ok"], checks
    assert low <= checks[-1]["expected_accuracy"] <= high and checks[-1]["min_position_accuracy"] >= 0.97
