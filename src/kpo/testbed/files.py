"""The embedded task as files: its train and held-out problems in verl's RL parquet schema, which ``kpo train
--dataset``, ``kpo eval`` and verl all read, and the reward function verl calls on them.

A row (one problem)::

    {"data_source": "kpo_chain",                                   # kpo_<kind>: names the grader
     "prompt": [{"role": "user", "content": "3+4="}],              # the task's prompt, fed as it is
     "ability": "arithmetic",
     "reward_model": {"style": "rule", "ground_truth": "7"},       # what TaskConfig.grade checks against
     "extra_info": {"split": "train", "index": 0, "id": "train-000000"}}

A file whose rows' ``data_source`` is ``kpo_<kind>`` is graded by :meth:`kpo.testbed.task.TaskConfig.grade` and
its prompts are fed without an instruction (``kpo train`` and ``kpo eval``, :func:`task_of_rows`; verl:
``reward.custom_reward_function.path=pkg://kpo.testbed.files reward.custom_reward_function.name=compute_score``);
any other file is a math benchmark graded by math-verify. ``kpo task --out DIR`` (:mod:`kpo.testbed.cli`) writes
``DIR/train.parquet``, ``DIR/test.parquet`` and ``DIR/model`` (the warm start, an ordinary Hugging Face
directory) with the settings to train and evaluate them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from kpo.testbed.task import TASKS, TaskConfig, load_split

__all__ = ["CHAT_TEMPLATE", "SOURCE_PREFIX", "compute_score", "task_of", "task_of_rows", "write_task_files"]

SOURCE_PREFIX = "kpo_"
# The chat template the exported model carries: the bare message text. verl applies a chat template to every
# prompt, and the embedded model was warm-started on the raw prompt ("3+4="), which this template leaves as it is.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def task_of(data_source: str | None) -> TaskConfig | None:
    """The embedded task a ``data_source`` names (``kpo_chain`` -> the chain task), None for any other source.
    Grading depends on the kind only, so the task's other fields are its defaults."""
    if not isinstance(data_source, str) or not data_source.startswith(SOURCE_PREFIX):
        return None
    kind = data_source[len(SOURCE_PREFIX) :]
    return TaskConfig(kind=kind) if kind in TASKS else None


def task_of_rows(rows: Sequence[dict], where: str = "rows") -> TaskConfig | None:
    """The embedded task of problems read by :func:`kpo.data.math.load_problems`, or None when they are math
    problems. ValueError naming ``where`` when the rows mix tasks, or a task with other problems: one file has one
    grader."""
    tasks = {(r.get("data_source") if task_of(r.get("data_source")) else None) for r in rows}
    if len(tasks) > 1:
        found = ", ".join(sorted(str(t) for t in tasks))
        raise ValueError(
            f"{where}: rows of several graders (data_source {found}); write the embedded task's problems and other "
            "problems to separate files"
        )
    return task_of(next(iter(tasks), None))


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **_) -> float:
    """verl's custom reward function on the embedded task's rows: 1.0 when the response solves the row's problem
    (:meth:`TaskConfig.grade`), else 0.0. ValueError for a row of another source (give verl a reward function
    that grades it)."""
    task = task_of(data_source)
    if task is None:
        raise ValueError(
            f"kpo.testbed.files.compute_score grades the embedded task's rows ({SOURCE_PREFIX}<kind>) only, got "
            f"data_source={data_source!r}"
        )
    return task.grade(solution_str, ground_truth)


def _rows(task: TaskConfig, split: str, n: int | None, seed: int) -> list[dict]:
    return [
        {
            "data_source": f"{SOURCE_PREFIX}{task.kind}",
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"split": split, "index": i, "id": row["id"]},
        }
        for i, row in enumerate(load_split(split, n=n, seed=seed, task=task))
    ]


def write_task_files(
    out: Path,
    task: TaskConfig,
    model: Path | Callable[[], Path],
    *,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
) -> dict[str, Path]:
    """Write ``out/train.parquet`` and ``out/test.parquet`` (``n_train`` / ``n_test`` problems of the task's
    splits, None: their default sizes; the train rows drawn with ``seed``) and ``out/model``, a copy of the
    Hugging Face directory ``model`` (or of the one it returns, called once the rows are drawn: building a warm
    start takes seconds, and a split too small for its size fails first) whose tokenizer gets
    :data:`CHAT_TEMPLATE`. Each is whole or absent. Returns {"train", "test", "model"} -> path."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from kpo._files import replacing

    out = Path(out)
    paths = {"train": out / "train.parquet", "test": out / "test.parquet", "model": out / "model"}
    # both splits drawn before anything is written: a split too small for its size leaves nothing behind
    rows = {"train": _rows(task, "train", n_train, seed), "test": _rows(task, "test", n_test, 0)}
    model = model() if callable(model) else model
    for split, found in rows.items():
        with replacing(paths[split]) as partial:
            pq.write_table(pa.Table.from_pylist(found), partial)
    with replacing(paths["model"]) as partial:
        shutil.copytree(model, partial)
        tokenizer = AutoTokenizer.from_pretrained(partial)
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(partial)
    return paths
