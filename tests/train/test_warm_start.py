"""The embedded model's warm start (kpo.train.warm_start): an example that does not fit the context is an error,
its check's band follows the teacher, and a warm start that fails its check trains another round, then is
refused."""

from __future__ import annotations

import pytest

import kpo.train.warm_start as warm_start
from kpo.testbed.task import TaskConfig
from kpo.testbed.tiny import TinyModelConfig, build_tokenizer
from kpo.train.warm_start import SFT_PRESETS, _check_fits, accuracy_band


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


def test_the_warm_start_band_scales_with_the_teacher():
    # 0.99^128 = 0.2762: the band 0.55x-1.25x of it is 15.2%-34.5%
    low, high = accuracy_band(TaskConfig(), SFT_PRESETS["running"])
    assert (low, high) == pytest.approx((0.55 * 0.99**128, 1.25 * 0.99**128)) and 0.15 < low < high < 0.35
    # 8 terms: 0.99^8 = 0.923; the top is capped at 1
    assert accuracy_band(TaskConfig(n_terms=8), SFT_PRESETS["running"])[1] == 1.0
    assert SFT_PRESETS["chain"].band is None  # many right answers: no exact check


def test_a_warm_start_that_fails_its_check_trains_another_round_then_is_refused(tmp_path, monkeypatch):
    import json

    task = TaskConfig(n_terms=3)
    shape = TinyModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=16
    )
    sft = warm_start.SFTSettings(
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

    monkeypatch.setattr(warm_start, "check_warm_start", fake_check)
    path = warm_start.warm_start(task, shape, sft, seed=4, cache_dir=tmp_path, progress=False)
    record = json.loads((path / "kpo_sft.json").read_text())
    assert seen == [4, 4] and record["rounds"] == 2 and len(record["train_losses"]) == 2
    assert [c["ok"] for c in record["checks"]] == [False, True]
    # each round trains on problems of its own
    assert warm_start.sft_problems(task, 16, 4, 0) != warm_start.sft_problems(task, 16, 4, 1)

    seen.clear()
    monkeypatch.setattr(warm_start, "check_warm_start", lambda *a: {**fake_check(*a), "ok": False})
    with pytest.raises(
        RuntimeError,
        match=r"the warm start of seed 5 failed its check after 3 SFT rounds: "
        r"expected accuracy 10.0% \(band 50.0-100.0%\), least position accuracy 0.5000 at "
        r"response token 0 \(floor 0.9\)\. Nothing was cached",
    ):
        warm_start.warm_start(task, shape, sft, seed=5, cache_dir=tmp_path, progress=False)
    assert len(seen) == 3 and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.slow
def test_a_real_warm_start_that_falls_short_is_retrained_into_its_band(tmp_path):
    import json
    from dataclasses import replace

    # 8 terms and 100-step rounds (3200 problems of 32): round 1 leaves the rule unlearnt (measured: 0.0% expected,
    # least position 0.15), round 2 half-learnt (16.6%), round 3 in the band 0.55-1.25 x 0.99^8 = 50.8-100%
    # (88.2%, least position 0.98). The full-size warm start's rounds are the same mechanism at 400 steps.
    task = TaskConfig(n_terms=8)
    shape = TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=32
    )
    sft = replace(warm_start.SFT_PRESETS["running"], n_examples=3200)
    path = warm_start.warm_start(task, shape, sft, seed=0, cache_dir=tmp_path, progress=False)
    checks = json.loads((path / "kpo_sft.json").read_text())["checks"]
    low, high = warm_start.accuracy_band(task, sft)
    assert not checks[0]["ok"] and checks[-1]["ok"], checks
    assert low <= checks[-1]["expected_accuracy"] <= high and checks[-1]["min_position_accuracy"] >= 0.97
