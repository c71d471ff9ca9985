"""``kpo compare regimes``: the command line. Its options are the fields of
:class:`kpo.compare.regimes.RegimeConfig`."""

from __future__ import annotations

import argparse

from kpo.compare.cell import MISMATCH
from kpo.compare.regimes.design import BATCHES, GRID, RegimeConfig, run_regimes
from kpo.compare.setup_cli import run_reporting, setup_from_args, setup_options, train_args_from

__all__ = ["build_parser", "main"]


def _listed(kind):
    """A comma-separated list of ``kind``: '4,16' -> (4, 16)."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated {kind.__name__} values") from None

    parse.__name__ = f"list of {kind.__name__}"
    return parse


def build_parser() -> argparse.ArgumentParser:
    d = RegimeConfig()
    p = argparse.ArgumentParser(
        prog="kpo compare regimes",
        description="Where does KPO help? A grid of regimes (train-inference mismatch x off-policy depth x "
        "learning rate); GRPO, GSPO, KPO (matched) and KPO (auto) paired by seed, the stress cells (the highest "
        "learning rate) also KPO's clip band without the filter; questions pooled over cells, run as a study "
        "(kpo compare study) whose plan these flags make. Prints the plan before anything trains; finished runs are "
        "reused; the report is rewritten as runs finish.",
    )
    p.add_argument("--out", default=d.out, help="Map and run directory (default: %(default)s).")
    p.add_argument(
        "--mismatch",
        type=_listed(str),
        default=d.mismatch,
        help=f"Sampler levels, of {', '.join(MISMATCH)}: none = the trainer's float32 policy with the trainer's "
        "anchor; bf16 / fp8 = a bf16 / FP8 copy with the sampler's log-probs as the anchor (default: "
        f"{','.join(GRID['mismatch'])}).",
    )
    p.add_argument(
        "--depth",
        type=_listed(int),
        default=d.depth,
        help=f"Optimizer steps per generation batch (default: {','.join(map(str, GRID['depth']))}).",
    )
    p.add_argument(
        "--lr", type=_listed(float), default=d.lr, help=f"Learning rates (default: {','.join(map(str, GRID['lr']))})."
    )
    p.add_argument(
        "--cells",
        type=_listed(str),
        default=None,
        help="Run these cells alone, by name (MISMATCH-depthN-lrX, e.g. none-depth4-lr0.0001), instead of the grid.",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=d.seeds,
        help="Paired seeds per cell; at 6 or more a question's two-sided sign-flip p can reach 0.05 (default: "
        "%(default)s).",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=d.batches,
        help=f"Generation batches per run, the same in every cell (default: {BATCHES}).",
    )
    p.add_argument("--eval-n", type=int, default=d.eval_n, help="Samples per held-out problem (default: %(default)s).")
    p.add_argument("--eval-limit", type=int, default=None, help="Held-out problems (default: the test split).")
    p.add_argument(
        "--jobs", type=int, default=None, help="Parallel runs (default: one per CPU; --engine verl: 1)."
    )
    p.add_argument("--plan", action="store_true", help="Print the plan and stop.")
    p.add_argument(
        "--report",
        action="store_true",
        help="Train nothing: rewrite the map from its records (the same command without --report continues it). "
        "Reads the map's plan.json, never writes it: give the map's own flags.",
    )
    setup_options(p)
    p.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="After `--`: kpo train flags (--engine kpo) or verl's Hydra overrides (--engine verl) for every run.",
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = RegimeConfig(
        out=args.out,
        mismatch=args.mismatch,
        depth=args.depth,
        lr=args.lr,
        cells_only=args.cells,
        seeds=args.seeds,
        batches=args.batches,
        eval_n=args.eval_n,
        eval_limit=args.eval_limit,
        jobs=args.jobs,
        train_args=train_args_from(args),
        **setup_from_args(args),
    )
    report, status = run_reporting(lambda: run_regimes(cfg, plan_only=args.plan, report_only=args.report))
    if report is not None:
        print(f"report: {report}")
    return status
