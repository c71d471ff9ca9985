"""A study's records, checked whenever they are read: ``seeds.json`` (the seeds admitted and dropped, in order)
and ``runs.json`` (one record per finished run). They are what the analysis reads, so a record that is not what
the plan and the seed rule allow stops the study in one line per problem instead of moving its answers.

seeds.json: ``{"admitted": [seeds, ascending], "warm": {seed: its warm start's accuracy}, "dropped":
[{"seed", "reason"}]}``; every seed from the plan's first up was tried once, in order, and is either admitted or
dropped. runs.json: ``{"CELL/RUN": {"cell", "arm", "seed", "accuracy", "warm", "reward_by_batch", "metrics",
"started", "code"}}``, the key the run's cell and folder name (:func:`kpo.compare.study.plan.run_name`).
"""

from __future__ import annotations

import math
from pathlib import Path

from kpo.compare.plan import CompareError
from kpo.compare.study.plan import group_arms, read_data_file, run_name

__all__ = ["RECORDS", "SEEDS", "read_records", "read_seeds", "records_errors", "seeds_errors"]

SEEDS, RECORDS = "seeds.json", "runs.json"


def _seed(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _fraction(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1


def seeds_errors(seeds, plan: dict) -> list[str]:
    """What is wrong with seeds.json's contents under ``plan``'s seed rule."""
    if not isinstance(seeds, dict) or set(seeds) != {"admitted", "warm", "dropped"}:
        return ["a mapping of admitted, warm and dropped"]
    admitted, warm, dropped = seeds["admitted"], seeds["warm"], seeds["dropped"]
    if not (isinstance(admitted, list) and all(_seed(s) for s in admitted)):
        return ["admitted: a list of seeds (integers >= 0)"]
    if not (isinstance(dropped, list) and all(isinstance(d, dict) and set(d) == {"seed", "reason"} and _seed(d["seed"])
                                              and isinstance(d["reason"], str) for d in dropped)):
        return ["dropped: a list of {seed, reason}"]
    errors = []
    if admitted != sorted(set(admitted)):
        errors.append(f"admitted {admitted}: each seed once, in ascending order (seeds are admitted in order)")
    gone = [d["seed"] for d in dropped]
    if len(set(gone)) < len(gone):
        errors.append("dropped: a seed listed twice")
    both = sorted(set(admitted) & set(gone))
    if both:
        errors.append(f"seeds {both} are both admitted and dropped")
    tried, first = sorted(set(admitted) | set(gone)), plan["seeds"]["first"]
    if tried and tried != list(range(first, first + len(tried))):
        errors.append(f"seeds tried {tried}: the plan takes them in order from {first}, each once")
    if not (isinstance(warm, dict) and set(warm) == {str(s) for s in admitted} and all(map(_fraction, warm.values()))):
        errors.append("warm: each admitted seed's warm-start accuracy (a fraction), and nothing else")
    return errors


def records_errors(records, plan: dict, seeds: dict) -> list[str]:
    """What is wrong with runs.json's records under ``plan`` and the admitted ``seeds``."""
    if not isinstance(records, dict):
        return ["a mapping of CELL/RUN to its record"]
    errors, admitted = [], set(seeds["admitted"])
    fields = {"cell", "arm", "seed", "accuracy", "warm", "reward_by_batch", "started", "code"}
    for key, r in records.items():
        where = f"record {key!r}"
        if not isinstance(r, dict) or not fields <= set(r) <= fields | {"metrics"}:
            errors.append(f"{where}: holds {', '.join(sorted(fields))} (and metrics)")
            continue
        group = next((g for g, v in plan["groups"].items() if r["cell"] in v["cells"]), None)
        if group is None:
            errors.append(f"{where}: cell {r['cell']!r} is not one of the plan's")
        elif r["arm"] not in group_arms(plan, group):
            errors.append(f"{where}: arm {r['arm']!r} does not run in cell {r['cell']!r}")
        elif not _seed(r["seed"]) or r["seed"] not in admitted:
            errors.append(f"{where}: seed {r['seed']!r} is not an admitted seed")
        elif key != f"{r['cell']}/{run_name(plan, r['arm'], r['seed'])}":
            errors.append(f"{where}: its key should be {r['cell']}/{run_name(plan, r['arm'], r['seed'])}")
        elif not _fraction(r["accuracy"]):
            errors.append(f"{where}: accuracy {r['accuracy']!r} is not a fraction in [0, 1]")
        elif r["warm"] != seeds["warm"][str(r["seed"])]:
            errors.append(f"{where}: warm {r['warm']!r} is not seed {r['seed']}'s warm start in seeds.json")
        elif not (isinstance(r["reward_by_batch"], list) and all(_fraction(x) for x in r["reward_by_batch"])):
            errors.append(f"{where}: reward_by_batch is a list of rewards in [0, 1]")
        elif not (r["started"] is None or (isinstance(r["started"], (int, float)) and math.isfinite(r["started"]))):
            errors.append(f"{where}: started is a time (seconds since 1970) or null")
        elif not isinstance(r.get("metrics", {}), dict) or not all(
            isinstance(v, (int, float)) and math.isfinite(v) for v in r.get("metrics", {}).values()
        ):
            errors.append(f"{where}: metrics maps names to finite numbers")
    return errors


def _checked(path: Path, found, errors: list[str]):
    if errors:
        raise CompareError([f"{path}: {e}" for e in errors]
                           + [f"{path} is the study's record: restore it from git (git checkout -- {path})"])
    return found


def read_seeds(folder: Path, plan: dict) -> dict:
    """seeds.json, checked (empty lists where the study has not admitted a seed yet)."""
    path = Path(folder) / SEEDS
    found = read_data_file(path, "the seed list")
    if found is None:
        return {"admitted": [], "warm": {}, "dropped": []}
    return _checked(path, found, seeds_errors(found, plan))


def read_records(folder: Path, plan: dict, seeds: dict) -> dict:
    """runs.json, checked against the plan and the admitted seeds."""
    path = Path(folder) / RECORDS
    found = read_data_file(path, "the run records")
    if found is None:
        return {}
    return _checked(path, found, records_errors(found, plan, seeds))
