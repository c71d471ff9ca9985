"""Write the verl parquet files of the paper's KPO run: DAPO-Math-17k for training, six benchmarks for validation.

    python examples/verl/prepare_data.py [--data-dir DIR] [--out DIR]

Reads the files in ``../shared/data`` (or ``--data-dir``, or env ``KPO_SHARED_DATA``) with
``kpo.data.math.load_problems`` (any of its formats) and writes, per file, one parquet in verl's RL schema:

    data_source   benchmark name ("dapo_math_17k", "aime24", ...): verl groups validation metrics by it
    prompt        [{"role": "user", "content": kpo's evaluation prompt with the problem}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": first accepted answer}
    extra_info    {"split", "index", "id", "answers": every accepted answer}

The prompt is ``kpo.evaluation.DEFAULT_PROMPT_TEMPLATE`` (verl applies the model's chat template to it, as
``kpo eval`` does), and ``examples/verl/reward.py`` grades with ``kpo.rewards.math_reward``, so verl's
validation numbers and ``kpo eval`` measure the same thing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kpo.data.math import load_problems
from kpo.evaluation import DEFAULT_PROMPT_TEMPLATE

TRAIN = {"dapo_math_17k": "dapo_math_17k.parquet"}
# The paper's six benchmarks (AIME25: the copy with the JSON escapes repaired; see PROVENANCE.md).
VALIDATION = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.fixed.jsonl",
    "amc23": "amc23.jsonl",
    "math500": "math500.jsonl",
    "minerva": "minerva.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
}


def default_data_dir() -> Path:
    env = os.environ.get("KPO_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


def verl_rows(
    path: Path, data_source: str, split: str, template: str = DEFAULT_PROMPT_TEMPLATE
) -> list[dict]:
    """verl RL rows (schema in the module docstring) for every problem in ``path``."""
    rows = []
    for index, problem in enumerate(load_problems(path)):
        answers = problem["answer"] if isinstance(problem["answer"], list) else [problem["answer"]]
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": template.replace("{problem}", problem["problem"])}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answers[0]},
                "extra_info": {"split": split, "index": index, "id": problem["id"], "answers": answers},
            }
        )
    return rows


def write(data_dir: Path, out: Path) -> dict[str, Path]:
    """Write ``train.parquet`` and one ``<benchmark>.parquet`` per validation set; returns name -> path."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, files in (("train", TRAIN), ("test", VALIDATION)):
        for name, filename in files.items():
            rows = verl_rows(data_dir / filename, name, split)
            target = out / ("train.parquet" if split == "train" else f"{name}.parquet")
            pq.write_table(pa.Table.from_pylist(rows), target)
            written[name] = target
            print(f"{name:>14}: {len(rows):6d} rows -> {target}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), help="benchmark files (default: %(default)s)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("~/data/kpo_verl").expanduser(),
        help="output dir (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    missing = [f for f in (*TRAIN.values(), *VALIDATION.values()) if not (args.data_dir / f).is_file()]
    if missing:
        print(
            f"missing in {args.data_dir}: {', '.join(missing)}; pass --data-dir or set KPO_SHARED_DATA",
            file=sys.stderr,
        )
        return 2
    write(args.data_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
