"""The outcome of a model in a comparison: its held-out score per problem, the one number every contrast, collapse
flag, "done" check and learning curve reads, whichever engine trained the model and whatever the task.

A model's folder (a run's, its warm start's, a checkpoint's) holds it in one of two files, read in this order:

- ``expected.json``: the exact expected accuracy of the embedded running task (:mod:`kpo.evaluation.expected`:
  the probability that a sample is right, from one teacher-forced forward, so no sampling noise); written only
  where it applies (:func:`exact_applies`);
- ``eval.json``: ``kpo eval``'s results (:func:`kpo.evaluation.evaluate`) on the held-out benchmarks: the embedded
  task's test split, or the user's ``--eval-data`` files; a problem's score is the share of its n samples the
  grader accepted, so the mean over problems is avg@n over all the benchmarks' problems together.

Every model of a comparison answers the same problems, in the same order, with the same sample seeds, so two
outcomes pair by problem as well as by seed.
"""

from __future__ import annotations

import json
from pathlib import Path

from kpo.compare.engines import engine_of
from kpo.compare.plan import CompareError

__all__ = ["EVAL_FILE", "EXPECTED_FILE", "exact_applies", "load_outcome", "read_evaluation"]

EXPECTED_FILE = "expected.json"  # the exact expected accuracy (the embedded running task only)
EVAL_FILE = "eval.json"  # kpo eval's results: avg@n / pass@k per benchmark, correct counts per problem


def exact_applies(cfg) -> bool:
    """Whether the runs of comparison ``cfg`` (a :class:`kpo.compare.CompareConfig`) are scored by the exact expected
    accuracy: trained on the embedded running task (the engine's
    :meth:`~kpo.compare.engines.Engine.embedded_task`, no ``--dataset``), evaluated on its test split (no
    ``--eval-data``)."""
    if cfg.eval_data or cfg.dataset is not None:
        return False
    task = engine_of(cfg).embedded_task(cfg)
    return task is not None and task.kind == "running"


def read_evaluation(path: Path) -> dict:
    """The JSON of an evaluation file; CompareError (one line, the fix) where a stop or a hand left it unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CompareError([f"{path}: not readable as JSON ({e}); delete {path.parent} to redo it"]) from None


def load_outcome(folder: Path) -> dict | None:
    """The outcome of the model evaluated in ``folder``, None when it has not been scored; CompareError (one line)
    where its file is torn or not a finished evaluation.

    Returns ``{"mean": float, "per_problem": [float] (P scores in [0, 1], the problems in evaluation order),
    "metric": str (what the numbers are), "exact": bool}``, from ``expected.json`` where it is there, else from
    ``eval.json`` (avg@n: each problem's correct count / n, the benchmarks' problems one after the other).
    """
    folder = Path(folder)
    try:
        return _outcome(folder)
    except CompareError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise CompareError([f"{folder}: its {EXPECTED_FILE} or {EVAL_FILE} is not a finished evaluation "
                            f"({type(e).__name__}: {e}); delete the folder to redo it"]) from None


def _outcome(folder: Path) -> dict | None:
    exact = folder / EXPECTED_FILE
    if exact.exists():
        found = read_evaluation(exact)
        return {
            "mean": float(found["mean"]),
            "per_problem": [float(p) for p in found["per_problem"]],
            "metric": f"exact expected held-out accuracy ({len(found['per_problem'])} problems)",
            "exact": True,
        }
    sampled = folder / EVAL_FILE
    if not sampled.exists():
        return None
    results = read_evaluation(sampled)
    n = results["params"]["n"]
    per_problem = [p["correct"] / n for b in results["benchmarks"].values() for p in b["per_problem"]]
    return {
        "mean": sum(per_problem) / len(per_problem),
        "per_problem": per_problem,
        "metric": f"held-out avg@{n} over the {len(per_problem)} problems of {', '.join(results['benchmarks'])}",
        "exact": False,
    }
