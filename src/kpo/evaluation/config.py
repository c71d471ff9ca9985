"""The settings of one evaluation (:class:`EvalConfig`) and their checks, made before anything loads."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kpo._checks import file_in_the_way, unwritable
from kpo.data.math import format_prompt
from kpo.evaluation.backends import check_engine

# The prompt kpo train builds from a dataset problem with its default instruction (one function builds both).
DEFAULT_PROMPT_TEMPLATE = format_prompt("{problem}")
DEFAULT_MATH_MAX_NEW_TOKENS = 4096
SYNTHETIC = "synthetic"
CHAT_MODES = ("auto", "on", "off")


@dataclass
class EvalConfig:
    """Everything of one evaluation but the model and the data; ``kpo eval`` has an option per field.

    n: samples per problem; ks: the k of each pass@k (each 1 <= k <= n).
    temperature: 0 = greedy (then n > 1 repeats the same completion); top_p: nucleus mass in (0, 1].
    max_new_tokens: generation budget; None = 4096 for math, the longest reference solution + 1 for synthetic,
        either capped (with a warning) to what the model's context leaves after the longest prompt. A budget given
        here that does not fit is an error.
    batch_size: sequences per generate call (results do not depend on it).
    seed: base seed; sample j of problem p always uses ``sample_seed(seed, dataset, p, j)``.
    output: write results JSON here and a markdown table beside it (same name, ``.md``; so ``output`` itself
        must not end in ``.md``).
    cache: generation cache (jsonl); default ``<output>.generations.jsonl`` when ``output`` is given.
    prompt_template: text with ``{problem}``; None = :data:`DEFAULT_PROMPT_TEMPLATE`. Synthetic rows use their
        raw ``prompt``.
    chat_template: "auto" (wrap math prompts in the tokenizer's chat template when it has one), "on", "off".
    backend: "auto" (vLLM on a GPU when installed and ``device`` is "auto" or "cuda", else transformers),
        "transformers", "vllm".
    device: transformers device: "auto" (cuda when available), "cpu", "cuda", "cuda:N".
    dtype: one of :data:`kpo.evaluation.backends.DTYPES`; None = bfloat16 on GPU, float32 on CPU.
    limit: first ``limit`` problems of each benchmark, >= 1 (synthetic: number of test problems, at most
        ``TaskConfig.max_problems("test")``, checked before any is drawn; None = the whole test split,
        ``kpo.testbed.task.load_split("test")``: 256 problems for the default task).
    synthetic_kw: task fields for the synthetic split, e.g. ``{"kind": "chain", "n_terms": 3}``.
    problem_key, answer_key: read these fields of every benchmark file instead of auto-detecting.
    """

    n: int = 16
    ks: Sequence[int] = (1, 16)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    batch_size: int = 32
    seed: int = 0
    output: str | Path | None = None
    cache: str | Path | None = None
    prompt_template: str | None = None
    show_progress: bool = True
    chat_template: str = "auto"
    backend: str = "auto"
    device: str = "auto"
    dtype: str | None = None
    limit: int | None = None
    synthetic_kw: dict | None = None
    problem_key: str | None = None
    answer_key: str | None = None

    @classmethod
    def with_settings(cls, config: EvalConfig | None, settings: dict) -> EvalConfig:
        """``config`` (default: the defaults) with ``settings`` replacing its fields; an unknown name is an
        error that lists the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise TypeError(f"evaluate: unknown setting(s) {unknown}; EvalConfig fields: {names}")
        return dataclasses.replace(config or cls(), **settings)

    @property
    def template(self) -> str:
        return DEFAULT_PROMPT_TEMPLATE if self.prompt_template is None else self.prompt_template

    def paths(self) -> tuple[Path | None, Path | None, Path | None]:
        """(results JSON, markdown table beside it, generation cache); the table and the default cache take the
        JSON path's name with their own suffix."""
        if self.output is None:
            return None, None, Path(self.cache) if self.cache is not None else None
        out = Path(self.output)
        cache = Path(self.cache) if self.cache is not None else out.with_suffix(".generations.jsonl")
        return out, out.with_suffix(".md"), cache

    def validate(self, data: str | Path | Sequence[str | Path]) -> None:
        """Every setting checked before anything loads: ValueError listing each problem."""
        n, ks = self.n, [int(k) for k in self.ks]
        errors = []
        if not isinstance(n, int) or n < 1:
            errors.append(f"n={n!r}: must be a positive integer")
        elif bad := [k for k in ks if not 1 <= k <= n]:
            errors.append(f"ks={ks}: {bad} outside [1, n={n}]; raise n or drop them")
        if not ks:
            errors.append("ks: give at least one k")
        if self.temperature < 0:
            errors.append(f"temperature={self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            errors.append(f"top_p={self.top_p}: must lie in (0, 1]")
        if self.batch_size < 1:
            errors.append(f"batch_size={self.batch_size}: must be >= 1")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            errors.append(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if "{problem}" not in self.template:
            errors.append(f"prompt_template={self.template!r}: must contain '{{problem}}'")
        if self.chat_template not in CHAT_MODES:
            errors.append(f"chat_template={self.chat_template!r}: must be one of {CHAT_MODES}")
        limit = self.limit
        bad_limit = limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1)
        if bad_limit:
            errors.append(
                f"limit={limit!r}: must be a positive integer (the first `limit` problems), or None for all"
            )
        task_errors = _check_task(self.synthetic_kw, specs(data))
        errors += _check_data(specs(data)) + task_errors
        if not (bad_limit or task_errors):
            errors += _check_limit(limit, self.synthetic_kw, specs(data))
        errors += self._unused(specs(data))
        errors += _check_outputs(*self.paths())
        errors += check_engine(self.backend, self.device, self.dtype)
        if errors:
            raise ValueError("evaluate: " + "; ".join(errors))

    def _unused(self, specs: list[str | Path]) -> list[str]:
        """Settings of benchmark files, given where the synthetic task is the only benchmark: its rows are fed
        their raw prompt and graded by the task, so these would be ignored."""
        if any(str(spec) != SYNTHETIC for spec in specs):
            return []
        given = {
            "prompt_template": self.prompt_template,
            "chat_template": self.chat_template if self.chat_template in ("on", "off") else None,
            "problem_key": self.problem_key,
            "answer_key": self.answer_key,
        }
        return [
            f"{name}={value!r} (--{name.replace('_', '-')}) is ignored with data 'synthetic' alone, whose rows are "
            "fed their raw prompt: drop it, or add a benchmark file"
            for name, value in given.items()
            if value is not None
        ]


def specs(data: str | Path | Sequence[str | Path]) -> list[str | Path]:
    """The benchmarks ``data`` names, as a list."""
    return [data] if isinstance(data, str | Path) else list(data)


def _check_data(specs: list[str | Path]) -> list[str]:
    """Benchmark files that are not there, or are folders."""
    errors = []
    for spec in specs:
        path = Path(spec)
        if str(spec) == SYNTHETIC or path.is_file():
            continue
        why = "is a directory" if path.is_dir() else "does not exist"
        errors.append(
            f"data: {str(spec)!r} {why}; give a benchmark file (.jsonl, .json, .parquet) or 'synthetic'"
        )
    return errors


def _check_task(synthetic_kw: dict | None, specs: list[str | Path]) -> list[str]:
    """Problems with the synthetic task fields: unknown names, bad values, or no synthetic benchmark to use them."""
    import dataclasses

    from kpo.testbed.task import TaskConfig

    if not synthetic_kw:
        return []
    if SYNTHETIC not in (str(s) for s in specs):
        return [
            f"synthetic_kw={synthetic_kw} (CLI --task) only applies to data 'synthetic', which is not among "
            f"{[str(s) for s in specs]}: drop it or add 'synthetic'"
        ]
    valid = [f.name for f in dataclasses.fields(TaskConfig)]
    unknown = sorted(set(synthetic_kw) - set(valid))
    if unknown:
        return [f"synthetic_kw (CLI --task): unknown task field(s) {unknown}; valid fields: {valid}"]
    try:
        TaskConfig(**synthetic_kw)
    except ValueError as e:
        return [f"synthetic_kw (CLI --task): {e}"]
    return []


def _check_limit(limit: int | None, synthetic_kw: dict | None, specs: list[str | Path]) -> list[str]:
    """More synthetic test problems than the task supplies: found before any is drawn (at any limit, instantly)."""
    from kpo.testbed.task import TaskConfig, too_many

    if limit is None or SYNTHETIC not in (str(s) for s in specs):
        return []
    why = too_many(TaskConfig(**(synthetic_kw or {})), "test", limit)
    return [] if why is None else [f"limit={limit} (--limit): {why}"]


def _check_outputs(output: Path | None, table: Path | None, cache: Path | None) -> list[str]:
    if output is not None and output == table:
        return [
            f"output={str(output)!r} ends in .md, the name of the markdown table written beside the results "
            f"JSON: give a .json path, e.g. {str(output.with_suffix('.json'))!r}"
        ]
    if cache is not None and cache in (output, table):
        return [f"cache={str(cache)!r} is also the results file; give the cache another name"]
    errors = _path_errors("output", output) if output is not None else []
    # The default cache sits beside the output: report a file in the way of their folder once.
    if cache is not None and not (errors and cache.parent == output.parent):
        errors += _path_errors("cache", cache)
    return errors


def _path_errors(name: str, path: Path) -> list[str]:
    """A file can be written at `path`: it is no directory, and no file stands where a parent folder goes."""
    if path.is_dir():
        return [f"{name}={str(path)!r} (--{name}) is a directory; give a file path"]
    existing = file_in_the_way(path.parent)
    if existing is not None:
        return [
            f"{name}={str(path)!r} (--{name}): {str(existing)!r} is a file, not a directory; choose "
            "another path"
        ]
    if (why := unwritable(path.parent)) is not None:
        return [f"{name}={str(path)!r} (--{name}): {why}; choose another path"]
    return []
