"""kpo.compare.questions.decide on hand-made data (no runs): a partial map claims no more than its complete looks,
the verdict's direction is the rejecting look's, the reported p-values are Holm-adjusted, and the seeds a
survivors-only question needs grow with the pairs a collapse left out."""

from __future__ import annotations

import pytest

from kpo.compare.questions import Question, _seeds_needed, _verdict, decide
from kpo.compare.regimes import Cell

STABLE = Cell("none", 4, 1e-4)
STRESS = [Cell("none", d, 5e-4) for d in (4, 8, 16)]


def _map(collapse_a: list[list[bool]], seeds: int = 4) -> dict:
    """Arms "a" and "b" in one stable cell (no difference between them) and the three stress cells, where "a"
    collapses as ``collapse_a[cell][seed]`` and "b" never."""
    wobble = [0.01, -0.02, 0.015, -0.005, 0.02, -0.01]
    data = {STABLE.name: {"a": [(0.6 + wobble[s], False) for s in range(seeds)],
                          "b": [(0.6 - wobble[s], False) for s in range(seeds)]}}
    for cell, flags in zip(STRESS, collapse_a):
        data[cell.name] = {"a": [(0.0 if f else 0.5, f) for f in flags], "b": [(0.5, False)] * seeds}
    return data


QUESTIONS = [Question("collapse", "does a collapse more?", "collapse", "a", "b", "stress")] + [
    Question(f"accuracy{i}", f"is a worse than b ({i})?", "accuracy", "a", "b", "stable") for i in range(9)
]


def test_a_pending_question_keeps_its_p_so_a_partial_map_claims_no_more():
    """The issue's case: a stress collapse question at 9 discordant pairs to 0 (look-split p 0.039) beside 9
    stable accuracy questions (18 hypotheses): undecided at the complete look (Holm's first threshold is
    0.05 / 19); on main, "yes" once one stable seed of that look was pending (the family shrank to 1)."""
    data = _map([[True] * 4, [True] * 4, [True] + [False] * 3])
    cells = [STABLE, *STRESS]
    complete = decide(QUESTIONS, data, cells, {"stable": 4, "stress": 4})
    assert complete[0]["verdict"] == "undecided"
    data[STABLE.name]["a"][3] = None  # one stable run of the look not finished
    partial = decide(QUESTIONS, data, cells, {"stable": 4, "stress": 4})
    assert partial[0]["verdict"] == "undecided"
    assert complete[0]["p_looks"]["difference"] == pytest.approx(2 * 0.5**9 / 0.1)
    assert {a["verdict"] for a in partial[1:]} == {"pending"}
    # pending with no complete look: in the family at p = 1, so every question still counts
    assert all(a["p_looks"] == {"difference": 1.0, "margin": 1.0} for a in partial[1:])
    assert sum(len(a["p_adjusted"]) for a in partial) == 19


def test_a_pending_question_keeps_its_last_complete_looks_p():
    data = _map([[True] * 6, [True] * 6, [False] * 6], seeds=6)
    cells = [STABLE, *STRESS]
    at_four = decide(QUESTIONS[:1], data, cells, {"stress": 4})[0]
    data[STRESS[2].name]["b"][5] = None
    pending = decide(QUESTIONS[:1], data, cells, {"stress": 6})[0]
    assert pending["verdict"] == "pending" and pending["p_looks"] == at_four["p_looks"]
    assert [look["seeds"] for look in pending["looks"]] == [4]


def test_reported_p_values_are_holm_adjusted_over_the_family():
    from statsmodels.stats.multitest import multipletests

    data = _map([[True] * 4, [True] * 4, [True] + [False] * 3])
    answers = decide(QUESTIONS, data, [STABLE, *STRESS], {"stable": 4, "stress": 4})
    looks = [p for a in answers for p in a["p_looks"].values()]
    adjusted = [p for a in answers for p in a["p_adjusted"].values()]
    assert adjusted == pytest.approx(multipletests(looks, method="holm")[1].tolist())
    # 0.039 for the looks alone (what main reported as adjusted), 19 x 0.039 = 0.74 for the family
    assert answers[0]["p_adjusted"]["difference"] == pytest.approx(19 * 2 * 0.5**9 / 0.1)


def test_the_direction_is_the_rejecting_looks():
    """Rejected at 4 seeds, where only "a" collapsed (12 pairs to 0); seeds 4-5 then collapse "b" alone in
    eight more cells' worth of pairs, so the last look leans to "b": main answered "no: b collapses more"."""
    cells = [Cell("none", d, 5e-4) for d in range(1, 9)] + [STABLE]
    data = {STABLE.name: {"a": [(0.6, False)] * 6, "b": [(0.6, False)] * 6}}
    for i, cell in enumerate(cells[:-1]):
        first = [i < 3] * 4  # 3 cells x 4 seeds: only "a" collapsed
        data[cell.name] = {
            "a": [(0.0 if f else 0.5, f) for f in first] + [(0.5, False)] * 2,
            "b": [(0.5, False)] * 4 + [(0.0, True)] * 2,  # 8 cells x 2 seeds: only "b"
        }
    q = Question("collapse", "does a collapse more?", "collapse", "a", "b", "stress")
    found = decide([q], data, cells, {"stress": 6})[0]
    assert (found["last"]["a_only"], found["last"]["b_only"]) == (12, 16)
    assert found["verdict"] == "yes" and found["answer"] == "yes: a collapses more often"
    assert found["rejecting_look"] == {"difference": 4}


def test_a_tie_never_defaults_to_b():
    q = Question("collapse", "?", "collapse", "a", "b", "stress")
    tied = {"a_only": 3, "b_only": 3}
    assert _verdict(q, {"difference": tied}, {"difference": True})["verdict"] == "undecided"
    acc = Question("accuracy", "?", "accuracy", "a", "b", "stable")
    flat = {"mean": 0.0}
    assert _verdict(acc, {"difference": flat, "margin": flat}, {"difference": True, "margin": False}) == {
        "verdict": "undecided",
        "answer": "undecided",
    }


def test_seeds_needed_grow_with_the_pairs_a_collapse_left_out():
    """A survivors-only contrast that kept 8 of 24 pairs needs 3 times the seeds of one that kept all 24."""
    q = Question("acc", "?", "accuracy", "a", "b", "stress")
    measured = {"seed_sd": 0.04, "mean": -0.03}
    everything = _seeds_needed(q, measured | {"pairs": 24, "excluded_by_collapse": 0}, 0.0025)
    survivors = _seeds_needed(q, measured | {"pairs": 8, "excluded_by_collapse": 16}, 0.0025)
    assert everything and survivors == 3 * everything
