"""``kpo compare``: the command line. Its options are the fields of :class:`kpo.compare.CompareConfig`; its
``regimes`` and ``study`` commands' are their packages' (:mod:`kpo.compare.regimes.cli`,
:mod:`kpo.compare.study.cli`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kpo.compare.plan import (
    AA_SEEDS,
    ABLATION_SEEDS,
    ABLATIONS,
    EVAL_N,
    MATCHED,
    PAPER,
    QUICK,
    SEEDS,
    STEPS,
    CompareConfig,
    CompareError,
)
from kpo.compare.run import run_compare
from kpo.compare.setup_cli import run_reporting, setup_from_args, setup_options, train_args_from


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
        description="Train every arm with every seed (on the embedded task, or on --model/--dataset scored on "
        "--eval-data; with kpo's trainer or verl's) under the paper's off-policy protocol (KPO at the matched "
        "memory against the baselines, the ablations that isolate the filter, an A/A arm), evaluate, analyze, and write one report whose differences are paired by seed. It prints the plan "
        "(runs, time, expected half-widths) before anything trains. Finished runs are reused. `kpo compare regimes "
        "--help`: the map of regimes (train-inference mismatch x off-policy depth x learning rate).",
    )
    p.add_argument("--out", default=d.out, help="Report and run directory (default: %(default)s).")
    p.add_argument(
        "--methods", default=",".join(d.methods), help="Comma-separated loss names (default: %(default)s)."
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"Seeds of the methods and of KPO at the matched memory (default: {SEEDS}; --quick: {QUICK['seeds']}).",
    )
    p.add_argument("--max-seeds", type=int, default=None, help=argparse.SUPPRESS)  # refused: _config says why
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
        help="Leave out KPO at the length-matched memory (by default the arm the claims are about, every seed), "
        "and with it the ablations; the A/A arm then repeats the first method.",
    )
    p.add_argument(
        "--no-ablations",
        action="store_true",
        help="Leave out the ablations (KPO's clip band without the filter; the constant-gain moving average; KPO "
        "at the paper's Q/V), which run by default.",
    )
    p.add_argument(
        "--ablation-arms",
        default=",".join(d.ablation_arms),
        help=f"Comma-separated ablations, of {', '.join(ABLATIONS)} (auto_memory: KPO with its memory fitted to each "
        "mini-batch by maximum likelihood, memory=auto) (default: %(default)s).",
    )
    p.add_argument(
        "--ablation-seeds",
        type=int,
        default=None,
        help=f"Seeds of each ablation (default: {ABLATION_SEEDS} or --seeds if fewer; --quick: "
        f"{QUICK['ablation_seeds']}).",
    )
    p.add_argument(
        "--aa-seeds",
        type=int,
        default=None,
        help=f"Seeds of the A/A arm, the subject again with another RL seed from the same warm starts; 0 = none "
        f"(default: {AA_SEEDS} or --seeds if fewer; --quick: {QUICK['aa_seeds']}).",
    )
    p.add_argument(
        "--sweep-memory",
        type=_sweep_memory,
        default=d.sweep_memory,
        help="KPO filter memories in tokens for the Figure 4 analog, 'matched' (the paper's memory-to-length "
        "ratio at this task's length) and 'paper' (Q/V = 1e-6), e.g. 8,matched,125,paper; '' = no sweep "
        "(default: none).",
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
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="Parallel runs (default: one per CPU; --engine verl: 1, as each run takes the cluster; on a Ray "
        "cluster (--ray-address) each run asks it for its own resources and its scheduler queues the rest).",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="Print the plan (runs, estimated time, expected half-widths) and stop (default: print it and run).",
    )
    p.add_argument(
        "--pilot",
        type=Path,
        default=None,
        help="A finished compare's report.json: the plan's half-widths from the paired-difference sd it measured "
        "(default: the stored prior, kpo.compare.plan.DIFF_SD).",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['steps']} steps per run, {QUICK['seeds']} seeds ({QUICK['ablation_seeds']} for the ablations "
        "and the A/A arm), where those options are not given: a smoke test instead of the comparison in 90 "
        "minutes.",
    )
    setup_options(p)
    p.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="After `--`: the engine's own settings for every run: `kpo train` flags with --engine kpo (e.g. -- "
        "--task chain --learning-rate 1e-4), verl's Hydra overrides with --engine verl (e.g. -- "
        "data.train_batch_size=32 actor_rollout_ref.actor.optim.lr=1e-6).",
    )
    return p


def config_from_args(argv: list[str] | None = None) -> CompareConfig:
    """The comparison the command line asks for (not yet validated: :meth:`CompareConfig.validate`)."""
    return _config(build_parser().parse_args(argv))


def _config(args) -> CompareConfig:
    if args.max_seeds is not None:
        raise CompareError([f"--max-seeds {args.max_seeds}: a comparison that adds seeds until it is decided is a "
                            "study: write its plan (arms, cells, looks; docs/study.md) and run kpo compare study "
                            "--plan FILE --register"])
    return CompareConfig(
        out=args.out,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        seeds=args.seeds,
        steps=args.steps,
        minibatches=args.minibatches,
        matched=not args.no_matched,
        ablations=not args.no_ablations,
        ablation_arms=tuple(a.strip() for a in args.ablation_arms.split(",") if a.strip()),
        ablation_seeds=args.ablation_seeds,
        aa_seeds=args.aa_seeds,
        sweep_memory=args.sweep_memory,
        sweep_seeds=args.sweep_seeds,
        eval_n=args.eval_n,
        eval_limit=args.eval_limit,
        dump_every=args.dump_every,
        jobs=args.jobs,
        train_args=train_args_from(args),
        quick=args.quick,
        **setup_from_args(args),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["regimes"]:
        from kpo.compare.regimes.cli import main as regimes_main

        return regimes_main(argv[1:])
    if argv[:1] == ["study"]:
        from kpo.compare.study.cli import main as study_main

        return study_main(argv[1:])
    args = build_parser().parse_args(argv)
    # validates every setting and prints the plan before anything trains
    report, status = run_reporting(lambda: run_compare(_config(args), pilot=args.pilot, plan_only=args.plan))
    if report is None:
        return status
    print(f"report: {report}\nfigures: {', '.join(str(p) for p in sorted(report.parent.glob('*.png')))}")
    return 0
