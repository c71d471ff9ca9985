"""The regime map's pre-registered questions, how each is tested, and the sequential design that adds seeds
until they are decided.

A question pools cells: the **stable** cells (the map's lowest learning rate) or the **stress** cells (its
highest). It is one of three kinds, each with its own test (:mod:`kpo.compare.stats`):

- ``collapse``: does arm ``a`` collapse where arm ``b`` does not? Exact McNemar test on the (cell, seed) pairs of
  the pooled cells. yes: ``a`` collapses more; no: ``b`` collapses more; else undecided.
- ``accuracy``: is ``a`` worse than ``b``? On the pairs where neither run collapsed, pooled over the cells with the
  seed as the unit (the t-test on the seeds' mean differences). Two hypotheses: the difference is 0 (two-sided),
  and ``a`` is worse by ``MARGIN`` or more (non-inferiority). yes: worse (and "by less than 5 points" when
  non-inferiority holds too); no: better, or not worse by 5 points or more; else undecided.
- ``interaction``: does the bf16 mismatch change the contrast ``a - b``? The difference of the contrast between
  each bf16 cell and the float32 cell of the same depth, per seed, pooled over depths as above. Two hypotheses:
  no change (two-sided) and a change of ``MARGIN`` or more (equivalence, TOST). yes: it changes; no: within
  +-5 points; else undecided.

Multiplicity: every hypothesis of every question is one member of one family, Holm at ALPHA over them; a report
states each hypothesis's Holm step-down adjusted p-value. Looks: the map trains ``LOOKS[0]`` seeds a cell, then
adds seeds look by look up to ``LOOKS[-1]`` to the cells of a question that is undecided. The error is spent over
the looks by a weighted Bonferroni split (``LOOK_SHARES``, the share of the error at each look, rising to the
last, so that only a clear result stops early, as with O'Brien-Fleming's boundary): a hypothesis's p-value at
look k is its test's p-value divided by share k, and its p-value is the least of these over the looks taken.
P(some look rejects a true hypothesis) <= sum_k share_k alpha = alpha whatever made the map stop, so stopping on
what the data show cannot inflate the error. A question whose latest look is not complete keeps its last complete
look's p-values in the family. A question undecided reports the seeds per cell that an 80%-power test at the
family's least final-look level would need, from the measured spread (scaled up by the pairs a collapse left out
of a survivors-only test) or discordance: post-hoc, at the effect measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kpo.compare.stats import (
    ALPHA,
    MARGIN,
    cells_differ,
    discordance_seeds,
    holm,
    holm_adjusted,
    mcnemar_exact,
    pooled_accuracy,
    seeds_for_effect,
)

__all__ = ["LOOKS", "Question", "decide", "describe", "groups_to_extend"]

LOOKS = (4, 6, 8)  # seeds a cell has at each look; the last is the cap
LOOK_SHARES = (0.1, 0.2, 0.7)  # the share of the error spent at each look


@dataclass(frozen=True)
class Question:
    """A pre-registered question: ``kind`` "collapse", "accuracy" or "interaction", arms ``a`` and ``b``
    (labels), pooled over the ``group`` ("stable" or "stress") of cells."""

    key: str
    text: str
    kind: str
    a: str
    b: str
    group: str

    def hypotheses(self) -> tuple[str, ...]:
        """The family members this question adds: "difference", and for accuracy and interaction "margin"."""
        return ("difference",) if self.kind == "collapse" else ("difference", "margin")


def groups(cells) -> dict[str, list]:
    """{"stable": cells at the lowest learning rate, "stress": at the highest} (stress empty with one rate)."""
    rates = sorted({c.lr for c in cells})
    return {
        "stable": [c for c in cells if c.lr == rates[0]],
        "stress": [c for c in cells if len(rates) > 1 and c.lr == rates[-1]],
    }


# ------------------------------------------------------------------ data
# The map's data as the questions read it: data[cell name][arm label] = per-seed list of (accuracy, collapsed),
# None where the run has not finished.


def _arms_done(data: dict, cells, arms, seeds: int) -> bool:
    for c in cells:
        for arm in arms:
            runs = data[c.name].get(arm) or ()
            if len(runs) < seeds or None in runs[:seeds]:
                return False
    return True


def _collapse_pairs(q: Question, data: dict, cells, seeds: int) -> tuple[list[bool], list[bool]]:
    a, b = [], []
    for c in cells:
        for s in range(seeds):
            a.append(data[c.name][q.a][s][1])
            b.append(data[c.name][q.b][s][1])
    return a, b


def _survivor_differences(q: Question, data: dict, cells, seeds: int) -> tuple[list[tuple], int]:
    """(cell, seed, a - b) of the pairs where neither run collapsed (fractions); and how many pairs a collapse
    excluded."""
    rows = []
    excluded = 0
    for c in cells:
        for s in range(seeds):
            (acc_a, col_a), (acc_b, col_b) = data[c.name][q.a][s], data[c.name][q.b][s]
            if col_a or col_b:
                excluded += 1
            else:
                rows.append((c.name, s, acc_a - acc_b))
    return rows, excluded


def _interaction_differences(q: Question, data: dict, cells, seeds: int) -> tuple[list[tuple], int]:
    """(depth, seed, (a - b) in the bf16 cell minus (a - b) in the float32 cell of that depth and rate) where none
    of the four runs collapsed; and how many such quadruples a collapse excluded."""
    rows = []
    excluded = 0
    base = {(c.depth, c.lr): c for c in cells if c.mismatch == "none"}
    for c in cells:
        other = base.get((c.depth, c.lr))
        if c.mismatch != "bf16" or other is None:
            continue
        for s in range(seeds):
            runs = [data[x.name][arm][s] for x in (c, other) for arm in (q.a, q.b)]
            if any(col for _, col in runs):
                excluded += 1
                continue
            (a1, _), (b1, _), (a0, _), (b0, _) = runs
            rows.append((f"depth{c.depth}", s, (a1 - b1) - (a0 - b0)))
    return rows, excluded


def _test(q: Question, data: dict, cells, seeds: int) -> dict:
    """The question's test on the first ``seeds`` seeds: its p-values ("difference", and "margin"), estimate and
    interval, and what the seeds-needed estimate reads."""
    if q.kind == "collapse":
        a, b = _collapse_pairs(q, data, cells, seeds)
        found = mcnemar_exact(a, b)
        return {**found, "p": {"difference": found["p"]}, "test": "exact McNemar", "cells": len(cells)}
    split = _survivor_differences if q.kind == "accuracy" else _interaction_differences
    rows, excluded = split(q, data, cells, seeds)
    by_seed: dict[int, list[float]] = {s: [] for s in range(seeds)}
    for _, s, d in rows:
        by_seed[s].append(d)
    pooled = pooled_accuracy(by_seed, MARGIN, "noninferiority" if q.kind == "accuracy" else "equivalence")
    means = [np.mean(v) for v in by_seed.values() if v]
    return {
        "p": {"difference": pooled["p"], "margin": pooled["p_margin"]},
        "test": "paired t over seeds (mean over cells)",
        **{k: pooled[k] for k in ("seeds", "pairs", "mean", "se", "df", "low", "high")},
        "excluded_by_collapse": excluded,
        "rows": rows,
        "seed_sd": float(np.std(means, ddof=1)) if len(means) > 1 else None,
    }


# ------------------------------------------------------------------ decisions
def decide(
    questions: list[Question],
    data: dict,
    cells,
    seeds_of: dict[str, int],
    alpha: float = ALPHA,
    memo: dict | None = None,
) -> list[dict]:
    """Every question answered on the data so far: ``seeds_of[group]`` seeds are asked of every cell of the group
    (looks at LOOKS up to it). Returns one dict per question: name, text, test, ``p_looks`` (per hypothesis, the
    least over the looks of p / the look's share: adjusted for the looks only), ``p_adjusted`` (those, Holm
    step-down adjusted over the family: the p-values a report states), the estimate at the last look, the looks,
    verdict "yes"/"no"/"undecided"/"pending"/"not asked", answer text, and for a question still undecided its
    ``level``, the family's least final-look level, at which :func:`describe` plans the seeds that would decide
    it. A question whose latest look has unfinished runs is "pending" and stays in the family with its last
    complete look's p-values (1 before any), so a map written while runs finish claims no more than its complete
    looks would: Holm rejects no fewer where p-values fall, and a pending one's can only fall. ``memo``: a dict
    kept between the calls of one map, so that a look's tests, which later seeds cannot change, run once."""
    memo = {} if memo is None else memo
    by_group = groups(cells)
    found, members = [], []  # members: (question index, hypothesis, sequential p)
    for i, q in enumerate(questions):
        pooled = by_group[q.group]
        if not pooled:
            found.append({"name": q.key, "question": q.text, "verdict": "not asked"})
            continue
        taken = [look for look in LOOKS if look <= seeds_of.get(q.group, 0)]
        if taken and _arms_done(data, pooled, (q.a, q.b), taken[-1]):
            complete = taken  # a look's seeds include every earlier look's
        else:
            complete = [look for look in taken[:-1] if (q.key, look) in memo or _arms_done(data, pooled, (q.a, q.b), look)]
        looks = []
        for look in complete:
            if (q.key, look) not in memo:
                memo[(q.key, look)] = {"seeds": look, **_test(q, data, pooled, look)}
            looks.append(memo[(q.key, look)])
        p_seq, at_look = {}, {}
        for h in q.hypotheses():
            ps = [(look["p"][h] / share, k) for k, (look, share) in enumerate(zip(looks, LOOK_SHARES))
                  if look["p"].get(h) is not None]
            p_seq[h], at_look[h] = min(ps) if ps else (1.0, None)
            p_seq[h] = min(1.0, p_seq[h])
            members.append((i, h, p_seq[h]))
        entry = {"name": q.key, "question": q.text, "looks": looks, "p_looks": p_seq}
        if not taken or len(complete) < len(taken):
            entry["verdict"] = "pending"
        else:
            entry.update(last=looks[-1], rejecting_look={h: None if k is None else looks[k]["seeds"]
                                                         for h, k in at_look.items()})
        found.append(entry)
    family = [p for _, _, p in members]
    rejected = dict(zip(((i, h) for i, h, _ in members), holm(family, alpha)))
    adjusted = dict(zip(((i, h) for i, h, _ in members), holm_adjusted(family)))
    least = alpha * LOOK_SHARES[-1] / max(len(members), 1)  # Holm's first step at the last look
    for i, q in enumerate(questions):
        entry = found[i]
        if "p_looks" in entry:
            entry["p_adjusted"] = {h: adjusted[(i, h)] for h in q.hypotheses()}
        if "last" not in entry:
            continue
        by_look = {look["seeds"]: look for look in entry["looks"]}
        rejecting = {h: by_look.get(seeds) for h, seeds in entry["rejecting_look"].items()}
        entry.update(_verdict(q, rejecting, {h: rejected[(i, h)] for h in q.hypotheses()}))
        entry["test"] = entry["last"]["test"]
        entry["seeds"] = entry["last"].get("seeds", seeds_of.get(q.group))
        if entry["verdict"] == "undecided":
            entry["level"] = least
    return found


def _verdict(q: Question, looks: dict[str, dict | None], rejected: dict[str, bool]) -> dict:
    """yes / no / undecided and the answer's words, from the hypotheses Holm rejected and the direction each
    showed at the look that rejected it (``looks``: hypothesis -> that look's test; the least p / share). A
    rejection without a direction (equal counts, a mean of 0) decides nothing."""
    if q.kind == "collapse":
        look = looks["difference"]
        if rejected["difference"] and look["a_only"] != look["b_only"]:
            more = q.a if look["a_only"] > look["b_only"] else q.b
            verdict = "yes" if more == q.a else "no"
            return {"verdict": verdict, "answer": f"{verdict}: {more} collapses more often"}
        return {"verdict": "undecided", "answer": "undecided"}
    mean = None if looks["difference"] is None else looks["difference"].get("mean")
    if q.kind == "accuracy":
        if rejected["difference"] and mean is not None and mean < 0:
            by = ", by less than 5 points" if rejected["margin"] else ""
            return {"verdict": "yes", "answer": f"yes: {q.a} is worse than {q.b}{by}"}
        if rejected["difference"] and mean is not None and mean > 0:
            return {"verdict": "no", "answer": f"no: {q.a} is better than {q.b}"}
        if rejected["margin"]:
            return {"verdict": "no", "answer": f"no: {q.a} is not worse than {q.b} by 5 points or more"}
        return {"verdict": "undecided", "answer": "undecided"}
    if rejected["difference"]:
        return {"verdict": "yes", "answer": f"yes: the bf16 mismatch changes {q.a} - {q.b}"}
    if rejected["margin"]:
        return {"verdict": "no", "answer": f"no: the bf16 mismatch changes {q.a} - {q.b} by less than 5 points"}
    return {"verdict": "undecided", "answer": "undecided"}


def describe(questions: list[Question], answers: list[dict]) -> None:
    """What a report adds to :func:`decide`'s answers, beyond the decisions: for a pooled accuracy or interaction
    question, whether its cells differ (``cells_differ``: the two-way ANOVA F-test of the cell effect with seeds as
    blocks, :func:`kpo.compare.stats.cells_differ`); for one undecided (it has a ``level``),
    ``seeds_needed``: the seeds per cell an 80%-power test at that level would need to decide it from what was
    measured (None: no spread or no discordant pair to go by)."""
    for q, entry in zip(questions, answers):
        last = entry.get("last")
        if last and "rows" in last:
            last["cells_differ"] = cells_differ(last["rows"])
        if "level" in entry:
            entry["seeds_needed"] = _seeds_needed(q, entry["last"], entry["level"])


def _seeds_needed(q: Question, last: dict, level: float) -> int | None:
    if q.kind == "collapse":
        return discordance_seeds(last["a_only"], last["b_only"], last["pairs"], last["cells"], level)
    sd, mean = last.get("seed_sd"), last.get("mean")
    if sd is None or mean is None:
        return None
    # the nearer of the two decisions: the difference itself, or the margin on the side the estimate lies
    distance = MARGIN - abs(mean) if q.kind == "interaction" else mean + MARGIN
    options = [n for n in (seeds_for_effect(sd, mean, level), seeds_for_effect(sd, distance, level)) if n]
    if not options:
        return None
    # the test reads the surviving pairs only: seeds in proportion to the pairs a collapse left out
    kept = last["pairs"]
    return math.ceil(min(options) * (kept + last["excluded_by_collapse"]) / kept)


def groups_to_extend(answers: list[dict], questions: list[Question], seeds_of: dict[str, int]) -> list[str]:
    """The groups whose cells get the next block of seeds: a question of theirs is undecided and they are below
    the last look."""
    want = set()
    for q, entry in zip(questions, answers):
        seeds = seeds_of.get(q.group, 0)
        if entry["verdict"] == "undecided" and seeds < LOOKS[-1]:
            want.add(q.group)
    return sorted(want)


def next_look(seeds: int) -> int:
    """The seeds of the look after ``seeds`` (the cap when past it)."""
    return next((look for look in LOOKS if look > seeds), LOOKS[-1])


def rules_text() -> dict[str, str]:
    """The design as plan.json records it before any run."""
    return {
        "questions": "pooled over the stable cells (the map's lowest learning rate) or the stress cells (its "
        "highest); collapse questions: exact McNemar test on the (cell, seed) pairs; accuracy questions: on the "
        "pairs where neither run collapsed, paired t-test over seeds of each seed's mean difference over the "
        "pooled cells, with a non-inferiority test at -5 points; interaction (does bf16 change a contrast): the "
        "per-seed difference of the contrast between the bf16 and float32 cell of each depth, t-test and TOST at "
        "+-5 points",
        "multiplicity": f"Holm at {ALPHA:g} over every hypothesis of every question; the p-values reported are "
        "Holm step-down adjusted; a question whose latest look has unfinished runs keeps its last complete look's "
        "p-values in the family (1 before any)",
        "sequential": f"looks at {', '.join(map(str, LOOKS))} seeds a cell; the cells of a question still "
        "undecided get the next block; the error is split over the looks "
        f"({', '.join(f'{s:.0%}' for s in LOOK_SHARES)}, weighted Bonferroni): a p-value at a look is divided by "
        "its look's share and a hypothesis takes the least over its looks",
        "seeds needed": "for a question undecided at a look: the seeds per cell an 80%-power test at "
        f"alpha x {LOOK_SHARES[-1]:.0%} / hypotheses would need, from the measured seed-to-seed sd (statsmodels "
        "TTestPower; for a test on the surviving pairs, in proportion to the pairs a collapse left out) or "
        "discordance (exact binomial power); post-hoc, at the measured effect",
    }

