"""Benchmark of kpo.diagnostics.token_dynamics on ~10 million valid tokens (issue 6 target: under 30 s).

    .venv/bin/python benchmarks/bench_token_dynamics.py [--tokens 10000000] [--max-len 4096]

Responses of uniform length in [max_len / 16, max_len], right padded, with exact-zero tokens and heavy-tailed
noise. Prints the time of each call, tokens per second, and the speed ratio against the plain-Python loop
reference measured side by side on a small subsample (the machine is shared; ratios are what to compare).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kpo.diagnostics import (
    run_lengths,
    sample_dynamics,
    token_dynamics,
    window_stats,
)
from kpo.diagnostics.reference import token_dynamics_reference


def batch(tokens: int, max_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mean_len = (max_len // 16 + max_len) / 2
    B = max(1, round(tokens / mean_len))
    n = rng.integers(max_len // 16, max_len + 1, size=B)
    mask = np.arange(max_len)[None, :] < n[:, None]
    z = (0.3 * rng.standard_t(3, size=(B, max_len))).astype(np.float32)
    z[rng.random((B, max_len)) < 0.5] = 0.0
    z[~mask] = 0.0
    return z, mask


def timed(fn, *args, **kw):
    """(wall seconds, CPU seconds of this process, result): CPU time is what load from other jobs inflates least."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return time.perf_counter() - start, time.process_time() - cpu, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=10_000_000)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ref-rows", type=int, default=64, help="rows timed with the loop reference")
    args = p.parse_args()
    z, m = batch(args.tokens, args.max_len, args.seed)
    valid = int(m.sum())
    print(f"batch: {z.shape[0]} responses x {z.shape[1]} positions, {valid:,} valid tokens (float32)")
    rows = [
        ("token_dynamics, exact on", token_dynamics, {}),
        ("token_dynamics, band 3e-4/4e-4", token_dynamics, dict(eps_low=3e-4, eps_high=4e-4)),
        ("window_stats", window_stats, {}),
        ("run_lengths", run_lengths, {}),
    ]
    total = 0.0
    for label, fn, kw in rows:
        seconds, cpu, _ = timed(fn, z, m, **kw)
        total += seconds if fn is token_dynamics and not kw else 0.0
        print(
            f"{label:<32} wall {seconds:6.2f} s ({valid / seconds / 1e6:6.2f} M tokens/s)   "
            f"cpu {cpu:6.2f} s ({valid / cpu / 1e6:6.2f} M tokens/s)"
        )
    verdict = "PASS" if total < 30 else "FAIL"
    print(f"target: one token_dynamics call on {valid:,} tokens under 30 s: {total:.2f} s -> {verdict}")

    # Side by side on the same small subsample: vectorized vs the per-sample Python loop.
    zs, ms = z[: args.ref_rows], m[: args.ref_rows]
    _, fast, _ = timed(sample_dynamics, zs, ms)
    _, slow, _ = timed(token_dynamics_reference, zs, ms)
    sub = int(ms.sum())
    print(
        f"subsample {sub:,} tokens: vectorized {fast * 1e3:.1f} ms, loop reference {slow * 1e3:.1f} ms (cpu) "
        f"-> {slow / fast:.1f}x"
    )


if __name__ == "__main__":
    main()
