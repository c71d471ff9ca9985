"""One-shot GPU check of the filter (issue 9): CUDA parity tests, then `kpo bench filter --device cuda`.

Run from the repository root on a CUDA machine (no install needed):
    PYTHONPATH=src:. python3 benchmarks/bench_filter_gpu.py [OUT_DIR]
Writes gpu.txt, pytest_cuda.log, bench_cuda*.log under OUT_DIR (default: $OUT or ./gpu-out) and echoes them.
"""

from __future__ import annotations

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
    run([*bench, "--repeats", "20", "--plot", str(out / "bench_cuda.png")], out / "bench_cuda.log", 150)
    run(
        [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "not compile",
         "tests/filter/test_filter_triton.py", "tests/filter/test_filter_inputs.py"],
        out / "pytest_cuda.log",
        180,
    )  # fmt: skip
    for block, warps in (("1024", "4"), ("2048", "8")):
        run(
            [*bench, "--repeats", "10", "--sizes", "1024x32768"],
            out / f"bench_cuda_block{block}_w{warps}.log",
            45,
            {"KPO_TRITON_BLOCK": block, "KPO_TRITON_WARPS": warps},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
