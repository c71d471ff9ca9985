"""The filter-or-band study's calibrated band: from the calibration pilots' runs (docs/results/filter-or-band/
calibration*, seeds 37-38), each arm's share of clipped off-policy tokens (metrics.jsonl's clip_frac over the
optimizer steps after each generation batch's first, pooled over cells and seeds), and the scale of KPO's band
(3e-4 / 4e-4) at which a plain token clip clips KPO (matched)'s share: linear in log(scale) between the two
measured scales that bracket it. Writes docs/results/filter-or-band/calibration.json.

    python scripts/calibrate_band.py RUNS      # RUNS: the pilots' --runs folder
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KPO_BAND = (3e-4, 4e-4)


def off_policy_share(folder: Path, depth: int) -> float:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    off = [r["clip_frac"] for r in rows if (r["step"] - 1) % depth and r.get("clip_frac") is not None]
    return sum(off) / len(off)


def main(runs: Path) -> None:
    from kpo._files import replacing
    from kpo.compare.study.plan import load_plan, run_name

    shares: dict[str, dict[str, float]] = {}  # arm -> "cell/seed" -> its share
    scale_of: dict[str, float | None] = {}
    for study in sorted((ROOT / "docs/results/filter-or-band").glob("calibration*/plan.json")):
        plan = load_plan(study)
        seeds = json.loads((study.parent / "seeds.json").read_text())["admitted"]
        for arm, a in plan["arms"].items():
            low = a["loss_kwargs"].get("clip_ratio_low")
            scale_of[arm] = None if low is None else low / KPO_BAND[0]
            for cell, c in plan["cells"].items():
                for seed in seeds:
                    folder = runs / cell / "runs" / run_name(plan, arm, seed)
                    key = f"{cell}/{seed}"
                    shares.setdefault(arm, {})[key] = off_policy_share(folder, c["depth"])
    pooled = {arm: sum(v.values()) / len(v) for arm, v in shares.items()}
    target = pooled["KPO (matched)"]
    bands = sorted((scale_of[a], pooled[a]) for a in pooled if scale_of[a] is not None)
    bracket = [(lo, hi) for lo, hi in zip(bands, bands[1:]) if min(lo[1], hi[1]) <= target <= max(lo[1], hi[1])]
    if not bracket:
        raise SystemExit(f"no two measured bands bracket KPO (matched)'s share {target:.4f}: {bands}")
    (s0, y0), (s1, y1) = bracket[0]
    t = (target - y0) / (y1 - y0)
    scale = math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0)))
    found = {
        "kpo_share": target,
        "shares": {a: {"scale": scale_of[a], "pooled": pooled[a], "per_cell_seed": shares[a]} for a in pooled},
        "bracket": [s0, s1],
        "scale": scale,
        "clip_ratio_low": float(f"{KPO_BAND[0] * scale:.3g}"),
        "clip_ratio_high": float(f"{KPO_BAND[1] * scale:.3g}"),
    }
    out = ROOT / "docs/results/filter-or-band/calibration.json"
    with replacing(out) as partial:
        partial.write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps({k: v for k, v in found.items() if k != "shares"}, indent=2))
    for a in sorted(pooled, key=lambda a: -(scale_of[a] or 99)):
        print(f"  {a}: {pooled[a]:.4f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
