from __future__ import annotations

import concurrent.futures
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import kpo.rewards as rewards
from kpo.rewards import last_boxed, math_reward

_REAL_GRADE = rewards._grade

SHARED = Path(
    os.environ.get("KPO_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
)
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared benchmark data not found at {SHARED}")
# Every row when KPO_FULL_GRADER_CHECK=1 (about a minute); every 12th row by default (a few seconds).
STRIDE = 1 if os.environ.get("KPO_FULL_GRADER_CHECK") == "1" else 12


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{\\{a, \\{b\\}\\}}", "\\{a, \\{b\\}\\}"),  # last box, escaped braces skipped
        ("\\fbox{7}", "7"),
        ("the answer is \\boxed 5$.", "5"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{12", None),  # truncated inside the box
        ("no box here", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("Thus $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
        ("Thus $\\boxed{\\frac12}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{(1,2)}", "(1, 2)", 1.0),
        ("The winner is \\boxed{\\text{Evelyn}}", "\\text{Evelyn}", 1.0),
        ("\\boxed{27}", 27.0, 1.0),  # AMC23 stores answers as floats
        ("\\boxed{6630}", ["6630.65", "6630"], 1.0),  # any listed alternative
        ("so the final answer is 7.", "7", 1.0),
        ("Answer: 7", "7", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("\\boxed{(1,2)}", "(2, 1)", 0.0),
        ("Step 1: we compute 3 + 4 and get", "7", 0.0),  # truncated: no anchored final answer
        ("The answer is \\boxed{7", "7", 0.0),  # truncated inside the box
        ("", "7", 0.0),
        ("\x00\x01 }}}{{{ \\boxed{", "7", 0.0),
        (None, "7", 0.0),  # a malformed completion earns nothing; a malformed answer raises (below)
        ("\\boxed{5}", np.int64(5), 1.0),  # numpy scalars from parquet/pandas rows are numbers too
        ("\\boxed{27}", np.float64(27.0), 1.0),
        ("\\boxed{0.1}", np.float32(0.1), 1.0),  # str(), not float(): stays "0.1"
        ("\\boxed{6630}", ("6630.65", 6630), 1.0),
        # Minerva writes answers in E notation, which math-verify alone reads as 4.5 * e * 33
        ("\\boxed{4.5 \\times 10^{33}}", "4.5e33", 1.0),
        ("\\boxed{4.5e33}", "4.5e33", 1.0),
        ("\\boxed{5.3\\times10^{-9}}", "5.3e-9", 1.0),
        ("\\boxed{10^{11}}", "1e11", 1.0),
        ("\\boxed{4.6 \\times 10^{33}}", "4.5e33", 0.0),
        ("\\boxed{4.5 \\times 10^{32}}", "4.5e33", 0.0),
        ("so $\\fbox{7}$", "7", 1.0),  # the box forms last_boxed reads, math-verify alone does not
        ("so \\boxed 7.", "7", 1.0),
        ("so $\\boxed 7$", "7", 1.0),
        ("\\fbox{6}", "7", 0.0),
    ],
)
def test_math_reward_cases(completion, answer, expected):
    assert math_reward(completion, answer) == expected


@pytest.mark.parametrize(
    "answer, error, message",
    [
        (
            None,
            TypeError,
            r"answer must be a str, a real number or a list of them, got NoneType None; the data row",
        ),
        ([], ValueError, "answer is an empty list"),
        ("  ", ValueError, "answer is a blank string"),
        (["5", None], TypeError, r"answer\[1\] must be a str or a real number, got NoneType"),
        (True, TypeError, "got bool True"),
        ({"value": 5}, TypeError, "got dict"),
        (np.array([5]), TypeError, "got ndarray"),
        (math.nan, ValueError, "answer is nan; a reference answer must be finite"),
    ],
)
def test_a_malformed_reference_answer_raises(answer, error, message):
    # A bad data row must not grade every completion 0.0: a run would train on nothing and not know it.
    with pytest.raises(error, match=message):
        math_reward("\\boxed{5}", answer)


@pytest.mark.parametrize("timeout_s", [0, -1, math.nan, math.inf])
def test_timeout_must_be_finite_and_positive(timeout_s):
    # 0 would disable the bound in the main thread and time out at once in other threads; < 0, NaN give 0.0.
    with pytest.raises(ValueError, match="timeout_s must be a finite number of seconds > 0"):
        math_reward("\\boxed{5}", "5", timeout_s=timeout_s)
    with pytest.raises(ValueError, match="timeout_s must be"):
        _in_thread(lambda: math_reward("\\boxed{5}", "5", timeout_s=timeout_s))


def test_missing_math_verify_raises_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    for completion in ("\\boxed{5}", ""):  # even a completion that would grade 0.0 without math-verify
        with pytest.raises(ImportError, match=r"pip install 'kpo\[eval\]'.*math-verify"):
            math_reward(completion, "5")


def _raising_grade(completion, answers):
    raise RecursionError("math-verify/sympy choked on this completion")


def _dying_grade(completion, answers):
    os._exit(1)  # the worker dies on this completion (as on a segfault or an out-of-memory kill)


def test_a_grader_error_on_one_completion_grades_it_zero(monkeypatch):
    monkeypatch.setattr(rewards, "_grade", _raising_grade)  # each new thread's worker forks with it in place
    assert math_reward("\\boxed{1}", "1") == 0.0
    assert _in_thread(lambda: math_reward("\\boxed{1}", "1")) == 0.0


def test_a_worker_that_dies_grades_zero_and_the_next_item_gets_a_fresh_one(monkeypatch):
    def dying_then_fine():
        first = math_reward("\\boxed{1}", "1")
        # The broken pool was dropped: this thread's next item is graded by a fresh worker, not refused.
        monkeypatch.setattr(rewards, "_grade", _REAL_GRADE)
        return first, math_reward("\\boxed{1}", "1")

    monkeypatch.setattr(rewards, "_grade", _dying_grade)
    assert _in_thread(dying_then_fine) == (0.0, 1.0)


def _in_thread(fn):
    """fn() in a non-main thread (math_reward then grades in a subprocess); re-raises what fn raised."""
    out, err = [], []

    def target():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            err.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join(60)
    if err:
        raise err[0]
    return out[0]


def test_timeout_bounds_a_stuck_item_in_the_main_thread(monkeypatch):
    monkeypatch.setattr(rewards, "_grade", lambda completion, answers: time.sleep(5) or 1.0)
    start = time.perf_counter()
    assert math_reward("\\boxed{1}", "1", timeout_s=0.2) == 0.0
    assert time.perf_counter() - start < 2.0
    # The alarm is disarmed afterwards: a later slow-but-legal step is not interrupted.
    time.sleep(0.3)


def test_grading_off_the_main_thread_uses_a_subprocess():
    assert _in_thread(lambda: math_reward("\\boxed{\\frac{2}{4}}", "\\frac12")) == 1.0
    assert _in_thread(lambda: math_reward("\\boxed{3}", "4")) == 0.0


def _slow_grade(completion, answers):
    time.sleep(30)
    return 1.0


def test_subprocess_timeout_kills_the_stuck_worker_and_recovers(monkeypatch):
    monkeypatch.setattr(rewards, "_grade", _slow_grade)  # the new thread's worker forks with it in place
    start = time.perf_counter()
    assert _in_thread(lambda: math_reward("\\boxed{1}", "1", timeout_s=1.0)) == 0.0
    assert time.perf_counter() - start < 10.0
    monkeypatch.undo()
    assert _in_thread(lambda: math_reward("\\boxed{1}", "1")) == 1.0


def _slow_if_asked(completion, answers):
    if "slow" in completion:
        time.sleep(30)
    return _REAL_GRADE(completion, answers)


def test_a_stuck_item_in_one_thread_does_not_fail_other_threads_items(monkeypatch):
    # verl grades from a thread pool. With one worker shared by all threads, the items queued behind a stuck
    # one timed out waiting, and killing the stuck worker broke the pool under them: correct answers got 0.0
    # or raised. Each thread now has its own worker: only the stuck item is lost.
    monkeypatch.setattr(rewards, "_grade", _slow_if_asked)

    def correct(i):
        time.sleep(0.1)  # queued after the stuck item has started
        return math_reward(f"\\boxed{{{i}}}", str(i), timeout_s=20.0)

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        stuck = pool.submit(math_reward, "slow \\boxed{1}", "1", timeout_s=1.0)
        items = [pool.submit(correct, i) for i in range(4)]
        assert stuck.result() == 0.0
        assert [f.result() for f in items] == [1.0] * 4


def _reference_pairs(name: str) -> list[tuple[str, str]]:
    from kpo.data.math import load_problems

    raw = [json.loads(line) for line in (SHARED / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    rows = load_problems(SHARED / f"{name}.jsonl")
    if name == "math500":
        # MATH solutions end in \boxed{answer}.
        return [(r["solution"], row["answer"]) for r, row in zip(raw, rows)]
    # OlympiadBench solutions are prose without a box; the reference answer is appended the way the eval
    # prompt asks a model to write it, so the check covers the answers' own formats (tuples, sets, intervals).
    return [
        (r["solution"][0] + f"\n\nThe final answer is $\\boxed{{{row['answer']}}}$.", row["answer"])
        for r, row in zip(raw, rows)
    ]


@needs_shared
@pytest.mark.parametrize("name", ["math500", "olympiadbench"])
def test_grader_accepts_reference_solutions_and_rejects_mismatches(name):
    pairs = _reference_pairs(name)
    subset = pairs[::STRIDE]
    accepted = sum(math_reward(c, a) for c, a in subset)
    assert accepted / len(subset) >= 0.99, f"{name}: accepted {accepted}/{len(subset)} reference solutions"
    # Each solution against the next problem's answer (skipping identical answer strings) must fail;
    # the one tolerated slip is a true equivalence such as "x=5" vs "5".
    mismatched = [(pairs[i][0], pairs[(i + 1) % len(pairs)][1]) for i in range(0, len(pairs), STRIDE)]
    mismatched = [(c, a) for (c, a), (_, own) in zip(mismatched, subset) if a.strip() != own.strip()]
    wrongly = sum(math_reward(c, a) for c, a in mismatched)
    assert wrongly / len(mismatched) <= 0.01, (
        f"{name}: accepted {wrongly}/{len(mismatched)} mismatched answers"
    )
