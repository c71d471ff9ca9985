"""Registration that means it (docs/study.md): :func:`plan_history` (the plan file's hash now and every committed
version of it, oldest first), :func:`confirmatory` (the report's verdict) and :func:`repeats` (the study's
(configuration, seed) pairs that results committed before the plan already hold).
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import time
from dataclasses import fields
from pathlib import Path

from kpo.compare.cell import Cell
from kpo.compare.engines import engine_of
from kpo.compare.plan import CompareConfig, CompareError, plan_runs
from kpo.compare.study.looks import schedule
from kpo.compare.study.plan import PLAN_FILE, cell_arms, cell_config, group_arms, plan_from, run_of

__all__ = ["confirmatory", "engine_errors", "plan_history", "register", "repeats", "runs_at_most"]


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except FileNotFoundError:
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def plan_history(folder: Path) -> dict:
    """{"hash": the file's sha256 now, "versions": [{"commit", "time" (epoch s), "hash"}] oldest first, "first":
    the first version or None, "changed": why the plan is not its first committed version, or None}."""
    path = Path(folder).resolve() / PLAN_FILE
    now = hashlib.sha256(path.read_bytes()).hexdigest()
    log = _git(path.parent, "log", "--follow", "--format=%H %ct", "--", PLAN_FILE) or ""
    versions = []
    for line in reversed(log.splitlines()):
        commit, when = line.split()
        top = _git(path.parent, "rev-parse", "--show-toplevel").strip()
        shown = subprocess.run(["git", "show", f"{commit}:{path.relative_to(top)}"], cwd=top, capture_output=True,
                               check=False)
        if shown.returncode == 0:  # a commit that deleted the file shows nothing
            versions.append({"commit": commit, "time": int(when), "hash": hashlib.sha256(shown.stdout).hexdigest()})
    first = versions[0] if versions else None
    changed = None
    if first is not None:
        later = next((v for v in versions[1:] if v["hash"] != first["hash"]), None)
        if later is not None:
            changed = f"committed again, changed, at {later['commit'][:12]} (first committed at {first['commit'][:12]})"
        elif now != first["hash"]:
            changed = f"differs from its first committed version ({first['commit'][:12]})"
    return {"hash": now, "versions": versions, "first": first, "changed": changed}


def confirmatory(history: dict, records: dict) -> tuple[bool, str]:
    """Whether the study may be called confirmatory: its plan committed, never changed, before every run
    started. Returns (verdict, why)."""
    first = history["first"]
    if first is None:
        return False, "its plan.json is not committed"
    if history["changed"]:
        return False, f"its plan.json {history['changed']}"
    early = sorted(k for k, r in records.items() if r.get("started") is None or r["started"] < first["time"])
    if early:
        return False, f"{len(early)} run(s) started before the plan's commit (or say not when): {', '.join(early[:3])}"
    return True, f"plan.json committed at {first['commit'][:12]} before every run started, never changed"


# ------------------------------------------------------------------ repeats of committed results
def _committed_files(top: Path, commit: str) -> list[str]:
    listing = _git(top, "ls-tree", "-r", "--name-only", commit) or ""
    return [p for p in listing.splitlines() if p.endswith(("/compare.json", "/plan.json"))]


def _show(top: Path, commit: str, path: str):
    text = _git(top, "show", f"{commit}:{path}")
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


@functools.lru_cache(maxsize=8)
def _earlier_runs(top: Path, commit: str, skip: str) -> dict[str, str]:
    """Fingerprint -> where, for every run of the results committed at ``commit``: each ``compare.json``'s runs
    (a compare's, a map cell's) and each other study's recorded runs."""
    found: dict[str, str] = {}
    known = {f.name for f in fields(CompareConfig)}  # a setting kpo no longer has changed no trained model
    for path in _committed_files(top, commit):
        if path.endswith("/plan.json") and path != skip:
            records = _show(top, commit, path.replace("plan.json", "runs.json"))
            raw = _show(top, commit, path)
            if not isinstance(records, dict):
                continue
            try:
                other = plan_from(raw, path)
            except CompareError:
                continue
            for r in records.values():
                if isinstance(r, dict) and r.get("cell") in other["cells"] and r.get("arm") in other["arms"]:
                    cfg = cell_config(other, r["cell"], r["arm"], Path("runs"))
                    found.setdefault(fingerprint(cfg, run_of(other, r["arm"], r["seed"])), path.rsplit("/", 1)[0])
        elif path.endswith("/compare.json"):
            settings = _show(top, commit, path)
            try:
                cfg = CompareConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()
                                       if k in known})
                runs = plan_runs(cfg)
                engine_of(cfg)
            except (AttributeError, TypeError, ValueError):  # not a compare's settings
                continue
            for run in runs:
                found.setdefault(fingerprint(cfg, run), path.rsplit("/", 1)[0])
    return found


def fingerprint(cfg, run) -> str:
    """What makes two runs one: their engine's settings that shape the trajectory and length, and the seed."""
    return json.dumps([cfg.engine, engine_of(cfg).run_settings(cfg, run)], sort_keys=True, default=str)


def repeats(plan: dict, folder: Path, seeds: list[int], commit: str | None = None) -> list[dict]:
    """The study's runs on ``seeds`` whose configuration and seed a result committed before the plan (at the
    commit before ``commit``, the plan's first; or at HEAD while it is not committed) holds: [{cell, arm, seed,
    where}]."""

    folder = Path(folder).resolve()
    near = next(p for p in (folder, *folder.parents) if p.is_dir())  # a study being registered has no folder yet
    top = (_git(near, "rev-parse", "--show-toplevel") or "").strip()
    if not top:
        return []
    before = f"{commit}^" if commit else "HEAD"
    if _git(Path(top), "rev-parse", "--verify", "--quiet", before) is None:
        return []
    skip = str((folder / PLAN_FILE).relative_to(top)) if (folder / PLAN_FILE).is_relative_to(top) else ""
    earlier = _earlier_runs(Path(top), before, skip)
    found = []
    for cell, arm in cell_arms(plan):
        cfg = cell_config(plan, cell, arm, Path("runs"))
        for seed in seeds:
            where = earlier.get(fingerprint(cfg, run_of(plan, arm, seed)))
            if where:
                found.append({"cell": cell, "arm": arm, "seed": seed, "where": where})
    return found


# ------------------------------------------------------------------ registering a plan
def engine_errors(plan: dict) -> list[str]:
    """What the engine rejects in each (cell, arm)'s runs, once per problem with the first run that has it."""
    first: dict[str, str] = {}
    for cell, arm in cell_arms(plan):
        c, cfg = plan["cells"][cell], cell_config(plan, cell, arm, Path("runs"))
        engine = engine_of(cfg)
        own = (*c["train_args"], *plan["setup"]["train_args"], *plan["arms"][arm]["train_args"])
        found = engine.cell_errors(Cell(c["mismatch"], c["depth"], c["lr"]), own)
        try:
            cfg.validate()
            found += engine.config_errors(cfg, [run_of(plan, arm, plan["seeds"]["first"])])
        except CompareError as e:
            found += e.errors
        for err in found:
            first.setdefault(err, f"cell {cell}, arm {arm}")
    return [f"{where}: {err}" for err, where in first.items()]


def runs_at_most(plan: dict) -> int:
    """The runs a study trains if every look is taken: each group's cells x its arms x its last look's seeds."""
    return sum(len(g["cells"]) * len(group_arms(plan, name)) * schedule(plan, name)[-1]
               for name, g in plan["groups"].items())


def register(source: Path, folder: Path, *, setup: dict | None = None, sims: int | None = None) -> dict:
    """Check the plan the user wrote at ``source`` (with ``setup``'s settings over its own), size it by simulation,
    and write ``folder/plan.json`` once; returns the plan. CompareError listing every problem, nothing written,
    where the plan is not valid, the engine rejects a run, a run repeats a committed result, or the folder holds a
    plan already."""
    from kpo._files import write_json
    from kpo.compare.study.plan import normalize, plan_errors, read_plan_file
    from kpo.compare.study.simulate import simulate, sizing_inputs

    path = Path(folder) / PLAN_FILE
    if path.exists():
        raise CompareError([f"{path}: a plan is there already; a plan is written once (register in a new folder)"])
    raw = read_plan_file(Path(source))
    if setup:
        raw["setup"] = {**(raw.get("setup") or {}), **setup} if isinstance(raw.get("setup", {}), dict) else setup
    if sims is not None:
        raw["sizing"] = {**(raw.get("sizing") or {}), "sims": sims} if isinstance(raw.get("sizing", {}), dict) else raw.get("sizing")
    errors = plan_errors(raw)
    if errors:
        raise CompareError([f"{source}: {e}" for e in errors])
    plan = normalize(raw)
    errors = engine_errors(plan)
    if errors:
        raise CompareError(errors)
    # the seeds the study may take (twice its most, for dropped ones), then as many past the last repeated one
    window, start, repeated = 2 * max(schedule(plan, g)[-1] for g in plan["groups"]), plan["seeds"]["first"], []
    while found := repeats(plan, Path(folder), list(range(start, start + window))):
        repeated += found
        start = max(r["seed"] for r in found) + 1
    if repeated:
        last = max(r["seed"] for r in repeated)
        where = ", ".join(sorted({r["where"] for r in repeated}))
        raise CompareError([f"seeds {', '.join(map(str, sorted({r['seed'] for r in repeated})))}: the plan's runs on "
                            f"them repeat runs committed in {where} (the same settings and seed: their results were "
                            f"read before this plan); set seeds.first above {last}"])
    inputs = sizing_inputs(plan)
    for q in plan["questions"]:
        anytime = plan["groups"][q["group"]]["looks"] == "anytime"
        if anytime and q["role"] != "descriptive" and q["outcome"] != "collapse" and "scale" not in q:
            # twice the seeds' spread: a typical seed stakes about half a full bet
            q["scale"] = round(2 * inputs["questions"][q["key"]]["sd"], 4)
    sizing = plan["sizing"]
    plan["simulation"] = {"inputs": inputs, **simulate(plan, inputs, sims=sizing.get("sims", 2000),
                                                       seed=sizing.get("seed", 0))}
    plan["runs_at_most"] = runs_at_most(plan)
    plan["registered"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    plan["source"] = Path(source).name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, plan, indent=2)
    return plan
