"""``kpo analyze``: the command. Its options are the fields of :class:`kpo.analysis.AnalyzeConfig`."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from kpo._checks import file_in_the_way
from kpo._files import writing
from kpo.analysis.compute import AnalyzeConfig
from kpo.analysis.dumps import DumpError, find_dumps, load_dump
from kpo.analysis.report import analyze, markdown_table
from kpo.analysis.synthetic import write_synthetic
from kpo.filter import MASK_MODES


def parse_q_values(text: str) -> tuple[float, ...]:
    """argparse type of a Q/V sweep: comma-separated positive numbers, e.g. ``1e-6,1e-4,1e-2``."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not (x > 0) for x in values):
        raise argparse.ArgumentTypeError(f"expected positive Q values, got {text!r}")
    return values


# The largest synthetic trace set, in tokens (samples x length): it is built in memory, float64 as it is made.
MAX_SYNTHETIC_TOKENS = 2**24
# --synthetic's settings and their defaults; without --synthetic they would be ignored
SYNTHETIC_DEFAULTS = {"seed": 0, "samples": 64, "length": 1024}


def _synthetic_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse --seed, --samples, --length without --synthetic (they set its trace set); else fill in defaults."""
    given = [f"--{name}" for name in SYNTHETIC_DEFAULTS if getattr(args, name) is not None]
    if given and not args.synthetic:
        parser.error(
            f"{', '.join(given)} set the --synthetic trace set, and PATHs are analysed as they are: drop them"
        )
    for name, default in SYNTHETIC_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def build_parser() -> argparse.ArgumentParser:
    d = AnalyzeConfig()
    p = argparse.ArgumentParser(
        prog="kpo analyze",
        description="Token-dynamics analysis of importance-ratio dumps: the paper's Table 2, Figure 1 and an "
        "offline Figure 4 (Q/V sweep). Definitions: kpo.diagnostics.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="dump file(s), run dir(s) or ratios/ folder(s)")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="analyse a seeded synthetic trace set (kpo.analysis.synthetic_dump, filtered at Q = 1e-6)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of --synthetic (default 0)")
    p.add_argument("--samples", type=int, default=None, help="responses in --synthetic (default 64)")
    p.add_argument(
        "--length", type=int, default=None, help="max response length in --synthetic (default 1024)"
    )
    p.add_argument("--out", type=Path, help="output folder (default: <PATH>/analysis, or ./kpo-analysis)")
    p.add_argument(
        "--eps-low", type=float, default=d.eps_low, help="on band after KF, below 1 (default 3e-4)"
    )
    p.add_argument(
        "--eps-high", type=float, default=d.eps_high, help="on band after KF, above 1 (default 4e-4)"
    )
    p.add_argument("--window", type=int, default=d.window, help="window in valid tokens (default 50)")
    p.add_argument("--lf-cutoff", type=float, default=d.lf_cutoff, help="k_c = floor(x * n) (default 0.1)")
    p.add_argument("--signal", choices=("log_ratio", "ratio"), default=d.signal, help="LFR/variance values")
    p.add_argument(
        "--q", type=float, default=None, help="re-filter at this Q (default: dump's filtered ratios)"
    )
    p.add_argument(
        "--v", type=float, default=None, help="re-filter at this V; also the sweep's V (default 1)"
    )
    p.add_argument(
        "--sweep-q", type=parse_q_values, default=d.sweep_q, help="Q values of the sweep (1e-6,1e-4,1e-2)"
    )
    p.add_argument(
        "--mask-mode",
        choices=MASK_MODES,
        default=None,
        help="kalman_filter mask_mode when re-filtering (default: the dump's, else skip); setting it re-filters",
    )
    p.add_argument("--examples", type=int, default=d.examples, help="responses in figure1_traces.png (3)")
    p.add_argument("--max-windows", type=int, default=d.max_windows, help="Figure 1 windows per sample (80)")
    p.add_argument(
        "--off-policy-only",
        action="store_true",
        help="leave out on-policy rows (dump metadata on_policy=1, else rows with all log-ratios exactly 0)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.synthetic == bool(args.paths):
        parser.error("give PATH(s) to dumps, or --synthetic (not both)")
    _synthetic_settings(parser, args)
    if args.examples < 1 or args.samples < 1 or args.length < 2:
        parser.error("--examples and --samples must be >= 1 and --length >= 2")
    if args.samples * args.length > MAX_SYNTHETIC_TOKENS:
        parser.error(
            f"--samples {args.samples} x --length {args.length}: more than the {MAX_SYNTHETIC_TOKENS} tokens a "
            "synthetic trace set may have (16 times a paper step's 32 x 8 x 4096; built in memory, about 50 bytes a "
            "token); lower --samples or --length"
        )
    cfg = AnalyzeConfig(
        eps_low=args.eps_low,
        eps_high=args.eps_high,
        window=args.window,
        lf_cutoff=args.lf_cutoff,
        signal=args.signal,
        q=args.q,
        v=args.v,
        sweep_q=args.sweep_q,
        mask_mode=args.mask_mode,
        examples=args.examples,
        max_windows=args.max_windows,
        off_policy_only=args.off_policy_only,
    )
    if args.synthetic:
        out = args.out or Path("kpo-analysis")
    else:
        base = Path(args.paths[0]) if Path(args.paths[0]).is_dir() else Path(args.paths[0]).parent
        out = args.out or ((base.parent if base.name == "ratios" else base) / "analysis")
    # Checked before any work, so a file in the way is one clear line, not a traceback after the analysis.
    existing = file_in_the_way(out)
    if existing is not None:
        print(
            f"kpo analyze: error: output folder {str(out)!r}: {str(existing)!r} is a file, not a folder; "
            "give another --out",
            file=sys.stderr,
        )
        return 2
    created = not out.exists()
    try:
        if args.synthetic:
            dump_path = write_synthetic(
                out / "synthetic", seed=args.seed, samples=args.samples, length=args.length
            )
            print(f"synthetic trace set written to {dump_path}")
            files = [dump_path]
        else:
            files = [f for p in args.paths for f in find_dumps(p)]
        dumps = [load_dump(f) for f in files]
        with writing(out):
            results = analyze(dumps, cfg, out)
    except (DumpError, ValueError) as exc:
        if created:  # a failed analysis leaves no folder behind (--synthetic wrote its dump first)
            shutil.rmtree(out, ignore_errors=True)
        print(f"kpo analyze: error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table([("Before KF", results["before"]), (results["after_label"], results["after"])]))
    print(f"report: {Path(out) / 'report.md'}")
    return 0
