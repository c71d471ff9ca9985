"""What ``kpo compare``, ``kpo compare regimes`` and ``kpo compare study`` share on the command line: the options of
the user's own setup (engine, model, data, verl configuration, what a run keeps), and how a refusal or failed
runs end the command (their lines, an exit status; no traceback)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kpo.compare.engines import KEEP, engine_names
from kpo.compare.plan import CompareConfig, CompareError
from kpo.compare.run import RunsFailed

__all__ = ["exit_status", "run_reporting", "setup_from_args", "setup_options", "train_args_from"]


def setup_options(p: argparse.ArgumentParser) -> None:
    """The options of the user's own setup, shared by kpo compare and kpo compare regimes."""
    p.add_argument(
        "--engine",
        choices=engine_names(),
        default="kpo",
        help="What trains each run: kpo (kpo train: TRL, one node) or verl (verl's main_ppo on your verl "
        "configuration) (default: %(default)s).",
    )
    p.add_argument(
        "--model",
        default=None,
        help="A Hugging Face causal LM every run starts from; its held-out score is the start row and the collapse "
        "threshold (default: the embedded warm start of each seed; --engine verl: your configuration's model).",
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="Training problems, in the formats kpo train --dataset reads (verl: its parquet) (default: the embedded "
        "task; --engine verl: your configuration's data.train_files).",
    )
    p.add_argument(
        "--eval-data",
        nargs="+",
        default=(),
        metavar="FILE",
        help="Held-out benchmarks in the formats kpo eval reads, scored by avg@--eval-n with the same problems and "
        "sample seeds for every run (default: the embedded task's test split; required with --engine verl).",
    )
    p.add_argument(
        "--verl-config",
        default=None,
        help="--engine verl: your verl YAML (as main_ppo's --config-path/--config-name); its overrides go after "
        "`--` (default: verl's ppo_trainer).",
    )
    p.add_argument(
        "--keep",
        choices=tuple(KEEP),
        default=CompareConfig.keep,
        help="What stays of each run once it is scored, besides its metrics, scores, ratio dumps and log: "
        + "; ".join(f"{k}: {v}" for k, v in KEEP.items())
        + ". Each run's disk use, written and kept, is printed as it finishes.",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="--engine verl: the Ray cluster you started (`ray start --head`; its dashboard, http://HEAD:8265, or "
        "auto): each run is a Ray job of it, --jobs of them at once, and --out must be on a filesystem every node "
        "shares (default: RAY_ADDRESS; neither: main_ppo as a child process).",
    )
    p.add_argument(
        "--ray-runtime-env",
        default=None,
        help="--engine verl with a cluster: Ray's runtime environment of every run's job, a YAML or JSON file as "
        "`ray job submit --runtime-env` takes (default: the current directory as its working_dir, --out left "
        "out); kpo adds each run's environment variables.",
    )


def train_args_from(args) -> tuple[str, ...]:
    """The engine's words after ``--`` (argparse's REMAINDER keeps the ``--`` itself)."""
    words = args.train_args
    return tuple(words[1:] if words[:1] == ["--"] else words)


def setup_from_args(args) -> dict:
    """The setup options as the settings of the same names."""
    return {
        "engine": args.engine,
        "model": args.model,
        "dataset": args.dataset,
        "eval_data": _eval_files(args.eval_data),
        "verl_config": args.verl_config,
        "keep": args.keep,
        "ray_address": args.ray_address,
        "ray_runtime_env": args.ray_runtime_env,
    }


def _eval_files(paths: list[str]) -> tuple[str, ...]:
    """``--eval-data`` with a file listed more than once read once, and a note saying so."""
    resolved = [Path(p).resolve() for p in paths]
    first = dict(zip(reversed(resolved), reversed(paths)))  # the file -> how it was first given
    repeated = [first[r] for r in dict.fromkeys(resolved) if resolved.count(r) > 1]
    if repeated:
        note = f"note: --eval-data lists {', '.join(repeated)} more than once; each is read once"
        print(note, file=sys.stderr)
    return tuple(first[r] for r in dict.fromkeys(resolved))


def exit_status(error: Exception) -> int:
    """Print a refusal (CompareError: 2) or the failed runs (RunsFailed: 1) and give the command's exit status."""
    print(error, file=sys.stderr)
    return 2 if isinstance(error, CompareError) else 1


def run_reporting(call):
    """(what ``call()`` returns, 0), or (None, :func:`exit_status`) when it refuses or its runs fail."""
    try:
        return call(), 0
    except (CompareError, RunsFailed) as e:
        return None, exit_status(e)
