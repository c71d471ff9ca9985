"""The embedded model's context follows the task, a warm-start example that does not fit is an error, and a
--model run without --dataset says it trains on the embedded task."""

from __future__ import annotations

import pytest

from kpo.data.synthetic import TaskConfig
from kpo.train.config import TrainConfig
from kpo.train.tiny import _check_fits, build_tokenizer, context_length


def test_context_follows_the_task():
    # running, 128 terms: 129-token prompt + 128-token response + 4 slack + end token = 262 -> 272 (16s)
    assert context_length(TaskConfig()) == 272
    assert context_length(TaskConfig(n_terms=512)) == 1040  # 513 + 512 + 4 + 1 = 1030 -> 1040
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
