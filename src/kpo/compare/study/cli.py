"""``kpo compare study``: register a study of the user's own (``--plan FILE --register``), then run it to its answer
or rewrite its report (``--report``); docs/study.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from kpo.compare.plan import CompareError
from kpo.compare.setup_cli import exit_status, run_reporting, setup_from_args, setup_options, train_args_from
from kpo.compare.study.registration import register
from kpo.compare.study.run import CLUSTER, Study, run_study


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kpo compare study",
        description="A confirmatory study: your questions, arms, cells, looks and seeds in a plan file (docs/study.md), "
        "checked and sized by simulation (--plan FILE --register), committed before its first run, then run to its "
        "answer on any engine kpo compare runs (rerun to continue: recorded runs are kept, on any machine).",
    )
    p.add_argument("--study", default="docs/results/study", help="plan.json, seeds, run records and report (committed; "
                   "default: %(default)s, the embedded study)")
    p.add_argument("--runs", default=None, help="the run folders, start models and logs (not committed; default: "
                   "runs/ and the study folder's name)")
    p.add_argument("--plan", type=Path, default=None, help="with --register: the plan you wrote (YAML or JSON)")
    p.add_argument("--register", action="store_true", help="check and size --plan, write STUDY/plan.json, and stop")
    p.add_argument("--sims", type=int, default=None, help="with --register: simulated studies behind the power "
                   "(default: the plan's sizing.sims, else 2000)")
    p.add_argument("--report", action="store_true", help="rewrite the report from the records; train nothing")
    p.add_argument("--jobs", type=int, default=None, help="runs side by side (default: the engine's: one per CPU; verl 1)")
    p.add_argument("--allow-uncommitted", action="store_true",
                   help="run from a plan not committed (the report then calls the study exploratory)")
    setup_options(p)  # with --register: the plan's setup, over the file's own; --ray-*: where the runs train
    p.set_defaults(engine=None, keep=None)
    p.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="with --register, after `--`: the engine's settings for every run (kpo train flags or verl "
                   "overrides), over the plan's setup.train_args")
    return p


def _given_setup(args) -> dict:
    """The setup flags given on the command line, in the plan's terms (where a run trains, a Ray cluster, is not the
    plan's: :data:`CLUSTER`)."""
    given = {k: v for k, v in setup_from_args(args).items() if v not in (None, ()) and k not in CLUSTER}
    if "eval_data" in given:
        given["eval_data"] = list(given["eval_data"])
    extra = train_args_from(args)
    return given | ({"train_args": list(extra)} if extra else {})


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    errors = []
    if not str(args.study).strip():
        errors.append("--study '': give the study's folder")
    if args.register == (args.plan is None):
        errors.append("--register and --plan go together: --plan FILE --register writes the plan once")
    if args.register and args.report:
        errors.append("--register and --report: one writes a plan, the other a report; give one")
    if args.sims is not None and not 100 <= args.sims <= 100_000:
        errors.append(f"--sims={args.sims}: give 100 to 100000 simulated studies")
    if args.jobs is not None and args.jobs < 1:
        errors.append(f"--jobs={args.jobs}: give 1 or more")
    setup = _given_setup(args)
    if setup and not args.register:
        errors.append(f"{', '.join(setup)}: a study's setup is its plan's; give them with --plan FILE --register")
    runs = Path(args.runs) if args.runs else Path("runs") / Path(args.study).name
    if errors:
        return exit_status(CompareError(errors))
    if args.register:
        plan, status = run_reporting(lambda: register(args.plan, Path(args.study), setup=setup, sims=args.sims))
        if not status:
            path = Path(args.study) / "plan.json"
            print(f"{_sizing_lines(plan)}\nplan: {path}\ncommit it before the first run: git add {path} && git commit")
        return status
    study = Study(Path(args.study), runs, jobs=args.jobs, cluster={k: getattr(args, k) for k in CLUSTER})
    report, status = run_reporting(lambda: run_study(study, report_only=args.report,
                                                     allow_uncommitted=args.allow_uncommitted))
    if not status:
        print(f"report: {report}")
    return status


def _sizing_lines(plan: dict) -> str:
    sim = plan["simulation"]
    lines = [f"{plan['title']}: at most {plan['runs_at_most']} runs; {sim['sims']} simulated studies:"]
    for key in sim["power"]["measured"]:
        lines.append(f"  {key}: power {sim['power']['measured'][key]:.2f} at the sizing's effect, "
                     f"{sim['power']['a third smaller'][key]:.2f} at a third smaller")
    for null, rate in sim["fwer"].items():
        low, high = sim["fwer_interval"][null]
        flag = "" if low <= plan["alpha"] else f"  ABOVE alpha {plan['alpha']:g}"
        lines.append(f"  family-wise error, {null}: {rate:.3f} [{low:.3f}, {high:.3f}]{flag}")
    return "\n".join(lines)
