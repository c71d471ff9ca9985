"""Loaders for math benchmark and training files: one call, every format, rows ``{id, problem, answer}``.

``load_problems(path)`` detects the format from the file's first row and then holds every row to it, so a
row that lacks a field is an error that names the file and the row (never a silent skip). Formats:

==================  =============================================  =============================================
format              fields read                                    files in ../shared/data
==================  =============================================  =============================================
``problem_answer``  ``problem``, ``answer`` (str or number)         aime24, aime25, amc23, math500, dapo head256
``olympiadbench``   ``question`` (+ ``context``), ``final_answer``  olympiadbench ("$a$,$b$" lists joined: "a, b")
``boxed_solution``  ``problem``, last ``\\boxed{}`` of ``solution``  minerva.jsonl
``deepscaler``      ``problem``, ``answer`` list of alternatives   minerva.deepscaler.json (answer may be a list)
``gsm8k``           ``question``, ``answer`` after ``####``         gsm8k (thousands separators removed)
``verl``            ``prompt`` messages, ``reward_model``           *.parquet (``extra_info.raw_problem`` if set)
``keys``            ``problem_key``, ``answer_key`` given          anything else
==================  =============================================  =============================================

``answer`` is a string, or a list of accepted alternatives when a file lists several distinct ones
(``kpo.rewards.math_reward`` accepts both). ``id`` is the file's own id field as a string, else the row number.

Quirks handled (and reported with a warning naming the rows):
- JSON written with unescaped LaTeX (``"\\frac"`` decoded as form feed + ``rac``, ``"\\triangle"`` as a tab +
  ``riangle``): form feeds and backspaces are always restored; a tab is restored only where it starts a
  known LaTeX command, so real tabs in text stay.
- Exact duplicate rows (same id, problem and answer; e.g. DAPO's AIME file repeats each problem 32 times)
  are collapsed to one; sample repeatedly with ``n`` instead. Same id with different content is an error.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kpo.rewards import UNESCAPED_DOLLAR, answer_text, last_boxed
from kpo.testbed.files import task_of

__all__ = ["DEFAULT_INSTRUCTION", "FORMATS", "UndetectedFormat", "format_prompt", "load_problems"]

# The reasoning instruction kpo train appends to dataset problems and kpo eval appends to benchmark problems.
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

FORMATS = ("problem_answer", "olympiadbench", "boxed_solution", "deepscaler", "gsm8k", "verl", "keys")

_ID_KEYS = ("id", "idx", "index", "unique_id")
# JSON escapes that swallow a LaTeX backslash: "\frac" decodes to FORM FEED + "rac", "\beta" to BACKSPACE +
# "eta", "\times" to TAB + "imes". A control character is restored only where it starts one of these
# commands, since tabs are real text and PDF-extracted rows use FORM FEED for the "fi" ligature.
_SWALLOWED = {
    "\x0c": ("frac", "forall", "fbox"),
    "\x08": ("beta", "binom", "boxed", "bar", "big", "bigg", "begin", "bmod", "bot", "bullet"),
    "\t": (
        "triangle",
        "times",
        "theta",
        "text",
        "textbf",
        "textit",
        "textrm",
        "tfrac",
        "tbinom",
        "tilde",
        "therefore",
    ),
}
# One pattern per control character: it, followed by a command name minus its first letter, then a non-letter.
_SWALLOWED_RE = [
    (
        re.compile(
            char
            + "(?=(?:"
            + "|".join(sorted((n[1:] for n in names), key=len, reverse=True))
            + ")(?![a-zA-Z]))"
        ),
        "\\" + names[0][0],
    )
    for char, names in _SWALLOWED.items()
]


class _RowError(ValueError):
    pass


class _NoFormat(_RowError):
    pass


class UndetectedFormat(ValueError):
    """A file whose first row matches no format :func:`load_problems` detects; ``where`` names the file and row,
    ``fields`` are the row's. Its message says to name the fields (problem_key=, answer_key=); a caller without
    those says its own fix."""

    def __init__(self, where: str, fields: list[str]):
        self.where, self.fields = where, fields
        super().__init__(
            f"{where}: cannot detect the format from fields {fields}; pass problem_key= and answer_key= "
            "(kpo eval and kpo train: --problem-key/--answer-key) [format undetected]"
        )


def _repair_latex_escapes(text: str) -> str:
    """Undo JSON escapes that swallowed a LaTeX backslash (see _SWALLOWED)."""
    for pattern, escape in _SWALLOWED_RE:
        text = pattern.sub(lambda m, e=escape: e, text)
    return text


def _repair_strings(value: Any) -> Any:
    """`value` (a row, or anything in it) with every string passed through _repair_latex_escapes."""
    if isinstance(value, str):
        return _repair_latex_escapes(value)
    if isinstance(value, dict):
        return {k: _repair_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_repair_strings(v) for v in value]
    return value


def _text(row: dict, key: str) -> str:
    if key not in row:
        raise _RowError(f"missing field {key!r} (fields present: {sorted(row)})")
    value = row[key]
    if isinstance(value, str):
        if not value.strip():
            raise _RowError(f"field {key!r} is empty")
        return value.strip()
    try:  # numbers as the grader writes them: 27.0 -> "27" (AMC23 stores integers as floats); NaN is an error
        return answer_text(value, f"field {key!r}", "a string or a number")
    except (TypeError, ValueError) as err:
        raise _RowError(str(err)) from None


def _problem_answer(row: dict) -> tuple[str, Any]:
    return _text(row, "problem"), _text(row, "answer")


def _olympiadbench(row: dict) -> tuple[str, Any]:
    problem = _text(row, "question")
    if row.get("context"):
        problem = f"{_text(row, 'context')}\n\n{problem}"
    parts = row.get("final_answer")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, str) and p.strip() for p in parts):
        raise _RowError(f"field 'final_answer' must be a non-empty list of strings, got {parts!r:.80}")
    # "$69$,$84$" style multi-answers become one comma-separated answer "69, 84"; "\$" (currency) stays.
    return problem, ", ".join(UNESCAPED_DOLLAR.sub("", p).strip() for p in parts)


def _boxed_solution(row: dict) -> tuple[str, Any]:
    solution = _text(row, "solution")
    answer = last_boxed(solution)
    if answer is None or not answer.strip():
        raise _RowError("field 'solution' has no complete \\boxed{...} to take the answer from")
    # the box is already math: a "$" in it is a stray delimiter (Minerva's "+$ $\\dot{x}_0"), "\\$" stays
    return _text(row, "problem"), UNESCAPED_DOLLAR.sub("", answer).strip()


def _deepscaler(row: dict) -> tuple[str, Any]:
    alternatives = row.get("answer")
    if isinstance(alternatives, str | int | float):
        return _problem_answer(row)
    if not isinstance(alternatives, list) or not all(isinstance(a, str) and a.strip() for a in alternatives):
        raise _RowError(f"field 'answer' must be a non-empty list of strings, got {alternatives!r:.80}")
    unique = list(dict.fromkeys(a.strip() for a in alternatives))
    if not unique:
        raise _RowError("field 'answer' is an empty list")
    return _text(row, "problem"), unique[0] if len(unique) == 1 else unique


def _gsm8k(row: dict) -> tuple[str, Any]:
    solution = _text(row, "answer")
    if solution.count("####") != 1:
        raise _RowError(
            f"field 'answer' must contain exactly one '#### N' final line, found {solution.count('####')}"
        )
    answer = solution.split("####")[1].strip().replace(",", "")
    if not answer:
        raise _RowError("nothing after '####' in field 'answer'")
    return _text(row, "question"), answer


def _verl(row: dict) -> tuple[str, Any]:
    extra = row.get("extra_info") or {}
    if isinstance(extra, dict) and isinstance(extra.get("raw_problem"), str) and extra["raw_problem"].strip():
        problem = extra["raw_problem"].strip()
    else:
        messages = row.get("prompt")
        users = [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise _RowError(
                f"field 'prompt' must be a list of chat messages with a user turn, got {messages!r:.80}"
            )
        problem = _text(users[-1], "content")
    reward = row.get("reward_model")
    if not isinstance(reward, dict):
        raise _RowError(f"field 'reward_model' must be a dict with 'ground_truth', got {reward!r:.80}")
    return problem, _text(reward, "ground_truth")


def _detect(row: dict) -> str:
    if "prompt" in row and "reward_model" in row:
        return "verl"
    if "final_answer" in row and "question" in row:
        return "olympiadbench"
    if "problem" in row and isinstance(row.get("answer"), list):
        return "deepscaler"
    if "problem" in row and "answer" in row:
        return "problem_answer"
    if "problem" in row and "solution" in row:
        return "boxed_solution"
    if "question" in row and isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return "gsm8k"
    raise _NoFormat(sorted(row))


_EXTRACTORS: dict[str, Callable[[dict], tuple[str, Any]]] = {
    "problem_answer": _problem_answer,
    "olympiadbench": _olympiadbench,
    "boxed_solution": _boxed_solution,
    "deepscaler": _deepscaler,
    "gsm8k": _gsm8k,
    "verl": _verl,
}


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """(row label, raw row) pairs; labels are what error messages print."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"row {i}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON ({e}); expected a list of objects") from e
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
        return [(f"row {i}", r) for i, r in enumerate(data)]
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((f"row {len(rows)} (line {lineno})", json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: row {len(rows)} (line {lineno}): invalid JSON: {e}") from e
    return rows


def load_problems(
    path: str | Path, problem_key: str | None = None, answer_key: str | None = None
) -> list[dict[str, Any]]:
    """Rows ``{"id": str, "problem": str, "answer": str | list[str]}`` from a .jsonl, .json or .parquet file; the
    embedded task's rows (:mod:`kpo.testbed.files`) also keep their ``data_source``, which names their grader.

    problem_key/answer_key: read these fields instead of auto-detecting (give both or neither).
    Raises ValueError naming the file and row for a malformed row or an undetectable format.
    """
    path = Path(path)
    if (problem_key is None) != (answer_key is None):
        raise ValueError("give both problem_key and answer_key, or neither (auto-detect)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    raw = _read_rows(path)
    if not raw:
        raise ValueError(f"{path}: no rows")

    if problem_key is not None:
        fmt = "keys"

        def extract(row: dict) -> tuple[str, Any]:
            return _text(row, problem_key), _text(row, answer_key)
    else:
        fmt = None
    out: list[dict[str, Any]] = []
    seen: dict[str, tuple[str, int]] = {}
    repaired, collapsed = [], 0
    for i, (label, row) in enumerate(raw):
        try:
            if not isinstance(row, dict):
                raise _RowError(f"expected a JSON object, got {type(row).__name__}")
            fixed = _repair_strings(row)
            if fixed != row:
                repaired.append(label.split(" (")[0])
                row = fixed
            if fmt is None:
                fmt = _detect(row)
                extract = _EXTRACTORS[fmt]
            problem, answer = extract(row)
        except _NoFormat as e:
            raise UndetectedFormat(f"{path}: {label}", e.args[0]) from None
        except _RowError as e:
            raise ValueError(f"{path}: {label}: {e} [format {fmt or 'undetected'}]") from None
        pid = _row_id(row, fmt, i)
        if pid in seen:
            prior_label, prior_index = seen[pid]
            if (out[prior_index]["problem"], out[prior_index]["answer"]) == (problem, answer):
                collapsed += 1
                continue
            raise ValueError(
                f"{path}: {label}: id {pid!r} already used by {prior_label} with a different problem or answer; "
                "ids must be unique"
            )
        seen[pid] = (label, len(out))
        out.append({"id": pid, "problem": problem, "answer": answer})
        if fmt == "verl" and task_of(row.get("data_source")) is not None:  # the embedded task: its own grader
            out[-1]["data_source"] = row["data_source"]
    if repaired:
        shown = ", ".join(repaired[:10]) + (f" and {len(repaired) - 10} more" if len(repaired) > 10 else "")
        warnings.warn(
            f"{path}: restored LaTeX backslashes lost to JSON escapes (\\f, \\b, \\t) in {shown}",
            stacklevel=2,
        )
    if collapsed:
        warnings.warn(
            f"{path}: collapsed {collapsed} exact duplicate rows to {len(out)} unique problems "
            "(sample repeatedly with n instead)",
            stacklevel=2,
        )
    return out


def _row_id(row: dict, fmt: str, index: int) -> str:
    if (
        fmt == "verl"
        and isinstance(row.get("extra_info"), dict)
        and row["extra_info"].get("index") is not None
    ):
        return str(row["extra_info"]["index"])
    for key in _ID_KEYS:
        if row.get(key) is not None:
            return str(row[key])
    return str(index)


def format_prompt(problem: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The user-turn text of a math problem: the problem, a newline, then the instruction (omitted when blank).

    The one place this text is built, so a model trained by ``kpo train --dataset`` is evaluated by ``kpo eval``
    on the prompt it was trained on.
    """
    instruction = instruction.strip()  # a YAML block scalar ends in a newline the prompt should not
    return f"{problem}\n{instruction}" if instruction else problem


def has_chat_template(tokenizer) -> bool:
    """Whether math prompts for ``tokenizer`` go in its chat template by default (kpo train, kpo eval "auto"): a
    template that is missing or empty means plain text."""
    return bool(getattr(tokenizer, "chat_template", None))
