"""The confirmatory study's report: ``report.json`` (the answers with their tests, sequential and adjusted p, the
seeds, the threshold sensitivity, whether the study is confirmatory), ``report.md`` (the answers first) and the
descriptive figures beside the tests: collapse rates per arm and cell (``collapse.png``), when runs collapsed
(``time_to_collapse.png``), and final accuracy in the convention of Agarwal et al. 2021 (``accuracy.png``:
interquartile mean with stratified bootstrap intervals, probability of improvement, performance profiles). The
tests decide; the figures describe. Written whole at every step of the study."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kpo._files import replacing
from kpo.compare.study import analyze, collapsed, rule_text

__all__ = ["write_study_report"]


def confirmatory(plan_commit: dict, records: dict) -> tuple[bool, str]:
    """Whether the study may be called confirmatory: its plan committed (and unchanged) before its first run
    started. Returns (verdict, why)."""
    if plan_commit.get("commit") is None:
        return False, "its plan.json is not committed"
    if not plan_commit.get("clean"):
        return False, "its plan.json differs from the committed one"
    early = [k for k, r in records.items() if r.get("started") is None or r["started"] < plan_commit["time"]]
    if early:
        return False, f"{len(early)} run(s) started before the plan's commit (or say not when): {', '.join(early[:3])}"
    return True, f"plan.json committed at {plan_commit['commit'][:12]} before every run started"


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


def _needed_level(entry: dict, plan: dict) -> float:
    """The level an undecided question is sized at: the gate's own (the plan's alpha) for the primary; for a family
    member, Holm's first threshold (alpha over the family), the strictest it can face."""
    family = sum(q["role"] == "family" for q in plan["questions"])
    return plan["alpha"] if entry["role"] == "primary" else plan["alpha"] / max(1, family)


def _seeds_needed(entry: dict, plan: dict) -> int | None:
    """For a question undecided at its cap: seeds per cell an 80%-power test at :func:`_needed_level` would need,
    from what was measured (kpo.compare.stats: exact binomial power of McNemar, or t power as the sign-flip test's
    approximation); None where no effect was measured or (collapse) beyond ``MOST_SEEDS``."""
    from kpo.compare.stats import discordance_seeds, seeds_for_effect

    last, level = entry["looks"][-1], _needed_level(entry, plan)
    if entry["kind"] == "collapse":
        return discordance_seeds(last["a_only"], last["b_only"], last["pairs"], len(entry["cells"]), level)
    return seeds_for_effect(last.get("sd"), last["estimate"], level)


def _seeds_needed_words(entry: dict, plan: dict, n: int | None, gate_open: bool) -> str:
    """What deciding an undecided question would take, in words: post-hoc, as if the measured effect were true; a
    family member behind a closed gate needs the gate's rejection first."""
    from kpo.compare.stats import MOST_SEEDS

    last = entry["looks"][-1]
    level = f"80% power at level {_needed_level(entry, plan):.2g}"
    if n is not None:
        words = f"about {n} seeds per cell for {level}, if the measured effect were the true one (post-hoc)"
    elif entry["kind"] == "collapse" and last["a_only"] != last["b_only"]:
        words = (f"more than {MOST_SEEDS} seeds per cell for {level}, if the measured {last['a_only']} to "
                 f"{last['b_only']} of {last['pairs']} pairs were the true effect (post-hoc)")
    else:
        words = "no number of seeds: the measured effect is 0 (or its spread unknown)"
    return words if gate_open or entry["role"] == "primary" else f"the gate's rejection first, then {words}"


def probability_of_improvement(xs, ys):
    """P(a run of X beats a run of Y), ties counted half, averaged over cells: per cell Mann-Whitney's U / (n m)
    (``xs``, ``ys``: per cell the runs' accuracies, [..., n] with any leading batch axes, as scipy's bootstrap
    passes them; a test checks it against ``scipy.stats.mannwhitneyu``)."""
    per_cell = [
        np.mean((x[..., :, None] > y[..., None, :]) + 0.5 * (x[..., :, None] == y[..., None, :]), axis=(-2, -1))
        for x, y in zip(xs, ys)
    ]
    return np.mean(per_cell, axis=0)


def _descriptive(plan: dict, records: dict) -> dict:
    """Per group, per cell and arm: collapses (count, exact 95% interval), final accuracies; the group's
    interquartile mean per arm with its stratified bootstrap interval and each arm's probability of improving on
    KPO (matched) (Mann-Whitney's U / (n m), averaged over cells, with its stratified bootstrap interval)."""
    from scipy.stats import bootstrap, trim_mean

    from kpo.compare.stats import collapse_count

    out = {}
    for group, g in plan["groups"].items():
        per = {c: {a: sorted((r["seed"], r) for r in records.values() if r["cell"] == c and r["arm"] == a)
                   for a in g["arms"]} for c in g["cells"]}
        cells = {}
        for c, arms in per.items():
            cells[c] = {}
            for a, rows in arms.items():
                fell = [collapsed(r["accuracy"], r["warm"], plan["collapse"]) for _, r in rows]
                cells[c][a] = {
                    "seeds": [seed for seed, _ in rows],
                    "accuracy": [r["accuracy"] for _, r in rows],
                    "collapse": collapse_count(fell),
                    "batch_of_collapse": [
                        batch_of_collapse(r["reward_by_batch"]) if f else None for (_, r), f in zip(rows, fell)
                    ],
                }
        iqm, improve = {}, {}
        rng = np.random.default_rng(0)
        for a in g["arms"]:
            samples = [np.asarray(cells[c][a]["accuracy"]) for c in g["cells"]]
            if min(s.size for s in samples) < 2:
                continue

            def pooled_iqm(*xs, axis=-1):
                return trim_mean(np.concatenate(xs, axis=axis), 0.25, axis=axis)

            ci = bootstrap(samples, pooled_iqm, n_resamples=2000, method="percentile", random_state=rng)
            iqm[a] = {"iqm": float(pooled_iqm(*samples)), "low": float(ci.confidence_interval.low),
                      "high": float(ci.confidence_interval.high)}
        kpo = "KPO (matched)"
        for a in g["arms"]:
            if a == kpo or a not in iqm or kpo not in iqm:
                continue
            xs = [np.asarray(cells[c][kpo]["accuracy"]) for c in g["cells"]]
            ys = [np.asarray(cells[c][a]["accuracy"]) for c in g["cells"]]
            k = len(xs)
            ci = bootstrap(
                [*xs, *ys], lambda *s, axis=-1, k=k: probability_of_improvement(s[:k], s[k:]), n_resamples=2000,
                method="percentile", random_state=rng,
            )
            improve[a] = {"p_kpo_better": float(probability_of_improvement(xs, ys)),
                          "low": float(ci.confidence_interval.low), "high": float(ci.confidence_interval.high)}
        out[group] = {"cells": cells, "iqm": iqm, "probability_of_improvement": improve}
    return out


def write_study_report(study, answer: dict, plan_commit: dict) -> Path:
    """Write the report of ``study`` (a :class:`kpo.compare.study_run.Study`) from ``answer``
    (:func:`kpo.compare.study.analyze`); returns report.md."""
    plan, records, seeds = study.plan, study.records(), study.seeds()
    ok, why = confirmatory(plan_commit, records)
    gate_open = any(e["rejected"] for e in answer["questions"].values() if e["role"] == "primary")
    for entry in answer["questions"].values():
        if entry["verdict"] == "undecided":
            entry["seeds_needed"] = _seeds_needed(entry, plan)
            entry["seeds_needed_words"] = _seeds_needed_words(entry, plan, entry["seeds_needed"], gate_open)
    primary = next(q["key"] for q in plan["questions"] if q["role"] == "primary")
    sensitivity, data = [], study.data()
    for rule in [plan["collapse"], *plan["sensitivity"]]:
        found = analyze(plan, data, seeds["admitted"], rule)["questions"][primary]
        last = found["looks"][-1] if found["looks"] else {}
        sensitivity.append({"rule": rule, "text": rule_text(rule), "a_only": last.get("a_only"),
                            "b_only": last.get("b_only"), "p_sequential": found["p_sequential"],
                            "verdict": found["verdict"], "primary": rule == plan["collapse"]})
    tried = len(seeds["admitted"]) + len(seeds["dropped"])
    report = {
        "study": "confirmatory" if ok else "exploratory",
        "confirmatory": ok,
        "why": why,
        "plan_commit": plan_commit,
        "hypotheses": len(plan["questions"]),
        "runs": len(records),
        "runs_at_most": plan["runs_at_most"],
        "seeds": {**seeds, "tried": tried, "drop_rate": len(seeds["dropped"]) / tried if tried else None},
        "looks": answer["looks"],
        "next": answer["next"],
        "active": answer["active"],
        "ended": answer["next"] is None,
        "questions": answer["questions"],
        "sensitivity": sensitivity,
        "collapse": plan["collapse_text"],
        "descriptive": _descriptive(plan, records),
    }
    folder = study.folder
    with replacing(folder / "report.json") as partial:
        partial.write_text(json.dumps(report, indent=2) + "\n")
    from kpo.compare.study_plots import plot_study

    figures = plot_study(report, plan, folder)
    with replacing(folder / "report.md") as partial:
        partial.write_text(_markdown(report, plan, figures))
    return folder / "report.md"


def _pts(x: float | None, sign: bool = True) -> str:
    return "-" if x is None else (f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}")


def _p(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def _answer_line(key: str, e: dict) -> str:
    looks = e["looks"]
    if not looks:
        return f"- **{e['question']}** ({e['role']}) open: no look taken yet."
    last = looks[-1]
    if e["kind"] == "collapse":
        detail = (f"{last['a_only']} (cell, seed) pairs where only {e['a']} collapsed, {last['b_only']} where only "
                  f"{e['b']}, of {last['pairs']}")
    else:
        ci = "" if last.get("low") is None else f" [{_pts(last['low'])}, {_pts(last['high'])}] (bootstrap)"
        detail = f"{e['a']} - {e['b']} {_pts(last['estimate'])} points{ci} over {last['seeds']} seeds, all pairs"
    needed = ""
    if e["verdict"] == "undecided":
        needed = f" Deciding it would take {e['seeds_needed_words']}."
    return (f"- **{e['question']}** ({e['role']}) **{e['answer']}**. {last['test']} at {last['seeds']} seeds: "
            f"{detail}; p at this look {_p(last['p'])}, sequential p {_p(e['p_sequential'])}, adjusted p "
            f"{_p(e['p_adjusted'])} (gate, then Holm; after the look split).{needed}")


def _markdown(report: dict, plan: dict, figures: list[str]) -> str:
    seeds = report["seeds"]
    state = "ended" if report["ended"] else "under way: next look at " + "; ".join(
        f"{n} seeds of the {g} cells ({', '.join(report['active'].get(g, []))})" for g, n in report["next"].items())
    lines = [
        "# kpo compare study: where KPO helps (confirmatory)" if report["confirmatory"]
        else "# kpo compare study (not confirmatory)",
        "",
        f"Status: {state}. {report['runs']} of at most {report['runs_at_most']} runs recorded; "
        f"{len(report['looks'])} look(s) taken. Confirmatory: **{'yes' if report['confirmatory'] else 'no'}** "
        f"({report['why']}).",
        "",
        "## Answers",
        "",
        *[_answer_line(k, e) for k, e in report["questions"].items()],
        "",
        f"Collapse: {report['collapse']} (fixed in the plan). The primary question at other thresholds "
        "(sensitivity, the same looks; not adjusted):",
        "",
        "| collapse rule | only GRPO | only KPO (matched) | sequential p | verdict |",
        "|---|---|---|---|---|",
        *[f"| {s['text']}{' (primary)' if s['primary'] else ''} | {s['a_only'] if s['a_only'] is not None else '-'} "
          f"| {s['b_only'] if s['b_only'] is not None else '-'} | {_p(s['p_sequential'])} | {s['verdict']} |"
          for s in report["sensitivity"]],
        "",
        "## Seeds",
        "",
        f"Admitted: {', '.join(map(str, seeds['admitted'])) or 'none yet'}. Dropped (warm start failed its check, "
        f"for every arm before any run): {', '.join(str(d['seed']) for d in seeds['dropped']) or 'none'}"
        + (f" ({100 * seeds['drop_rate']:.0f}% of {seeds['tried']} tried)." if seeds["tried"] else "."),
        "",
        "## Descriptive (not tests)",
    ]
    for group, d in report["descriptive"].items():
        lines += ["", f"### The {group} cells", "",
                  "| cell | arm | seeds | final accuracy, mean | collapsed (exact 95% interval) |", "|---|---|---|---|---|"]
        for cell, arms in d["cells"].items():
            for arm, a in arms.items():
                acc, c = a["accuracy"], a["collapse"]
                bound = "-" if not c["n"] else f"{c['k']}/{c['n']} [{100 * c['low95']:.0f}%, {100 * c['upper95']:.0f}%]"
                lines.append(f"| {cell} | {arm} | {len(acc)} | {_pts(np.mean(acc) if acc else None, False)} | {bound} |")
        improvement = d["probability_of_improvement"]
        lines += ["", "| arm | interquartile mean [95%, stratified bootstrap] | P(KPO (matched) beats it) [95%] |",
                  "|---|---|---|"]
        for arm, v in d["iqm"].items():
            poi = improvement.get(arm)
            beats = "-" if poi is None else f"{poi['p_kpo_better']:.2f} [{poi['low']:.2f}, {poi['high']:.2f}]"
            lines.append(f"| {arm} | {_pts(v['iqm'], False)} [{_pts(v['low'], False)}, {_pts(v['high'], False)}] "
                         f"| {beats} |")
    sim = plan["simulation"]
    lines += ["", "## Figures", "", *[f"![{f}]({f})" for f in figures], "", "## The plan", "",
              "Questions in order, cells, arms, looks, spending and collapse: [plan.json](plan.json). Its simulation:",
              "", "| question | power at the exploratory map's effects | at effects a third smaller |", "|---|---|---|",
              *[f"| {q} | {sim['power']['measured'][q]:.3f} | {sim['power']['a third smaller'][q]:.3f} |"
                for q in sim["power"]["measured"]],
              "", f"| null hypothesis | family-wise error (simulated) | exact 95% interval ({sim['sims']} studies) |",
              "|---|---|---|", *_fwer_rows(sim), ""]
    return "\n".join(lines)


def _fwer_rows(sim: dict) -> list[str]:
    """The simulated family-wise errors with their Monte Carlo uncertainty, so that 0.051 of 2000 reads as what it
    is: consistent with 5%."""
    from kpo.compare.stats import rate_interval

    rows = []
    for null, rate in sim["fwer"].items():
        low, high = rate_interval(round(rate * sim["sims"]), sim["sims"])
        rows.append(f"| {null} | {rate:.3f} | [{low:.3f}, {high:.3f}] |")
    return rows
