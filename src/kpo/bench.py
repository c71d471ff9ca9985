"""``kpo bench``: benchmarks printed as side-by-side ratios (machines are shared and noisy, so every
number in one table is measured in one process, interleaved, as the minimum and the median of repeats).

    kpo bench filter [--device cpu|cuda] [--sizes 256x4096,64x32768] [--repeats 25] [--q 1e-6]
                     [--mode skip|advance|zero|all] [--mask padded|full]
    kpo bench triton-ptx [--arch 90] [--dtype float32]

Add a benchmark by writing a ``(configure(parser), run(args) -> int)`` pair and registering it in BENCHMARKS.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kpo.filter import kalman_filter
from kpo.filter.authors import authors_closed_form
from kpo.filter.dispatch import compiled, triton_kernels
from kpo.filter.reference import kalman_filter_reference

# bytes a filter pass moves per token: read z (4) and the bool mask (1), write the result (4)
FILTER_BYTES = 9
COPY_BYTES = 8
CLOSED = "float32 closed form (authors)"
COPY = "memory copy (into a warm buffer)"


def _interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None]
) -> dict[str, tuple[float, float]]:
    """(minimum, median) seconds of each function, timed round-robin so that load changes hit all alike.

    The minimum is the run least disturbed by other work on a shared machine; the median says how
    typical it is. Ratios are taken between minima (and between medians), never across the two.
    """
    for fn in fns.values():
        fn()  # warm-up: compilation, caches, allocator, first touch of every buffer
    sync()
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(repeats):
        for label, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            times[label].append(time.perf_counter() - start)
    return {label: (min(ts), statistics.median(ts)) for label, ts in times.items()}


def _python_loop_seconds(z: torch.Tensor, mask: torch.Tensor, q: float, mode: str) -> tuple[float, int]:
    """Seconds of the per-token Python loop (the float64 reference) on one row's first <= 4096 tokens."""
    tokens = min(z.shape[1], 4096)
    zs, ms = z[:1, :tokens].cpu(), mask[:1, :tokens].cpu()
    start = time.perf_counter()
    kalman_filter_reference(zs, ms, q=q, mask_mode=mode)
    return time.perf_counter() - start, tokens


def _parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        b, _, t = item.lower().partition("x")
        if not (b.isdigit() and t.isdigit()) or int(b) < 1 or int(t) < 1:
            raise argparse.ArgumentTypeError(f"sizes must look like 256x4096,64x32768, got {item!r}")
        sizes.append((int(b), int(t)))
    return sizes


def _positive_int(text: str) -> int:
    """``--repeats``: a median needs at least one timed run."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def _process_noise(text: str) -> float:
    """``--q``: the filter's process noise Q, a finite float > 0 (V is 1), e.g. 1e-6."""
    try:
        q = float(text)
    except ValueError:
        q = math.nan
    if not (math.isfinite(q) and q > 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number > 0 (the process noise Q; V = 1), got {text!r}"
        )
    return q


def _plot_path(text: str) -> str:
    """``--plot``: checked before the benchmark runs (a bad path fails at once, not after the whole benchmark)."""
    path = Path(text)
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib: pip install matplotlib, or drop --plot")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path, e.g. filter.png")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{str(path.parent)!r} is not an existing directory; create it first"
        )
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix and path.suffix[1:].lower() not in formats:
        raise argparse.ArgumentTypeError(
            f"{text!r}: matplotlib cannot write {path.suffix!r} files; use one of "
            + ", ".join("." + f for f in sorted(formats))
        )
    return text


def _configure_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--sizes",
        type=_parse_sizes,
        default=None,
        help="BxT list; default 256x4096,64x32768 (cpu), 256x4096,1024x32768 (cuda)",
    )
    parser.add_argument(
        "--repeats", type=_positive_int, default=25, help="timed runs per entry (minimum and median reported)"
    )
    parser.add_argument("--q", type=_process_noise, default=1e-6, help="process noise > 0 (v = 1)")
    parser.add_argument("--mode", choices=("skip", "advance", "zero", "all"), default="skip")
    parser.add_argument(
        "--mask",
        choices=("padded", "full"),
        default="padded",
        help="padded: each row valid for a random length in T/2..T, then padding; full: every token valid",
    )
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plot",
        type=_plot_path,
        metavar="PNG",
        default=None,
        help="also write a bar chart (needs matplotlib)",
    )


def _run_filter(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu")
        return 2
    sizes = args.sizes or (
        [(256, 4096), (64, 32768)] if device.type == "cpu" else [(256, 4096), (1024, 32768)]
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    paths = ["torch"]
    if device.type == "cpu" and compiled is not None:
        paths.insert(0, "numba")
    if device.type == "cuda" and triton_kernels() is not None:
        paths.insert(0, "triton")
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    modes = ("zero", "skip", "advance") if args.mode == "all" else (args.mode,)
    print(
        f"kpo bench filter: device={device} ({_device_name(device)}) mode={args.mode} mask={args.mask} "
        f"q={args.q:g} v=1, {args.repeats} interleaved repeats"
    )
    print(
        "tokens/s counts every [B, T] position, from the minimum time; x closed and copies are ratios of\n"
        "minima (med: of medians); copies = time / the time of copying z into a warm buffer (fwd + bwd: two)."
    )
    tables = []
    for B, T in sizes:
        for mode in modes:
            tables += _bench_size(args, mode, device, paths, sync, gen, B, T)
    if args.plot:
        _plot(tables, args.plot, f"kpo filter, {device}, mode={args.mode}, mask={args.mask}, q={args.q:g}")
        print(f"\nplot: {args.plot}")
    return 0


def _device_name(device: torch.device) -> str:
    """The machine in words, for the header: CPU model and core count, or the GPU's name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def _bench_size(args, mode, device, paths, sync, gen, B: int, T: int) -> list[tuple[str, dict, int]]:
    """Forward and forward+backward tables for one mode and [B, T]; returns (title, times per entry, tokens)."""
    z = (0.05 * torch.randn(B, T, generator=gen)).to(device)
    if args.mask == "full":
        mask = torch.ones(B, T, dtype=torch.bool, device=device)
    else:
        lengths = torch.randint(T // 2, T + 1, (B, 1), generator=gen).to(device)
        mask = torch.arange(T, device=device)[None] < lengths
    n = B * T

    # the float64 loop on the first rows, up to 65536 tokens (it is too slow for more)
    checked = max(1, min(B, 65536 // T))
    ref = kalman_filter_reference(z[:checked].cpu(), mask[:checked].cpu(), q=args.q, v=1.0, mask_mode=mode)

    def accuracy(out: torch.Tensor) -> str:
        err = (out[:checked].double().cpu() - ref).abs()
        bad = int((~torch.isfinite(out)).sum())
        return f"max err {float(err.nan_to_num(float('inf')).max()):.1e}" + (
            f", {bad} NaN/Inf" if bad else ""
        )

    # the copy writes into a buffer allocated and touched once, as the filter's own output pages are warm
    # after its first call: a fresh z.clone() pays page faults that make the copy look slower than memory
    warm = torch.empty_like(z)
    fwd = {COPY: lambda: warm.copy_(z)}
    for path in paths:
        fwd[f"kalman_filter [{path}]"] = lambda path=path: kalman_filter(
            z, mask, q=args.q, v=1.0, mask_mode=mode, backend=path
        )
    fwd[CLOSED] = lambda: authors_closed_form(z, mask, args.q, 1.0)
    times = _interleaved(fwd, args.repeats, sync)
    outs = {label: fn() for label, fn in fwd.items() if label != COPY}
    notes = {label: accuracy(out) for label, out in outs.items()}
    if mode != "zero":
        notes[CLOSED] = "zero-mode semantics; " + notes[CLOSED]
    loop_s, loop_tokens = _python_loop_seconds(z, mask, args.q, mode)
    label = f"python loop ({loop_tokens} tokens timed, scaled)"
    times[label], notes[label] = (loop_s * n / loop_tokens,) * 2, "float64 oracle"
    tables = [(f"forward  mode={mode} B={B} T={T}", times)]
    _print_table(tables[-1][0], times, notes, n, device)
    _print_agreement("outputs", {label: out for label, out in outs.items() if label.startswith("kalman")})

    if not args.no_backward:
        grad = torch.randn(B, T, generator=gen).to(device)
        leaf = z.clone().requires_grad_()
        warm_grad = torch.empty_like(grad)

        def fwd_bwd(fn):
            def run():
                leaf.grad = None
                fn(leaf).backward(grad)

            return run

        both = {COPY: lambda: (warm.copy_(z), warm_grad.copy_(grad))}
        for path in paths:
            both[f"kalman_filter fwd+bwd [{path}]"] = fwd_bwd(
                lambda x, path=path: kalman_filter(x, mask, q=args.q, v=1.0, mask_mode=mode, backend=path)
            )
        both[CLOSED + " fwd+bwd"] = fwd_bwd(lambda x: authors_closed_form(x, mask, args.q, 1.0))
        times = _interleaved(both, args.repeats, sync)
        tables.append((f"forward + backward  mode={mode} B={B} T={T}", times))
        _print_table(tables[-1][0], times, {}, n, device)
        grads = {}
        for label, fn in both.items():
            if label.startswith("kalman"):
                fn()
                grads[label] = leaf.grad.clone()
        _print_agreement("gradients", grads)
    if "triton" in paths:
        tables.append((f"kernels only  mode={mode} B={B} T={T}", _kernel_only(args, mode, z, mask, sync)))
        print(
            f"\n{tables[-1][0]}: {args.repeats} back-to-back launches, one sync (no per-call checks or autograd)"
        )
        _print_kernel_table(tables[-1][1], n)
    return [(title, times, n) for title, times in tables]


def _print_agreement(what: str, results: dict[str, torch.Tensor]) -> None:
    """The largest difference between every path's result and the first's (all of [B, T], every path)."""
    labels = list(results)
    first = results[labels[0]].double()
    for label in labels[1:]:
        diff = float((results[label].double() - first).abs().nan_to_num(float("inf")).max())
        print(f"  {what} agree: max |{_path(label)} - {_path(labels[0])}| = {diff:.1e}")


def _path(label: str) -> str:
    return label[label.index("[") + 1 : label.index("]")]


def _kernel_only(args, mode: str, z: torch.Tensor, mask: torch.Tensor, sync) -> dict[str, float]:
    """Seconds per call of the Triton kernels alone and of a copy, from back-to-back launches."""
    kernels = triton_kernels()
    grad = torch.randn_like(z)
    out = torch.empty_like(z)
    fns = {
        "memory copy (out.copy_(z))": lambda: out.copy_(z),
        "triton forward kernel": lambda: kernels.forward(z, mask, mode, args.q, 1.0, 0.0, 0.0),
        "triton backward kernel": lambda: kernels.backward(grad, mask, mode, args.q, 1.0, 0.0),
    }
    seconds = {}
    for label, fn in fns.items():
        fn()
        sync()
        start = time.perf_counter()
        for _ in range(args.repeats):
            fn()
        sync()
        seconds[label] = (time.perf_counter() - start) / args.repeats
    return seconds


def _print_kernel_table(seconds: dict[str, float], n: int) -> None:
    copy_s = seconds["memory copy (out.copy_(z))"]
    print(f"  {'':<44} {'us':>9} {'Gtok/s':>8} {'GB/s':>7} {'BW/copy':>8}")
    for label, s in seconds.items():
        nbytes = COPY_BYTES if label.startswith("memory") else FILTER_BYTES
        print(
            f"  {label:<44} {s * 1e6:9.1f} {n / s / 1e9:8.1f} {n * nbytes / s / 1e9:7.0f}"
            f" {n * nbytes / s / (n * COPY_BYTES / copy_s):8.0%}"
        )


def _print_table(title, times: dict[str, tuple[float, float]], notes: dict[str, str], n: int, device) -> None:
    """One row per entry: ms (min, median), G tokens/s, speed-up over the authors' closed form (of minima and
    of medians), time in copies; on CUDA also the fraction of the copy's bandwidth (a filter pass moves
    9 bytes/token, a copy 8)."""
    closed = next(t for label, t in times.items() if label.startswith(CLOSED))
    copy = times[COPY]
    cuda = device.type == "cuda"
    print(f"\n{title}")
    print(
        f"  {'':<44} {'ms min':>9} {'ms med':>9} {'Gtok/s':>8} {'x closed':>9} {'(med)':>7} {'copies':>7}"
        + ("  BW/copy" if cuda else "")
        + "  note"
    )
    for label, (lo, med) in times.items():
        bw = (
            f"  {copy[0] / lo * FILTER_BYTES / COPY_BYTES:7.0%}"
            if cuda and label.startswith("kalman")
            else ("         " if cuda else "")
        )
        print(
            f"  {label:<44} {lo * 1e3:9.3f} {med * 1e3:9.3f} {n / lo / 1e9:8.3f} {closed[0] / lo:9.2f}"
            f" {closed[1] / med:7.2f} {lo / copy[0]:7.2f}{bw}  {notes.get(label, '')}"
        )
    if cuda:
        print(f"  copy: {n * COPY_BYTES / copy[0] / 1e9:.0f} GB/s")


def _plot(tables: list[tuple[str, dict[str, float], int]], path: str, title: str) -> None:
    """Horizontal bars of G tokens/s (log scale), one panel per table, next to the printed tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tables), 1, figsize=(9, 2.2 * len(tables) + 0.6), squeeze=False)
    for ax, (name, times, n) in zip(axes[:, 0], tables):
        labels = list(times)
        # kernel-only tables hold plain seconds, the others (minimum, median)
        rates = [n / (t[0] if isinstance(t, tuple) else t) / 1e9 for t in times.values()]
        colors = ["tab:green" if label.startswith(("kalman", "triton")) else "tab:gray" for label in labels]
        ax.barh(labels[::-1], rates[::-1], color=colors[::-1])
        ax.set_xscale("log")
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("G tokens/s (log), from minimum times")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# instruction sites in a kernel's PTX, by kind: global accesses as 8/16-byte vectors or single elements,
# CTA barriers, warp shuffles, shared-memory accesses (layout changes and cross-warp scans go through it)
PTX_KINDS = {
    "vec ld": r"\bld\.global\S*\.v[24]\.",
    "scalar ld": r"\bld\.global(?!\S*\.v[24]\.)\S*",
    "vec st": r"\bst\.global\S*\.v[24]\.",
    "scalar st": r"\bst\.global(?!\S*\.v[24]\.)\S*",
    "bar.sync": r"\bbar\.sync\b",
    "shfl": r"\bshfl\.",
    "shared ld/st": r"\b(?:ld|st)\.shared\b",
}


def ptx_counts(ptx: str) -> dict[str, int]:
    """How many instruction sites of each PTX_KINDS kind a kernel's PTX has (static, not executed counts)."""
    return {kind: len(re.findall(pattern, ptx)) for kind, pattern in PTX_KINDS.items()}


# NVIDIA compute capabilities (x10) these kernels compile for with triton 3.9's bundled LLVM and ptxas, from
# Volta (triton runs on compute capability >= 7.0) to Blackwell. Others abort the process inside LLVM (sm_7:
# "Cannot select ... shfl"; sm_88: "PTX version 8.8 does not support target") or fail in ptxas (sm_101).
PTX_ARCHS = (70, 72, 75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121)


def _configure_triton_ptx(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arch",
        type=int,
        choices=PTX_ARCHS,
        default=90,
        metavar="ARCH",
        help=f"NVIDIA compute capability x10, one of {', '.join(map(str, PTX_ARCHS))} "
        "(default 90: H100/H200)",
    )
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--json", action="store_true", help="print one JSON object per variant instead")


def _run_triton_ptx(args: argparse.Namespace) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1 is set: unset it (the interpreter compiles nothing)")
        return 2
    kernels = triton_kernels()
    if kernels is None:
        print("triton is not installed (pip install 'kpo[gpu]')")
        return 2
    dtype = getattr(torch, args.dtype)
    rows = []
    for kernel, code in kernels.VARIANTS:
        ptx = kernels.compile_for(kernel, code, dtype, args.arch).asm["ptx"]
        name = kernel.fn.__name__.strip("_").removesuffix("_kernel")
        rows.append({"kernel": name, "mode": kernels.MODE_NAMES[code], **ptx_counts(ptx)})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"kpo bench triton-ptx: sm_{args.arch}, {args.dtype}, BLOCK={kernels.BLOCK}: instruction sites in")
    print("each kernel's PTX (static counts; the tile loop is most of each kernel). No GPU needed.")
    print(f"  {'kernel':<16} {'mode':<8}" + "".join(f" {kind:>12}" for kind in PTX_KINDS))
    for row in rows:
        print(f"  {row['kernel']:<16} {row['mode']:<8}" + "".join(f" {row[kind]:>12}" for kind in PTX_KINDS))
    return 0


BENCHMARKS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]
] = {
    "filter": (
        _configure_filter,
        _run_filter,
        "the causal Kalman filter vs a Python loop, the authors' closed form, memory copy",
    ),
    "triton-ptx": (
        _configure_triton_ptx,
        _run_triton_ptx,
        "what the Triton filter kernels compile to (vector accesses, barriers, shuffles), without a GPU",
    ),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kpo bench", description="benchmarks printed as side-by-side ratios"
    )
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, (configure, _, text) in BENCHMARKS.items():
        configure(sub.add_parser(name, help=text, description=text))
    args = parser.parse_args(argv)
    return BENCHMARKS[args.benchmark][1](args)
