"""The digest of a compare's report written by this checkout's kpo from deterministic fake runs (every arm, the
A/A replica, the ablations and a memory sweep; rewards, entropies and per-problem counts drawn from each run's
name). Run it from two checkouts into the same OUT: equal digests mean a change left the report unchanged to the
last digit.

    cd CHECKOUT && PYTHONPATH=$PWD/src:$PWD python scripts/report_digest.py /tmp/digest/cmp
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from tests.compare.conftest import TOY_TRAIN, write_fake_run

from kpo.compare import CompareConfig, plan_runs
from kpo.compare.report import write_report

out = Path(sys.argv[1])
cfg = CompareConfig(
    out=str(out),
    methods=("vanilla", "kpo", "gspo"),
    seeds=4,
    steps=8,
    minibatches=2,
    matched=True,
    ablations=True,
    aa_seeds=2,
    sweep_memory=("paper", "2"),
    sweep_seeds=2,
    eval_n=8,
    eval_limit=6,
    dump_every=1,
    jobs=2,
    train_args=(*TOY_TRAIN, "--cache-dir", str(out.parent / "cache")),
)
runs = plan_runs(cfg)
for run in runs:
    folder = write_fake_run(cfg, run, problems=6)
    rng = np.random.default_rng(int(hashlib.sha256(run.name.encode()).hexdigest()[:8], 16))
    rows = [
        {
            "step": s,
            "reward_mean": float(rng.uniform(0, 1)),
            "entropy": float(rng.uniform(0.1, 2)),
            "clip_frac": 0.0,
            "pg_loss": 0.0,
        }
        for s in range(1, cfg.steps + 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = json.loads((folder / "eval.json").read_text())
    for p in results["benchmarks"]["synthetic"]["per_problem"]:
        p["correct"] = int(rng.integers(0, cfg.eval_n + 1))
    results["macro"][f"avg@{cfg.eval_n}"] = float(rng.uniform(0, 1))
    (folder / "eval.json").write_text(json.dumps(results))
write_report(cfg, runs, out)
for f in ("report.md", "report.json"):
    print(f, hashlib.sha256((out / f).read_bytes()).hexdigest()[:16])
