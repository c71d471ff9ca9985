"""The embedded tiny model and task as verl reads them (test-only): a model directory, parquet files in verl's RL
schema, and the reward function verl's reward loop calls (``reward.custom_reward_function.path=<this file>``,
``.name=compute_score``). Nothing is downloaded.

The model is kpo's warm start of the tiny Qwen3-architecture model on sums of two numbers up to 4, the one the
`kpo train` tests use (:func:`tests.train.conftest.tiny_config_factory`). Sampled at temperature 1 in verl it
scores 0.25-0.42 per step (measured), so GRPO groups are mixed and advantages are not all zero. Its character-level tokenizer gets a chat template that is the bare
message text: verl applies the chat template to every prompt, and the task's prompts are raw text
(``"3+4="``), exactly what the model was warm-started on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kpo.testbed.task import TaskConfig, load_split

__all__ = ["CHAT_TEMPLATE", "DATA_SOURCE", "TASK", "compute_score", "prepare"]

DATA_SOURCE = "kpo_chain"
TASK = TaskConfig(kind="chain", n_terms=2, max_value=4)
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **_) -> float:
    """verl's custom reward: 1.0 if the decoded response solves the row's problem (the task's own grader)."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"compute_score grades {DATA_SOURCE!r} rows only, got data_source={data_source!r}")
    return TASK.grade(solution_str, ground_truth)


def _rows(split: str, n: int) -> list[dict]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"split": split, "index": i, "id": row["id"]},
        }
        for i, row in enumerate(load_split(split, n=n, task=TASK))
    ]


def prepare(out: Path, cache: Path, n_train: int, n_val: int) -> dict[str, Path]:
    """Write ``out/model`` (the warm start, tokenizer with :data:`CHAT_TEMPLATE`), ``out/train.parquet`` and
    ``out/val.parquet`` (``n_train`` / ``n_val`` problems of the task's splits); the warm start is built once
    into ``cache``. Returns {"model", "train", "val"} -> path."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tests.train.conftest import tiny_config_factory
    from transformers import AutoTokenizer

    from kpo.train.run import model_path

    config = tiny_config_factory(cache, out)("warm")
    if config.task_config() != TASK:
        raise AssertionError(
            f"the train tests' tiny task is now {config.task_config()}; update TASK ({TASK})"
        )
    warm = model_path(config)
    model = out / "model"
    shutil.copytree(warm, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model)
    paths = {"model": model, "train": out / "train.parquet", "val": out / "val.parquet"}
    pq.write_table(pa.Table.from_pylist(_rows("train", n_train)), paths["train"])
    pq.write_table(pa.Table.from_pylist(_rows("test", n_val)), paths["val"])
    return paths
