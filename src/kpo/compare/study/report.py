"""A study's report: ``report.json`` (the answers with their tests, sequential and adjusted p, the seeds, the
sensitivity analyses, whether the study is confirmatory), ``report.md`` (the answers first) and the descriptive
figures beside the tests (:mod:`kpo.compare.study.plots`). The tests decide; the rest describes:

- **sensitivity**: each collapse question under the plan's other collapse rules; where the plan registered
  (cell, seed) pairs as the unit (the first study), every question again with the seed as the unit; where some of
  its runs repeat results committed before the plan, each such question without those seeds.
- **descriptive**: per group, per cell and arm, collapses (exact interval) and final accuracy; per arm the
  interquartile mean with its stratified bootstrap interval and the probability of improving on the group's
  reference arm (the one most of its questions read), in the convention of Agarwal et al. 2021.

Written whole at every step of the study.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import numpy as np

from kpo._files import replacing, write_json
from kpo.compare.stats import MOST_SEEDS, collapse_count, discordance_seeds, rate_interval, seeds_for_effect
from kpo.compare.study.looks import analyze, gate_and_holm, look_test
from kpo.compare.study.plan import collapsed, group_arms, rule_text
from kpo.compare.study.registration import confirmatory, repeats

__all__ = ["batch_of_collapse", "probability_of_improvement", "write_study_report"]


def batch_of_collapse(rewards: list[float]) -> int | None:
    """The generation batch (1-based) from which a run's training reward stays below half its first batch's to
    the end, None where it never does (a descriptive time of collapse)."""
    if not rewards:
        return None
    floor = 0.5 * rewards[0]
    for b in range(len(rewards)):
        if all(r < floor for r in rewards[b:]):
            return b + 1
    return None


def _seeds_needed(entry: dict, plan: dict, gate_open: bool) -> tuple[int | None, str]:
    """For a question undecided at its cap, post-hoc, as if the measured effect were true: the seeds (per cell) an
    80%-power test would need, and what deciding it would take in words. The level is the gate's own (the plan's
    alpha) for the primary or a family without a gate, else Holm's first threshold (alpha over the family), the
    strictest it can face; the power is McNemar's exact binomial one for (cell, seed) pairs, else the t-test's as
    the sign-flip test's approximation (None where no effect was measured or, for pairs, beyond ``MOST_SEEDS``). A
    family member behind a closed gate needs the gate's rejection first."""
    last, family = entry["looks"][-1], sum(q["role"] == "family" for q in plan["questions"])
    level = plan["alpha"] if entry["role"] == "primary" else plan["alpha"] / max(1, family)
    if entry["test"] == "mcnemar-pairs":
        n = discordance_seeds(last["a_only"], last["b_only"], last["pairs"], len(entry["cells"]), level)
    else:
        n = seeds_for_effect(last.get("sd"), last["estimate"], level)
    power = f"80% power at level {level:.2g}"
    if n is not None:
        words = f"about {n} seeds per cell for {power}, if the measured effect were the true one (post-hoc)"
    elif entry["test"] == "mcnemar-pairs" and last["a_only"] != last["b_only"]:
        words = (f"more than {MOST_SEEDS} seeds per cell for {power}, if the measured {last['a_only']} to "
                 f"{last['b_only']} of {last['pairs']} pairs were the true effect (post-hoc)")
    else:
        words = "no number of seeds: the measured effect is 0 (or its spread unknown)"
    if not gate_open and entry["role"] != "primary" and any(q["role"] == "primary" for q in plan["questions"]):
        words = f"the gate's rejection first, then {words}"
    return n, words


def probability_of_improvement(xs, ys):
    """P(a run of X beats a run of Y), ties counted half, averaged over cells: per cell Mann-Whitney's U / (n m)
    (``xs``, ``ys``: per cell the runs' accuracies, [..., n] with any leading batch axes, as scipy's bootstrap
    passes them; a test checks it against ``scipy.stats.mannwhitneyu``)."""
    per_cell = [
        np.mean((x[..., :, None] > y[..., None, :]) + 0.5 * (x[..., :, None] == y[..., None, :]), axis=(-2, -1))
        for x, y in zip(xs, ys)
    ]
    return np.mean(per_cell, axis=0)


def reference_arm(plan: dict, group: str) -> str:
    """The arm most of the group's questions read (the first such in the plan's order): what the others are set
    against in the descriptive tables."""
    arms = group_arms(plan, group)
    reads = [sum(a in (q["a"], q["b"]) for q in plan["questions"] if q["group"] == group) for a in arms]
    return arms[int(np.argmax(reads))]


def _descriptive(plan: dict, records: dict) -> dict:
    """Per group, per cell and arm: collapses (count, exact 95% interval), final accuracies, when collapsed runs
    fell; per arm the interquartile mean with its stratified bootstrap interval, and each arm's probability of
    improving on the reference arm (Mann-Whitney's U / (n m), averaged over cells, stratified bootstrap)."""
    from scipy.stats import bootstrap, trim_mean

    out = {}
    for group, g in plan["groups"].items():
        arms, cells = group_arms(plan, group), {}
        for c in g["cells"]:
            cells[c] = {}
            for a in arms:
                rows = sorted((r["seed"], r) for r in records.values() if r["cell"] == c and r["arm"] == a)
                fell = [collapsed(r["accuracy"], r["warm"], plan["collapse"]) for _, r in rows]
                cells[c][a] = {
                    "seeds": [seed for seed, _ in rows],
                    "accuracy": [r["accuracy"] for _, r in rows],
                    "collapse": collapse_count(fell),
                    "batch_of_collapse": [batch_of_collapse(r["reward_by_batch"]) if f else None
                                          for (_, r), f in zip(rows, fell)],
                }
        iqm, improve, rng = {}, {}, np.random.default_rng(0)

        def pooled_iqm(*xs, axis=-1):
            return trim_mean(np.concatenate(xs, axis=axis), 0.25, axis=axis)

        for a in arms:
            samples = [np.asarray(cells[c][a]["accuracy"]) for c in g["cells"]]
            if min(s.size for s in samples) < 2:
                continue
            ci = bootstrap(samples, pooled_iqm, n_resamples=2000, method="percentile", random_state=rng)
            iqm[a] = {"iqm": float(pooled_iqm(*samples)), "low": float(ci.confidence_interval.low),
                      "high": float(ci.confidence_interval.high)}
        ref = reference_arm(plan, group)
        for a in arms:
            if a == ref or a not in iqm or ref not in iqm:
                continue
            xs = [np.asarray(cells[c][ref]["accuracy"]) for c in g["cells"]]
            ys = [np.asarray(cells[c][a]["accuracy"]) for c in g["cells"]]
            k = len(xs)
            ci = bootstrap([*xs, *ys], lambda *s, axis=-1, k=k: probability_of_improvement(s[:k], s[k:]),
                           n_resamples=2000, method="percentile", random_state=rng)
            improve[a] = {"p_reference_better": float(probability_of_improvement(xs, ys)),
                          "low": float(ci.confidence_interval.low), "high": float(ci.confidence_interval.high)}
        out[group] = {"cells": cells, "reference": ref, "iqm": iqm, "probability_of_improvement": improve}
    return out


# ------------------------------------------------------------------ sensitivity
def _collapse_rules(plan: dict, data: dict, seeds: list[int]) -> list[dict]:
    """Each tested collapse question under the plan's collapse rule and each of its sensitivity rules."""
    rows = []
    for rule in [plan["collapse"], *plan["sensitivity"]]:
        answers = analyze(plan, data, seeds, rule)["questions"]
        for key, e in answers.items():
            if e["outcome"] != "collapse" or e["role"] == "descriptive" or not e["looks"]:
                continue
            last = e["looks"][-1]
            counts = (last["a_only"], last["b_only"]) if "a_only" in last else (last["a_collapsed"], last["b_collapsed"])
            rows.append({"question": key, "rule": rule, "text": rule_text(rule), "a": counts[0], "b": counts[1],
                         "p_sequential": e["p_sequential"], "verdict": e["verdict"], "answer": e["answer"],
                         "primary": rule == plan["collapse"]})
    return rows


def _seed_unit(plan: dict, data: dict, seeds: list[int]) -> dict | None:
    """Where questions were registered on (cell, seed) pairs: every question again with the seed as the unit
    (the same looks and spending), its sequential and adjusted p and decision."""
    if not any(q["test"] == "mcnemar-pairs" for q in plan["questions"]):
        return None
    again = {**plan, "questions": [{**q, "test": "sign-flip"} for q in plan["questions"]]}
    answers = analyze(again, data, seeds)["questions"]
    return {k: {"p_sequential": e["p_sequential"], "p_adjusted": e["p_adjusted"], "verdict": e["verdict"],
                "answer": e["answer"]} for k, e in answers.items()}


@functools.lru_cache(maxsize=4)
def _repeats(plan_json: str, folder: str, seeds: tuple[int, ...], commit: str | None) -> list[dict]:
    return repeats(json.loads(plan_json), Path(folder), list(seeds), commit)


def _without_repeats(plan: dict, data: dict, seeds: list[int], answers: dict, repeated: list[dict]) -> dict:
    """Each tested question that reads a repeated run, tested at its looks without the repeated runs' seeds."""
    p_seq = {k: e["p_sequential"] if e["p_sequential"] is not None else 1.0
             for k, e in answers.items() if e["role"] != "descriptive"}
    out = {}
    for q in plan["questions"]:
        gone = sorted({r["seed"] for r in repeated if r["cell"] in q["cells"] and r["arm"] in (q["a"], q["b"])})
        if not gone or q["role"] == "descriptive" or not answers[q["key"]]["looks"]:
            continue
        ps, kept = [], []
        for look in answers[q["key"]]["looks"]:
            kept = [s for s in seeds[: look["seeds"]] if s not in gone]
            ps.append(look_test(plan, q, data, kept, plan["collapse"], len(ps))["p_look"])
        rejected, adjusted = gate_and_holm({**p_seq, q["key"]: min(ps)}, plan)
        out[q["key"]] = {"seeds_left_out": gone, "seeds": len(kept), "p_sequential": min(ps),
                         "p_adjusted": adjusted[q["key"]], "rejected": rejected[q["key"]]}
    return out


# ------------------------------------------------------------------ the report
def write_study_report(study, answer: dict, history: dict) -> Path:
    """Write the report of ``study`` (a :class:`kpo.compare.study.run.Study`) from ``answer``
    (:func:`kpo.compare.study.looks.analyze`) and its plan's ``history``; returns report.md."""
    from kpo.compare.study.plots import plot_study

    plan, records, seeds = study.plan, study.records(), study.seeds()
    data = study.data()
    ok, why = confirmatory(history, records)
    primary = [e for e in answer["questions"].values() if e["role"] == "primary"]
    gate_open = not primary or primary[0]["rejected"]
    for entry in answer["questions"].values():
        if entry["verdict"] == "undecided":
            entry["seeds_needed"], entry["seeds_needed_words"] = _seeds_needed(entry, plan, gate_open)
    commit = history["first"]["commit"] if history["first"] else None
    repeated = _repeats(json.dumps(plan), str(study.folder), tuple(seeds["admitted"]), commit)
    tried = len(seeds["admitted"]) + len(seeds["dropped"])
    report = {
        "title": plan["title"],
        "study": "confirmatory" if ok else "exploratory",
        "confirmatory": ok,
        "why": why,
        "plan": {"hash": history["hash"], "first_commit": history["first"], "changed": history["changed"]},
        "hypotheses": sum(q["role"] != "descriptive" for q in plan["questions"]),
        "runs": len(records),
        "runs_at_most": plan["runs_at_most"],
        # the commit of the kpo that trained each run (a study runs from a worktree at a fixed commit): runs by commit,
        # the most first
        "trained_by": dict(Counter(r["code"] or "unknown" for r in records.values()).most_common()),
        "seeds": {**seeds, "tried": tried, "drop_rate": len(seeds["dropped"]) / tried if tried else None},
        "looks": answer["looks"],
        "next": answer["next"],
        "active": answer["active"],
        "ended": answer["next"] is None,
        "questions": answer["questions"],
        "sensitivity": {
            "collapse_rules": _collapse_rules(plan, data, seeds["admitted"]),
            "seed_unit": _seed_unit(plan, data, seeds["admitted"]),
            "repeats": repeated,
            "without_repeats": _without_repeats(plan, data, seeds["admitted"], answer["questions"], repeated),
        },
        "collapse": rule_text(plan["collapse"]),
        "descriptive": _descriptive(plan, records),
    }
    folder = study.folder
    write_json(folder / "report.json", report, indent=2)
    figures = plot_study(report, plan, folder)
    with replacing(folder / "report.md") as partial:
        partial.write_text(_markdown(report, plan, figures))
    return folder / "report.md"


def _pts(x: float | None, sign: bool = True) -> str:
    return "-" if x is None else (f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}")


def _p(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def look_detail(e: dict, last: dict) -> str:
    """What a question's test saw at a look, in words."""
    if "a_only" in last:
        return (f"{last['a_only']} (cell, seed) pairs where only {e['a']} collapsed, {last['b_only']} where only "
                f"{e['b']}, of {last['pairs']}")
    if e["outcome"] == "collapse":
        return (f"{e['a']} collapsed in {last['a_collapsed']} of {last['runs']} runs, {e['b']} in {last['b_collapsed']}"
                f" ({last['seeds']} seeds, each seed's cells pooled)")
    ci = "" if last.get("low") is None else f" [{_pts(last['low'])}, {_pts(last['high'])}] (bootstrap)"
    if e.get("versus"):
        unit = " points" if e["outcome"] == "accuracy" else ""
        shown = _pts(last["estimate"]) if e["outcome"] == "accuracy" else f"{last['estimate']:+.4g}"
        return (f"({e['a']} - {e['b']}) in {', '.join(e['cells'])} less the same in {', '.join(e['versus'])}: "
                f"{shown}{unit}{ci} over {last['seeds']} seeds")
    if e["outcome"] == "accuracy":
        return f"{e['a']} - {e['b']} {_pts(last['estimate'])} points{ci} over {last['seeds']} seeds, all pairs"
    return f"{e['a']} - {e['b']} {e['metric']} {last['estimate']:+.4g} over {last['seeds']} seeds"


def _answer_line(e: dict) -> str:
    if not e["looks"]:
        return f"- **{e['text']}** ({e['role']}) open: no look taken yet."
    last = e["looks"][-1]
    needed = f" Deciding it would take {e['seeds_needed_words']}." if e["verdict"] == "undecided" else ""
    adjusted = "" if e["role"] == "descriptive" else (f", sequential p {_p(e['p_sequential'])}, adjusted p "
                                                      f"{_p(e['p_adjusted'])} (gate, then Holm; after the look split)")
    return (f"- **{e['text']}** ({e['role']}) **{e['answer']}**. {last['test']} at {last['seeds']} seeds: "
            f"{look_detail(e, last)}; p at this look {_p(last['p'])}{adjusted}.{needed}")


def _commit(code: str) -> str:
    """A run's record's commit as the report names it: unknown where kpo did not run from a git checkout."""
    return "an unknown commit" if code == "unknown" else code[:12]


def _markdown(report: dict, plan: dict, figures: list[str]) -> str:
    seeds, sens = report["seeds"], report["sensitivity"]
    state = "ended" if report["ended"] else "under way: next look at " + "; ".join(
        f"{n} seeds of the {g} cells ({', '.join(report['active'].get(g, []))})" for g, n in report["next"].items())
    kind = "confirmatory" if report["confirmatory"] else "not confirmatory"
    lines = [
        f"# kpo compare study: {report['title']} ({kind})", "",
        f"Status: {state}. {report['runs']} of at most {report['runs_at_most']} runs recorded; "
        f"{len(report['looks'])} look(s) taken. Confirmatory: **{'yes' if report['confirmatory'] else 'no'}** "
        f"({report['why']}). Trained by kpo at "
        f"{', '.join(f'{_commit(c)} ({n} runs)' for c, n in report['trained_by'].items()) or 'no commit yet'}.",
        "", "## Answers", "", *[_answer_line(e) for e in report["questions"].values()], "",
        f"Collapse: {report['collapse']} (fixed in the plan).",
    ]
    if sens["collapse_rules"]:
        lines += ["", "Each collapse question at the plan's collapse rules (sensitivity, the same looks; not adjusted):",
                  "", "| question | collapse rule | a | b | sequential p | verdict |", "|---|---|---|---|---|---|",
                  *[f"| {s['question']} | {s['text']}{' (registered)' if s['primary'] else ''} | {s['a']} | {s['b']} | "
                    f"{_p(s['p_sequential'])} | {s['verdict']} |" for s in sens["collapse_rules"]]]
    if sens["seed_unit"]:
        lines += ["", "The seed as the unit (sensitivity): the plan registered (cell, seed) pairs as the unit, but a "
                  "seed's cells share its warm start; each question again on one number per seed (its cells pooled), "
                  "by the exact sign-flip test at the same looks and spending. The registered tests decide.", "",
                  "| question | sequential p | adjusted p | decision |", "|---|---|---|---|",
                  *[f"| {k} | {_p(v['p_sequential'])} | {_p(v['p_adjusted'])} | {v['answer']} |"
                    for k, v in sens["seed_unit"].items()]]
    if sens["repeats"]:
        where = sorted({r["where"] for r in sens["repeats"]})
        lines += ["", f"Repeated runs: {len(sens['repeats'])} of the study's runs have the settings and seed of runs "
                  f"committed before its plan ({', '.join(where)}): "
                  + ", ".join(f"{r['cell']}/{r['arm']}/seed {r['seed']}" for r in sens["repeats"][:8])
                  + (" ..." if len(sens["repeats"]) > 8 else "") + ". Each question that reads them, without their seeds:",
                  "", "| question | seeds left out | seeds | sequential p | adjusted p | rejected |",
                  "|---|---|---|---|---|---|",
                  *[f"| {k} | {', '.join(map(str, v['seeds_left_out']))} | {v['seeds']} | {_p(v['p_sequential'])} | "
                    f"{_p(v['p_adjusted'])} | {'yes' if v['rejected'] else 'no'} |"
                    for k, v in sens["without_repeats"].items()]]
    dropped = ", ".join(str(d["seed"]) for d in seeds["dropped"]) or "none"
    lines += ["", "## Seeds", "", f"Admitted: {', '.join(map(str, seeds['admitted'])) or 'none yet'}. Dropped (start "
              f"model failed its check, for every arm before any run): {dropped}"
              + (f" ({100 * seeds['drop_rate']:.0f}% of {seeds['tried']} tried)." if seeds["tried"] else "."),
              "", "## Descriptive (not tests)"]
    for group, d in report["descriptive"].items():
        lines += ["", f"### The {group} cells", "",
                  "| cell | arm | seeds | final accuracy, mean | collapsed (exact 95% interval) |", "|---|---|---|---|---|"]
        for cell, arms in d["cells"].items():
            for arm, a in arms.items():
                acc, c = a["accuracy"], a["collapse"]
                bound = "-" if not c["n"] else f"{c['k']}/{c['n']} [{100 * c['low95']:.0f}%, {100 * c['upper95']:.0f}%]"
                lines.append(f"| {cell} | {arm} | {len(acc)} | {_pts(np.mean(acc) if acc else None, False)} | {bound} |")
        lines += ["", f"| arm | interquartile mean [95%, stratified bootstrap] | P({d['reference']} beats it) [95%] |",
                  "|---|---|---|"]
        for arm, v in d["iqm"].items():
            poi = d["probability_of_improvement"].get(arm)
            beats = "-" if poi is None else f"{poi['p_reference_better']:.2f} [{poi['low']:.2f}, {poi['high']:.2f}]"
            lines.append(f"| {arm} | {_pts(v['iqm'], False)} [{_pts(v['low'], False)}, {_pts(v['high'], False)}] | {beats} |")
    sim = plan.get("simulation")  # a regime map's plan is not sized
    lines += ["", "## Figures", "", *[f"![{f}]({f})" for f in figures], "", "## The plan", "",
              "Questions in order, arms, cells, looks, spending, collapse and seeds: [plan.json](plan.json)"
              + (f" (written by {plan['source']}, not sized)." if sim is None else ". Its simulation:"), ""]
    if sim is not None:
        lines += ["| question | power at the sizing's effects | at effects a third smaller |", "|---|---|---|",
                  *[f"| {q} | {sim['power']['measured'][q]:.3f} | {sim['power']['a third smaller'][q]:.3f} |"
                    for q in sim["power"]["measured"]],
                  "", f"| null hypothesis | family-wise error (simulated) | exact 95% interval ({sim['sims']} studies) |",
                  "|---|---|---|", *_fwer_rows(sim), ""]
    return "\n".join(lines)


def _fwer_rows(sim: dict) -> list[str]:
    """The simulated family-wise errors with their Monte Carlo uncertainty, so that 0.051 of 2000 reads as what it
    is: consistent with 5%."""
    rows = []
    for null, rate in sim["fwer"].items():
        low, high = rate_interval(round(rate * sim["sims"]), sim["sims"])
        rows.append(f"| {null} | {rate:.3f} | [{low:.3f}, {high:.3f}] |")
    return rows


def verdict_rows(report: dict, link: str) -> list[str]:
    """A study's tested questions as rows of a verdict table (question | answer | test | adjusted p | study), read
    from its ``report`` (report.json), the study named by its title and linked by ``link``: what the README shows."""
    rows = []
    for e in report["questions"].values():
        if e["role"] == "descriptive":
            continue
        last = e["looks"][-1] if e["looks"] else None
        answer = f"**{e['answer']}**" if e["verdict"] == "decided" else e["answer"].split(":")[0]
        test = "-" if last is None else f"{last['test']}, {last['seeds']} seeds"
        rows.append(f"| {e['text']} | {answer} | {test} | {_p(e['p_adjusted'])} | [{report['title']}]({link}) |")
    return rows
