"""One-shot GPU check of the filter (issues 9 and 17): `kpo bench filter --device cuda`, the tile/warps sweep,
40 steps of `kpo train` on the GPU, then the CUDA parity tests.

Run from the repository root on a CUDA machine (no install needed but for `kpo train`'s wheels that the lent
machine's image lacks: `scripts/gpu_wheels.sh` puts them in .whl/ here, and the run carries .whl):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 python3 benchmarks/bench_filter_gpu.py [OUT_DIR]
Writes gpu.txt, bench_cuda.log, sweep_cuda.log (tile size and warps), train_cuda.log (step times) and
pytest_cuda.log under OUT_DIR (default: $OUT or ./gpu-out) and echoes them; each step's time limit keeps the
whole under 10 minutes. `--sweep` runs only the sweep; `--train` only the 40 training steps, on whatever device
torch finds (on a CPU machine: the step times to put beside the GPU's).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path


def run(cmd: list[str], log: Path, timeout: int, env: dict[str, str] | None = None) -> None:
    start = time.time()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
        text = proc.stdout + proc.stderr + f"\n[exit {proc.returncode}, {time.time() - start:.0f} s]\n"
    except subprocess.TimeoutExpired as exc:
        text = f"{exc.stdout or ''}{exc.stderr or ''}\n[timed out after {timeout} s]\n"
    except OSError as exc:
        text = f"[could not run: {exc}]\n"
    log.write_text(text)
    print(f"==== {log.name}: {' '.join(cmd)}\n{text[-6000:]}", flush=True)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "gpu-out"))
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv"], out / "gpu.txt", 30)
    bench = [
        py,
        "-c",
        "import sys; from kpo.bench import main; sys.exit(main(sys.argv[1:]))",
        "filter",
        "--device",
        "cuda",
    ]
    # numbers first (device time is short), then parity on the device, then tile-size sensitivity
    # --plot refuses to start without matplotlib, which the device machine may lack: the numbers come first
    plot = ["--plot", str(out / "bench_cuda.png")] if importlib.util.find_spec("matplotlib") else []
    run([*bench, "--repeats", "20", *plot], out / "bench_cuda.log", 120)
    run([py, __file__, "--sweep"], out / "sweep_cuda.log", 120)
    run([py, __file__, "--train"], out / "train_cuda.log", 180, env=OFFLINE)
    run(
        [
            py,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-k",
            "not compile",
            "tests/filter/test_filter_triton.py",
            "tests/filter/test_filter_inputs.py",
        ],
        out / "pytest_cuda.log",
        150,
    )  # the steps' limits total 570 s: inside one device call's 600
    return 0


# (tokens per tile, warps): the defaults, and one-warp programs whose scans need no barrier at all
# (`kpo bench triton-ptx` shows 0 bar.sync for them)
SWEEP = [(1024, 8), (1024, 4), (2048, 8), (512, 1), (1024, 1), (1024, 2), (2048, 4)]


def sweep() -> int:
    """Kernel-only fraction of copy bandwidth per (BLOCK, warps) at 1024 x 32768, forward and backward."""
    import argparse

    import torch

    from kpo.bench import COPY_BYTES, FILTER_BYTES, _kernel_only
    from kpo.filter.dispatch import triton_kernels

    kernels = triton_kernels()
    B, T = 1024, 32768
    z = 0.05 * torch.randn(B, T, device="cuda")
    mask = torch.arange(T, device="cuda")[None] < torch.randint(T // 2, T + 1, (B, 1), device="cuda")
    print(f"{'mode':<6} {'BLOCK':>6} {'warps':>6} {'fwd BW/copy':>12} {'bwd BW/copy':>12}", flush=True)
    for mode in ("skip", "zero"):
        for block, warps in SWEEP:
            kernels.BLOCK, kernels.NUM_WARPS, kernels.NUM_WARPS_BACKWARD = block, warps, warps
            args = argparse.Namespace(q=1e-6, repeats=20)
            seconds = _kernel_only(args, mode, z, mask, torch.cuda.synchronize)
            copy = seconds["memory copy (out.copy_(z))"] / COPY_BYTES
            fwd = copy / (seconds["triton forward kernel"] / FILTER_BYTES)
            bwd = copy / (seconds["triton backward kernel"] / FILTER_BYTES)
            print(f"{mode:<6} {block:>6} {warps:>6} {fwd:>12.0%} {bwd:>12.0%}", flush=True)
    return 0


OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TRAIN_STEPS = 40


def train() -> int:
    """`kpo train` on the embedded default for TRAIN_STEPS steps (warm start built first if not cached), then
    its step times from metrics.jsonl: generation steps (every `minibatches`-th) apart from update-only ones."""
    import json
    import statistics
    import tempfile

    from kpo.cli import main as kpo
    from kpo.train.config import TrainConfig

    with tempfile.TemporaryDirectory() as tmp:
        start = time.time()
        code = kpo(["train", "--output-dir", tmp, "--max-steps", str(TRAIN_STEPS), "--report-to", "none"])
        wall = time.time() - start
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        every = TrainConfig.from_yaml(Path(tmp) / "config.yaml").minibatches
    times = [row["step_time"] for row in rows]
    generation, update = times[::every], [t for i, t in enumerate(times) if i % every]
    print(
        f"kpo train, {len(times)} steps (exit {code}), {wall:.0f} s wall with start-up: step_time mean "
        f"{statistics.mean(times):.3f} s; generation steps (1 in {every}) median {statistics.median(generation):.3f} "
        f"s; update-only steps median {statistics.median(update):.3f} s",
        flush=True,
    )
    return code


if __name__ == "__main__":
    mode = {"--sweep": sweep, "--train": train}.get(sys.argv[1] if sys.argv[1:] else "", main)
    sys.exit(mode())
