"""``kpo compare``: the command line. Its options are the fields of :class:`kpo.compare.CompareConfig`."""

from __future__ import annotations

import argparse
import sys

from kpo.compare.plan import EVAL_N, MATCHED, PAPER, QUICK, STEPS, CompareConfig, CompareError
from kpo.compare.run import run_compare


def _sweep_memory(text: str) -> tuple[str, ...]:
    """``--sweep-memory``: comma-separated filter memories in tokens (> 0), ``matched`` or ``paper``; ``''`` for
    no sweep."""
    points = tuple(x.strip() for x in text.split(",") if x.strip())
    for point in points:
        if point in (PAPER, MATCHED):
            continue
        try:
            ok = float(point) > 0 and float(point) != float("inf")
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(
                f"{point!r}: give memories in tokens (> 0), '{MATCHED}' or '{PAPER}', comma-separated"
            )
    return tuple(dict.fromkeys(points))


def build_parser() -> argparse.ArgumentParser:
    """The command line; each option's help states its default once (settings left unset are resolved by
    :class:`CompareConfig`, so their help says what they resolve to)."""
    d = CompareConfig()
    p = argparse.ArgumentParser(
        prog="kpo compare",
        description="Train every method with every seed on the embedded task under the paper's off-policy "
        "protocol, evaluate, analyze, and write one report. Finished runs are reused.",
    )
    p.add_argument("--out", default=d.out, help="Report and run directory (default: %(default)s).")
    p.add_argument(
        "--methods", default=",".join(d.methods), help="Comma-separated loss names (default: %(default)s)."
    )
    p.add_argument("--seeds", type=int, default=d.seeds, help="Seeds per method (default: %(default)s).")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"Optimizer steps per run (default: {STEPS}; --quick: {QUICK['steps']}).",
    )
    p.add_argument(
        "--minibatches",
        type=int,
        default=d.minibatches,
        help="Optimizer steps per generation batch: more = more off-policy updates (default: %(default)s).",
    )
    p.add_argument(
        "--no-matched",
        action="store_true",
        help="Leave out KPO at the length-matched memory (by default run at every seed beside the paper's Q/V).",
    )
    p.add_argument(
        "--sweep-memory",
        type=_sweep_memory,
        default=d.sweep_memory,
        help="KPO filter memories in tokens for the Figure 4 analog, 'matched' (the paper's memory-to-length "
        f"ratio at this task's length) and 'paper' (Q/V = 1e-6); '' = no sweep (default: {','.join(d.sweep_memory)}).",
    )
    p.add_argument(
        "--sweep-seeds",
        type=int,
        default=d.sweep_seeds,
        help="Seeds of the sweep's extra runs (default: %(default)s).",
    )
    p.add_argument(
        "--eval-n",
        type=int,
        default=None,
        help=f"Samples per held-out problem (default: {EVAL_N}; --quick: {QUICK['eval_n']}).",
    )
    p.add_argument(
        "--eval-limit", type=int, default=None, help="Held-out problems (default: the whole test split)."
    )
    p.add_argument(
        "--dump-every",
        type=int,
        default=d.dump_every,
        help="Ratio dump period in optimizer steps (default: %(default)s).",
    )
    p.add_argument("--jobs", type=int, default=None, help="Parallel runs (default: one per CPU).")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['steps']} steps per run, {QUICK['eval_n']} samples per problem, where those options are "
        "not given: a smoke test in minutes instead of the comparison in 90.",
    )
    p.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="After `--`: extra `kpo train` flags for every run (e.g. -- --task chain --learning-rate 1e-4).",
    )
    return p


def config_from_args(argv: list[str] | None = None) -> CompareConfig:
    """The comparison the command line asks for (not yet validated: :meth:`CompareConfig.validate`)."""
    args = build_parser().parse_args(argv)
    extra = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    return CompareConfig(
        out=args.out,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        seeds=args.seeds,
        steps=args.steps,
        minibatches=args.minibatches,
        matched=not args.no_matched,
        sweep_memory=args.sweep_memory,
        sweep_seeds=args.sweep_seeds,
        eval_n=args.eval_n,
        eval_limit=args.eval_limit,
        dump_every=args.dump_every,
        jobs=args.jobs,
        train_args=tuple(extra),
        quick=args.quick,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        report = run_compare(config_from_args(argv))  # validates every setting before anything trains
    except CompareError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"report: {report}\nfigures: {', '.join(str(p) for p in sorted(report.parent.glob('*.png')))}")
    return 0
