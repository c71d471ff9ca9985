"""``kpo task``: write the embedded task and its warm start as files (:mod:`kpo.testbed.files`), so that any
trainer (``kpo train --dataset``, ``kpo compare --model/--dataset/--eval-data``, verl) can run on them. Every
setting is checked before the warm start is built."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kpo.train.checks import WARM_START_FIELDS

# The kpo train settings kpo task uses (after `--`): the task, and its warm start's seed, shape, SFT round and
# cache. The others set RL, which kpo task does not run.
TASK_FIELDS = ("task", "n_terms", "max_value", "seed", *WARM_START_FIELDS, "progress")
# What kpo task writes in --out, each replaced: name -> whether it is a folder
ENTRIES = {"train.parquet": False, "test.parquet": False, "model": True}


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kpo task",
        description="Write the embedded task as files: DIR/train.parquet and DIR/test.parquet (verl's RL schema, "
        "which kpo train --dataset, kpo eval and verl read; graded by the task's own grader) and DIR/model (the "
        "warm start, built and cached on first use, as a Hugging Face directory). Prints the settings to train "
        "and evaluate them with.",
    )
    p.add_argument("--out", required=True, help="Folder to write (its three entries are replaced).")
    p.add_argument(
        "--n-train", type=int, default=None, help="Training problems (default: the split's default)."
    )
    p.add_argument(
        "--n-test", type=int, default=None, help="Held-out problems (default: the split's default)."
    )
    p.add_argument(
        "task_args",
        nargs=argparse.REMAINDER,
        help=f"After `--`: kpo train's flags for the task and the warm start, of {', '.join(map(_flag, TASK_FIELDS))} "
        "(e.g. -- --task chain --n-terms 2 --max-value 4 --seed 0); default: the running task, seed 0's warm start.",
    )
    return p


def out_errors(out: str) -> list[str]:
    """``--out`` that kpo task cannot write: empty (the current folder), under a file, not writable, or holding
    one of its entries in the other kind (a file where it writes the model's folder)."""
    from kpo._checks import file_in_the_way, unwritable

    if not out.strip():
        return ["--out '': empty, so the files would replace ./model and the parquets here; give a folder"]
    folder = Path(out)
    existing = file_in_the_way(folder)
    if existing is not None:
        return [f"--out {out}: {str(existing)!r} is a file, not a folder; choose another --out"]
    if (why := unwritable(folder)) is not None:
        return [f"--out {out}: {why}; choose another --out"]
    errors = []
    for name, is_folder in ENTRIES.items():
        path = folder / name
        if path.exists() and path.is_dir() != is_folder:
            kind, other = ("a file", "folder") if is_folder else ("a folder", "file")
            errors.append(
                f"--out {out}: {str(path)!r} is {kind}, where kpo task writes its {other} {name}; move it away or "
                "choose another --out"
            )
    return errors


def task_config(extra: list[str]):
    """(kpo train's config of the `--` flags, errors): flags kpo task does not use or cannot parse, and kpo train's
    own checks of the settings it uses, each in one line (not kpo train's usage)."""
    from kpo.train.config import ConfigError
    from kpo.train.flags import build_parser, parse_args

    parser = build_parser("kpo task --", defaults=False)
    parser.exit_on_error = False  # a bad value raises, instead of printing kpo train's usage
    try:
        given, unknown = parser.parse_known_args(extra)
    except argparse.ArgumentError as e:
        return None, [f"-- {e}"]
    if unknown:
        return None, [
            f"-- {' '.join(unknown)}: not a kpo train flag; kpo task takes {', '.join(map(_flag, TASK_FIELDS))}"
        ]
    # kpo train's parser without defaults leaves unset fields out (config is there with --config): its keys are the
    # flags given
    other = [
        key
        for key, value in vars(given).items()
        if key not in TASK_FIELDS and (key, value) != ("config", None)
    ]
    if other:
        yaml = "; give the task's settings of the YAML as flags" if "config" in other else ""
        return None, [
            f"-- {', '.join(map(_flag, other))}: kpo task writes the task and its warm start and trains no policy, "
            f"so it takes only {', '.join(map(_flag, TASK_FIELDS))}{yaml}"
        ]
    config = parse_args(extra)
    try:
        config.validate()
    except ConfigError as e:
        # kpo train's errors name their field first; those of the settings kpo task leaves at kpo train's
        # defaults (the RL batch, the output folder) are not kpo task's
        mine = [err for err in e.errors if err.startswith(("task/", *(f"{name}=" for name in TASK_FIELDS)))]
        if mine:
            return None, [f"-- {err}" for err in mine]
    return config, []


def main(argv: list[str]) -> int:
    from kpo.testbed.files import write_task_files
    from kpo.testbed.tiny import context_length
    from kpo.train.run import model_path

    args = build_parser().parse_args(argv)
    extra = args.task_args[1:] if args.task_args[:1] == ["--"] else args.task_args
    sizes = (("train", args.n_train), ("test", args.n_test))
    errors = [f"--n-{name}={n}: must be >= 1" for name, n in sizes if n is not None and n < 1]
    errors += out_errors(args.out)
    config, found = task_config(list(extra))
    errors += found
    if errors:
        print(
            "kpo task: " + (errors[0] if len(errors) == 1 else "\n" + "\n".join(f"  - {e}" for e in errors)),
            file=sys.stderr,
        )
        return 2
    task = config.task_config()
    try:
        paths = write_task_files(
            Path(args.out),
            task,
            lambda: model_path(config),
            n_train=args.n_train,
            n_test=args.n_test,
            seed=config.seed,
        )
    except ValueError as e:  # a split too small for its size (found before the warm start is built)
        print(f"kpo task: --n-train / --n-test: {e}", file=sys.stderr)
        return 2
    prompt, response = task.max_prompt_chars(), context_length(task) - task.max_prompt_chars()
    print(
        f"wrote {paths['train']}, {paths['test']} and {paths['model']} ({task.kind} task, warm start of seed "
        f"{config.resolved_warm_start_seed()})\n"
        f"kpo train / kpo compare: --model {paths['model']} --dataset {paths['train']} (kpo compare: --eval-data "
        f"{paths['test']}) -- --max-completion-length {response}\n"
        f"verl: data.train_files={paths['train']} data.max_prompt_length={prompt} data.max_response_length="
        f"{response} actor_rollout_ref.model.path={paths['model']} "
        "reward.custom_reward_function.path=pkg://kpo.testbed.files reward.custom_reward_function.name=compute_score"
    )
    return 0
