from __future__ import annotations

import pytest

from kpo.data.synthetic import TaskConfig, grade, load_split, solve


def test_solve_reduces_chain_left_to_right():
    # 23+45 = 68, then 68+7 = 75
    assert solve([23, 45, 7]) == "68+7=75"
    assert solve([1, 2]) == "3"
    # 1+2=3, 3+3=6, 6+4=10
    assert solve([1, 2, 3, 4]) == "3+3+4=6+4=10"


def test_rows_are_deterministic_and_well_formed():
    a = load_split("train", n=50, seed=3, n_terms=3, max_value=20)
    b = load_split("train", n=50, seed=3, n_terms=3, max_value=20)
    assert a == b
    assert a != load_split("train", n=50, seed=4, n_terms=3, max_value=20)
    for row in a:
        assert set(row) == {"id", "problem", "answer", "prompt", "solution"}
        assert row["prompt"] == row["problem"] + "="
        assert str(sum(int(x) for x in row["problem"].split("+"))) == row["answer"]
        assert grade(row["solution"], row["answer"]) == 1.0
    assert len({r["problem"] for r in a}) == 50


def test_train_and_test_are_disjoint_across_seeds():
    test = {r["problem"] for r in load_split("test", n=200, seed=0, max_value=99)}
    for seed in range(3):
        train = {r["problem"] for r in load_split("train", n=2000, seed=seed, max_value=99)}
        assert not train & test
    # the default task (2 terms up to 19) has 400 problems; the default sizes take half of each split
    assert len(load_split("test")) == 40 and len(load_split("train")) == 200


def test_grade_is_strict_and_never_raises():
    assert grade("68+7=75", "75") == 1.0
    assert grade("75", "75") == 1.0
    assert grade(" 75 ", "75") == 1.0
    assert grade("68+7=76", "75") == 0.0
    # right final number, wrong intermediate sum: 60+7 = 67 != 75
    assert grade("60+7=75", "75") == 0.0
    assert grade("68+7=75+0=75", "75") == 1.0  # an extra step that keeps the sum is still correct
    assert grade("68+=75", "75") == 0.0  # empty term
    assert grade("68+7=075", "75") == 0.0  # the last expression must be exactly the answer
    assert grade("75=", "75") == 0.0  # the last '=' leaves nothing
    assert grade("7500", "75") == 0.0
    assert grade("", "75") == 0.0
    assert grade(None, "75") == 0.0  # type: ignore[arg-type]
    assert grade("\x00\uffff==", "75") == 0.0


def test_bad_task_and_split_report_every_problem():
    with pytest.raises(ValueError, match="n_terms=1.*max_value=0"):
        TaskConfig(n_terms=1, max_value=0)
    with pytest.raises(ValueError, match="split='dev'"):
        load_split("dev")
    with pytest.raises(ValueError, match="lower n"):
        load_split("test", n=100, max_value=9)  # 100 problems, about 10 in test


def test_noisy_teacher_errors_carry_on():
    import random

    from kpo.data.synthetic import noisy_solve

    assert noisy_solve([23, 45, 7], random.Random(0), 0.0) == "68+7=75"
    # noise 1: every step is off by one; the second step adds 7 to the wrong first sum
    chain = noisy_solve([23, 45, 7], random.Random(0), 1.0)
    first, final = chain.split("=")
    assert first.split("+")[1] == "7" and abs(int(first.split("+")[0]) - 68) == 1
    assert abs(int(final) - (int(first.split("+")[0]) + 7)) == 1
    assert grade(chain, "75") == 0.0


def test_too_many_problems_states_the_true_maximum():
    # The default task has 400 problems, about 80 in the test split; at most half of them (40) may be drawn.
    with pytest.raises(ValueError, match=r"n=50 test problems requested .* allows at most 40 \("):
        load_split("test", n=50)
    assert len(load_split("test", n=40)) == 40


def test_a_split_with_too_few_problems_is_a_value_error_saying_how_many_there_are():
    # 16 problems of which none hashes into the test split: the expected share (3) said one could be drawn
    assert TaskConfig(max_value=3).max_problems("test") == 1
    with pytest.raises(ValueError, match=r"has 16 distinct problems, 0 of them in the test split, too few for 1 "
                                         r"distinct test problems: raise max_value or n_terms$"):
        load_split("test", max_value=3)
    assert TaskConfig().max_problems("train") == 200 and TaskConfig().max_problems("test") == 40
