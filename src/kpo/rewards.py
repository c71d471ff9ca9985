"""Verifiable rewards: grade a completion against a reference math answer.

`math_reward(completion, answer) -> 1.0 | 0.0` extracts the completion's final answer (a ``\\boxed{}`` first,
then anchored patterns such as "the final answer is ..." or "Answer: ...") and compares it with the reference
with math-verify (symbolic, numeric and set/interval equality). A completion without an anchored answer
grades 0.0: a truncated chain of thought must not earn credit for an expression it happened to write.
Every call is bounded by a per-item wall-clock timeout. A bad *completion* (empty, truncated, garbage, or one
that makes math-verify raise or time out) grades 0.0; a bad *call* raises instead, because a run that
silently grades everything 0.0 trains on nothing: math-verify not installed (ImportError), a reference answer
that is missing, empty or of the wrong type (TypeError/ValueError), or a timeout that is not a finite
positive number (ValueError).

Timeout: math-verify's own timeout is a whole-second ``signal.alarm`` per parse/verify call that only
works in the main thread. kpo disables it and bounds the *whole item* instead: with a float
``signal.setitimer`` in the main thread of a POSIX process, and with a one-worker subprocess per calling thread
(killed and restarted on expiry) in any other thread or on Windows.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import numbers
import re
import signal
import threading
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool

__all__ = ["math_reward", "last_boxed", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 5.0

# math-verify logs one warning when its own timeout is disabled; kpo's timeout replaces it.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
# The box forms math-verify does not read, rewritten as \boxed{...}: "\fbox{7}" and "\boxed 7".
# ("\boxed 7." ends its sentence: the period is not the answer's).
_OTHER_BOXES = (
    (re.compile(r"\\fbox\s*\{"), r"\\boxed{"),
    (re.compile(r"\\boxed\s+([^\s{}$]*[^\s{}$.,;:])"), r"\\boxed{\1}"),
)
# A number in E notation ("4.5e33", "1e-5", as Minerva writes answers), not part of a name or a longer number.
_E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")


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
    """Untimed grading; may raise on a malformed completion (callers turn that into 0.0)."""
    from math_verify import parse, verify

    gold_cfg, pred_cfg = _configs()
    for pattern, box in _OTHER_BOXES:
        completion = pattern.sub(box, completion)
    pred = parse(completion, extraction_config=pred_cfg, parsing_timeout=None)
    if not pred:
        return 0.0
    for answer in answers:
        text = answer.strip()
        delimited = UNESCAPED_DOLLAR.search(text) or "\\boxed" in text
        gold = parse(text if delimited else f"${text}$", gold_cfg, parsing_timeout=None)
        if gold and verify(gold, pred, timeout_seconds=None):
            return 1.0
    return 0.0


def _require_math_verify() -> None:
    """Raise ImportError with the install hint when math-verify cannot be imported (else every grade is 0.0)."""
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"kpo.rewards.math_reward grades with math-verify, which cannot be imported ({exc}); "
            "install it with pip install 'kpo[eval]' (or pip install 'math-verify>=0.8')"
        ) from exc


def _check_timeout(timeout_s: float) -> None:
    # 0 would disarm the main-thread alarm (no bound) yet time out at once in a subprocess; < 0 or NaN grade 0.0.
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise TypeError(
            f"timeout_s must be a number of seconds, got {type(timeout_s).__name__} {timeout_s!r}"
        )
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")


def answer_text(answer: numbers.Real | str, where: str, allowed: str) -> str:
    """One reference answer as grader text; a number becomes its plain decimal form (27.0 -> "27").

    where: how the error names it ("answer", "answer[2]"); allowed: the types the error says it may be.
    """
    if isinstance(answer, str):
        if not answer.strip():
            raise ValueError(f"{where} is a blank string; the data row has no reference answer")
        return answer
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise TypeError(
            f"{where} must be {allowed}, got {type(answer).__name__} {answer!r:.80}"
            + ("; the data row has no reference answer" if answer is None else "")
        )
    if isinstance(answer, numbers.Integral):
        return str(int(answer))
    value = float(answer)
    if not math.isfinite(value):
        raise ValueError(f"{where} is {answer!r}; a reference answer must be finite")
    # str(), not float(): np.float32(0.1) must stay "0.1", not 0.10000000149011612.
    return str(int(value)) if value.is_integer() else str(answer)


def _normalize_answers(answer: str | numbers.Real | Sequence[str | numbers.Real]) -> tuple[str, ...]:
    """The reference as a non-empty tuple of alternatives; raises naming what is wrong with it.

    An answer in E notation also stands as LaTeX ("4.5e33" and "4.5\\times10^{33}"): math-verify reads the e of
    "4.5e33" as Euler's number, so a completion's "4.5 \\times 10^{33}" could not match the plain form.
    """
    if isinstance(answer, list | tuple):
        if not answer:
            raise ValueError("answer is an empty list; give at least one accepted alternative")
        texts = [answer_text(a, f"answer[{i}]", "a str or a real number") for i, a in enumerate(answer)]
    else:
        texts = [answer_text(answer, "answer", "a str, a real number or a list of them")]
    latex = (_E_NOTATION.sub(lambda m: f"{m.group(1)}\\times10^{{{int(m.group(2))}}}", t) for t in texts)
    return tuple(dict.fromkeys([*texts, *latex]))


def _grade_with_alarm(completion: str, answers: tuple[str, ...], timeout_s: float) -> float:
    def on_alarm(signum, frame):
        raise _ItemTimeout

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return _grade(completion, answers)
        except Exception:  # noqa: BLE001 - math-verify/sympy raising on this completion: it earns nothing
            return 0.0
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _ItemTimeout:  # also when the alarm fires between _grade's return and the disarm
        return 0.0
    finally:
        signal.signal(signal.SIGALRM, old)


# One worker process per grading thread (verl grades from a thread pool): an item's timeout then counts its
# own grading only, not a queue behind other threads' items, and killing a stuck worker breaks no other
# thread's item. A pool goes with its thread (the executor shuts its worker down when it is collected).
_local = threading.local()


def _grade_in_subprocess(completion: str, answers: tuple[str, ...], timeout_s: float) -> float:
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = concurrent.futures.ProcessPoolExecutor(max_workers=1)
    future = pool.submit(_grade, completion, answers)
    try:
        return future.result(timeout=timeout_s)
    except (concurrent.futures.TimeoutError, BrokenProcessPool):
        # The worker is stuck in a computation that cannot be interrupted, or died on this completion: kill it
        # and start afresh next time (a broken pool would refuse every later item).
        _local.pool = None
        for proc in list((pool._processes or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        return 0.0
    except Exception:  # noqa: BLE001 - math-verify/sympy raised in the worker on this completion
        return 0.0


def math_reward(
    completion: str,
    answer: str | numbers.Real | Sequence[str | numbers.Real],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """1.0 if `completion`'s final answer equals `answer` (math-verify), else 0.0.

    completion: the model's text; anything that is not a non-blank str grades 0.0.
    answer: the reference (LaTeX without ``$``, or a real number such as 27.0 or numpy.int64(5)), or a non-empty
        list/tuple of accepted alternatives. None, blank, empty or other types raise: that is a bad data row.
    timeout_s: wall-clock bound in seconds (finite, > 0) for the whole item; on expiry the grade is 0.0.
    Raises ImportError when math-verify is not installed.
    """
    _check_timeout(timeout_s)
    answers = _normalize_answers(answer)
    _require_math_verify()
    if not isinstance(completion, str) or not completion.strip():
        return 0.0
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _grade_with_alarm(completion, answers, timeout_s)
    return _grade_in_subprocess(completion, answers, timeout_s)
