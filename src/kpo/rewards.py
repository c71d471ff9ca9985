"""Verifiable rewards: grade a completion against a reference math answer.

`math_reward(completion, answer) -> 1.0 | 0.0` extracts the completion's final answer (a ``\\boxed{}`` first,
then anchored patterns such as "the final answer is ..." or "Answer: ...") and compares it with the reference
with math-verify (symbolic, numeric and set/interval equality). A completion without an anchored answer
grades 0.0: a truncated chain of thought must not earn credit for an expression it happened to write.
Every call is bounded by a per-item wall-clock timeout and never raises: empty, truncated or garbage
completions grade 0.0.

Timeout: math-verify's own timeout is a whole-second ``signal.alarm`` per parse/verify call that only
works in the main thread. kpo disables it and bounds the *whole item* instead: with a float
``signal.setitimer`` in the main thread of a POSIX process, and with a one-worker subprocess (killed and
restarted on expiry) in any other thread or on Windows.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import signal
import threading
from collections.abc import Sequence

__all__ = ["math_reward", "last_boxed", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 5.0

# math-verify logs one warning when its own timeout is disabled; kpo's timeout replaces it.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in `text`, braces matched.

    Returns None when there is no box or the last box is not closed (a truncated completion).
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    i = text.index("{", start) if "{" in text[start:] else -1
    cmd_end = start + (len("\\fbox") if text.startswith("\\fbox", start) else len("\\boxed"))
    if i < 0 or text[cmd_end:i].strip():
        # "\boxed 5" form: the argument is the next whitespace-delimited token.
        m = re.match(r"\s+([^\s$]+)", text[cmd_end:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{" and text[j - 1] != "\\":
            depth += 1
        elif text[j] == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


class _ItemTimeout(BaseException):
    """Raised by the alarm; a BaseException so math-verify's `except Exception` cannot swallow it."""


def _configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    gold = [LatexExtractionConfig(), ExprExtractionConfig()]
    # A boxed answer outranks "the final answer is" patterns: the eval prompt asks for \boxed{}.
    pred = [
        LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),
        ExprExtractionConfig(try_extract_without_anchor=False),
    ]
    return gold, pred


def _grade(completion: str, answers: tuple[str, ...]) -> float:
    """Untimed grading; may raise (callers catch)."""
    from math_verify import parse, verify

    gold_cfg, pred_cfg = _configs()
    pred = parse(completion, extraction_config=pred_cfg, parsing_timeout=None)
    if not pred:
        return 0.0
    for answer in answers:
        text = answer.strip()
        delimited = _UNESCAPED_DOLLAR.search(text) or "\\boxed" in text
        gold = parse(text if delimited else f"${text}$", gold_cfg, parsing_timeout=None)
        if gold and verify(gold, pred, timeout_seconds=None):
            return 1.0
    return 0.0


def _normalize_answers(answer: str | int | float | Sequence[str]) -> tuple[str, ...]:
    if isinstance(answer, str):
        return (answer,)
    if isinstance(answer, bool):
        raise TypeError(f"answer must be str, a number or a list of str, got bool {answer!r}")
    if isinstance(answer, int | float):
        return (str(int(answer)) if float(answer).is_integer() else str(answer),)
    out = tuple(answer)
    if not out or not all(isinstance(a, str) for a in out):
        raise TypeError(f"answer list must be non-empty and hold str alternatives, got {answer!r}")
    return out


def _grade_with_alarm(completion: str, answers: tuple[str, ...], timeout_s: float) -> float:
    def on_alarm(signum, frame):
        raise _ItemTimeout

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return _grade(completion, answers)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _grade_in_subprocess(completion: str, answers: tuple[str, ...], timeout_s: float) -> float:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ProcessPoolExecutor(max_workers=1)
        pool = _pool
    future = pool.submit(_grade, completion, answers)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        # The worker is stuck in a computation that cannot be interrupted: kill it, start afresh next time.
        with _pool_lock:
            if _pool is pool:
                _pool = None
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        return 0.0


def math_reward(
    completion: str, answer: str | int | float | Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> float:
    """1.0 if `completion`'s final answer equals `answer` (math-verify), else 0.0; never raises.

    answer: the reference (LaTeX without ``$``, or a number), or a list of accepted alternatives.
    timeout_s: wall-clock bound for the whole item (extraction + comparison); on expiry the grade is 0.0.
    """
    try:
        answers = _normalize_answers(answer)
        if not isinstance(completion, str) or not completion.strip():
            return 0.0
        if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
            return _grade_with_alarm(completion, answers, timeout_s)
        return _grade_in_subprocess(completion, answers, timeout_s)
    except _ItemTimeout:
        return 0.0
    except Exception:  # noqa: BLE001 - a grader that raises would kill a training or eval run
        return 0.0
