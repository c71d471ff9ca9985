"""``kpo task``: write the embedded task and its warm start as files (:mod:`kpo.data.task_files`), so that any
trainer (``kpo train --dataset``, ``kpo compare --model/--dataset/--eval-data``, verl) can run on them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kpo task",
        description="Write the embedded task as files: DIR/train.parquet and DIR/test.parquet (verl's RL schema, "
        "which kpo train --dataset, kpo eval and verl read; graded by the task's own grader) and DIR/model (the "
        "warm start, built and cached on first use, as a Hugging Face directory). Prints the settings to train "
        "and evaluate them with.",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="Folder to write (its three entries are replaced)."
    )
    p.add_argument(
        "--n-train", type=int, default=None, help="Training problems (default: the split's default)."
    )
    p.add_argument(
        "--n-test", type=int, default=None, help="Held-out problems (default: the split's default)."
    )
    p.add_argument(
        "task_args",
        nargs=argparse.REMAINDER,
        help="After `--`: kpo train's flags for the task and the warm start (e.g. -- --task chain --n-terms 2 "
        "--max-value 4 --seed 0); default: the running task, seed 0's warm start.",
    )
    return p


def main(argv: list[str]) -> int:
    from kpo.data.task_files import write_task_files
    from kpo.train.config import parse_args
    from kpo.train.run import model_path
    from kpo.train.tiny import context_length

    args = build_parser().parse_args(argv)
    extra = args.task_args[1:] if args.task_args[:1] == ["--"] else args.task_args
    config = parse_args(list(extra))
    sizes = (("train", args.n_train), ("test", args.n_test))
    errors = [f"--n-{name}={n}: must be >= 1" for name, n in sizes if n is not None and n < 1]
    try:
        task = config.task_config()
    except ValueError as e:
        errors.append(str(e))
    if errors:
        print("kpo task:\n" + "\n".join(f"  - {e}" for e in errors), file=sys.stderr)
        return 2
    try:
        paths = write_task_files(
            args.out, task, model_path(config), n_train=args.n_train, n_test=args.n_test, seed=config.seed
        )
    except ValueError as e:  # a split that cannot supply the problems asked for
        print(f"kpo task: {e}", file=sys.stderr)
        return 2
    prompt, response = task.max_prompt_chars(), context_length(task) - task.max_prompt_chars()
    print(
        f"wrote {paths['train']}, {paths['test']} and {paths['model']} ({task.kind} task, warm start of seed "
        f"{config.resolved_warm_start_seed()})\n"
        f"kpo train / kpo compare: --model {paths['model']} --dataset {paths['train']} (kpo compare: --eval-data "
        f"{paths['test']}) -- --max-completion-length {response}\n"
        f"verl: data.train_files={paths['train']} data.max_prompt_length={prompt} data.max_response_length="
        f"{response} actor_rollout_ref.model.path={paths['model']} "
        "reward.custom_reward_function.path=pkg://kpo.data.task_files reward.custom_reward_function.name=compute_score"
    )
    return 0
