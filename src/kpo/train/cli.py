"""``kpo train [--config FILE] [--field value ...]``: parse, validate (every error at once), train."""

from __future__ import annotations

import sys

from kpo._distributed import is_main
from kpo.train.config import ConfigError
from kpo.train.flags import parse_args

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_args(argv)
        from kpo.train.run import run_training

        out = run_training(config)
    except ConfigError as e:
        print(f"kpo train: {e}", file=sys.stderr)
        return 2
    if not is_main():  # on several processes rank 0 alone says where the run's files are
        return 0
    print(
        f"kpo train: done. metrics: {out / 'metrics.jsonl'}  plot: {out / 'training_dynamics.png'}  "
        f"model: {out / 'final'}"
    )
    return 0
