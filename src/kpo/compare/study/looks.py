"""A study's looks and decisions: each question tested at its group's looks, the error of a look spent by the
plan (a weighted Bonferroni split), the gate and Holm over the sequential p-values, and the answers; how it
decides: docs/study.md, "How it decides". The seed is the unit (:func:`seed_values`), but the first study's
collapse questions, registered on (cell, seed) pairs (``test: mcnemar-pairs``, the exact McNemar test), keep
their decisions; its report shows the seed-level test beside them.
"""

from __future__ import annotations

import numpy as np

from kpo.compare.stats import anytime_p, e_values, holm_adjusted, mcnemar_exact, sign_flip_p, spending
from kpo.compare.study.plan import collapsed, group_arms

__all__ = ["analyze", "gate_and_holm", "look_test", "nest", "schedule", "seed_values", "shares"]


def nest(rows) -> dict:
    """{cell: {arm: {seed: record}}}, the analysis's data, from (cell, arm, seed, record) rows."""
    data: dict = {}
    for cell, arm, seed, record in rows:
        data.setdefault(cell, {}).setdefault(arm, {})[seed] = record
    return data


def schedule(plan: dict, group: str) -> list[int]:
    """Seeds at each look of ``group``: its looks, or every seed count up to max_seeds (looks at any time)."""
    g = plan["groups"][group]
    return list(range(1, g["max_seeds"] + 1)) if g["looks"] == "anytime" else list(g["looks"])


def look_test(plan: dict, q: dict, data: dict, seeds: list[int], rule: dict, k: int) -> dict:
    """:func:`test_look` of question ``q`` at look ``k`` of its group (an e-process where the group looks at any
    time), with ``p_look``: its p-value on the scale of the plan's alpha, divided by that look's share of alpha
    (group-sequential looks), as it is for looks at any time (already valid at any look)."""
    split = shares(plan, q["group"])
    found = test_look(q if split is not None else {**q, "test": "anytime"}, data, seeds, rule)
    found["p_look"] = found["p"] if split is None else min(1.0, found["p"] * plan["alpha"] / split[k])
    return found


def shares(plan: dict, group: str) -> list[float] | None:
    """The error each look of ``group`` spends (adding up to alpha), None for looks at any time."""
    g = plan["groups"][group]
    if g["looks"] == "anytime":
        return None
    if g["spending"] == "obrien-fleming":
        return spending(plan["alpha"], tuple(g["looks"]))
    return list(g["spending"])


def scale_of(q: dict) -> float:
    """The difference a look at any time bets fully on: the plan's, or for collapse the question's cells (a
    seed's count difference reaches it)."""
    return q.get("scale") or float(len(q["cells"]))


def seed_values(q: dict, data: dict, seeds: list[int], rule: dict) -> np.ndarray:
    """Per seed, a's outcome minus b's over the question's cells: collapsed runs (a count), the mean final
    accuracy, or the mean final value of its metric; less the same over its ``versus`` cells where it has them.
    ``data[cell][arm][seed]`` is the run's record."""
    def pooled(cells: list[str]) -> np.ndarray:
        per_cell = []
        for cell in cells:
            a, b = (data[cell][q[side]] for side in ("a", "b"))
            if q["outcome"] == "collapse":
                per_cell.append([_fell(a[s], rule) - _fell(b[s], rule) for s in seeds])
            elif q["outcome"] == "accuracy":
                per_cell.append([a[s]["accuracy"] - b[s]["accuracy"] for s in seeds])
            else:
                per_cell.append([a[s]["metrics"][q["metric"]] - b[s]["metrics"][q["metric"]] for s in seeds])
        values = np.asarray(per_cell, dtype=np.float64)
        return values.sum(axis=0) if q["outcome"] == "collapse" else values.mean(axis=0)

    return pooled(q["cells"]) - pooled(q["versus"]) if q.get("versus") else pooled(q["cells"])


def null_centre(q: dict) -> float:
    """The sign-flip test's centre under the null: -margin for "greater" (a not worse than b by more than the
    margin), +margin for "less"."""
    return -q["margin"] if q["alternative"] == "greater" else q["margin"]


def test_look(q: dict, data: dict, seeds: list[int], rule: dict) -> dict:
    """The question's test on ``seeds`` (its first n admitted seeds): {test, seeds, p, estimate, ...}."""
    if q["test"] == "mcnemar-pairs":
        a = [_fell(data[c][q["a"]][s], rule) for s in seeds for c in q["cells"]]
        b = [_fell(data[c][q["b"]][s], rule) for s in seeds for c in q["cells"]]
        found = mcnemar_exact(a, b)
        return {"test": "exact McNemar", "seeds": len(seeds), **found, "estimate": found["a_only"] - found["b_only"]}
    d = seed_values(q, data, seeds, rule)
    out = {"test": "exact sign-flip permutation test", "seeds": len(seeds), "estimate": float(d.mean()),
           "per_seed": d.tolist(), "sd": float(d.std(ddof=1)) if d.size > 1 else None}
    if q["outcome"] == "collapse":
        out["a_collapsed"] = int(sum(_fell(data[c][q["a"]][s], rule) for s in seeds for c in q["cells"]))
        out["b_collapsed"] = int(sum(_fell(data[c][q["b"]][s], rule) for s in seeds for c in q["cells"]))
        out["runs"] = len(seeds) * len(q["cells"])
    else:
        out["low"], out["high"] = _bootstrap_interval(d)
    if q["test"] == "anytime":
        e = e_values(d - null_centre(q), scale_of(q), q["alternative"])
        out |= {"test": "e-process (sign-flip bets)", "e_value": float(e.max()), "p": float(anytime_p(e)[-1])}
    else:
        out["p"] = sign_flip_p(d, q["alternative"], null_centre(q))
    return out


def _fell(record: dict, rule: dict) -> bool:
    return collapsed(record["accuracy"], record["warm"], rule)


def _bootstrap_interval(d: np.ndarray) -> tuple[float | None, float | None]:
    """The 95% BCa bootstrap interval of the mean of ``d`` (scipy.stats.bootstrap, fixed seed), None without
    spread (descriptive: the test decides)."""
    from scipy.stats import bootstrap

    if d.size < 3 or np.all(d == d[0]):
        return None, None
    found = bootstrap((d,), np.mean, n_resamples=4999, method="BCa", random_state=np.random.default_rng(0))
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def gate_and_holm(p_seq: dict[str, float], plan: dict) -> tuple[dict, dict]:
    """Decisions on the tested questions' sequential p-values (key -> p): the primary, if any, at alpha; once it is
    rejected (or with none), Holm at alpha over the family (statsmodels' adjusted values). Returns (rejected,
    adjusted p): a family member's adjusted p is the larger of the gate's p and its Holm-adjusted p."""
    tested = [q for q in plan["questions"] if q["role"] != "descriptive"]
    primary = [q["key"] for q in tested if q["role"] == "primary"]
    family = [q["key"] for q in tested if q["role"] == "family"]
    adjusted = {k: min(1.0, p_seq[k]) for k in primary}
    gate = adjusted[primary[0]] if primary else 0.0
    for key, p in zip(family, holm_adjusted([p_seq[k] for k in family]) if family else []):
        adjusted[key] = float(max(gate, p))
    return {k: bool(p <= plan["alpha"]) for k, p in adjusted.items()}, adjusted


def _complete(data: dict, cells: list[str], arms: list[str], seeds: list[int], n: int) -> bool:
    return len(seeds) >= n and all(s in data.get(c, {}).get(a, {}) for c in cells for a in arms for s in seeds[:n])


def analyze(plan: dict, data: dict, seeds: list[int], rule: dict | None = None) -> dict:
    """The study on its records so far: ``data[cell][arm][seed]`` a finished run's record, ``seeds`` the admitted
    seeds in order. Each group takes its looks in order while their runs are recorded (groups in turn, a look at a
    time: the decisions after each look set the arms the next needs). Returns {"looks": [{group, seeds,
    rejected}], "questions": {key: answer}, "next": {group: seeds of its next look} or None once the study has
    ended, "active": {group: the arms its next look needs}}. ``rule``: the collapse rule (the plan's by default;
    the report's sensitivity passes others)."""
    rule = rule or plan["collapse"]
    questions = plan["questions"]
    taken: dict[str, list[dict]] = {q["key"]: [] for q in questions}
    p_seq = {q["key"]: 1.0 for q in questions if q["role"] != "descriptive"}
    rejected, adjusted = gate_and_holm(p_seq, plan)
    position = {g: 0 for g in plan["groups"]}
    waiting: dict[str, int] = {}
    looks = []

    def live(group: str) -> list[dict]:
        return [q for q in questions if q["group"] == group and q["role"] != "descriptive" and not rejected[q["key"]]]

    advanced = True
    while advanced:
        advanced = False
        for group in plan["groups"]:
            steps = schedule(plan, group)
            if group in waiting or position[group] >= len(steps) or not live(group):
                continue
            n = steps[position[group]]
            testing = live(group)
            arms = [a for a in group_arms(plan, group) if any(a in (q["a"], q["b"]) for q in testing)]
            if not _complete(data, plan["groups"][group]["cells"], arms, seeds, n):
                waiting[group] = n
                continue
            for q in [*testing, *(q for q in questions if q["group"] == group and q["role"] == "descriptive"
                                  and _complete(data, q["cells"] + q.get("versus", []), [q["a"], q["b"]], seeds, n))]:
                found = look_test(plan, q, data, seeds[:n], rule, position[group])
                taken[q["key"]].append(found)
                if q["role"] != "descriptive":
                    p_seq[q["key"]] = min(p_seq[q["key"]], found["p_look"])
            position[group] += 1
            rejected, adjusted = gate_and_holm(p_seq, plan)
            looks.append({"group": group, "seeds": n, "rejected": [key for key, r in rejected.items() if r]})
            advanced = True
    ended = not waiting
    active = {g: [a for a in group_arms(plan, g) if any(a in (q["a"], q["b"]) for q in live(g))] for g in waiting}
    answers = {q["key"]: _answer(plan, q, taken[q["key"]], p_seq, rejected, adjusted, ended, position) for q in questions}
    return {"looks": looks, "questions": answers, "next": None if ended else waiting, "active": active}


def _answer(plan, q, found, p_seq, rejected, adjusted, ended, position) -> dict:
    key = q["key"]
    entry = {**{k: q[k] for k in ("text", "role", "outcome", "metric", "a", "b", "group", "cells", "alternative",
                                    "margin", "test")}, **({"versus": q["versus"]} if q.get("versus") else {}),
             "looks": found, "p_sequential": p_seq.get(key) if found else None,
             "p_adjusted": adjusted.get(key) if found else None, "rejected": rejected.get(key, False)}
    spent = position[q["group"]] >= len(schedule(plan, q["group"]))
    if q["role"] == "descriptive":
        entry["verdict"], entry["answer"] = "descriptive", "descriptive: not a test of the plan's family"
    elif entry["rejected"]:
        deciding = min(found, key=lambda x: x["p_look"])  # the look that rejected
        entry["decided_at_seeds"] = deciding["seeds"]
        entry["verdict"], entry["answer"] = "decided", _direction(q, deciding)
    elif found and (ended or (spent and q["role"] == "primary")):
        entry["verdict"], entry["answer"] = "undecided", "undecided at the study's cap"
    elif found and spent:
        # its own looks are spent, but its decision is the gate's and Holm's over the whole family, and those
        # p-values still fall while another group's looks run
        entry["verdict"] = "open"
        entry["answer"] = "open: its looks are taken; its decision waits for the gate and Holm at the study's end"
    else:
        entry["verdict"], entry["answer"] = "open", "open: its next look has not been taken"
    entry["estimate"] = (min(found, key=lambda x: x["p_look"]) if entry["rejected"] else found[-1])["estimate"] if found else None
    return entry


def _direction(q: dict, look: dict) -> str:
    """The decided answer in words, from the estimate at the look that rejected."""
    a, b, est = q["a"], q["b"], look["estimate"]
    if q["test"] == "mcnemar-pairs":
        more, less = (a, b) if look["a_only"] > look["b_only"] else (b, a)
        return f"{more} collapses where {less} does not ({max(look['a_only'], look['b_only'])} pairs to " \
               f"{min(look['a_only'], look['b_only'])})"
    if q.get("versus"):
        return (f"{a} - {b} is {'larger' if est > 0 else 'smaller'} in {', '.join(q['cells'])} than in "
                f"{', '.join(q['versus'])}, by {_amount(q, abs(est))}")
    if q["margin"]:
        side = "worse" if q["alternative"] == "greater" else "better"
        return f"{a} is not {side} than {b} by {_amount(q, q['margin'])} or more ({_amount(q, est, sign=True)})"
    if q["outcome"] == "collapse":
        more, less = (a, b) if est > 0 else (b, a)
        return f"{more} collapses more often than {less} ({look['a_collapsed']} of {look['runs']} runs to {look['b_collapsed']})"
    if q["outcome"] == "accuracy":
        return f"{a} is {'more' if est > 0 else 'less'} accurate than {b}, by {abs(100 * est):.1f} points"
    return f"{a}'s {q['metric']} is {'higher' if est > 0 else 'lower'} than {b}'s, by {abs(est):.3g}"


def _amount(q: dict, x: float, sign: bool = False) -> str:
    if q["outcome"] == "accuracy":
        return f"{100 * x:+.1f} points" if sign else f"{100 * x:g} points"
    return f"{x:+.3g}" if sign else f"{x:g}"
