"""Where the host time of one CUDA filter call goes (cProfile over many calls at a host-bound size).

PYTHONPATH=src python3 benchmarks/bench_filter_profile.py [B] [T] [calls]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from kpo.filter import kalman_filter


def main() -> int:
    B, T, calls = (int(a) for a in (sys.argv[1:] + ["256", "4096", "300"][len(sys.argv) - 1 :])[:3])
    z = torch.randn(B, T, device="cuda") * 0.05
    mask = torch.arange(T, device="cuda")[None] < torch.randint(T // 2, T + 1, (B, 1), device="cuda")
    for _ in range(10):
        kalman_filter(z, mask, q=1e-6, v=1.0, p0=0.0, x0=0.0, mask_mode="skip", backend="triton")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        kalman_filter(z, mask, q=1e-6, v=1.0, p0=0.0, x0=0.0, mask_mode="skip", backend="triton")
    torch.cuda.synchronize()
    print(f"B={B} T={T}: {(time.perf_counter() - start) / calls * 1e6:.1f} us per call (each ends in a sync)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        kalman_filter(z, mask, q=1e-6, v=1.0, p0=0.0, x0=0.0, mask_mode="skip", backend="triton")
    torch.cuda.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
