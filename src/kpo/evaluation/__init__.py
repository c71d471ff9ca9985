"""Evaluation on math benchmarks: avg@n / pass@k with math-verify grading and a resumable generation cache.

``evaluate(model, data, config=EvalConfig(...))`` is the programmatic entry point (``kpo eval`` wraps it);
``pass_at_k`` and ``avg_at_n`` are the metrics. Heavy imports (torch, transformers) happen on first use.

Modules: ``config`` (EvalConfig and its checks), ``backends`` (transformers, vLLM), ``cache`` (the resumable
generation cache, per-sample seeds), ``runner`` (evaluate), ``metrics``, ``cli``.
"""

from __future__ import annotations

from kpo.evaluation.cache import GenerationCache, sample_seed
from kpo.evaluation.config import DEFAULT_PROMPT_TEMPLATE, EvalConfig
from kpo.evaluation.metrics import avg_at_n, benchmark_metrics, pass_at_k
from kpo.evaluation.runner import evaluate, format_table

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "EvalConfig",
    "GenerationCache",
    "avg_at_n",
    "benchmark_metrics",
    "evaluate",
    "format_table",
    "pass_at_k",
    "sample_seed",
]
