"""The embedded model's context follows the task, and a --model run without --dataset says it trains on the
embedded task."""

from __future__ import annotations

from kpo.testbed.task import TaskConfig
from kpo.testbed.tiny import context_length
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


def test_a_model_without_a_dataset_is_said_once(tmp_path):
    from kpo.train.run import notices

    assert notices(TrainConfig()) == []
    assert notices(TrainConfig(model=str(tmp_path), dataset=str(tmp_path / "d.jsonl"))) == []
    [line] = notices(TrainConfig(model=str(tmp_path)))
    assert line == (
        f"--model {tmp_path} without --dataset trains it on the embedded running task (n_terms=128, "
        "max_value=9), whose prompts are digits; pass --dataset FILE to train on a math dataset"
    )
