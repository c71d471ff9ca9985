from __future__ import annotations

import pytest

from data.draws import no_more_draws
from kpo.testbed.task import MAX_ROWS, TaskConfig, grade, load_split, solve


def test_solve_reduces_chain_left_to_right():
    # 23+45 = 68, then 68+7 = 75
    assert solve([23, 45, 7]) == "68+7=75"
    assert solve([1, 2]) == "3"
    # 1+2=3, 3+3=6, 6+4=10
    assert solve([1, 2, 3, 4]) == "3+3+4=6+4=10"


def test_rows_are_deterministic_and_well_formed():
    a = load_split("train", n=50, seed=3, kind="chain", n_terms=3, max_value=20)
    b = load_split("train", n=50, seed=3, kind="chain", n_terms=3, max_value=20)
    assert a == b
    assert a != load_split("train", n=50, seed=4, kind="chain", n_terms=3, max_value=20)
    for row in a:
        assert set(row) == {"id", "problem", "answer", "prompt", "solution"}
        assert row["prompt"] == row["problem"] + "="
        assert str(sum(int(x) for x in row["problem"].split("+"))) == row["answer"]
        assert grade(row["solution"], row["answer"]) == 1.0
    assert len({r["problem"] for r in a}) == 50


def test_train_and_test_are_disjoint_across_seeds():
    test = {r["problem"] for r in load_split("test", n=200, seed=0, kind="chain", max_value=99)}
    for seed in range(3):
        train = {r["problem"] for r in load_split("train", n=2000, seed=seed, kind="chain", max_value=99)}
        assert not train & test
    # the chain task (2 terms up to 19) has 400 problems; the default sizes take half of each split
    assert len(load_split("test", kind="chain")) == 40 and len(load_split("train", kind="chain")) == 200


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
        TaskConfig(kind="chain", n_terms=1, max_value=0)
    with pytest.raises(
        ValueError,
        match=r"\(running\): n_terms=0: must be an integer >= 1; max_value=10: must be an "
        r"integer in 1..9",
    ):
        TaskConfig(n_terms=0, max_value=10)
    with pytest.raises(ValueError, match="kind='sum': must be one of"):
        TaskConfig(kind="sum")
    with pytest.raises(ValueError, match="split='dev'"):
        load_split("dev")
    with pytest.raises(ValueError, match="ask for 10 or fewer, or raise max_value"):
        load_split("test", n=100, kind="chain", max_value=9)  # 100 problems, about 10 in test


def test_noisy_teacher_errors_carry_on():
    import random

    from kpo.testbed.task import noisy_solve

    assert noisy_solve([23, 45, 7], random.Random(0), 0.0) == "68+7=75"
    # noise 1: every step is off by one; the second step adds 7 to the wrong first sum
    chain = noisy_solve([23, 45, 7], random.Random(0), 1.0)
    first, final = chain.split("=")
    assert first.split("+")[1] == "7" and abs(int(first.split("+")[0]) - 68) == 1
    assert abs(int(final) - (int(first.split("+")[0]) + 7)) == 1
    assert grade(chain, "75") == 0.0


def test_too_many_problems_states_the_true_maximum():
    # The chain task has 400 problems, about 80 in the test split; at most half of them (40) may be drawn.
    with pytest.raises(ValueError, match=r"n=50: 50 test problems requested .* allows at most 40 \("):
        load_split("test", n=50, kind="chain")
    assert len(load_split("test", n=40, kind="chain")) == 40


def test_a_split_with_too_few_problems_is_a_value_error_saying_how_many_there_are():
    # 16 problems of which none hashes into the test split: the expected share (3) said one could be drawn
    assert TaskConfig(kind="chain", max_value=3).max_problems("test") == 1
    with pytest.raises(
        ValueError,
        match=r"has 16 distinct problems, 0 of them in the test split, too few for 1 "
        r"distinct test problems: raise max_value or n_terms$",
    ):
        load_split("test", kind="chain", max_value=3)
    chain = TaskConfig(kind="chain")
    assert chain.max_problems("train") == 200 and chain.max_problems("test") == 40


# ---------------------------------------------------------------------------------------- the running task


def test_running_solution_is_the_last_digit_of_every_prefix_sum():
    # 3; 3+5 = 8; 8+2 = 10 -> 0; 0+7 = 7
    assert solve([3, 5, 2, 7], "running") == "3807"
    # 9; 9+9 = 18 -> 8; 8+9 = 17 -> 7
    assert solve([9, 9, 9], "running") == "987"
    task = TaskConfig()
    assert (task.kind, task.n_terms, task.max_value) == ("running", 128, 9)
    # the prompt ends with the sum's start, 0: the first step reads a digit, as every later one does
    assert task.prompt([3, 5, 2, 7]) == "3527=0" and task.terms("3527") == [3, 5, 2, 7]
    assert TaskConfig(kind="chain").prompt([23, 45]) == "23+45="


def test_running_task_is_long_large_and_disjoint():
    task = TaskConfig()
    # the default: 128 digits in, 128 digits out, one token each, plus '=0' and the end token
    assert task.max_response_chars() == 128 and task.max_prompt_chars() == 130
    assert task.max_sequence_tokens() == 259
    assert task.space_size() == 10**128
    test = load_split("test", task=task)
    train = load_split("train", n=2000, task=task)
    assert len(test) == 256 and not {r["problem"] for r in train} & {r["problem"] for r in test}
    for row in test[:20]:
        assert len(row["solution"]) == 128 and row["answer"] == row["solution"]
        assert row["prompt"] == row["problem"] + "=0" and task.grade(row["solution"], row["answer"]) == 1.0
    # the running kind draws its own stream: its rows are not the chain task's
    assert load_split("train", n=3, kind="running", n_terms=2, max_value=9) != load_split(
        "train", n=3, kind="chain", n_terms=2, max_value=9
    )


def test_running_grade_needs_every_step():
    task = TaskConfig(n_terms=4)
    assert task.grade("3807", "3807") == 1.0
    assert task.grade(" 3807\n", "3807") == 1.0
    assert task.grade("3817", "3807") == 0.0  # one wrong step
    assert task.grade("380", "3807") == 0.0  # stopped early
    assert task.grade("38070", "3807") == 0.0  # ran on
    assert task.grade("", "") == 0.0 and task.grade(None, "3807") == 0.0  # type: ignore[arg-type]


def test_running_noisy_teacher_carries_its_errors():
    import random

    from kpo.testbed.task import noisy_solve

    terms = [3, 5, 2, 7]
    assert noisy_solve(terms, random.Random(0), 0.0, "running") == "3807"
    # noise 1: every digit is off by one from the previous (wrong) digit plus the term
    noisy = noisy_solve(terms, random.Random(1), 1.0, "running")
    previous = 0
    for term, digit in zip(terms, noisy):
        assert (int(digit) - previous - term) % 10 in (1, 9)
        previous = int(digit)
    # at 1% per step a 128-step response is all right with probability 0.99**128 = 0.276
    rng = random.Random(2)
    rows = load_split("train", n=400, seed=5)
    right = sum(
        noisy_solve(TaskConfig().terms(r["problem"]), rng, 0.01, "running") == r["solution"] for r in rows
    )
    assert 0.2 < right / 400 < 0.36  # 3.5 binomial standard deviations (0.022) either side


# ------------------------------------------------------------------------------------- sizes checked first


def test_a_split_larger_than_kpo_draws_is_refused_before_any_problem_is_drawn(monkeypatch):
    """load_split("test", n=1e8) of the running task (10^127 test problems) built rows for about 15 hours (and
    100 GB) before anything said so: kpo eval --limit and kpo compare --eval-limit hung on it."""
    no_more_draws(monkeypatch, 0)
    assert TaskConfig().max_problems("test") == TaskConfig().max_problems("train") == MAX_ROWS == 1_000_000
    for split in ("test", "train"):
        with pytest.raises(ValueError) as info:
            load_split(split, n=10**8)
        assert str(info.value) == (
            f"n=100000000: 100000000 {split} problems requested but the task {{'kind': 'running', 'n_terms': "
            "128, 'max_value': 9} allows at most 1000000 (all that kpo draws: it builds every problem in memory, "
            "about 1 kB each): ask for 1000000 or fewer"
        )


@pytest.mark.parametrize(
    "kw, longest",
    [
        ({"n_terms": 10**8}, 200_000_003),
        ({"n_terms": 8191}, 16385),
        ({"kind": "chain", "n_terms": 1000}, 1_504_498),
    ],
)
def test_a_task_longer_than_an_embedded_sequence_is_refused_before_any_text_is_built(kw, longest):
    """n_terms=1e8 hung: counting its problems alone took minutes (a 10^(1e8) integer), then rows of 1e8 terms."""
    with pytest.raises(
        ValueError, match=rf"sequences of up to {longest} tokens \(prompt and response\), more than the 16384"
    ):
        TaskConfig(**kw)
    # the bound holds the longest sequence: exactly for the running task, from above for the chain
    assert TaskConfig(n_terms=8190).max_sequence_tokens() == 16383
    chain = TaskConfig(kind="chain", n_terms=30, max_value=19)
    assert chain.max_sequence_tokens() == 1420 <= chain._sequence_bound() == 1454
