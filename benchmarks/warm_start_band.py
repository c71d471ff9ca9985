"""The embedded warm starts of several seeds at one thread count: are they all in the band?

    .venv/bin/python benchmarks/warm_start_band.py --seeds 0-7 --threads 2 --cache-dir /tmp/ws2 --out ws2.json

For each seed it builds (or reuses from ``--cache-dir``) the running-sum task's warm start with ``--threads``
torch threads, then scores it on the 256 held-out problems in two ways: the exact expected accuracy (one
teacher-forced forward, :mod:`kpo.evaluation.expected`) with its least per-position accuracy, and the sampled
avg@8 / pass@8 that ``kpo eval --data synthetic --n 8`` reports. It prints one row per seed and writes them as
JSON. A different thread count changes the float rounding of every matmul, so comparing two runs of this script
(1 and 2 threads, separate cache dirs) tests that the warm start is a property of its settings, not of the CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=_seeds, default=_seeds("0-7"), help="a seed or a range, e.g. 0-7")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache-dir", required=True, help="warm-start cache (one per thread count)")
    p.add_argument("--n", type=int, default=8, help="samples per held-out problem")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kpo.evaluation import evaluate
    from kpo.evaluation.expected import expected_on_rows
    from kpo.testbed.task import load_split
    from kpo.train.config import TrainConfig
    from kpo.train.run import model_path

    torch.set_num_threads(args.threads)
    rows = []
    print("| seed | threads | SFT rounds | build s | expected % | least position acc | avg@8 % | pass@8 % |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        config = TrainConfig(seed=seed, cache_dir=args.cache_dir, progress=False)
        start = time.time()
        path = model_path(config)
        built = time.time() - start
        sft = json.loads((Path(path) / "kpo_sft.json").read_text())
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        exact = expected_on_rows(model, tokenizer, load_split("test", task=config.task_config()))
        sampled = evaluate(path, "synthetic", n=args.n, ks=(1, args.n), show_progress=False, batch_size=128)
        macro = sampled["macro"]
        row = {
            "seed": seed,
            "threads": args.threads,
            "rounds": sft.get("rounds", 1),
            "build_seconds": built,
            "expected_accuracy": exact["mean"],
            "min_position_accuracy": exact["min_position_accuracy"],
            "first_position_accuracy": exact["position_accuracy"][0],
            f"avg@{args.n}": macro[f"avg@{args.n}"],
            f"pass@{args.n}": macro[f"pass@{args.n}"],
            "validation_checks": sft.get("checks"),
        }
        rows.append(row)
        print(
            f"| {seed} | {args.threads} | {row['rounds']} | {built:.0f} | {100 * exact['mean']:.1f} | "
            f"{exact['min_position_accuracy']:.4f} | {100 * row[f'avg@{args.n}']:.1f} | "
            f"{100 * row[f'pass@{args.n}']:.1f} |",
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
