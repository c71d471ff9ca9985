"""Sizing a study by simulation: its power and family-wise error at its looks, before any run, from a pilot
(earlier records, whole seeds resampled: the questions of a group share its draws) or from effects the user states
(per seed, normal draws at the stated mean and sd, or each cell's runs collapsing at the stated rates); the effect
size and the errors reported: docs/study.md, "Sizing". The tests and decisions are the study's own
(:mod:`kpo.compare.study.looks`); beyond 16 seeds of real differences a sign-flip p is estimated from 2,000 random
sign patterns.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from kpo.compare.plan import CompareError
from kpo.compare.stats import anytime_p, e_values, rate_interval, sign_flip_many
from kpo.compare.study.looks import gate_and_holm, nest, null_centre, scale_of, schedule, seed_values, shares
from kpo.compare.study.plan import read_data_file
from kpo.compare.study.records import _fraction

__all__ = ["load_pilot", "simulate", "sizing_inputs"]

SCALES = {"measured": 1.0, "a third smaller": 2 / 3}


def load_pilot(pilot: dict) -> dict:
    """A pilot's runs as {cell: {arm: {seed: {"accuracy", "warm", "metrics"}}}} under the plan's names (its
    ``cells`` and ``arms`` maps: plan name -> pilot name, the same name where unmapped), from a study's or a regime
    map's runs.json."""
    path = Path(pilot["records"])
    found = read_data_file(path, "the pilot's records")
    if found is None:
        where = "" if path.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()})"
        raise CompareError([f"sizing.pilot.records {path}: no such file{where}; give a study's or a map's runs.json"])
    if not (isinstance(found, dict) and all(isinstance(r, dict) and {"cell", "arm", "seed", "accuracy", "warm"} <= set(r)
                                            for r in found.values())):
        raise CompareError([f"sizing.pilot.records {path}: not a study's or a map's runs.json"])
    bad = [key for key, r in found.items() if not (_fraction(r["accuracy"]) and _fraction(r["warm"]))]
    if bad:  # a hand-edited or merged file: its numbers would move every simulated power and error
        raise CompareError([f"sizing.pilot.records {path}: record {bad[0]!r} (and {len(bad) - 1} more): accuracy and "
                            "warm must be fractions in [0, 1]; restore the file from git"])
    rows = [(r["cell"], r["arm"], r["seed"], {"accuracy": r["accuracy"], "warm": r["warm"],
                                              "metrics": r.get("metrics", {})}) for r in found.values()]
    cells, arms = _renaming(pilot.get("cells", {})), _renaming(pilot.get("arms", {}))
    return nest((cells(c), arms(a), s, r) for c, a, s, r in rows if cells(c) is not None and arms(a) is not None)


def _renaming(plan_to_pilot: dict):
    """A pilot name's plan name: the plan name mapped to it, else its own unless the plan maps that name elsewhere
    (None: the plan does not read it)."""
    back = {v: k for k, v in plan_to_pilot.items()}
    return lambda name: back.get(name, None if name in plan_to_pilot else name)


def _pilot_seeds(data: dict, q: dict) -> list[int]:
    """The pilot seeds that ran both of the question's arms in every one of its cells."""
    runs = [set(data.get(c, {}).get(q[side], {})) for c in q["cells"] for side in ("a", "b")]
    return sorted(set.intersection(*runs)) if runs else []


def sizing_inputs(plan: dict) -> dict:
    """What the simulation draws from, per group: the pilot seeds of its pilot-read questions and their per-seed
    differences [seeds]; per question, "pilot" or its stated effect; CompareError listing the questions neither
    gives (at least 3 pilot seeds are needed to resample)."""
    sizing = plan["sizing"]
    data = load_pilot(sizing["pilot"]) if sizing.get("pilot") else {}
    stated = sizing.get("effects", {})
    inputs: dict = {"groups": {}, "questions": {}}
    errors = []
    for group in plan["groups"]:
        tested = [q for q in plan["questions"] if q["group"] == group and q["role"] != "descriptive"]
        from_pilot = [q for q in tested if q["key"] not in stated and len(_pilot_seeds(data, q)) >= 3]
        seeds = sorted(set.intersection(*(set(_pilot_seeds(data, q)) for q in from_pilot))) if from_pilot else []
        inputs["groups"][group] = {"pilot_seeds": seeds}
        for q in tested:
            if q in from_pilot:
                d = seed_values(q, data, seeds, plan["collapse"])
                inputs["questions"][q["key"]] = {"from": "pilot", "per_seed": d.tolist(), "mean": float(d.mean()),
                                                 "sd": float(d.std(ddof=1))}
            elif q["key"] in stated:
                errors += _stated_errors(q, stated[q["key"]])
                inputs["questions"][q["key"]] = {"from": "stated", **stated[q["key"]]}
            else:
                errors.append(f"question {q['key']!r}: the pilot has not run {q['a']} and {q['b']} in its cells on 3 "
                              f"seeds or more; state its effect in sizing.effects ({_stated_form(q)})")
    if errors:
        raise CompareError(errors)
    if data:
        raw = Path(sizing["pilot"]["records"]).read_bytes()
        inputs["pilot"] = {**sizing["pilot"], "sha256": hashlib.sha256(raw).hexdigest()}
    return inputs


def _stated_form(q: dict) -> str:
    return "{a_rate: ..., b_rate: ...}, the collapse rates" if q["outcome"] == "collapse" else \
        "{mean: ..., sd: ...}, the per-seed difference a - b"


def _stated_errors(q: dict, effect) -> list[str]:
    keys = ("a_rate", "b_rate") if q["outcome"] == "collapse" else ("mean", "sd")
    ok = isinstance(effect, dict) and set(effect) == set(keys) and all(
        isinstance(effect[k], (int, float)) and np.isfinite(effect[k]) for k in keys)
    if ok and q["outcome"] == "collapse":
        ok = all(0 <= effect[k] <= 1 for k in keys)
    if ok and q["outcome"] != "collapse":
        ok = effect["sd"] > 0
    return [] if ok else [f"sizing.effects.{q['key']}: write {_stated_form(q)}"]


def _draws(plan: dict, inputs: dict, sims: int, rng) -> dict[str, np.ndarray]:
    """Each tested question's per-seed differences in ``sims`` simulated studies [sims, its group's most seeds]."""
    out = {}
    for group, g in inputs["groups"].items():
        n = schedule(plan, group)[-1]
        picks = rng.integers(0, len(g["pilot_seeds"]), size=(sims, n)) if g["pilot_seeds"] else None
        for q in plan["questions"]:
            if q["group"] != group or q["role"] == "descriptive":
                continue
            source = inputs["questions"][q["key"]]
            if source["from"] == "pilot":
                out[q["key"]] = np.asarray(source["per_seed"])[picks]
            elif q["outcome"] == "collapse":
                cells = len(q["cells"])
                a = rng.random((sims, n, cells)) < source["a_rate"]
                b = rng.random((sims, n, cells)) < source["b_rate"]
                out[q["key"]] = (a.astype(float) - b).sum(axis=2)
            else:
                out[q["key"]] = rng.normal(source["mean"], source["sd"], size=(sims, n))
    return out


def _scaled(q: dict, d: np.ndarray, scale: float, rng) -> np.ndarray:
    """Each seed keeps its difference's sign about the null's centre with probability ``scale``, else a fair coin's."""
    centre = null_centre(q)
    flip = (rng.random(d.shape) >= scale) & (rng.random(d.shape) < 0.5)
    return centre + np.where(flip, -1.0, 1.0) * (d - centre)


def _p_sequential(plan: dict, q: dict, d: np.ndarray, rng) -> np.ndarray:
    """The question's sequential p in each simulated study (its group's looks and spending, as the study takes
    them)."""
    centre, split = null_centre(q), shares(plan, q["group"])
    if split is None:
        return anytime_p(e_values(d - centre, scale_of(q), q["alternative"]))[:, -1]
    ps = [np.minimum(1.0, sign_flip_many(d[:, :n] - centre, q["alternative"], rng=rng) * plan["alpha"] / share)
          for n, share in zip(schedule(plan, q["group"]), split)]
    return np.min(ps, axis=0)


def _rejections(plan: dict, draws: dict, scales: dict, rng) -> dict[str, np.ndarray]:
    """Which tested questions each simulated study rejects (key -> bool [sims]) at these effect scales."""
    by_key = {q["key"]: q for q in plan["questions"]}
    p = {k: _p_sequential(plan, by_key[k], _scaled(by_key[k], d, scales[k], rng), rng) for k, d in draws.items()}
    sims = next(iter(p.values())).shape[0]
    rejected = np.zeros((sims, len(p)), dtype=bool)
    keys = list(p)
    for i in range(sims):
        decided, _ = gate_and_holm({k: float(p[k][i]) for k in keys}, plan)
        rejected[i] = [decided[k] for k in keys]
    return {k: rejected[:, j] for j, k in enumerate(keys)}


def simulate(plan: dict, inputs: dict, sims: int = 2000, seed: int = 0) -> dict:
    """Power and family-wise error of ``plan`` in ``sims`` simulated studies drawn from ``inputs``
    (:func:`sizing_inputs`): {"sims", "seed", "power": {effect: {key: P(rejected)}}, "joint_power", "fwer": {null:
    P(a true null rejected)}, "fwer_interval": {null: [low, high]} (exact 95%)}."""
    rng = np.random.default_rng(seed)
    draws = _draws(plan, inputs, sims, rng)
    keys = list(draws)
    out: dict = {"sims": sims, "seed": seed, "power": {}, "joint_power": {}, "fwer": {}, "fwer_interval": {}}
    for name, scale in SCALES.items():
        rejected = _rejections(plan, draws, {k: scale for k in keys}, rng)
        out["power"][name] = {k: float(v.mean()) for k, v in rejected.items()}
        out["joint_power"][name] = float(np.mean(np.all(list(rejected.values()), axis=0)))
    scenarios = {"global null": {k: 0.0 for k in keys}}
    scenarios |= {f"{k} null": {j: (0.0 if j == k else 1.0) for j in keys} for k in keys} if len(keys) > 1 else {}
    for name, scales in scenarios.items():
        rejected = _rejections(plan, draws, scales, rng)
        wrong = np.any([rejected[k] for k, s in scales.items() if s == 0.0], axis=0)
        out["fwer"][name] = float(wrong.mean())
        out["fwer_interval"][name] = list(rate_interval(int(wrong.sum()), sims))
    return out
