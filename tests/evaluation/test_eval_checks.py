"""``kpo eval``: bad backend/device/dtype/output settings and unloadable models are clean errors found before
anything loads; a run without --output says it cannot resume; the results record the budget actually used."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from data.draws import no_more_draws
from kpo.evaluation import evaluate
from kpo.evaluation import runner as runner_mod
from kpo.evaluation.cli import build_parser
from kpo.evaluation.cli import main as cli_main
from kpo.evaluation.config import DEFAULT_MATH_MAX_NEW_TOKENS
from kpo.testbed.task import TaskConfig

from .tiny_model import save_tiny_model

NO_OUTPUT_WARNING = "no --output: results are printed only and an interrupted run cannot resume"


class _EmptyBackend:
    """Answers "" to every prompt and remembers each budget it was given."""

    name = "empty"
    dtype = "float32"
    context_length = None  # an engine that does not say: budgets are not capped

    def __init__(self):
        from transformers import PreTrainedTokenizerBase

        self.tokenizer = PreTrainedTokenizerBase()
        self.budgets = set()

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens):
        self.budgets.add(max_new_tokens)
        return [("", 1, True) for _ in prompts]


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if evaluate gets as far as building a backend (the checks must come first)."""

    def refuse(*args):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(runner_mod, "make_backend", refuse)


@pytest.fixture
def empty_backend(monkeypatch):
    backend = _EmptyBackend()
    monkeypatch.setattr(runner_mod, "make_backend", lambda *a: backend)
    return backend


def _eval(model, *extra):
    return cli_main(
        ["--model", str(model), "--data", "synthetic", "--n", "1", "--k", "1", "--no-progress", *extra]
    )


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_dtype_must_be_a_model_dtype(tiny_model, no_load, capsys):
    with pytest.raises(SystemExit) as e:
        _eval(tiny_model, "--dtype", "float99")
    assert e.value.code == 2
    assert "argument --dtype: invalid choice: 'float99'" in _error(capsys)
    with pytest.raises(ValueError, match=r"dtype='float99' \(--dtype\): must be one of \('bfloat16', "):
        evaluate(tiny_model, "synthetic", dtype="float99")


def test_cuda_device_without_cuda(tiny_model, no_load, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _eval(tiny_model, "--device", "cuda") == 2
    assert "device='cuda' (--device): no CUDA device is available" in (err := _error(capsys))
    assert "use --device cpu" in err
    assert _eval(tiny_model, "--device", "gpu0") == 2
    assert "device='gpu0' (--device): must be auto, cpu, cuda or cuda:N" in _error(capsys)


def test_vllm_backend_without_vllm(tiny_model, no_load, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec then reports it as not installed
    assert _eval(tiny_model, "--backend", "vllm") == 2
    assert "backend='vllm' (--backend): vllm is not installed; pip install vllm" in _error(capsys)


def test_vllm_backend_takes_no_device(tiny_model, no_load, capsys):
    assert _eval(tiny_model, "--backend", "vllm", "--device", "cpu") == 2
    assert "device='cpu' (--device): vLLM places the model itself" in _error(capsys)


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("weights", "no file named model.safetensors"),
        ("corrupt", "Error while deserializing header"),
    ],
)
def test_a_model_that_cannot_load_names_the_path_and_the_reason(tiny_model, tmp_path, capsys, damage, reason):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    if damage == "weights":
        (model / "model.safetensors").unlink()
    else:
        (model / "model.safetensors").write_bytes(b"not a safetensors file")
    assert _eval(model, "--limit", "1") == 2
    err = _error(capsys)
    assert f"kpo eval: error: model={str(model)!r}: cannot load it: " in err and reason in err


def test_a_task_too_small_for_a_test_split_is_a_clean_error(tiny_model, no_load, capsys):
    assert _eval(tiny_model, "--task", "kind=chain", "--task", "max_value=3") == 2
    err = _error(capsys)
    assert "kpo eval: error: " in err and "'max_value': 3" in err and "raise max_value or n_terms" in err


def test_a_limit_beyond_the_synthetic_test_split_is_refused_before_any_problem_is_drawn(
    no_load, monkeypatch, capsys
):
    """--limit 100000000 hung with no output, building the running task's test problems (about 15 hours)."""
    no_more_draws(monkeypatch, 0)
    assert _eval("m", "--limit", "100000000") == 2
    assert (
        "limit=100000000 (--limit): 100000000 test problems requested but the task {'kind': 'running', 'n_terms': "
        "128, 'max_value': 9} allows at most 1000000 (all that kpo draws: it builds every problem in memory, about "
        "1 kB each): ask for 1000000 or fewer" in _error(capsys)
    )
    # the chain task's test split: 40 problems
    assert _eval("m", "--task", "kind=chain", "--limit", "41") == 2
    assert "limit=41 (--limit): 41 test problems requested" in _error(capsys)


def test_more_samples_than_one_evaluation_plans_are_refused_before_the_model_loads(no_load, capsys):
    # a record per sample was made before the first was drawn: --n 100000000 built them for minutes, silently
    assert _eval("m", "--n", "1000000", "--k", "1", "--limit", "2") == 2
    assert (
        "n=1000000 (--n) samples of each problem (synthetic 2) makes 2000000 samples, more than the 1000000 one "
        "evaluation plans (a record each, in memory, before the first is drawn); lower --n or --limit"
        in _error(capsys)
    )


@pytest.mark.parametrize(
    "flags, setting",
    [
        (("--prompt-template", "Q: {problem}"), "prompt_template='Q: {problem}' (--prompt-template)"),
        (("--chat-template", "on"), "chat_template='on' (--chat-template)"),
        (("--problem-key", "q", "--answer-key", "a"), "problem_key='q' (--problem-key)"),
    ],
)
def test_benchmark_file_settings_with_synthetic_data_alone_are_refused(no_load, capsys, flags, setting):
    # the synthetic rows are fed their raw prompt and graded by the task: these did nothing, without a word
    assert _eval("m", *flags) == 2
    assert (
        f"{setting} is ignored with data 'synthetic' alone, whose rows are fed their raw prompt: drop it, or add "
        "a benchmark file" in _error(capsys)
    )


def test_no_output_warns_that_nothing_is_saved(tmp_path, empty_backend, capsys):
    assert _eval("m", "--limit", "1") == 0
    assert f"kpo eval: warning: {NO_OUTPUT_WARNING}; pass --output PATH.json" in capsys.readouterr().err
    assert _eval("m", "--limit", "1", "--output", str(tmp_path / "r.json")) == 0
    assert "warning" not in capsys.readouterr().err
    assert (
        "without it results are only printed, and an interrupted run cannot resume unless --cache"
        in " ".join(build_parser().format_help().split())
    )


def test_results_record_the_budget_used(tmp_path, empty_backend):
    synthetic_budget = TaskConfig().max_response_chars() + 1
    out = tmp_path / "r.json"
    res = evaluate("m", "synthetic", n=1, ks=(1,), limit=1, output=out, show_progress=False)
    assert empty_backend.budgets == {synthetic_budget}
    assert json.loads(out.read_text())["params"]["max_new_tokens"] == synthetic_budget
    assert res["benchmarks"]["synthetic"]["max_new_tokens"] == synthetic_budget
    # Benchmarks with different default budgets: each one's, by name.
    bench = tmp_path / "toy.jsonl"
    bench.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    res = evaluate("m", ["synthetic", bench], n=1, ks=(1,), limit=1, show_progress=False)
    budgets = {"synthetic": synthetic_budget, "toy": DEFAULT_MATH_MAX_NEW_TOKENS}
    assert res["params"]["max_new_tokens"] == budgets
    assert (
        evaluate("m", bench, n=1, ks=(1,), max_new_tokens=7, show_progress=False)["params"]["max_new_tokens"]
        == 7
    )


@pytest.mark.parametrize(
    "flag, path, message",
    [
        (
            "--output",
            "{file}/r.json",
            "output='{file}/r.json' (--output): '{file}' is a file, not a directory",
        ),
        ("--output", "{file}/sub/r.json", "'{file}' is a file, not a directory"),
        (
            "--cache",
            "{file}/c.jsonl",
            "cache='{file}/c.jsonl' (--cache): '{file}' is a file, not a directory",
        ),
        ("--output", "{tmp}", "output='{tmp}' (--output) is a directory; give a file path"),
    ],
)
def test_an_output_path_blocked_by_a_file_is_a_clean_error(
    tiny_model, tmp_path, no_load, capsys, flag, path, message
):
    file = tmp_path / "existing_file"
    file.write_text("")
    assert _eval(tiny_model, flag, path.format(file=file, tmp=tmp_path)) == 2
    err = _error(capsys)
    assert message.format(file=file, tmp=tmp_path) in err
    assert err.count("is a file") <= 1  # the default cache beside the output is not reported again


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory):
    """The eval tests' tiny model with 64 positions: a 12-character prompt leaves 52 tokens to generate."""
    return save_tiny_model(tmp_path_factory.mktemp("short") / "model", context=64)


def _short_eval(model, tmp_path, prompt, *extra):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"problem": prompt, "answer": "2"}) + "\n")
    argv = [
        "--model",
        str(model),
        "--data",
        str(data),
        "--n",
        "1",
        "--k",
        "1",
        "--no-progress",
        "--prompt-template",
        "{problem}",
        "--chat-template",
        "off",
        "--temperature",
        "0",
        "--output",
        str(tmp_path / "eval.json"),
        *extra,
    ]
    return cli_main(argv)


def test_the_default_budget_is_capped_to_the_context_with_a_warning(short_context_model, tmp_path, capsys):
    # 64 positions - 12 prompt tokens ("What is 1+1?", one per character) = 52 tokens left, not 4096
    assert _short_eval(short_context_model, tmp_path, "What is 1+1?") == 0
    err = capsys.readouterr().err
    assert "longest prompt (row 0) has 12 tokens and the model's context is 64" in err
    assert "capped at 52 tokens (default 4096)" in err
    results = json.loads((tmp_path / "eval.json").read_text())
    assert results["params"]["max_new_tokens"] == 52 and results["benchmarks"]["one"]["max_new_tokens"] == 52


def test_an_asked_budget_beyond_the_context_is_an_error(short_context_model, tmp_path, capsys):
    assert _short_eval(short_context_model, tmp_path, "What is 1+1?", "--max-new-tokens", "53") == 2
    err = capsys.readouterr().err
    assert "max_new_tokens=53:" in err and "leaves 52 tokens; give --max-new-tokens 52 or less" in err
    assert not (tmp_path / "eval.json").exists()
    assert _short_eval(short_context_model, tmp_path, "What is 1+1?", "--max-new-tokens", "52") == 0


def test_a_prompt_that_fills_the_context_is_an_error(short_context_model, tmp_path, capsys):
    assert _short_eval(short_context_model, tmp_path, "x" * 64) == 2
    err = capsys.readouterr().err
    assert "has 64 tokens and the model's context is 64, which leaves no room to generate" in err


def test_a_model_without_tokenizer_files_is_named(tiny_model, tmp_path, capsys):
    """transformers builds a one-token tokenizer from the model's config instead of failing (issue 34: an
    IndexError in the decoder followed)."""
    model = tmp_path / "model"
    shutil.copytree(
        tiny_model, model, ignore=shutil.ignore_patterns("tokenizer*", "vocab*", "special_tokens*")
    )
    assert _eval(model, "--limit", "1") == 2
    assert f"kpo eval: error: model={str(model)!r}: no tokenizer files in this directory" in _error(capsys)


def test_data_that_is_a_folder_or_missing_is_named_before_the_model_loads(tmp_path, no_load, capsys):
    folder, missing = tmp_path / "data", tmp_path / "aime.parquet"
    folder.mkdir()
    assert _eval("m", "--data", str(folder), str(missing), "--output", str(tmp_path / "r.json")) == 2
    err = _error(capsys)
    assert f"data: {str(folder)!r} is a directory; give a benchmark file" in err
    assert f"data: {str(missing)!r} does not exist; give a benchmark file" in err


def test_an_output_that_cannot_be_written_is_refused_before_sampling(read_only_dir, no_load, capsys):
    folder, why = read_only_dir
    for output in (folder / "res.json", folder / "sub" / "res.json"):
        assert _eval("m", "--output", str(output)) == 2
        assert f"output={str(output)!r} (--output): {str(folder)!r} {why}; choose another path" in _error(
            capsys
        )
    assert not any(folder.iterdir())


def test_a_torn_cache_line_is_dropped_and_said(tmp_path, empty_backend, capsys):
    """What a kill or a full disk during an append leaves: the rerun drops it, says so, and redoes that sample."""
    out, cache = tmp_path / "r.json", tmp_path / "r.generations.jsonl"
    assert _eval("m", "--limit", "2", "--output", str(out)) == 0
    whole = cache.read_bytes()
    cache.write_bytes(whole[:-10])
    capsys.readouterr()
    assert _eval("m", "--limit", "2", "--output", str(out)) == 0
    err = capsys.readouterr().err
    dropped = len(whole.splitlines(keepends=True)[-1]) - 10
    assert (
        f"kpo eval: dropped the torn last line of {cache} ({dropped} bytes, cut while it was written)" in err
    )
    assert cache.read_bytes() == whole
