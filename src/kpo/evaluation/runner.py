"""Sample, cache, grade and score: the engine behind ``kpo eval`` and :func:`kpo.evaluation.evaluate`.

Reproducibility: every sample draws its randomness from its own generator seeded by
``(seed, dataset, problem id, sample index)``, so a completion does not depend on which batch it ran in,
on the batch size or on a resume. The transformers backend runs ``generate`` greedily over scores that a
logits processor has turned into ``log_softmax(logits / T)`` (nucleus-filtered) plus per-row Gumbel noise:
the arg-max of that is an exact sample from the temperature/top-p distribution (the Gumbel-max trick).
vLLM takes the same per-sample seed through ``SamplingParams(seed=...)`` (its streams differ from
transformers', so the backend is part of the cache key).

Resumability: completions are appended to a jsonl cache, one batch at a time, flushed and fsync'd, so a
killed run loses at most the batch in flight. A record's key is (model, dataset, problem id, sample index,
sampling parameters, prompt hash); a rerun with the same key skips the work.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kpo._checks import file_in_the_way
from kpo.data.math import format_prompt, has_chat_template
from kpo.evaluation.metrics import benchmark_metrics

__all__ = ["DEFAULT_PROMPT_TEMPLATE", "GenerationCache", "evaluate", "format_table", "sample_seed"]

# The prompt kpo train builds from a dataset problem with its default instruction (one function builds both).
DEFAULT_PROMPT_TEMPLATE = format_prompt("{problem}")
DEFAULT_MATH_MAX_NEW_TOKENS = 4096
SYNTHETIC = "synthetic"
_CHAT_MODES = ("auto", "on", "off")
BACKENDS = ("auto", "transformers", "vllm")
# Model dtypes both backends take by these names (vLLM has no float64).
DTYPES = ("bfloat16", "float16", "float32")
# The devices vLLM can honour: it places the model itself (on the GPUs CUDA_VISIBLE_DEVICES shows it).
_VLLM_DEVICES = ("auto", "cuda")


def sample_seed(seed: int, dataset: str, problem_id: str, sample: int) -> int:
    """The 63-bit seed of one sample: a stable hash of (seed, dataset, problem id, sample index)."""
    digest = hashlib.sha256(f"{seed}\x1f{dataset}\x1f{problem_id}\x1f{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- cache


class GenerationCache:
    """Append-only jsonl of completions; see the module docstring for the key.

    A line cut short by a kill (the batch in flight) is dropped on open, so appends resume on a clean line.
    A corrupt line anywhere else is an error naming the line.
    """

    KEY_FIELDS = ("model", "dataset", "id", "sample", "params", "prompt_sha")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._records: dict[str, dict] = {}
        if self.path.exists():
            self._load()

    @classmethod
    def key(cls, record: dict) -> str:
        return json.dumps([record[f] for f in cls.KEY_FIELDS], sort_keys=True)

    def _load(self) -> None:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) < len(data):
            # The process died mid-write: drop the partial tail so the next append starts a fresh line.
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
        for lineno, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                self._records[self.key(record)] = record
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{self.path}: line {lineno} is not a generation record ({e}); delete the file to start over"
                ) from e

    def get(self, record_key: str) -> dict | None:
        return self._records.get(record_key)

    def __len__(self) -> int:
        return len(self._records)

    def append(self, records: Sequence[dict]) -> None:
        """Write `records` as one durable batch (flush + fsync before returning)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        for r in records:
            self._records[self.key(r)] = r


# ------------------------------------------------------------------------------------------- backends


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _check_engine(backend: str, device: str, dtype: str | None) -> list[str]:
    """Problems with backend/device/dtype, found before anything loads (they used to fail inside the load)."""
    import importlib.util

    if backend not in BACKENDS:
        return [f"backend={backend!r} (--backend): must be one of {BACKENDS}"]
    errors = []
    if dtype is not None and dtype not in DTYPES:
        errors.append(f"dtype={dtype!r} (--dtype): must be one of {DTYPES}; leave it unset for the default "
                      "(bfloat16 on GPU, float32 on CPU)")  # fmt: skip
    if backend == "vllm":
        if importlib.util.find_spec("vllm") is None:
            errors.append("backend='vllm' (--backend): vllm is not installed; pip install vllm, or use "
                          "--backend transformers")  # fmt: skip
        if device not in _VLLM_DEVICES:
            errors.append(f"device={device!r} (--device): vLLM places the model itself (choose its GPUs with "
                          "CUDA_VISIBLE_DEVICES); drop --device or use --backend transformers")  # fmt: skip
        return errors
    return errors + _check_device(device)


def _check_device(device: str) -> list[str]:
    """Problems with the transformers device: a malformed name, or a CUDA device this machine lacks."""
    import torch

    if device in ("auto", "cpu"):
        return []
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        return [f"device={device!r} (--device): must be auto, cpu, cuda or cuda:N"]
    if not torch.cuda.is_available():
        return [f"device={device!r} (--device): no CUDA device is available (torch.cuda.is_available() is "
                "False); use --device cpu or --device auto"]  # fmt: skip
    count = torch.cuda.device_count()
    if colon and int(index) >= count:
        return [f"device={device!r} (--device): this machine has {count} CUDA device(s), cuda:0 to "
                f"cuda:{count - 1}"]  # fmt: skip
    return []


def _use_chat_template(tokenizer, mode: str) -> bool:
    if mode not in _CHAT_MODES:
        raise ValueError(f"chat_template={mode!r}: must be one of {_CHAT_MODES}")
    has = has_chat_template(tokenizer)
    if mode == "on" and not has:
        raise ValueError("chat_template='on' but the tokenizer has no chat template; use 'auto' or 'off'")
    return has and mode != "off"


class _SeededSampler:
    """Logits processor: log_softmax(scores / T) restricted to the top-p nucleus, plus Gumbel noise drawn
    from one generator per row. Greedy decoding over its output samples from the nucleus distribution.

    scores: [B, V]; generators: B torch.Generators on the scores' device.
    """

    def __init__(self, generators: list, temperature: float, top_p: float):
        self.generators = generators
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids, scores):
        import torch

        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_logp, order = logp.sort(dim=-1, descending=True)
            # Keep a token while the mass before it is below top_p (the top token is always kept).
            mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
            drop = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, order, mass_before >= self.top_p)
            logp = logp.masked_fill(drop, float("-inf"))
        tiny = torch.finfo(torch.float32).tiny
        u = torch.stack(
            [torch.rand(logp.shape[-1], generator=g, device=logp.device) for g in self.generators]
        ).clamp_(min=tiny, max=1.0 - 1e-7)
        return logp - torch.log(-torch.log(u))


class TransformersBackend:
    """Batched ``generate`` with left padding on CPU or GPU."""

    name = "transformers"

    def __init__(self, model_path: str | Path, *, device: str = "auto", dtype: str | None = None):
        import torch
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = _resolve_device(device)
        torch_dtype = (
            getattr(torch, dtype)
            if dtype
            else (torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
        except (OSError, SafetensorError) as e:
            # The loaders' own failures (missing weights, unreadable config or weight files): name the model.
            raise ValueError(f"model={str(model_path)!r}: cannot load it: {e}") from e
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = model.to(self.device).eval()
        self.dtype = str(torch_dtype).removeprefix("torch.")
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        if not self.eos_ids or None in self.eos_ids:
            raise ValueError(
                f"{model_path}: neither the generation config nor the tokenizer names an eos token"
            )

    def generate(
        self, prompts: list[str], seeds: list[int], *, temperature: float, top_p: float, max_new_tokens: int
    ) -> list[tuple[str, int, bool]]:
        """(completion text, generated tokens incl. eos, stopped at eos) per prompt."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        # Explicit neutral values: transformers fills unset fields from the model's generation_config (e.g. a
        # repetition penalty), which would silently change the sampling distribution.
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.tokenizer.pad_token_id,
        )
        processors = LogitsProcessorList()
        if temperature > 0:
            gens = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
            processors.append(_SeededSampler(gens, temperature, top_p))
        with torch.inference_mode():
            out = self.model.generate(**enc, generation_config=config, logits_processor=processors)
        results = []
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos_ids), None)
            tokens = row if stop is None else row[:stop]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append((text, len(tokens) + (stop is not None), stop is not None))
        return results


class VLLMBackend:
    """vLLM engine; one request per sample with its own seed."""

    name = "vllm"

    def __init__(self, model_path: str | Path, *, device: str = "auto", dtype: str | None = None):
        from vllm import LLM

        self.dtype = dtype or "auto"
        self.llm = LLM(model=str(model_path), dtype=self.dtype)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(
        self, prompts: list[str], seeds: list[int], *, temperature: float, top_p: float, max_new_tokens: int
    ) -> list[tuple[str, int, bool]]:
        from vllm import SamplingParams

        params = [
            SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=s)
            for s in seeds
        ]
        # token ids as the transformers backend makes them: vLLM tokenizes a string with special tokens, which
        # puts a second BOS before a chat-templated prompt (Llama, Gemma, Mistral)
        ids = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=False).input_ids} for p in prompts]
        outs = self.llm.generate(ids, params, use_tqdm=False)
        return [
            (o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason == "stop")
            for o in outs
        ]


def _require_model_dir(model: str | Path) -> None:
    """Both backends load a local checkpoint; say so instead of a Hugging Face Hub lookup's traceback."""
    path = Path(model)
    if not path.is_dir():
        raise ValueError(f"model={str(model)!r}: no such directory; give a Hugging Face model directory "
                         "(config.json, weights and tokenizer files)")  # fmt: skip
    if not (path / "config.json").is_file():
        raise ValueError(f"model={str(model)!r}: no config.json in this directory; give a Hugging Face model "
                         "directory")  # fmt: skip


def _make_backend(name: str, model_path: str | Path, device: str, dtype: str | None):
    _require_model_dir(model_path)
    if name == "auto":
        import importlib.util

        import torch

        gpu = torch.cuda.is_available() and device in _VLLM_DEVICES
        name = "vllm" if gpu and importlib.util.find_spec("vllm") else "transformers"
    if name == "vllm":
        return VLLMBackend(model_path, device=device, dtype=dtype)
    return TransformersBackend(model_path, device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------------- data


def _load_benchmarks(
    data: str | Path | Sequence[str | Path],
    limit: int | None,
    synthetic_kw: dict | None,
    problem_key: str | None,
    answer_key: str | None,
) -> dict[str, tuple[list[dict], Callable[[str, Any], float]]]:
    """name -> (rows, grader). Rows with a "prompt" key are fed raw (the synthetic task)."""
    from kpo.rewards import math_reward

    specs = _specs(data)
    if not specs:
        raise ValueError("data: give at least one benchmark file or 'synthetic'")
    out: dict[str, tuple[list[dict], Callable[[str, Any], float]]] = {}
    for spec in specs:
        if str(spec) == SYNTHETIC:
            from kpo.data.synthetic import TaskConfig, load_split

            task = TaskConfig(**(synthetic_kw or {}))
            name, rows, grader = SYNTHETIC, load_split("test", n=limit, task=task), task.grade
        else:
            from kpo.data.math import load_problems

            path = Path(spec)
            name = path.stem
            rows, grader = load_problems(path, problem_key, answer_key)[:limit], math_reward
        if name in out:
            raise ValueError(f"data: two benchmarks named {name!r} ({spec}); evaluate them in separate runs")
        out[name] = (rows, grader)
    return out


def _specs(data: str | Path | Sequence[str | Path]) -> list[str | Path]:
    return [data] if isinstance(data, str | Path) else list(data)


def _check_task(synthetic_kw: dict | None, specs: list[str | Path]) -> list[str]:
    """Problems with the synthetic task fields: unknown names, bad values, or no synthetic benchmark to use them."""
    import dataclasses

    from kpo.data.synthetic import TaskConfig

    if not synthetic_kw:
        return []
    if SYNTHETIC not in (str(s) for s in specs):
        return [f"synthetic_kw={synthetic_kw} (CLI --task) only applies to data 'synthetic', which is not among "
                f"{[str(s) for s in specs]}: drop it or add 'synthetic'"]  # fmt: skip
    valid = [f.name for f in dataclasses.fields(TaskConfig)]
    unknown = sorted(set(synthetic_kw) - set(valid))
    if unknown:
        return [f"synthetic_kw (CLI --task): unknown task field(s) {unknown}; valid fields: {valid}"]
    try:
        TaskConfig(**synthetic_kw)
    except ValueError as e:
        return [f"synthetic_kw (CLI --task): {e}"]
    return []


def _output_paths(output: str | Path | None, cache: str | Path | None) -> tuple[Path | None, ...]:
    """(results JSON, markdown table beside it, generation cache); the table and the default cache take the
    JSON path's name with their own suffix."""
    if output is None:
        return None, None, Path(cache) if cache is not None else None
    out = Path(output)
    cache = Path(cache) if cache is not None else out.with_suffix(".generations.jsonl")
    return out, out.with_suffix(".md"), cache


def _check_outputs(output: Path | None, table: Path | None, cache: Path | None) -> list[str]:
    if output is not None and output == table:
        return [f"output={str(output)!r} ends in .md, the name of the markdown table written beside the results "
                f"JSON: give a .json path, e.g. {str(output.with_suffix('.json'))!r}"]  # fmt: skip
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
        return [f"{name}={str(path)!r} (--{name}): {str(existing)!r} is a file, not a directory; choose "
                "another path"]  # fmt: skip
    return []


def _build_prompt(row: dict, tokenizer, template: str, use_chat: bool) -> str:
    if "prompt" in row:
        return row["prompt"]
    text = template.replace("{problem}", row["problem"])
    if use_chat:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    return text


# ------------------------------------------------------------------------------------------- evaluate


def evaluate(
    model: str | Path,
    data: str | Path | Sequence[str | Path],
    *,
    n: int = 16,
    ks: Sequence[int] = (1, 16),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    seed: int = 0,
    output: str | Path | None = None,
    cache: str | Path | None = None,
    prompt_template: str | None = None,
    show_progress: bool = True,
    chat_template: str = "auto",
    backend: str = "auto",
    device: str = "auto",
    dtype: str | None = None,
    limit: int | None = None,
    synthetic_kw: dict | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
) -> dict[str, Any]:
    """Sample `n` completions per problem, grade them and report avg@n / pass@k per benchmark.

    Args:
        model: a Hugging Face model directory (tokenizer saved beside it). Its cache identity is the resolved
            path plus a fingerprint of its weight/config files, so retraining in place invalidates the cache.
        data: a benchmark file (any format :func:`kpo.data.math.load_problems` reads), ``"synthetic"`` (the
            embedded task's test split, graded by :meth:`kpo.data.synthetic.TaskConfig.grade`), or a list.
        n: samples per problem; ks: the k of each pass@k (each 1 <= k <= n).
        temperature: 0 = greedy (then n > 1 repeats the same completion); top_p: nucleus mass in (0, 1].
        max_new_tokens: generation budget; default 4096 for math, the longest reference solution + 1 for synthetic.
        batch_size: sequences per generate call (results do not depend on it).
        seed: base seed; sample j of problem p always uses ``sample_seed(seed, dataset, p, j)``.
        output: write results JSON here and a markdown table beside it (same name, ``.md``; so `output` itself
            must not end in ``.md``).
        cache: generation cache (jsonl); default ``<output>.generations.jsonl`` when `output` is given.
        prompt_template: text with ``{problem}``; default :data:`DEFAULT_PROMPT_TEMPLATE`. Synthetic rows use
            their raw ``prompt``.
        chat_template: "auto" (wrap math prompts in the tokenizer's chat template when it has one), "on", "off".
        backend: "auto" (vLLM on a GPU when installed and `device` is "auto" or "cuda", else transformers),
            "transformers", "vllm".
        device: transformers device: "auto" (cuda when available), "cpu", "cuda", "cuda:N".
        dtype: one of :data:`DTYPES`; default bfloat16 on GPU, float32 on CPU.
        limit: first `limit` problems of each benchmark, >= 1 (synthetic: number of test problems, default the
            whole test split: ``kpo.data.synthetic.load_split("test")``, 256 problems for the default task).
        synthetic_kw: task fields for the synthetic split, e.g. ``{"kind": "chain", "n_terms": 3}``.
        problem_key, answer_key: read these fields of every benchmark file instead of auto-detecting.

    Returns:
        ``{"model", "params", "benchmarks": {name: {"problems", "samples", "avg@n", "pass@k"...,
        "mean_response_tokens", "truncated_frac", "per_problem": [{"id", "correct"}], "max_new_tokens"}},
        "macro": {...}}``. ``params["max_new_tokens"]`` is the budget used, or ``{name: budget}`` when the
        benchmarks' defaults differ.

    Raises:
        ValueError: a bad argument (all of them are checked before anything loads), a benchmark or task that
            cannot be read or drawn, or a model that cannot be loaded (naming the path and the loader's
            reason).
    """
    ks = [int(k) for k in ks]
    errors = []
    if not isinstance(n, int) or n < 1:
        errors.append(f"n={n!r}: must be a positive integer")
    elif bad := [k for k in ks if not 1 <= k <= n]:
        errors.append(f"ks={ks}: {bad} outside [1, n={n}]; raise n or drop them")
    if not ks:
        errors.append("ks: give at least one k")
    if temperature < 0:
        errors.append(f"temperature={temperature}: must be >= 0")
    if not 0 < top_p <= 1:
        errors.append(f"top_p={top_p}: must lie in (0, 1]")
    if batch_size < 1:
        errors.append(f"batch_size={batch_size}: must be >= 1")
    if max_new_tokens is not None and max_new_tokens < 1:
        errors.append(f"max_new_tokens={max_new_tokens}: must be >= 1")
    template = DEFAULT_PROMPT_TEMPLATE if prompt_template is None else prompt_template
    if "{problem}" not in template:
        errors.append(f"prompt_template={template!r}: must contain '{{problem}}'")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        errors.append(f"limit={limit!r}: must be a positive integer (the first `limit` problems), or None for all")
    output, table, cache = _output_paths(output, cache)
    errors += _check_task(synthetic_kw, _specs(data)) + _check_outputs(output, table, cache)
    errors += _check_engine(backend, device, dtype)
    if errors:
        raise ValueError("evaluate: " + "; ".join(errors))

    benchmarks = _load_benchmarks(data, limit, synthetic_kw, problem_key, answer_key)
    store = GenerationCache(cache) if cache is not None else None
    engine = _make_backend(backend, model, device, dtype)
    use_chat = _use_chat_template(engine.tokenizer, chat_template)
    model_id = _model_id(model)

    results: dict[str, Any] = {"model": model_id, "benchmarks": {}}
    budgets = {
        name: max_new_tokens if max_new_tokens is not None else _default_budget(name, synthetic_kw)
        for name in benchmarks
    }
    for name, (rows, grader) in benchmarks.items():
        budget = budgets[name]
        # everything that changes a sample keys the cache (the dtype too: bf16 and fp32 sample differently)
        params = {
            "temperature": temperature, "top_p": top_p, "max_new_tokens": budget, "seed": seed, "backend": engine.name,
            "dtype": engine.dtype,
        }  # fmt: skip
        params_key = json.dumps(params, sort_keys=True)
        records: dict[tuple[int, int], dict] = {}
        todo = []
        for i, row in enumerate(rows):
            prompt = _build_prompt(row, engine.tokenizer, template, use_chat)
            for j in range(n):
                rec = {"model": model_id, "dataset": name, "id": row["id"], "sample": j, "params": params_key,
                       "prompt_sha": _prompt_hash(prompt)}  # fmt: skip
                hit = store.get(GenerationCache.key(rec)) if store is not None else None
                if hit is not None:
                    records[i, j] = hit
                else:
                    todo.append((i, j, prompt, rec))
        _generate(engine, todo, records, store, params, batch_size, name, show_progress)
        results["benchmarks"][name] = {
            **_score(rows, records, grader, n, ks, name, show_progress), "max_new_tokens": budget
        }

    # The budgets used, not the argument (None means a per-benchmark default); a mapping when they differ.
    used = next(iter(budgets.values())) if len(set(budgets.values())) == 1 else budgets
    results["params"] = {
        "n": n, "ks": ks, "temperature": temperature, "top_p": top_p, "max_new_tokens": used,
        "seed": seed, "prompt_template": template, "chat_template": use_chat, "backend": engine.name,
    }  # fmt: skip
    metric_keys = [k for k in next(iter(results["benchmarks"].values())) if "@" in k or k.startswith("mean_")]
    results["macro"] = {
        k: sum(b[k] for b in results["benchmarks"].values()) / len(results["benchmarks"]) for k in metric_keys
    }
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
        table.write_text(format_table(results) + "\n")
    return results


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
        from kpo.data.synthetic import TaskConfig

        return TaskConfig(**(synthetic_kw or {})).max_response_chars() + 1  # + eos
    return DEFAULT_MATH_MAX_NEW_TOKENS


def _generate(engine, todo, records, store, params, batch_size, name, show_progress) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=f"generate {name}", unit="sample", disable=not show_progress or not todo)
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
        bar.update(len(batch))
        bar.set_postfix(tok_per_s=f"{tokens / (time.perf_counter() - start):.0f}")
    bar.close()


def _score(rows, records, grader, n, ks, name, show_progress) -> dict[str, Any]:
    from tqdm.auto import tqdm

    correct = []
    for i, row in enumerate(tqdm(rows, desc=f"grade {name}", unit="problem", disable=not show_progress)):
        correct.append([float(grader(records[i, j]["completion"], row["answer"])) for j in range(n)])
    lengths = [records[i, j]["n_tokens"] for i in range(len(rows)) for j in range(n)]
    truncated = [not records[i, j]["stopped"] for i in range(len(rows)) for j in range(n)]
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
