"""The paper's claims as ``kpo compare`` tests them: the rules, and one line per claim with its verdict and numbers.

The claim rules (``CLAIM_RULES``) were committed before the default compare ran:
- Metric: each model's outcome (:mod:`kpo.compare.outcome`): its exact expected held-out accuracy
  (``expected.json``, :mod:`kpo.evaluation.expected`: the probability that a sample is right, with no sampling
  noise) where the task has one right response (the running-sum task), else the sampled avg@n per problem.
- A run **collapsed** when its final held-out accuracy is below its seed's warm start's; Table 1 gives each arm's
  collapses with their exact 95% bound, and each contrast the exact McNemar test of the two arms' collapses.
- Every difference is paired by seed (the arms of a seed share its warm start, its prompt stream and its
  evaluation samples), over the seeds both arms ran, by :func:`kpo.compare.stats.paired_accuracy`: the Student-t
  interval over the seed pairs where no run of a pair collapsed, else the exact sign test (and the median's
  order-statistic interval from 6 pairs); with one seed, the t-interval over problems
  (:func:`kpo.evaluation.metrics.paired_diff_ci`). A contrast's verdict: "better" or "worse" when its test of no
  difference is rejected by Holm's procedure over the key and ablation contrasts (the family of the claims
  below), "equivalent" when its 95% interval lies inside +-``margin`` points, else "undecided"; the A/A contrast
  and those against the warm start are read from their interval alone.
- Table 1: KPO (the subject: clipped, at the length-matched memory) is best: "better" against every baseline
  (vanilla, GSPO and any other method without a filter).
- Ablations, each against the subject: the filter matters beyond its clip band (vs the token ratio clipped at
  KPO's band, no filter), the ramp from the prior matters (vs the constant-gain moving average), the matched
  memory matters (vs KPO at the paper's Q/V). Each holds when the subject is "better".
- A/A: the subject against its replica (same warm starts, other RL seeds) must be consistent with 0 (its
  interval contains 0); otherwise the design's intervals are too narrow, and the report says so.
- Figure 3, reward: vanilla GRPO collapses (its final reward ends ``collapse_drop`` or more below its peak) while
  KPO keeps rising (its final reward is within ``rise_tolerance`` of its peak and above its first steps').
- Figure 3, entropy: GRPO's entropy collapses (its final entropy is at most ``entropy_collapse`` of its first)
  while KPO's does not, in every seed.
- Table 2: filtering lengthens runs (mean run length of the three states) and removes switching (switch frequency).
- Figure 4: a longer filter memory (smaller Q/V) gives a higher final training reward (monotone over the sweep,
  and the longest memory above the shortest).
"""

from __future__ import annotations

import statistics

import numpy as np

from kpo.compare.stats import centre

__all__ = ["CLAIM_RULES", "paper_claims"]

CLAIM_RULES = {
    "smooth": 5,  # steps of the trailing mean of the figures' curves, and the least window of first/peak/final
    "final_frac": 0.1,  # first/peak/final reward: means over windows of 10% of the steps (at least `smooth`)
    "collapse_drop": 0.1,  # collapse: final reward at least this far below the smoothed peak
    "rise_tolerance": 0.02,  # still rising: final within this of the smoothed peak
    "entropy_collapse": 0.1,  # entropy collapse: final entropy at most this fraction of the first
    "metric": "exact expected held-out accuracy (running task), else sampled avg@n",
    "collapse": "a run's final held-out accuracy below its seed's warm start's; exact McNemar between arms",
    "ci": "kpo.compare.stats.paired_accuracy: Student-t over seed pairs where no run of a pair collapsed, else "
    "the exact sign test (median interval from 6 pairs)",
    "multiplicity": "Holm at 0.05 over the key and ablation contrasts' tests of no difference",
    "ci_level": 0.95,  # the intervals' coverage
    "margin": 0.05,  # "equivalent": the interval inside +-5 points
}


def _claim(title: str, text: str) -> str:
    return f"- **{title}** — {text}"


def _missing_methods(methods, needed: tuple[str, ...]) -> str | None:
    """Why a claim needing the methods ``needed`` is not tested on ``methods``, or None when all are there."""
    missing = [m for m in needed if m not in methods]
    if not missing:
        return None
    it = "it" if len(missing) == 1 else "them"
    fixed = ",".join([*methods, *missing])
    return f"not tested: --methods has no {' and '.join(missing)} (add {it}: --methods {fixed})"


def _decision_claims(labels, subject: str, results: dict, baselines: list[str]) -> list[str]:
    """Table 1's claim (the subject "better" than every baseline), each ablation's and the A/A check."""

    def text(name):
        c = results[name]
        one = "; one seed: the interval covers the problems only" if c["seeds"] == 1 else ""
        interval = "" if c["low"] is None else f" [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
        test = f"median; sign test p = {c['p']:.2g}; " if c["method"] == "sign" else ""
        return f"{name} {100 * centre(c):+.1f}{interval} ({test}{c['verdict']}{one})"

    title = f"Table 1: {subject} has the best held-out accuracy"
    # sorted: the verdict and its text never depend on the order of --methods
    keys = sorted(f"{subject} - {b}" for b in baselines if f"{subject} - {b}" in results)
    if subject not in labels:
        claims = [_claim(title, _missing_methods(labels, (subject,)))]
    elif not keys:
        claims = [_claim(title, "not tested: no baseline without a filter beside it (add e.g. vanilla,gspo)")]
    else:
        holds = "holds" if all(results[k]["verdict"] == "better" for k in keys) else "does not hold"
        claims = [_claim(title, f"{holds}: points, 95% interval paired by seed: {'; '.join(text(k) for k in keys)}.")]
    what = {
        "vanilla (clip_ratio_low=0.0003, clip_ratio_high=0.0004)": "the filter matters beyond KPO's clip band",
        "kpo (memory=matched, p0=steady)": "the filter's ramp from its prior matters (vs constant gains)",
        "kpo": "the length-matched memory beats the paper's Q/V",
        "kpo (memory=auto)": "the length-matched memory beats the memory fitted by maximum likelihood",
    }
    for name, c in results.items():
        if c["kind"] == "ablation":
            other = name.split(" - ", 1)[1]
            holds = "holds" if c["verdict"] == "better" else "does not hold"
            claims.append(_claim(f"Ablation: {what.get(other, other)}", f"{holds}: {text(name)}."))
        elif c["kind"] == "aa":
            inside = c["low"] is None or c["low"] <= 0 <= c["high"]
            width = (
                f"its half-width {100 * c['half_width']:.1f} points is what RL sampling alone moves a difference at "
                "this many seeds"
                if c["half_width"] is not None
                else "no interval: a run of a pair collapsed and there are fewer than 6 pairs"
            )
            holds = "holds" if inside else "does not hold: the design's intervals are too narrow"
            claims.append(_claim("A/A: the noise floor is consistent with 0", f"{holds}: {text(name)}; {width}."))
    return claims


def _figure3_claim(methods, groups, kpo: str) -> str:
    title = "Figure 3: GRPO collapses while KPO keeps rising"
    if (why := _missing_methods(methods, ("vanilla", kpo))) is not None:
        return _claim(title, why)

    def collapsed(entry):
        s = entry["summary"]
        return s["final"] <= s["peak"] - CLAIM_RULES["collapse_drop"]

    def rising(entry):
        s = entry["summary"]
        return s["final"] >= s["peak"] - CLAIM_RULES["rise_tolerance"] and s["final"] > s["first"]

    van = [collapsed(e) for e in groups["vanilla"]]
    rises = [rising(e) for e in groups[kpo]]
    detail = "; ".join(
        f"{m}: first {statistics.fmean(e['summary']['first'] for e in groups[m]):.3f}, peak "
        f"{statistics.fmean(e['summary']['peak'] for e in groups[m]):.3f}, final "
        f"{statistics.fmean(e['summary']['final'] for e in groups[m]):.3f}, entropy "
        f"{statistics.fmean(e['summary']['entropy_first'] for e in groups[m]):.3f} -> "
        f"{statistics.fmean(e['summary']['entropy_final'] for e in groups[m]):.3f}"
        for m in methods
    )
    holds = "holds" if all(van) and all(rises) else "does not hold"
    return _claim(
        title,
        f"{holds}: vanilla collapsed in {sum(van)}/{len(van)} seeds (final >= {CLAIM_RULES['collapse_drop']} "
        f"below peak), {kpo} still rising in {sum(rises)}/{len(rises)} seeds. Per arm (mean over seeds): "
        f"{detail}.",
    )


def _entropy_claim(methods, groups, kpo: str) -> str:
    title = "Figure 3: GRPO's entropy collapses while KPO's does not"
    if (why := _missing_methods(methods, ("vanilla", kpo))) is not None:
        return _claim(title, why)
    frac = CLAIM_RULES["entropy_collapse"]

    def collapsed(entry):
        s = entry["summary"]
        return s["entropy_final"] <= frac * s["entropy_first"]

    van = [collapsed(e) for e in groups["vanilla"]]
    kept = [not collapsed(e) for e in groups[kpo]]
    detail = "; ".join(
        f"{m}: {statistics.fmean(e['summary']['entropy_first'] for e in groups[m]):.4f} -> "
        f"{statistics.fmean(e['summary']['entropy_final'] for e in groups[m]):.4f}"
        for m in ("vanilla", kpo)
    )
    holds = "holds" if all(van) and all(kept) else "does not hold"
    return _claim(
        title,
        f"{holds}: vanilla's final entropy fell to at most {frac:g} of its first in {sum(van)}/{len(van)} seeds, "
        f"{kpo}'s stayed above that in {sum(kept)}/{len(kept)}. Entropy per token, first -> final (mean over "
        f"seeds): {detail}.",
    )


def _table2_claim(table2) -> str:
    title = "Table 2: filtering lengthens runs and removes switching"
    if not table2:
        return _claim(title, "not tested: no method has off-policy ratio dumps (Table 2 says why)")
    parts, ok = [], []
    runlen = ("runlen_up", "runlen_down", "runlen_on")
    for m, s in table2.items():
        # Mean over the states that occur: after filtering a state may have no run at all (NaN).
        run_before = float(np.nanmean([s["before"][k] for k in runlen]))
        run_after = float(np.nanmean([s["after"][k] for k in runlen]))
        ok.append(run_after > run_before and s["after"]["switch_freq"] < s["before"]["switch_freq"])
        parts.append(
            f"{m}: mean run length {run_before:.2f} -> {run_after:.2f}, switch frequency "
            f"{s['before']['switch_freq']:.3f} -> {s['after']['switch_freq']:.3f}"
        )
    return _claim(title, f"{'holds' if all(ok) else 'does not hold'}: {'; '.join(parts)}.")


def _figure4_claim(sweep) -> str:
    """``sweep``: point -> {"memory": tokens, "final": (mean, std), ...}."""
    title = "Figure 4: a longer filter memory (smaller Q/V) gives higher reward"
    if not sweep:
        return _claim(title, "not tested: no memory sweep (--sweep-memory '')")
    if len(sweep) == 1:
        return _claim(
            title, "not tested: --sweep-memory has one point (give two or more, e.g. 8,matched,paper)"
        )
    points = sorted(sweep, key=lambda p: sweep[p]["memory"])
    finals = [sweep[p]["final"][0] for p in points]
    # Non-decreasing in memory, and not flat: the longest memory must beat the shortest.
    monotone = all(a <= b for a, b in zip(finals, finals[1:])) and finals[-1] > finals[0]
    listing = ", ".join(f"memory {sweep[p]['memory']:.4g} ({p}): {f:.3f}" for p, f in zip(points, finals))
    return _claim(title, f"{'holds' if monotone else 'does not hold'}: final training reward {listing}.")


def paper_claims(labels, groups, results, baselines, table2, sweep, subject: str) -> list[str]:
    """One line per claim, in the order of the paper's sections: its verdict with numbers, or why it is not
    tested on this comparison (a method missing from --methods, no dumps, no sweep)."""
    return [
        *_decision_claims(labels, subject, results, baselines),
        _figure3_claim(labels, groups, subject),
        _entropy_claim(labels, groups, subject),
        _table2_claim(table2),
        _figure4_claim(sweep),
    ]
