"""The confirmatory study (``kpo compare study``): a few questions about where KPO helps, fixed in a plan that is
written and committed before the first run, on seeds no earlier experiment has read, sized by simulation and
answered by a gatekept, group-sequential design. This module holds the design, its simulation and its analysis
(no training: :mod:`kpo.compare.study_run` runs it).

The design (:func:`design`, recorded in ``plan.json``):

- **questions in order.** A primary question is the gate, tested at the full level: at the stress learning rate,
  does GRPO collapse where KPO (matched) does not? Only once it is rejected is the family tested, Holm at the
  full level over its members (serial gatekeeping: the family-wise error stays at ``ALPHA`` in the strong sense).
  Collapse questions use the exact McNemar test on the (cell, seed) pairs of the pooled cells; accuracy questions
  the exact two-sided sign-flip permutation test of each seed's mean difference over the cells of one depth, over
  all pairs, collapsed or not (no normality assumed, nothing conditioned on survival). Contrasts are tested per
  depth where the exploratory map saw them differ by depth.
- **cells that carry information.** Collapse questions read the stress rate at depth 4 (at depth 16 nearly every
  arm collapsed in the exploratory map: few discordant pairs); accuracy questions the stable rate.
- **looks and spending.** Each group of cells has its looks (seeds a cell); the error of a group with two looks is
  spent by Lan-DeMets' O'Brien-Fleming function at the interim's information fraction, alpha_1 = 2 - 2
  Phi(z_{1-alpha/2} / sqrt(t)), and the rest at the final look, as a weighted Bonferroni split: a hypothesis's
  p-value at look k divided by alpha_k / alpha, its sequential p-value the least over its looks (valid whatever
  the looks' correlation and whatever made the study stop). A group whose test cannot reach the interim's level
  (the sign-flip test's smallest p at 6 seeds is 1/32) has one look.
- **arms stop** once every hypothesis that reads them is decided.
- **collapse** is defined once, before any run (:data:`COLLAPSE`), from the exploratory map's final accuracies;
  the report shows the primary answer at the other thresholds beside it.
- **seeds** are new (from :data:`FIRST_SEED` up, above every seed the exploratory map ran), admitted in order; a
  seed whose warm start fails its check is dropped for every arm and cell before any of its runs and the next
  unused seed takes its place (the check reads no arm's result, so dropping cannot favour one); the report lists
  the dropped seeds and their rate.

The simulation (:func:`simulate`) resamples the exploratory map's depth-4 stress (cell, seed) collapse patterns and
draws the stable cells' per-seed differences from normal laws at the measured mean and sd; it reports each
hypothesis's power at the measured effects and at effects a third smaller, and the family-wise error under the
global null and under each partial null (one hypothesis true, the others at the measured effects).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kpo.compare.questions import Question
from kpo.compare.regimes import BATCHES
from kpo.compare.stats import spending

__all__ = [
    "ALPHA",
    "COLLAPSE",
    "FIRST_SEED",
    "StudyQuestion",
    "analyze",
    "collapsed",
    "design",
    "simulate",
    "sign_flip_p",
    "spending",
]

ALPHA = 0.05
FIRST_SEED = 8  # the exploratory map planned seeds 0-7 (it ran 0-5): the study's seeds are all new
GRPO, KPO, BAND, AUTO, GSPO = "GRPO", "KPO (matched)", "clip band", "KPO (auto)", "GSPO"
# kpo compare's arm of each label: (method, loss overrides); see kpo.compare.plan.ABLATIONS
ARMS = {
    GRPO: ("vanilla", ()),
    KPO: ("kpo", (("memory", "matched"),)),
    BAND: ("vanilla", (("clip_ratio_low", 3e-4), ("clip_ratio_high", 4e-4))),
    AUTO: ("kpo", (("memory", "auto"),)),
    GSPO: ("gspo", ()),
}
# Collapse, fixed before any run. In the exploratory map (96 runs at the stress rate) final accuracies are 0.0-1.7
# (27 runs), 8.0 (1), 16.7-28.0 (9) and 29.7 or more, against warm starts of 20.8-25.1: "below the warm start"
# splits the 16.7-28.0 runs by a point either side of their warm start (GSPO at 21.7 against 22.7 collapsed, the
# band at 23.1 against 22.7 did not). A run that lost half of what its warm start knew has not merely stood still.
COLLAPSE = {"rule": "below_fraction_of_warm", "value": 0.5}
SENSITIVITY = (
    {"rule": "below_absolute", "value": 0.05},  # near zero: the run forgot the task
    {"rule": "below_fraction_of_warm", "value": 1.0},  # below its warm start: the exploratory map's rule
    {"rule": "below_fraction_of_warm", "value": 0.75},
)


def collapsed(accuracy: float, warm: float, rule: dict = COLLAPSE) -> bool:
    """Whether a run whose final accuracy is ``accuracy`` (a fraction) collapsed from its seed's warm start ``warm``
    under ``rule`` ({"rule": "below_fraction_of_warm" | "below_absolute", "value"})."""
    if rule["rule"] == "below_fraction_of_warm":
        return accuracy < rule["value"] * warm
    if rule["rule"] == "below_absolute":
        return accuracy < rule["value"]
    raise ValueError(f"collapse rule {rule['rule']!r}: use below_fraction_of_warm or below_absolute")


def rule_text(rule: dict) -> str:
    if rule["rule"] == "below_absolute":
        return f"final accuracy below {100 * rule['value']:g}%"
    if rule["value"] == 1.0:
        return "final accuracy below its warm start's"
    return f"final accuracy below {rule['value']:g} x its warm start's"


@dataclass(frozen=True)
class StudyQuestion(Question):
    """A question of the study (:class:`kpo.compare.questions.Question`: ``kind`` "collapse" or "accuracy", arm
    labels ``a`` and ``b``: whether ``a`` collapses more, or is less accurate, than ``b``), with the ``cells`` of
    its ``group`` that it pools and its ``role``: "primary" (the gate) or "family"."""

    cells: tuple[str, ...]
    role: str


STRESS = ("none-depth4-lr0.0005", "bf16-depth4-lr0.0005")
STABLE_DEPTH4 = ("none-depth4-lr0.0001", "bf16-depth4-lr0.0001")
STABLE_DEPTH16 = ("none-depth16-lr0.0001", "bf16-depth16-lr0.0001")
QUESTIONS = (
    StudyQuestion("grpo_collapses", "At the stress rate (depth 4), does GRPO collapse where KPO (matched) does not?",
                  "collapse", GRPO, KPO, "stress", STRESS, "primary"),
    StudyQuestion("band_collapses", "Filter or band: at the stress rate (depth 4), does the clip band without the "
                  "filter collapse where KPO (matched) does not?", "collapse", BAND, KPO, "stress", STRESS, "family"),
    StudyQuestion("auto_collapses", "At the stress rate (depth 4), does KPO (auto) collapse where KPO (matched) "
                  "does not?", "collapse", AUTO, KPO, "stress", STRESS, "family"),
    StudyQuestion("kpo_vs_gspo_depth4", "At the stable rate and depth 4, is KPO (matched) less accurate than GSPO?",
                  "accuracy", KPO, GSPO, "stable", STABLE_DEPTH4, "family"),
)
GROUP_ARMS = {"stress": (GRPO, KPO, BAND, AUTO), "stable": (KPO, GSPO)}


# ------------------------------------------------------------------ the tests
def sign_flip_p(d) -> float:
    """Two-sided p of the exact sign-flip permutation test of mean(d) = 0 (``d``: per-seed differences), from
    ``scipy.stats.permutation_test`` (every one of the 2^n sign patterns for n <= 20; 1.0 with no spread)."""
    from scipy.stats import permutation_test

    d = np.asarray(d, dtype=np.float64)
    if d.size == 0 or not np.any(d != 0):
        return 1.0
    found = permutation_test(
        (d,), np.mean, permutation_type="samples", alternative="two-sided", n_resamples=np.inf, vectorized=True
    )
    return float(min(1.0, found.pvalue))


def _sign_flip_many(d: np.ndarray) -> np.ndarray:
    """:func:`sign_flip_p` of every row of ``d`` [sims, n] at once, for the simulation (the exact null over all 2^n
    sign patterns, as scipy enumerates it; a test checks the two agree)."""
    n = d.shape[1]
    signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # [2^n, n]
    out = np.empty(d.shape[0])
    for lo in range(0, d.shape[0], 256):
        chunk = d[lo : lo + 256]
        null = np.abs(signs @ chunk.T)  # [2^n, chunk]: |sum| is |mean| x n
        observed = np.abs(chunk.sum(axis=1))
        # scipy counts null statistics within a relative 1e-14 of the observed one as at least as extreme
        out[lo : lo + 256] = np.mean(null >= observed * (1 - 1e-14), axis=0)
    return np.minimum(out, 1.0)


def _mcnemar_many(a_only: np.ndarray, b_only: np.ndarray) -> np.ndarray:
    """Exact two-sided McNemar p of discordant counts (arrays), as :func:`kpo.compare.stats.mcnemar_exact`."""
    from scipy.special import bdtr

    n = a_only + b_only
    p = np.where(n > 0, 2.0 * bdtr(np.minimum(a_only, b_only), np.maximum(n, 1), 0.5), 1.0)
    return np.minimum(p, 1.0)


def gate_and_holm(p_seq: dict[str, float], questions=QUESTIONS, alpha: float = ALPHA) -> tuple[dict, dict]:
    """The decisions on sequential p-values ``p_seq`` (question key -> p): the primary at ``alpha``; if rejected,
    Holm at ``alpha`` over the family (:func:`kpo.compare.stats.holm_adjusted`, statsmodels' values). Returns
    (rejected, adjusted p): a family member's adjusted p is the larger of the primary's p and its Holm-adjusted p
    (the least level at which the gatekept procedure rejects it)."""
    from kpo.compare.stats import holm_adjusted

    primary = next(q.key for q in questions if q.role == "primary")
    family = [q.key for q in questions if q.role == "family"]
    adjusted = {primary: min(1.0, p_seq[primary])}
    holm_p = holm_adjusted([p_seq[k] for k in family]) if family else []
    for key, p in zip(family, holm_p):
        adjusted[key] = float(max(adjusted[primary], p))
    return {k: bool(p <= alpha) for k, p in adjusted.items()}, adjusted


# ------------------------------------------------------------------ the design
def design(exploratory: dict, stress_looks=(14, 28), stable_looks=(12,), sims: int = 2000, seed: int = 0) -> dict:
    """The plan: the questions in order, cells, arms, seeds, looks and spending, the collapse definition and the
    seed rule, with the simulation's inputs (from ``exploratory``, the exploratory map's report.json) and its
    power and family-wise error at these looks. Everything a run of the study reads comes from here."""
    inputs = simulation_inputs(exploratory)
    looks = {"stress": list(stress_looks), "stable": list(stable_looks)}
    sim = simulate(inputs, looks, sims=sims, seed=seed)
    cells = {g: sorted({c for q in QUESTIONS if q.group == g for c in q.cells}) for g in looks}
    runs = sum(len(cells[g]) * len(GROUP_ARMS[g]) * looks[g][-1] for g in looks)
    return {
        "study": "confirmatory",
        "alpha": ALPHA,
        "questions": [asdict(q) for q in QUESTIONS],
        "groups": {
            g: {"cells": cells[g], "arms": list(GROUP_ARMS[g]), "looks": looks[g], "spending": spending(ALPHA, looks[g])}
            for g in looks
        },
        "arms": {label: {"method": m, "loss_kwargs": [list(kv) for kv in kw]} for label, (m, kw) in ARMS.items()},
        "runs_at_most": runs,
        # every run as the exploratory map's (kpo compare regimes' defaults): the cell fixes the rest
        "run_settings": {"batches": BATCHES, "eval_n": 4, "eval_limit": None, "train_args": []},
        "first_seed": FIRST_SEED,
        "collapse": COLLAPSE,
        "collapse_text": rule_text(COLLAPSE),
        "sensitivity": list(SENSITIVITY),
        "rules": {
            "order": "the primary question is the gate, at the full level; the family is tested only once the gate "
            "is rejected, Holm at the full level over its members (serial gatekeeping)",
            "tests": "collapse: exact McNemar on the (cell, seed) pairs of the question's cells, two-sided; "
            "accuracy: exact sign-flip permutation test (scipy) of each seed's mean difference over the question's "
            "cells, all pairs, two-sided",
            "looks": "a look is taken when every run of the active arms of its group has finished on the first N "
            "admitted seeds; a hypothesis's p at look k is divided by alpha_k / alpha (Lan-DeMets O'Brien-Fleming "
            "spending, weighted Bonferroni split) and its sequential p is the least over its looks",
            "stopping": "an arm stops once every hypothesis that reads it is rejected; the study ends when every "
            "hypothesis is rejected or at its last look",
            "direction": "the estimate at the look whose p gave the sequential p (the look that rejected)",
            "seeds": f"new seeds from {FIRST_SEED} up, in order; a seed whose warm start fails its check is dropped for "
            "every arm and cell before any run of it, and the next unused seed takes its place",
            "confirmatory": "the study is confirmatory only if plan.json was committed before its first run "
            "started; the report checks it against git",
            "simulation": "stress: the exploratory map's depth-4 stress (cell, seed) collapse patterns resampled "
            "(its seeds 0-5; the questions were chosen after seeds 0-3, so its effects may be inflated: hence the "
            "power at effects a third smaller); a collapse effect scaled by randomising each pair's two arms with "
            "probability 1 - scale; stable: normal per-seed differences at the measured mean and sd",
            "left out": "KPO (matched) - GSPO at the stable rate and depth 16 (exploratory -4.0 points, sd 5.9 "
            "over seeds): 57% power at 12 seeds in the simulation, about 30 seeds a cell for 90%; it stays "
            "exploratory",
        },
        "simulation": {"inputs": inputs, **sim},
    }


def simulation_inputs(exploratory: dict) -> dict:
    """What the simulation resamples, from the exploratory map's report.json: the (cell, seed) collapse patterns
    of the stress cells (arms in GROUP_ARMS["stress"] order) under :data:`COLLAPSE`, and per stable question the
    per-seed mean difference a - b over its cells (fractions)."""
    cells = {c["cell"]: c for c in exploratory["cells"]}

    def per_seed(cell: str, label: str) -> list[float]:
        arm = next(a for a in cells[cell]["arms"].values() if a["label"] == label)
        return arm["accuracy"]

    patterns = []
    for name in STRESS:
        warm = cells[name]["warm_start"]
        acc = {label: per_seed(name, label) for label in GROUP_ARMS["stress"]}
        for s, w in enumerate(warm):
            patterns.append([int(collapsed(acc[label][s], w)) for label in GROUP_ARMS["stress"]])
    stable = {}
    for q in QUESTIONS:
        if q.kind == "accuracy":
            d = np.mean([np.subtract(per_seed(c, q.a), per_seed(c, q.b)) for c in q.cells], axis=0)
            stable[q.key] = {"per_seed": d.tolist(), "mean": float(d.mean()), "sd": float(d.std(ddof=1))}
    return {"stress_patterns": patterns, "accuracy": stable, "source_seeds": len(cells[STRESS[0]]["warm_start"])}


def simulate(inputs: dict, looks: dict, sims: int = 2000, seed: int = 0) -> dict:
    """Power and family-wise error of the design at ``looks`` ({group: seeds at each look}) by ``sims`` simulated
    studies: {"power": {scale: {question: P(rejected)}, ...} at the measured effects (scale 1) and a third smaller
    (2/3), "joint_power", "fwer": {scenario: P(a true hypothesis rejected)} for the global null and each partial
    null, "sims"}. A collapse question's effect is scaled by randomising each pair's two arms with probability 1 -
    scale (its discordant pairs then fall on either side evenly: scale 0 is its null, with the measured discordance
    rate and dependence kept); an accuracy question's draws are normal at scale x the measured mean, measured sd."""
    rng = np.random.default_rng(seed)
    scenarios = {"global null": {q.key: 0.0 for q in QUESTIONS}}
    scenarios |= {f"{q.key} null": {k.key: (0.0 if k is q else 1.0) for k in QUESTIONS} for q in QUESTIONS}
    out = {"sims": sims, "power": {}, "joint_power": {}, "fwer": {}}
    for scale in (1.0, 2 / 3):
        rejected = _simulate_once(inputs, looks, {q.key: scale for q in QUESTIONS}, sims, rng)
        key = "measured" if scale == 1.0 else "a third smaller"
        out["power"][key] = {k: float(v.mean()) for k, v in rejected.items()}
        out["joint_power"][key] = float(np.mean(np.all(list(rejected.values()), axis=0)))
    for name, scales in scenarios.items():
        rejected = _simulate_once(inputs, looks, scales, sims, rng)
        nulls = [k for k, s in scales.items() if s == 0.0]
        out["fwer"][name] = float(np.mean(np.any([rejected[k] for k in nulls], axis=0)))
    return out


def _simulate_once(inputs: dict, looks: dict, scales: dict, sims: int, rng) -> dict[str, np.ndarray]:
    """Which questions each of ``sims`` simulated studies rejects (question -> bool [sims])."""
    arms = GROUP_ARMS["stress"]
    patterns = np.asarray(inputs["stress_patterns"], dtype=bool)
    stress_looks, stable_looks = looks["stress"], looks["stable"]
    pairs = stress_looks[-1] * len(STRESS)
    drawn = patterns[rng.integers(0, len(patterns), size=(sims, pairs))]  # [sims, pairs, arms], seed-major
    p_seq = {}
    for q in QUESTIONS:
        if q.kind == "collapse":
            a, b = drawn[..., arms.index(q.a)].copy(), drawn[..., arms.index(q.b)].copy()
            swap = (rng.random(a.shape) > scales[q.key]) & (rng.random(a.shape) < 0.5)
            a, b = np.where(swap, b, a), np.where(swap, a, b)
            alphas = spending(ALPHA, tuple(stress_looks))
            ps = []
            for n, share in zip(stress_looks, alphas):
                k = n * len(STRESS)
                p = _mcnemar_many((a[:, :k] & ~b[:, :k]).sum(1), (~a[:, :k] & b[:, :k]).sum(1))
                ps.append(np.minimum(1.0, p * ALPHA / share))
            p_seq[q.key] = np.min(ps, axis=0)
        else:
            law = inputs["accuracy"][q.key]
            d = rng.normal(scales[q.key] * law["mean"], law["sd"], size=(sims, stable_looks[-1]))
            alphas = spending(ALPHA, tuple(stable_looks))
            ps = [np.minimum(1.0, _sign_flip_many(d[:, :n]) * ALPHA / share) for n, share in zip(stable_looks, alphas)]
            p_seq[q.key] = np.min(ps, axis=0)
    return _decide_many(p_seq)


def _decide_many(p_seq: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`gate_and_holm`'s decisions for many simulated studies at once (a test checks they agree)."""
    primary = next(q.key for q in QUESTIONS if q.role == "primary")
    family = [q.key for q in QUESTIONS if q.role == "family"]
    gate = p_seq[primary] <= ALPHA
    p = np.stack([p_seq[k] for k in family], axis=1)  # [sims, m]
    order = np.argsort(p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=1)
    passes = sorted_p <= ALPHA / np.arange(p.shape[1], 0, -1)
    upto = np.cumprod(passes, axis=1).astype(bool)  # step-down: reject while every smaller p passed
    reject_sorted = upto & gate[:, None]
    reject = np.zeros_like(reject_sorted)
    np.put_along_axis(reject, order, reject_sorted, axis=1)
    return {primary: gate, **{k: reject[:, i] for i, k in enumerate(family)}}


# ------------------------------------------------------------------ the analysis
def _question(plan: dict, key: str) -> StudyQuestion:
    q = next(q for q in plan["questions"] if q["key"] == key)
    return StudyQuestion(**{**q, "cells": tuple(q["cells"])})


def _test(q: StudyQuestion, data: dict, seeds: list[int], rule: dict) -> dict:
    """The question's test on ``seeds``: collapse, the exact McNemar test on the (cell, seed) pairs; accuracy,
    the sign-flip test of each seed's mean difference over the cells, with a bootstrap interval (scipy,
    descriptive)."""
    from kpo.compare.stats import mcnemar_exact

    if q.kind == "collapse":
        a = [collapsed(*data[c][q.a][s], rule) for s in seeds for c in q.cells]
        b = [collapsed(*data[c][q.b][s], rule) for s in seeds for c in q.cells]
        found = mcnemar_exact(a, b)
        return {"test": "exact McNemar", "seeds": len(seeds), **found, "estimate": found["a_only"] - found["b_only"]}
    d = np.mean([[data[c][q.a][s][0] - data[c][q.b][s][0] for s in seeds] for c in q.cells], axis=0)
    low, high = _bootstrap_interval(d)
    return {
        "test": "exact sign-flip permutation test",
        "seeds": len(seeds),
        "p": sign_flip_p(d),
        "estimate": float(d.mean()),
        "low": low,
        "high": high,
        "per_seed": d.tolist(),
        "sd": float(d.std(ddof=1)) if d.size > 1 else None,
    }


def _bootstrap_interval(d: np.ndarray) -> tuple[float | None, float | None]:
    """The 95% BCa bootstrap interval of the mean of ``d`` (scipy.stats.bootstrap, fixed seed), None without
    spread."""
    from scipy.stats import bootstrap

    if d.size < 3 or np.all(d == d[0]):
        return None, None
    found = bootstrap((d,), np.mean, n_resamples=4999, method="BCa", random_state=np.random.default_rng(0))
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def analyze(plan: dict, data: dict, seeds: list[int], rule: dict | None = None) -> dict:
    """The study on its data so far: ``data[cell][arm label][seed] = (final accuracy, warm start accuracy)`` for
    every finished run, ``seeds`` the admitted seeds in order. The looks are taken in order while their runs are
    all there (a look reads the first N admitted seeds of its group's active arms); an arm is active at a look
    while a hypothesis that reads it is undecided. Returns {"looks": [...], "questions": {key: answer},
    "active": the arms per group the next look needs, "next": {group: seeds} or None when the study has ended}.
    ``rule``: the collapse rule (the plan's by default; the sensitivity analysis passes others)."""
    rule = rule or plan["collapse"]
    questions = [_question(plan, q["key"]) for q in plan["questions"]]
    groups = plan["groups"]
    alphas = {g: groups[g]["spending"] for g in groups}
    taken: dict[str, list[dict]] = {q.key: [] for q in questions}
    p_seq = {q.key: 1.0 for q in questions}
    rejected = {q.key: False for q in questions}
    adjusted = {q.key: 1.0 for q in questions}
    looks = []
    for k in range(max(len(g["looks"]) for g in groups.values())):
        wanted = {g: groups[g]["looks"][k] for g in groups if k < len(groups[g]["looks"])}
        live = [q for q in questions if q.group in wanted and not rejected[q.key]]
        if not live:
            break
        if not all(_complete(data, q, seeds, wanted[q.group]) for q in live):
            return _answers(plan, questions, taken, p_seq, rejected, adjusted, looks, wanted, live)
        for q in live:
            found = _test(q, data, seeds[: wanted[q.group]], rule)
            found["p_look"] = min(1.0, found["p"] * plan["alpha"] / alphas[q.group][k])
            taken[q.key].append(found)
            p_seq[q.key] = min(p_seq[q.key], found["p_look"])
        rejected, adjusted = gate_and_holm(p_seq, questions, plan["alpha"])
        looks.append({"look": k + 1, "seeds": wanted, "rejected": [key for key, r in rejected.items() if r]})
    return _answers(plan, questions, taken, p_seq, rejected, adjusted, looks, None, [])


def _complete(data: dict, q: StudyQuestion, seeds: list[int], n: int) -> bool:
    if len(seeds) < n:
        return False
    return all(s in data.get(c, {}).get(arm, {}) for c in q.cells for arm in (q.a, q.b) for s in seeds[:n])


def _answers(plan, questions, taken, p_seq, rejected, adjusted, looks, wanted, live) -> dict:
    """Each question's answer: its looks, sequential and adjusted p, decision and words."""
    answers = {}
    for q in questions:
        found = taken[q.key]
        last_look = len(plan["groups"][q.group]["looks"])
        entry = {
            "question": q.text,
            "role": q.role,
            "kind": q.kind,
            "a": q.a,
            "b": q.b,
            "cells": list(q.cells),
            "looks": found,
            "p_sequential": p_seq[q.key] if found else None,
            "p_adjusted": adjusted[q.key] if found else None,
            "rejected": rejected[q.key],
        }
        if rejected[q.key]:
            deciding = min(found, key=lambda x: x["p_look"])  # the look that rejected
            entry["decided_at_seeds"] = deciding["seeds"]
            entry["estimate"] = deciding["estimate"]
            entry["verdict"], entry["answer"] = _direction(q, deciding)
        elif found and len(found) == last_look and (q.role == "primary" or wanted is None):
            entry["verdict"], entry["answer"] = "undecided", "undecided at the study's cap"
            entry["estimate"] = found[-1]["estimate"]
        elif found and len(found) == last_look:
            # a family member's own looks are spent, but its decision is the gate's and Holm's over the whole
            # family, and those p-values still fall while another group's looks run
            entry["verdict"] = "open"
            entry["answer"] = "open: its looks are taken; its decision waits for the gate and Holm at the study's end"
            entry["estimate"] = found[-1]["estimate"]
        else:
            entry["verdict"], entry["answer"] = "open", "open: its next look has not been taken"
            entry["estimate"] = found[-1]["estimate"] if found else None
        answers[q.key] = entry
    active = {}
    for q in live:
        active.setdefault(q.group, set()).update((q.a, q.b))
    return {
        "looks": looks,
        "questions": answers,
        "next": wanted,
        "active": {g: sorted(arms) for g, arms in active.items()},
    }


def _direction(q: StudyQuestion, look: dict) -> tuple[str, str]:
    """yes / no and the answer's words for a rejected hypothesis, from the estimate at the look that rejected."""
    if q.kind == "collapse":
        if look["a_only"] > look["b_only"]:
            return "yes", f"yes: {q.a} collapses where {q.b} does not ({look['a_only']} pairs to {look['b_only']})"
        return "no", f"no: {q.b} collapses where {q.a} does not ({look['b_only']} pairs to {look['a_only']})"
    points = 100 * look["estimate"]
    if look["estimate"] < 0:
        return "yes", f"yes: {q.a} is less accurate than {q.b}, by {-points:.1f} points"
    return "no", f"no: {q.a} is more accurate than {q.b}, by {points:.1f} points"
