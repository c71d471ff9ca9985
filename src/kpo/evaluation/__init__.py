"""Evaluation on math benchmarks: avg@n / pass@k with math-verify grading and a resumable generation cache.

``evaluate(model, data, ...)`` is the programmatic entry point (``kpo eval`` wraps it); ``pass_at_k`` and
``avg_at_n`` are the metrics. Heavy imports (torch, transformers) happen on first use.
"""

from __future__ import annotations

from kpo.evaluation.metrics import avg_at_n, benchmark_metrics, pass_at_k
from kpo.evaluation.runner import (
    DEFAULT_PROMPT_TEMPLATE,
    GenerationCache,
    evaluate,
    format_table,
    sample_seed,
)

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "GenerationCache",
    "avg_at_n",
    "benchmark_metrics",
    "evaluate",
    "format_table",
    "pass_at_k",
    "sample_seed",
]
