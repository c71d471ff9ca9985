"""``kpo compare study``: the confirmatory study (:mod:`kpo.compare.study`). ``--register`` writes its plan;
commit it; then the same command without ``--register`` runs the study to its answer (rerun it to continue:
recorded runs are kept), and ``--report`` rewrites the report from the records, training nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kpo.compare.plan import CompareError
from kpo.compare.study_run import EXPLORATORY, Study, register, run_study


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kpo compare study",
        description="The confirmatory study: questions, cells, arms, seeds, looks, spending and the collapse "
        "definition fixed in plan.json (--register) and committed before its first run; then run to its answer "
        "(rerun to continue: recorded runs are kept, on any machine).",
    )
    p.add_argument("--study", default="docs/results/study", help="plan, seeds, run records and report (committed)")
    p.add_argument("--runs", default="runs/study", help="the run folders, warm starts and logs (not committed)")
    p.add_argument("--register", action="store_true", help="write the plan (its simulation included) and stop")
    p.add_argument("--exploratory", default=str(EXPLORATORY), help="the exploratory map the simulation resamples")
    p.add_argument("--sims", type=int, default=2000, help="simulated studies behind the plan's power")
    p.add_argument("--report", action="store_true", help="rewrite the report from the records; train nothing")
    p.add_argument("--jobs", type=int, default=None, help="runs side by side (default: one per CPU)")
    p.add_argument(
        "--allow-uncommitted",
        action="store_true",
        help="run from a plan not committed (the report then calls the study exploratory)",
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    errors = []
    if args.register and args.report:
        errors.append("--register and --report: one writes a plan, the other a report; give one")
    if args.sims < 100:
        errors.append(f"--sims={args.sims}: give 100 or more simulated studies")
    if args.jobs is not None and args.jobs < 1:
        errors.append(f"--jobs={args.jobs}: give 1 or more")
    try:
        if errors:
            raise CompareError(errors)
        if args.register:
            path = register(Path(args.study), Path(args.exploratory), sims=args.sims)
            print(f"plan: {path}\ncommit it before the first run: git add {path} && git commit")
            return 0
        report = run_study(
            Study(Path(args.study), Path(args.runs), jobs=args.jobs),
            report_only=args.report,
            allow_uncommitted=args.allow_uncommitted,
        )
    except CompareError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0
