"""Sample, cache, grade and score: the engine behind ``kpo eval`` and :func:`kpo.evaluation.evaluate`.

How a sample is drawn reproducibly: :mod:`kpo.evaluation.backends`; how a run resumes: :mod:`kpo.evaluation.cache`.

On N processes (``kpo launch --nproc-per-node N eval ...``, torchrun) each process loads the model
(on GPUs its own, ``cuda:LOCAL_RANK``), samples and grades the problems whose index is its rank modulo N, and
appends its batches to the one cache (appends of whole batches, which a local file system does not interleave);
the graded problems are gathered, so every process returns the results, which are those of one process (a
sample does not depend on where it ran), and rank 0 writes the files.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kpo import _distributed
from kpo._files import replacing
from kpo._progress import library_bars, progress_bar
from kpo.data.math import has_chat_template
from kpo.evaluation.backends import make_backend
from kpo.evaluation.cache import GenerationCache, prompt_hash, sample_seed
from kpo.evaluation.config import DEFAULT_MATH_MAX_NEW_TOKENS, SYNTHETIC, EvalConfig, specs
from kpo.evaluation.metrics import benchmark_metrics

__all__ = ["MAX_SAMPLES", "evaluate", "format_table"]

# The most samples (problems x n) one evaluation plans: it makes a record of each before generating the first
# (about 1 kB each): 1e8 would take minutes and tens of GB, with no output. 500 problems x 1024 samples fit.
MAX_SAMPLES = 1_000_000


def evaluate(
    model: str | Path,
    data: str | Path | Sequence[str | Path],
    config: EvalConfig | None = None,
    **settings,
) -> dict[str, Any]:
    """Sample ``n`` completions per problem, grade them and report avg@n / pass@k per benchmark.

    Args:
        model: a Hugging Face model directory (tokenizer saved beside it). Its cache identity is the resolved
            path plus a fingerprint of its weight/config files, so retraining in place invalidates the cache.
        data: a benchmark file (any format :func:`kpo.data.math.load_problems` reads), ``"synthetic"`` (the
            embedded task's test split, graded by :meth:`kpo.testbed.task.TaskConfig.grade`), or a list.
        config: the settings (:class:`kpo.evaluation.EvalConfig`, which documents each); default: its defaults.
        settings: fields of :class:`EvalConfig` replacing the config's, e.g. ``evaluate(m, "synthetic", n=4)``.

    Returns:
        ``{"model", "params", "benchmarks": {name: {"problems", "samples", "avg@n", "pass@k"...,
        "mean_response_tokens", "truncated_frac", "per_problem": [{"id", "correct"}], "max_new_tokens"}},
        "macro": {...}}``. ``params["max_new_tokens"]`` is the budget used, or ``{name: budget}`` when the
        benchmarks' budgets differ.

    Raises:
        ValueError: a bad setting (all of them are checked before anything loads), a benchmark or task that
            cannot be read or drawn, a model that cannot be loaded (naming the path and the loader's reason),
            or prompts that leave the model no room for the budget asked.
    """
    cfg = EvalConfig.with_settings(config, settings)
    cfg.validate(data)
    output, table, cache = cfg.paths()
    ks = [int(k) for k in cfg.ks]

    benchmarks = _load_benchmarks(data, cfg.limit, cfg.synthetic_kw, cfg.problem_key, cfg.answer_key)
    _check_samples(cfg.n, {name: len(rows) for name, (rows, _) in benchmarks.items()})
    world, rank = _distributed.world_size(), _distributed.rank()
    show_progress = cfg.show_progress and rank == 0
    library_bars(show_progress)  # the model loader's bar: on a terminal only
    store = GenerationCache(cache) if cache is not None else None
    if store is not None and store.torn and rank == 0:
        print(
            f"kpo eval: dropped the torn last line of {cache} ({store.torn} bytes, cut while it was written)",
            file=sys.stderr,
        )
    _distributed.barrier()  # every process has read the cache before any appends to it
    engine = make_backend(cfg.backend, model, _process_device(cfg.device, world), cfg.dtype)
    if world > 1 and engine.name == "vllm":
        raise ValueError(
            f"backend vllm on {world} processes: vLLM spreads a model over GPUs itself; run kpo eval as one "
            "process, or use --backend transformers"
        )
    use_chat = _use_chat_template(engine.tokenizer, cfg.chat_template)
    model_id = _model_id(model)

    results: dict[str, Any] = {"model": model_id, "benchmarks": {}}
    budgets = {}
    for name, (rows, grader) in benchmarks.items():
        prompts = [_build_prompt(row, engine.tokenizer, cfg.template, use_chat) for row in rows]
        budget = _fit_budget(
            name, engine, prompts, cfg.max_new_tokens, _default_budget(name, cfg.synthetic_kw), rank == 0
        )
        budgets[name] = budget
        # everything that changes a sample keys the cache (the dtype too: bf16 and fp32 sample differently)
        params = {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_new_tokens": budget,
            "seed": cfg.seed,
            "backend": engine.name,
            "dtype": engine.dtype,
        }
        params_key = json.dumps(params, sort_keys=True)
        records: dict[tuple[int, int], dict] = {}
        todo = []
        mine = range(rank, len(rows), world)  # this process's share of the problems
        for i in mine:
            row, prompt = rows[i], prompts[i]
            sha = prompt_hash(prompt)
            for j in range(cfg.n):
                rec = {
                    "model": model_id,
                    "dataset": name,
                    "id": row["id"],
                    "sample": j,
                    "params": params_key,
                    "prompt_sha": sha,
                }
                hit = store.get(GenerationCache.key(rec)) if store is not None else None
                if hit is not None:
                    records[i, j] = hit
                else:
                    todo.append((i, j, prompt, rec))
        _generate(engine, todo, records, store, params, cfg.batch_size, name, show_progress)
        graded = {}
        for part in _distributed.gather_objects(
            _grade(rows, records, grader, cfg.n, mine, name, show_progress)
        ):
            graded |= part
        results["benchmarks"][name] = {**_score(rows, graded, cfg.n, ks), "max_new_tokens": budget}

    # The budgets used, not the setting (None means a per-benchmark default); a mapping when they differ.
    used = next(iter(budgets.values())) if len(set(budgets.values())) == 1 else budgets
    results["params"] = {
        "n": cfg.n,
        "ks": ks,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_new_tokens": used,
        "seed": cfg.seed,
        "prompt_template": cfg.template,
        "chat_template": use_chat,
        "backend": engine.name,
    }
    metric_keys = [k for k in next(iter(results["benchmarks"].values())) if "@" in k or k.startswith("mean_")]
    results["macro"] = {
        k: sum(b[k] for b in results["benchmarks"].values()) / len(results["benchmarks"]) for k in metric_keys
    }
    if output is not None and rank == 0:
        # whole or absent: kpo summary and kpo compare read them
        with replacing(output) as partial:
            partial.write_text(json.dumps(results, indent=2) + "\n")
        with replacing(table) as partial:
            partial.write_text(format_table(results) + "\n")
    return results


def _check_samples(n: int, problems: dict[str, int]) -> None:
    """ValueError, before the model loads, when the evaluation asks for more than :data:`MAX_SAMPLES` samples
    (``n`` per problem; ``problems``: name -> count): each gets a record in memory before the first is drawn."""
    total = n * sum(problems.values())
    if total > MAX_SAMPLES:
        counts = ", ".join(f"{name} {count}" for name, count in problems.items())
        raise ValueError(
            f"n={n} (--n) samples of each problem ({counts}) makes {total} samples, more than the {MAX_SAMPLES} one "
            "evaluation plans (a record each, in memory, before the first is drawn); lower --n or --limit"
        )


def _process_device(device: str, world: int) -> str:
    """The device of this process: on several processes, "auto" and "cuda" are the GPU of its local rank."""
    import torch

    if world > 1 and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{_distributed.local_rank()}"
    return device


def _fit_budget(
    name: str, engine, prompts: list[str], asked: int | None, default: int, say: bool = True
) -> int:
    """The generation budget of benchmark ``name``: ``asked``, or ``default`` capped to what the model's context
    leaves after the longest prompt (said on stderr if ``say``). ValueError when a prompt fills the context, or when an
    asked budget does not fit: the model's positions past its context are untrained, so such samples would be
    silently garbage."""
    budget = default if asked is None else asked
    context = engine.context_length
    if context is None or not prompts:
        return budget
    ids = engine.tokenizer(prompts, add_special_tokens=False).input_ids
    longest = max(range(len(ids)), key=lambda i: len(ids[i]))
    room = context - len(ids[longest])
    if room >= budget:
        return budget
    where = f"{name}: the longest prompt (row {longest}) has {len(ids[longest])} tokens and the model's context is {context}"
    if room < 1:
        raise ValueError(
            f"{where}, which leaves no room to generate; use a model with a longer context, or "
            "fewer or shorter prompts (--limit, --prompt-template, --chat-template off)"
        )
    if asked is not None:
        raise ValueError(
            f"max_new_tokens={asked}: {where}, which leaves {room} tokens; give --max-new-tokens "
            f"{room} or less"
        )
    if say:
        print(
            f"kpo eval: warning: {where}: the generation budget is capped at {room} tokens (default {default})",
            file=sys.stderr,
        )
    return room


def _use_chat_template(tokenizer, mode: str) -> bool:
    """Whether math prompts go through the tokenizer's chat template (``mode``: one of CHAT_MODES)."""
    has = has_chat_template(tokenizer)
    if mode == "on" and not has:
        raise ValueError("chat_template='on' but the tokenizer has no chat template; use 'auto' or 'off'")
    return has and mode != "off"


def _load_benchmarks(
    data: str | Path | Sequence[str | Path],
    limit: int | None,
    synthetic_kw: dict | None,
    problem_key: str | None,
    answer_key: str | None,
) -> dict[str, tuple[list[dict], Callable[[str, Any], float]]]:
    """name -> (rows, grader). Rows with a "prompt" key are fed raw (the synthetic task)."""
    from kpo.rewards import math_reward

    names = specs(data)
    if not names:
        raise ValueError("data: give at least one benchmark file or 'synthetic'")
    out: dict[str, tuple[list[dict], Callable[[str, Any], float]]] = {}
    for spec in names:
        if str(spec) == SYNTHETIC:
            from kpo.testbed.task import TaskConfig, load_split

            task = TaskConfig(**(synthetic_kw or {}))
            name, rows, grader = SYNTHETIC, load_split("test", n=limit, task=task), task.grade
        else:
            from kpo.data.math import load_problems
            from kpo.testbed.files import task_of_rows

            path = Path(spec)
            name = path.stem
            rows, grader = load_problems(path, problem_key, answer_key)[:limit], math_reward
            task = task_of_rows(rows, str(path))
            if task is not None:  # the embedded task as a file (kpo.testbed.files): fed raw, its own grader
                rows, grader = [{**r, "prompt": r["problem"]} for r in rows], task.grade
        if name in out:
            raise ValueError(f"data: two benchmarks named {name!r} ({spec}); evaluate them in separate runs")
        out[name] = (rows, grader)
    return out


def _build_prompt(row: dict, tokenizer, template: str, use_chat: bool) -> str:
    if "prompt" in row:
        return row["prompt"]
    text = template.replace("{problem}", row["problem"])
    if use_chat:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    return text


def _model_id(model: str | Path) -> str:
    """Resolved path plus a fingerprint of the weight and config files (names, sizes, mtimes), so a
    checkpoint retrained in place never reuses the old checkpoint's cached generations."""
    path = Path(model)
    if not path.is_dir():
        return str(model)
    files = sorted(
        p for p in path.iterdir() if p.suffix in {".safetensors", ".bin", ".pt", ".json"} and p.is_file()
    )
    stamp = "\n".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return f"{path.resolve()}@{hashlib.sha256(stamp.encode()).hexdigest()[:12]}"


def _default_budget(name: str, synthetic_kw: dict | None) -> int:
    if name == SYNTHETIC:
        from kpo.testbed.task import TaskConfig

        return TaskConfig(**(synthetic_kw or {})).max_response_chars() + 1  # + eos
    return DEFAULT_MATH_MAX_NEW_TOKENS


def _generate(engine, todo, records, store, params, batch_size, name, show_progress) -> None:
    bar = progress_bar(len(todo), f"generate {name}", "samples", enabled=show_progress and bool(todo))
    tokens, start = 0, time.perf_counter()
    for b in range(0, len(todo), batch_size):
        batch = todo[b : b + batch_size]
        outs = engine.generate(
            [p for _, _, p, _ in batch],
            [sample_seed(params["seed"], name, rec["id"], j) for _, j, _, rec in batch],
            temperature=params["temperature"],
            top_p=params["top_p"],
            max_new_tokens=params["max_new_tokens"],
        )
        done = []
        for (i, j, _, rec), (text, n_tokens, stopped) in zip(batch, outs):
            records[i, j] = {**rec, "completion": text, "n_tokens": n_tokens, "stopped": stopped}
            done.append(records[i, j])
            tokens += n_tokens
        if store is not None:
            store.append(done)
        bar.set_postfix(tok_per_s=f"{tokens / (time.perf_counter() - start):.0f}")
        bar.update(len(batch))
    bar.close()


def _grade(rows, records, grader, n, indices, name, show_progress) -> dict[int, dict[str, list]]:
    """{problem index: {"correct", "n_tokens", "stopped"}: one entry per sample} for the problems ``indices``."""
    graded = {}
    with progress_bar(len(indices), f"grade {name}", "problems", enabled=show_progress) as bar:
        for i in indices:
            samples = [records[i, j] for j in range(n)]
            graded[i] = {
                "correct": [float(grader(r["completion"], rows[i]["answer"])) for r in samples],
                "n_tokens": [r["n_tokens"] for r in samples],
                "stopped": [r["stopped"] for r in samples],
            }
            bar.update()
    return graded


def _score(rows, graded, n, ks) -> dict[str, Any]:
    """A benchmark's metrics from every problem's graded samples (:func:`_grade`)."""
    per_problem = [graded[i] for i in range(len(rows))]
    correct = [g["correct"] for g in per_problem]
    lengths = [t for g in per_problem for t in g["n_tokens"]]
    truncated = [not s for g in per_problem for s in g["stopped"]]
    return {
        "problems": len(rows),
        "samples": n,
        **benchmark_metrics(correct, ks),
        "mean_response_tokens": sum(lengths) / len(lengths),
        "truncated_frac": sum(truncated) / len(truncated),
        "per_problem": [{"id": row["id"], "correct": int(sum(c))} for row, c in zip(rows, correct)],
    }


def format_table(results: dict[str, Any]) -> str:
    """Markdown table: one row per benchmark plus the macro average; columns avg@n, pass@k..., length."""
    benches = results["benchmarks"]
    cols = [k for k in results["macro"] if "@" in k]
    header = ["benchmark", "problems", *cols, "mean len (tok)", "truncated"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, b in benches.items():
        cells = [name, str(b["problems"]), *(f"{100 * b[c]:.1f}" for c in cols)]
        lines.append(
            "| "
            + " | ".join([*cells, f"{b['mean_response_tokens']:.0f}", f"{100 * b['truncated_frac']:.1f}%"])
            + " |"
        )
    m = results["macro"]
    cells = [
        "**macro avg**",
        "",
        *(f"{100 * m[c]:.1f}" for c in cols),
        f"{m['mean_response_tokens']:.0f}",
        "",
    ]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
