"""The public ``kalman_filter`` of an earlier commit against this checkout's, interleaved in one process.

    PYTHONPATH=src python benchmarks/bench_filter_before_after.py REV [--repeats 15] [--mask full|padded|holes]
        [--threads N]

REV's ``src/kpo`` is exported (git archive) into a temporary folder as the package ``kpo_before``, so both
versions run side by side and every load change on a shared machine hits both alike. Prints, for every mode,
size, direction and path (numba, torch), the minimum and median milliseconds and G tokens/s of both, with
the authors' float32 closed form and a copy into a warm buffer as references (ratios of minima). Each round
of repeats runs the calls in a new (seeded) order.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = ((256, 4096), (64, 32768))


def export(rev: str, folder: Path) -> None:
    """REV's src/kpo as folder/kpo_before (its absolute imports of kpo rewritten)."""
    archive = subprocess.run(["git", "archive", rev, "src/kpo"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    package = folder / "kpo_before"
    (folder / "src" / "kpo").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(re.sub(r"\bkpo(?=[. ])", "kpo_before", path.read_text()))


def time_size(before, after, B: int, T: int, args: argparse.Namespace, gen: torch.Generator) -> None:
    """One [B, T]: every mode, path and direction of both versions, with the references, interleaved."""
    from kpo.filter.authors import authors_closed_form

    z = 0.05 * torch.randn(B, T, generator=gen)
    grad = torch.randn(B, T, generator=gen)
    if args.mask == "full":
        mask = torch.ones(B, T, dtype=torch.bool)
    else:  # right padding: lengths T/2 to T
        mask = torch.arange(T)[None] < torch.randint(T // 2, T + 1, (B, 1), generator=gen)
    if args.mask == "holes":  # and inside the responses: 5% single tokens and one span of up to T/8 per row
        mask &= torch.rand(B, T, generator=gen) >= 0.05
        starts = torch.randint(0, T, (B, 1), generator=gen)
        spans = torch.randint(1, T // 8 + 1, (B, 1), generator=gen)
        position = torch.arange(T)[None]
        mask &= (position < starts) | (position >= starts + spans)
    warm, warm_grad = torch.empty_like(z), torch.empty_like(grad)

    def both_ways(filter_fn):
        leaf = z.clone().requires_grad_()

        def run():
            leaf.grad = None
            filter_fn(leaf).backward(grad)

        return run

    fns = {
        "copy (warm) fwd": lambda: warm.copy_(z),
        "copy (warm) x2 f+b": lambda: (warm.copy_(z), warm_grad.copy_(grad)),
        "closed form fwd": lambda: authors_closed_form(z, mask, 1e-6, 1.0),
        "closed form f+b": both_ways(lambda x: authors_closed_form(x, mask, 1e-6, 1.0)),
    }
    for path in ("numba", "torch"):
        for mode in ("zero", "skip", "advance"):
            for name, module in (("before", before), ("after", after)):

                def call(x, m=module, p=path, mo=mode):
                    if "backend" in inspect.signature(m.kalman_filter).parameters:
                        return m.kalman_filter(
                            x, mask, q=1e-6, v=1.0, p0=0.0, x0=0.0, mask_mode=mo, backend=p
                        )
                    # before the backend keyword, the environment variable chose the path (read per call)
                    os.environ["KPO_FILTER_BACKEND"] = p
                    try:
                        return m.kalman_filter(x, mask, q=1e-6, v=1.0, p0=0.0, x0=0.0, mask_mode=mo)
                    finally:
                        del os.environ["KPO_FILTER_BACKEND"]

                fns[f"{path} {mode} fwd {name}"] = lambda call=call: call(z)
                fns[f"{path} {mode} f+b {name}"] = both_ways(call)
    for fn in fns.values():
        fn()  # compile, warm caches and buffers
    times: dict[str, list[float]] = {label: [] for label in fns}
    order, rng = list(fns.items()), random.Random(0)
    for _ in range(args.repeats):
        # a new order each round: a call right after one that freed much memory pays page faults for its
        # fresh output; in a fixed order that would always be the same call
        rng.shuffle(order)
        for label, fn in order:
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    n = B * T
    print(f"\nB={B} T={T}{'':<24} {'ms min':>8} {'ms med':>8} {'Gtok/s':>7} {'x closed':>8} {'copies':>7}")
    for label, ts in times.items():
        lo = min(ts)
        both = "f+b" in label
        copy = min(times["copy (warm) x2 f+b" if both else "copy (warm) fwd"])
        closed = min(times["closed form f+b" if both else "closed form fwd"])
        print(
            f"  {label:<34} {lo * 1e3:8.3f} {statistics.median(ts) * 1e3:8.3f} {n / lo / 1e9:7.2f}"
            f" {closed / lo:8.2f} {lo / copy:7.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit, e.g. 6b7df81")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--mask", choices=("full", "padded", "holes"), default="full")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="kpo-before-"))
    export(args.rev, folder)
    sys.path.insert(0, str(folder))
    before = importlib.import_module("kpo_before.filter")
    after = importlib.import_module("kpo.filter")
    print(
        f"before = {args.rev}, after = this checkout; {args.repeats} interleaved repeats, {args.threads} threads,"
    )
    print(f"mask={args.mask}, q=1e-6 v=1, float32. ms min / median; G tokens/s from the minimum.")
    gen = torch.Generator().manual_seed(0)
    for B, T in SIZES:
        time_size(before, after, B, T, args, gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
