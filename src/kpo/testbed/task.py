"""The embedded tasks: arithmetic with a verifiable answer, the whole response graded.

Two kinds, chosen by :attr:`TaskConfig.kind`:

``running`` (the default): a running sum modulo 10 over ``n_terms`` digits. The prompt is the digits, ``=`` and
the sum's start ``0``; the response writes the last digit of every prefix sum, one token per step, so it is as
long as the problem (128 tokens by default) and grows linearly with it::

    prompt    "3527=0"
    solution  "3807"          (0+3 = 3; 3+5 = 8; 8+2 = 10 -> 0; 0+7 = 7)
    answer    "3807"          (the whole response is the answer)

Every step is the same easy rule: the digit just read plus the term a fixed distance back, mod 10. The first
step too: the prompt's ``0`` is its previous digit (a prompt ending at ``=`` made step 0 a rule of its own,
"copy term 0" from the input ``=``, trained on 1/128 of the tokens, and warm starts that missed it scored near
0). So a small model learns the rule to ~99% at every position, and a response is right only if all of its
steps are: RL must credit single tokens among many. An error carries into every later step, as in a long chain
of thought.

``chain``: chained additions of ``n_terms`` numbers up to ``max_value`` (responses of ~3 tokens by default).
The solution reduces the chain one addition at a time::

    prompt    "23+45+7="
    solution  "68+7=75"       (step 1: 23+45 -> 68; step 2: 68+7 -> 75)
    answer    "75"

Every string uses only the characters in :data:`ALPHABET`, so a character-level tokenizer covers it.
Train and test are disjoint by construction: a problem belongs to the test split if and only if a stable
hash of its text falls in the test bucket, so no seed or size can leak a test problem into training.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from dataclasses import asdict, dataclass

__all__ = [
    "ALPHABET",
    "MAX_ROWS",
    "TASKS",
    "TaskConfig",
    "grade",
    "load_split",
    "noisy_solve",
    "solve",
    "too_many",
]

# Characters the tasks can emit; the embedded tokenizer has one token per character.
ALPHABET = "0123456789+="

# kind -> (default n_terms, default max_value)
TASKS = {"running": (128, 9), "chain": (2, 19)}

_SPLITS = ("train", "test")
# One problem in _TEST_BUCKETS goes to the test split (about 20%).
_TEST_BUCKETS = 5
_DEFAULT_SIZES = {"train": 4096, "test": 256}
# Rejection sampling gives up after this many draws per requested row (the space is then nearly exhausted).
_MAX_DRAWS_PER_ROW = 50
# The most rows load_split draws, whatever the task's space: it builds every row in memory (about 1 kB each, and
# 0.2-0.4 ms each for the default running task, so a million take a GB and minutes; 1e8 took 15 hours). kpo uses at
# most 12800 a call (a warm-start round), and an evaluation samples every problem n times.
MAX_ROWS = 1_000_000
# The longest sequence (prompt, response and end token) an embedded task may have, checked from n_terms and
# max_value before any text is built: the embedded model attends over all of it, and larger tasks hung in their
# own setup (n_terms=1e7 took 20 s to count its problems, then its rows and model context would not fit). The
# paper's responses reach 4096 tokens; the running task's 8190 terms give 16383.
MAX_SEQUENCE_TOKENS = 16384


@dataclass(frozen=True)
class TaskConfig:
    """Knobs of an embedded task; ``None`` takes the kind's default (:data:`TASKS`).

    Attributes:
        kind: ``"running"`` (running sum mod 10, one response token per term) or ``"chain"`` (chained
            additions, ``n_terms - 1`` chain-of-thought steps).
        n_terms: numbers in the problem (running: >= 1, default 128; chain: >= 2, default 2).
        max_value: each number is drawn uniformly from ``[0, max_value]`` (running: 1..9, single digits, default
            9; chain: >= 1, default 19, more digits = harder).
    """

    kind: str = "running"
    n_terms: int | None = None
    max_value: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ValueError(f"invalid TaskConfig: kind={self.kind!r}: must be one of {sorted(TASKS)}")
        n_default, v_default = TASKS[self.kind]
        if self.n_terms is None:
            object.__setattr__(self, "n_terms", n_default)
        if self.max_value is None:
            object.__setattr__(self, "max_value", v_default)
        errors = []
        least = 2 if self.kind == "chain" else 1
        if not _is_int(self.n_terms) or self.n_terms < least:
            why = " (a chain needs one addition)" if self.kind == "chain" else ""
            errors.append(f"n_terms={self.n_terms!r}: must be an integer >= {least}{why}")
        top = 9 if self.kind == "running" else None
        if not _is_int(self.max_value) or self.max_value < 1 or (top is not None and self.max_value > top):
            bound = "in 1..9 (the running task's terms are single digits)" if top else ">= 1"
            errors.append(f"max_value={self.max_value!r}: must be an integer {bound}")
        if not errors and (longest := self._sequence_bound()) > MAX_SEQUENCE_TOKENS:
            errors.append(
                f"n_terms={self.n_terms}, max_value={self.max_value}: sequences of up to {longest} tokens (prompt "
                f"and response), more than the {MAX_SEQUENCE_TOKENS} an embedded task may have (its model attends "
                "over all of them); lower "
                + ("n_terms to 8190 or less" if self.kind == "running" else "n_terms or max_value")
            )
        if errors:
            raise ValueError(f"invalid TaskConfig ({self.kind}): " + "; ".join(errors))

    def _sequence_bound(self) -> int:
        """At least :meth:`max_sequence_tokens`, from n and m = max_value alone (no text built): running exactly
        (n + 2) + n + 1; chain with d, D the digits of m and n m: a prompt of n (d + 1) characters and a response
        whose step k writes (k + 1) m and the n - k - 1 terms left, with '+' and '=' between."""
        n, m = self.n_terms, self.max_value
        if self.kind == "running":
            return 2 * n + 3
        d, big = _digits(m), _digits(n * m)
        return n * (d + 1) + (n - 1) * (big + 1) + (n - 1) * (n - 2) // 2 * (d + 1) + 1

    def max_prompt_chars(self) -> int:
        """Longest prompt in characters (= tokens of the embedded tokenizer)."""
        return len(self.prompt([self.max_value] * self.n_terms))

    def max_response_chars(self) -> int:
        """Upper bound on the characters of a reference solution (for sizing max_completion_length)."""
        if self.kind == "running":
            return self.n_terms
        return len(solve([self.max_value] * self.n_terms, "chain"))

    def max_sequence_tokens(self) -> int:
        """Longest prompt + response + end-of-sequence token: the context the embedded model needs."""
        return self.max_prompt_chars() + self.max_response_chars() + 1

    def space_size(self) -> int:
        """Number of distinct problems (both splits together)."""
        return (self.max_value + 1) ** self.n_terms

    def max_problems(self, split: str) -> int:
        """Most distinct problems :func:`load_split` draws from ``split``: half the split's expected size
        (about 80% of :meth:`space_size` for train, 20% for test), so rejection sampling stays fast, and at most
        :data:`MAX_ROWS`."""
        if split not in _SPLITS:
            raise ValueError(f"split={split!r}: must be one of {_SPLITS}")
        available = self.space_size() // _TEST_BUCKETS if split == "test" else self.space_size()
        return min(available // 2, MAX_ROWS)

    def problem(self, terms: list[int]) -> str:
        """The problem text: digits side by side (running) or numbers joined by ``+`` (chain)."""
        return ("" if self.kind == "running" else "+").join(str(x) for x in terms)

    def prompt(self, terms: list[int]) -> str:
        """The text the model continues: the problem and ``=``; running adds the sum's start ``0``."""
        return self.problem(terms) + ("=0" if self.kind == "running" else "=")

    def terms(self, problem: str) -> list[int]:
        """Inverse of :meth:`problem`."""
        return [int(x) for x in (problem if self.kind == "running" else problem.split("+"))]

    def solve(self, terms: list[int]) -> str:
        """The reference response (:func:`solve` for the kind)."""
        return solve(terms, self.kind)

    def answer(self, terms: list[int]) -> str:
        """What :meth:`grade` checks against: the whole response (running) or the sum (chain)."""
        return self.solve(terms) if self.kind == "running" else str(sum(terms))

    def grade(self, completion: str, answer: str) -> float:
        """1.0 if ``completion`` is a correct response for ``answer``, else 0.0; never raises on garbage.

        running: the completion, surrounding whitespace ignored, must be exactly the answer (every step).
        chain: :func:`grade`."""
        if self.kind == "chain":
            return grade(completion, answer)
        if not isinstance(completion, str) or not isinstance(answer, str):
            return 0.0
        return float(completion.strip() == answer.strip() != "")


def _digits(value: int) -> int:
    """At least the decimal digits of ``value`` >= 1, from its bit length (str() of a huge int is slow, or refused)."""
    return int(value.bit_length() * math.log10(2)) + 1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def solve(terms: list[int], kind: str = "chain") -> str:
    """Reference response for ``terms``.

    chain: each step replaces the first two numbers by their sum. running: the last digit of every prefix sum.

    >>> solve([23, 45, 7])
    '68+7=75'
    >>> solve([3, 5, 2, 7], "running")
    '3807'
    """
    return noisy_solve(terms, random.Random(0), 0.0, kind)


def noisy_solve(terms: list[int], rng: random.Random, noise: float, kind: str = "chain") -> str:
    """A response like :func:`solve` from an imperfect teacher: each step's new value (chain: partial sum;
    running: digit) is off by one, up or down, with probability ``noise``, and later steps carry the error on.
    (chain: never below 0; running: mod 10.) ``noise=0`` gives :func:`solve`. Used for the warm start, so the
    tiny model imitates a teacher that is right most of the time and RL has something to sharpen.

    >>> noisy_solve([23, 45, 7], random.Random(0), 0.0)
    '68+7=75'
    """
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise={noise!r}: must be a probability in [0, 1]")
    if kind not in TASKS:
        raise ValueError(f"kind={kind!r}: must be one of {sorted(TASKS)}")
    if kind == "running":
        digits, total = [], 0
        for x in terms:
            total = (total + x) % 10
            if noise and rng.random() < noise:
                total = (total + (1 if rng.random() < 0.5 else 9)) % 10
            digits.append(str(total))
        return "".join(digits)
    steps = []
    rest = list(terms)
    while len(rest) > 1:
        total = rest[0] + rest[1]
        if noise and rng.random() < noise:
            total = total + 1 if total == 0 or rng.random() < 0.5 else total - 1
        rest = [total, *rest[2:]]
        steps.append("+".join(str(x) for x in rest))
    return "=".join(steps)


def _is_test(problem: str) -> bool:
    digest = hashlib.sha256(problem.encode()).digest()
    return int.from_bytes(digest[:8], "little") % _TEST_BUCKETS == 0


def load_split(
    split: str, *, n: int | None = None, seed: int = 0, task: TaskConfig | None = None, **task_kw
) -> list[dict]:
    """Deterministic rows of one split.

    Args:
        split: ``"train"`` or ``"test"`` (disjoint by a stable hash of the problem text).
        n: number of distinct problems, at most :meth:`TaskConfig.max_problems` (checked before any row is
            drawn: :func:`too_many`); default ``min(4096 train / 256 test, half the split's space)``.
        seed: same seed, same rows in the same order.
        task: a :class:`TaskConfig`; or give its fields as keywords (``kind="chain", n_terms=3``).

    Returns:
        rows ``{"id", "problem", "answer", "prompt", "solution"}``: ``prompt`` is the exact text fed to the
        model (:meth:`TaskConfig.prompt`: problem + ``"="``, running + ``"=0"``), ``solution`` the reference
        completion used for supervised warm start, and
        ``answer`` what :meth:`TaskConfig.grade` checks against.
    """
    if task is not None and task_kw:
        raise ValueError(f"give either task= or task fields {sorted(task_kw)}, not both")
    task = task if task is not None else TaskConfig(**task_kw)
    most = task.max_problems(split)
    n = min(_DEFAULT_SIZES[split], max(1, most)) if n is None else n
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: must be a positive integer")
    if most < 1:
        raise ValueError(
            f"the task {asdict(task)} is too small for a {split} split (under 2 problems expected in it): "
            "raise max_value or n_terms"
        )
    if (why := too_many(task, split, n)) is not None:
        raise ValueError(f"n={n}: {why}")
    return [dict(row) for row in _drawn(split, n, seed, task)]


@functools.lru_cache(maxsize=16)
def _drawn(split: str, n: int, seed: int, task: TaskConfig) -> tuple[dict, ...]:
    """The rows :func:`load_split` returns (as a tuple it copies: callers may change their rows). Cached: a
    compare checks and evaluates the same split once per run config and per run, and drawing 256 problems of 128
    terms takes a second."""
    # Salt the stream with the split so train and test seeds are independent streams; the chain task keeps
    # its original salt, so its rows are what they always were.
    salt = "kpo-synthetic" if task.kind == "chain" else f"kpo-synthetic-{task.kind}"
    rng = random.Random(f"{salt}/{split}/{seed}")
    rows: list[dict] = []
    seen: set[str] = set()
    for _ in range(n * _MAX_DRAWS_PER_ROW):
        terms = [rng.randint(0, task.max_value) for _ in range(task.n_terms)]
        problem = task.problem(terms)
        if problem in seen or _is_test(problem) != (split == "test"):
            continue
        seen.add(problem)
        rows.append(
            {
                "id": f"{split}-{len(rows):06d}",
                "problem": problem,
                "answer": task.answer(terms),
                "prompt": task.prompt(terms),
                "solution": task.solve(terms),
            }
        )
        if len(rows) == n:
            return tuple(rows)
    # Only small tasks get here (the hash put fewer problems in this split than its expected share), so
    # counting the split exactly is cheap.
    count = _split_count(task, split)
    fewer = f", or ask for {count} {split} problems or fewer" if count else ""
    raise ValueError(
        f"the task {asdict(task)} has {task.space_size()} distinct problems, {count} of them in the {split} "
        f"split, too few for {n} distinct {split} problems: raise max_value or n_terms{fewer}"
    )


def too_many(task: TaskConfig, split: str, n: int) -> str | None:
    """Why :func:`load_split` cannot draw ``n`` distinct problems of ``split`` (more than
    :meth:`TaskConfig.max_problems`), or None; found before anything is drawn. The caller names the setting."""
    most = task.max_problems(split)
    if n <= most:
        return None
    capped = most == MAX_ROWS  # the task holds more: a bigger one would not help
    bound = (
        "all that kpo draws: it builds every problem in memory, about 1 kB each"
        if capped
        else "half of the problems expected in this split, so sampling them stays fast"
    )
    return (
        f"{n} {split} problems requested but the task {asdict(task)} allows at most {most} ({bound}): ask for "
        f"{most} or fewer" + ("" if capped else ", or raise max_value / n_terms")
    )


def _split_count(task: TaskConfig, split: str) -> int:
    """Exact number of distinct problems in ``split`` (enumerates the task: only for small ones)."""
    from itertools import product

    values = range(task.max_value + 1)
    return sum(
        _is_test(task.problem(list(t))) == (split == "test") for t in product(values, repeat=task.n_terms)
    )


def grade(completion: str, answer: str) -> float:
    """The chain task's grader: 1.0 if the completion is a correct chain for ``answer``, else 0.0. Never raises
    on garbage input. (:meth:`TaskConfig.grade` grades either kind.)

    The completion (surrounding whitespace ignored) is split at ``=`` into expressions; it is correct when every
    expression is digits joined by ``+``, every expression sums to ``answer`` (each chain-of-thought step keeps
    the total, so a wrong intermediate sum fails even when the final number is right), and the last
    expression is exactly the number ``answer``. A bare final answer (``"75"``) is a correct one-step chain.
    """
    if not isinstance(completion, str) or not isinstance(answer, str):
        return 0.0
    target = answer.strip()
    if not target.isdigit():
        return 0.0
    parts = completion.strip().split("=")
    if parts[-1] != target:
        return 0.0
    for expr in parts:
        terms = expr.split("+")
        if not all(t.isdigit() and t.isascii() for t in terms) or sum(int(t) for t in terms) != int(target):
            return 0.0
    return 1.0
