"""The embedded arithmetic task: chained additions with a verifiable answer.

A problem is ``n_terms`` non-negative integers joined by ``+``. The prompt is the problem followed by ``=``;
the reference solution reduces the chain one addition at a time (the chain of thought), so a problem with
``n_terms`` terms has ``n_terms - 1`` steps and the answer is the number after the last ``=``::

    prompt    "23+45+7="
    solution  "68+7=75"       (step 1: 23+45 -> 68; step 2: 68+7 -> 75)
    answer    "75"

:func:`grade` checks the whole chain: every expression must sum to the answer and the last must be it.

Every string uses only the characters in :data:`ALPHABET`, so a character-level tokenizer covers it.
Train and test are disjoint by construction: a problem belongs to the test split if and only if a stable
hash of its text falls in the test bucket, so no seed or size can leak a test problem into training.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass

__all__ = ["ALPHABET", "TaskConfig", "grade", "load_split", "noisy_solve", "solve"]

# Characters the task can emit; the embedded tokenizer has one token per character.
ALPHABET = "0123456789+="

_SPLITS = ("train", "test")
# One problem in _TEST_BUCKETS goes to the test split (about 20%).
_TEST_BUCKETS = 5
_DEFAULT_SIZES = {"train": 4096, "test": 256}
# Rejection sampling gives up after this many draws per requested row (the space is then nearly exhausted).
_MAX_DRAWS_PER_ROW = 50


@dataclass(frozen=True)
class TaskConfig:
    """Knobs of the arithmetic task.

    Attributes:
        n_terms: numbers in the chain; the chain of thought has ``n_terms - 1`` steps (>= 2).
        max_value: each number is drawn uniformly from ``[0, max_value]`` (>= 1). Larger values mean more
            digits and more carries, i.e. a harder task and longer responses.
    """

    n_terms: int = 2
    max_value: int = 19

    def __post_init__(self) -> None:
        errors = []
        if not isinstance(self.n_terms, int) or self.n_terms < 2:
            errors.append(f"n_terms={self.n_terms!r}: must be an integer >= 2 (a chain needs one addition)")
        if not isinstance(self.max_value, int) or self.max_value < 1:
            errors.append(f"max_value={self.max_value!r}: must be an integer >= 1")
        if errors:
            raise ValueError("invalid TaskConfig: " + "; ".join(errors))

    def max_response_chars(self) -> int:
        """Upper bound on the characters of a reference solution (for sizing max_completion_length)."""
        return len(solve([self.max_value] * self.n_terms))

    def space_size(self) -> int:
        """Number of distinct problems (both splits together)."""
        return (self.max_value + 1) ** self.n_terms

    def max_problems(self, split: str) -> int:
        """Most distinct problems :func:`load_split` draws from ``split``: half the split's expected size
        (about 80% of :meth:`space_size` for train, 20% for test), so rejection sampling stays fast."""
        if split not in _SPLITS:
            raise ValueError(f"split={split!r}: must be one of {_SPLITS}")
        available = self.space_size() // _TEST_BUCKETS if split == "test" else self.space_size()
        return available // 2


def solve(terms: list[int]) -> str:
    """Reference chain of thought for ``terms``: each step replaces the first two numbers by their sum.

    >>> solve([23, 45, 7])
    '68+7=75'
    """
    steps = []
    rest = list(terms)
    while len(rest) > 1:
        rest = [rest[0] + rest[1], *rest[2:]]
        steps.append("+".join(str(x) for x in rest))
    return "=".join(steps)


def noisy_solve(terms: list[int], rng: random.Random, noise: float) -> str:
    """A chain like :func:`solve` from an imperfect teacher: each step's new partial sum is off by one (up
    or down, never below 0) with probability ``noise``, and later steps carry the error on. ``noise=0``
    gives :func:`solve`. Used for the warm start, so the tiny model imitates a teacher that is right most of
    the time and RL has something to sharpen.

    >>> noisy_solve([23, 45, 7], random.Random(0), 0.0)
    '68+7=75'
    """
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise={noise!r}: must be a probability in [0, 1]")
    steps = []
    rest = list(terms)
    while len(rest) > 1:
        total = rest[0] + rest[1]
        if rng.random() < noise:
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
        n: number of distinct problems; default ``min(4096 train / 256 test, half the split's space)``.
        seed: same seed, same rows in the same order.
        task: a :class:`TaskConfig`; or give its fields as keywords (``n_terms=3, max_value=99``).

    Returns:
        rows ``{"id", "problem", "answer", "prompt", "solution"}``: ``prompt`` is the exact text fed to the
        model (problem + ``"="``), ``solution`` the reference completion used for supervised warm start.
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
    if n > most:
        raise ValueError(
            f"n={n} {split} problems requested but the task {asdict(task)} allows at most {most} "
            f"(half of the problems expected in this split, so sampling them stays fast): lower n to "
            f"{most} or less, or raise max_value / n_terms"
        )
    # Salt the stream with the split so train and test seeds are independent streams.
    rng = random.Random(f"kpo-synthetic/{split}/{seed}")
    rows: list[dict] = []
    seen: set[str] = set()
    for _ in range(n * _MAX_DRAWS_PER_ROW):
        terms = [rng.randint(0, task.max_value) for _ in range(task.n_terms)]
        problem = "+".join(str(x) for x in terms)
        if problem in seen or _is_test(problem) != (split == "test"):
            continue
        seen.add(problem)
        solution = solve(terms)
        rows.append(
            {
                "id": f"{split}-{len(rows):06d}",
                "problem": problem,
                "answer": str(sum(terms)),
                "prompt": problem + "=",
                "solution": solution,
            }
        )
        if len(rows) == n:
            return rows
    # Only small tasks get here (the hash put fewer problems in this split than its expected share), so
    # counting the split exactly is cheap.
    count = _split_count(task, split)
    fewer = f", or ask for {count} {split} problems or fewer" if count else ""
    raise ValueError(
        f"the task {asdict(task)} has {task.space_size()} distinct problems, {count} of them in the {split} "
        f"split, too few for {n} distinct {split} problems: raise max_value or n_terms{fewer}"
    )


def _split_count(task: TaskConfig, split: str) -> int:
    """Exact number of distinct problems in ``split`` (enumerates the task: only for small ones)."""
    from itertools import product

    values = range(task.max_value + 1)
    return sum(_is_test("+".join(map(str, t))) == (split == "test") for t in product(values, repeat=task.n_terms))


def grade(completion: str, answer: str) -> float:
    """1.0 if the completion is a correct chain for ``answer``, else 0.0. Never raises on garbage input.

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
