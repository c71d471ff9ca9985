from __future__ import annotations

import json
import math

import pytest

from kpo.evaluation import GenerationCache, evaluate, sample_seed
from kpo.evaluation import backends as backends_mod
from kpo.evaluation import runner as runner_mod
from kpo.evaluation.cli import main as cli_main
from kpo.evaluation.config import DEFAULT_PROMPT_TEMPLATE
from kpo.testbed.task import TaskConfig, load_split

from .tiny_model import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(path):
    return {(r["id"], r["sample"]): r["completion"] for r in map(json.loads, path.read_text().splitlines())}


def test_sampler_draws_from_the_nucleus_distribution():
    import torch

    # p = (0.5, 0.3, 0.15, 0.05); top_p = 0.8 keeps {0, 1} (mass before token 2 is 0.8) -> (0.625, 0.375).
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = 4000
    gens = [torch.Generator().manual_seed(sample_seed(0, "t", str(i), 0)) for i in range(rows)]
    scores = probs.log().expand(rows, 4)
    picks = backends_mod._SeededSampler(gens, temperature=1.0, top_p=0.8)(None, scores).argmax(-1)
    freq = torch.bincount(picks, minlength=4).double() / rows
    assert freq[2] == 0 and freq[3] == 0
    # binomial sd at p=0.625, n=4000: sqrt(.625*.375/4000) = 0.0077; 4 sd tolerance
    assert abs(freq[0].item() - 0.625) < 0.031
    # Temperature 2 flattens: p^(1/2) normalised = (0.3992, 0.3092, 0.2186, 0.0730).
    gens = [torch.Generator().manual_seed(sample_seed(1, "t", str(i), 0)) for i in range(rows)]
    picks = backends_mod._SeededSampler(gens, temperature=2.0, top_p=1.0)(None, scores).argmax(-1)
    freq = torch.bincount(picks, minlength=4).double() / rows
    expected = probs.sqrt() / probs.sqrt().sum()
    assert torch.allclose(freq, expected.double(), atol=0.031)


def test_samples_do_not_depend_on_batch_size(tiny_model, tmp_path):
    kw = dict(n=3, ks=(1, 3), limit=5, max_new_tokens=12, show_progress=False)
    a = evaluate(tiny_model, "synthetic", batch_size=1, cache=tmp_path / "a.jsonl", **kw)
    b = evaluate(tiny_model, "synthetic", batch_size=7, cache=tmp_path / "b.jsonl", **kw)
    assert _records(tmp_path / "a.jsonl") == _records(tmp_path / "b.jsonl")
    assert a["benchmarks"] == b["benchmarks"]
    # Different samples of one problem differ (they have their own seeds); greedy repeats itself.
    recs = _records(tmp_path / "a.jsonl")
    assert len({recs[("test-000000", j)] for j in range(3)}) > 1
    evaluate(tiny_model, "synthetic", temperature=0.0, batch_size=4, cache=tmp_path / "g.jsonl", **kw)
    greedy = _records(tmp_path / "g.jsonl")
    assert len({greedy[("test-000000", j)] for j in range(3)}) == 1


def test_outputs_and_cache_reuse(tiny_model, tmp_path):
    out = tmp_path / "res" / "results.json"
    kw = dict(n=2, ks=(1, 2), limit=4, batch_size=3, max_new_tokens=8, show_progress=False, output=out)
    first = evaluate(tiny_model, "synthetic", **kw)
    cache = out.with_suffix(".generations.jsonl")
    assert len(cache.read_text().splitlines()) == 8  # 4 problems x 2 samples
    saved = json.loads(out.read_text())
    assert saved["benchmarks"]["synthetic"]["problems"] == 4 and saved["params"]["n"] == 2
    b = saved["benchmarks"]["synthetic"]
    # every number recomputed from the cached records: lengths, truncation (no eos within 8 tokens), grades
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    task, answers = TaskConfig(), {row["id"]: row["answer"] for row in load_split("test", n=4)}
    lengths = [r["n_tokens"] for r in records]
    truncated = sum(not r["stopped"] for r in records) / 8
    assert truncated > 0 and b["truncated_frac"] == pytest.approx(truncated)
    assert b["mean_response_tokens"] == pytest.approx(sum(lengths) / 8) and max(lengths) <= 8
    correct = {
        pid: sum(task.grade(r["completion"], answers[pid]) for r in records if r["id"] == pid)
        for pid in answers
    }
    assert {p["id"]: p["correct"] for p in b["per_problem"]} == correct
    assert b["avg@2"] == pytest.approx(sum(correct.values()) / 8)
    row = f"| synthetic | 4 | {100 * b['avg@2']:.1f} | {100 * b['pass@1']:.1f} | {100 * b['pass@2']:.1f} | "
    assert row + f"{sum(lengths) / 8:.0f} | {100 * truncated:.1f}% |" in out.with_suffix(".md").read_text()
    # Rerun: everything comes from the cache; same results, nothing appended.
    assert evaluate(tiny_model, "synthetic", **kw) == first
    assert len(cache.read_text().splitlines()) == 8
    # More samples reuse the first two of each problem and add the rest.
    evaluate(tiny_model, "synthetic", **{**kw, "n": 3, "ks": (1,)})
    assert len(cache.read_text().splitlines()) == 12
    # A different sampling parameter is a different key, and so is the model dtype (bf16 samples differ).
    evaluate(tiny_model, "synthetic", **{**kw, "temperature": 0.5})
    assert len(cache.read_text().splitlines()) == 20
    evaluate(tiny_model, "synthetic", **{**kw, "dtype": "bfloat16"})
    assert len(cache.read_text().splitlines()) == 28


def test_a_checkpoint_rewritten_in_place_misses_the_cache(tmp_path):
    model = save_tiny_model(tmp_path / "ckpt", seed=0)
    kw = dict(n=2, ks=(1,), limit=2, max_new_tokens=4, show_progress=False, cache=tmp_path / "c.jsonl")
    evaluate(model, "synthetic", **kw)
    evaluate(model, "synthetic", **kw)
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 4
    save_tiny_model(model, seed=1)  # "retrained": new weights at the same path
    evaluate(model, "synthetic", **kw)
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 8


def test_cache_drops_a_partial_tail_and_rejects_corruption(tmp_path):
    rec = {
        "model": "m",
        "dataset": "d",
        "id": "1",
        "sample": 0,
        "params": "{}",
        "prompt_sha": "x",
        "completion": "c",
    }
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(rec) + "\n" + '{"model": "m", "data')  # killed mid-write
    cache = GenerationCache(path)
    assert len(cache) == 1 and cache.get(GenerationCache.key(rec))["completion"] == "c"
    assert path.read_text().endswith("}\n")  # the partial tail is gone, appends start on a clean line
    cache.append([{**rec, "sample": 1}])
    assert len(GenerationCache(path)) == 2
    path.write_text("garbage\n" + json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="line 1 is not a generation record"):
        GenerationCache(path)


class _FakeBackend:
    """Answers the problem's own reference in a box for even sample seeds, a wrong number otherwise."""

    name = "fake"
    dtype = "float32"
    context_length = None

    def __init__(self, answers, chat_template=None):
        from transformers import PreTrainedTokenizerBase

        self.answers = answers
        self.tokenizer = PreTrainedTokenizerBase()
        self.tokenizer.chat_template = chat_template
        self.prompts = []

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens):
        self.prompts += prompts
        out = []
        for prompt, seed in zip(prompts, seeds):
            answer = next(a for p, a in self.answers.items() if p in prompt)
            text = f"so \\boxed{{{answer}}}" if seed % 2 == 0 else "so \\boxed{-12345}"
            out.append((text, len(text), True))
        return out


def test_math_pipeline_grades_and_scores(tmp_path, monkeypatch, capsys):
    problems = {"Compute 1/2.": "\\frac{1}{2}", "Name the pair.": "(1, 2)", "How many?": "7"}
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in problems.items()))
    fake = _FakeBackend(problems)
    monkeypatch.setattr(runner_mod, "make_backend", lambda *a: fake)
    res = evaluate("fake-model", data, n=8, ks=(1, 8), show_progress=False)
    per = {p["id"]: p["correct"] for p in res["benchmarks"]["toy"]["per_problem"]}
    seeds = {pid: [sample_seed(0, "toy", pid, j) % 2 == 0 for j in range(8)] for pid in ("0", "1", "2")}
    assert per == {pid: sum(s) for pid, s in seeds.items()}
    expected_avg = sum(sum(s) for s in seeds.values()) / 24
    assert res["benchmarks"]["toy"]["avg@8"] == pytest.approx(expected_avg)
    assert res["benchmarks"]["toy"]["pass@8"] == pytest.approx(sum(any(s) for s in seeds.values()) / 3)
    assert res["macro"]["avg@8"] == res["benchmarks"]["toy"]["avg@8"]
    # Default prompt: the problem, then the \boxed instruction; no chat template on this tokenizer.
    assert (
        fake.prompts[0]
        == "Compute 1/2.\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    # The CLI prints the table and reports bad arguments as errors, not tracebacks.
    assert (
        cli_main(["--model", "fake-model", "--data", str(data), "--n", "2", "--k", "1,2", "--no-progress"])
        == 0
    )
    # percentages with one decimal: 2 samples of 3 problems, grades from the seeds' parity
    two = {pid: [sample_seed(0, "toy", pid, j) % 2 == 0 for j in range(2)] for pid in ("0", "1", "2")}
    avg, p2 = sum(map(sum, two.values())) / 6, sum(map(any, two.values())) / 3
    table = capsys.readouterr().out
    assert (
        f"| toy | 3 | {100 * avg:.1f} | {100 * avg:.1f} | {100 * p2:.1f} | " in table and "| 0.0% |" in table
    )
    assert cli_main(["--model", "m", "--data", str(data), "--n", "2", "--k", "1,4"]) == 2
    assert "ks=[1, 4]: [4] outside [1, n=2]" in capsys.readouterr().err


def test_chat_template_modes(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    row = {"id": "0", "problem": "P?", "answer": "1"}
    assert (
        runner_mod._build_prompt(row, tok, "Q: {problem}", runner_mod._use_chat_template(tok, "auto"))
        == "Q: P?"
    )
    with pytest.raises(ValueError, match="no chat template"):
        runner_mod._use_chat_template(tok, "on")
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    assert runner_mod._build_prompt(row, tok, "Q: {problem}", runner_mod._use_chat_template(tok, "auto")) == (
        "<user>Q: P?<assistant>"
    )
    assert (
        runner_mod._build_prompt(row, tok, "Q: {problem}", runner_mod._use_chat_template(tok, "off"))
        == "Q: P?"
    )
    # Synthetic rows carry their exact raw prompt: never templated.
    assert runner_mod._build_prompt({**row, "prompt": "1+2="}, tok, "Q: {problem}", True) == "1+2="


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"n": 4, "ks": (1, 8)}, r"\[8\] outside \[1, n=4\]"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"temperature": -1.0}, "temperature=-1.0"),
        ({"prompt_template": "no slot"}, "must contain '{problem}'"),
    ],
)
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        evaluate("unused", "synthetic", **kw)


def test_pass_at_k_keys_are_consistent_with_metrics(tiny_model):
    res = evaluate(tiny_model, "synthetic", n=2, ks=(1, 2), limit=2, max_new_tokens=4, show_progress=False)
    b = res["benchmarks"]["synthetic"]
    assert b["pass@1"] == pytest.approx(b["avg@2"]) and 0.0 <= b["pass@1"] <= b["pass@2"] <= 1.0
    assert math.isclose(res["macro"]["pass@2"], b["pass@2"])


def test_train_and_eval_build_the_same_prompt(tiny_model, tmp_path):
    """A model trained with `kpo train --dataset` is evaluated on the exact prompt text it was trained on."""
    from transformers import AutoTokenizer

    from kpo.train.config import TrainConfig
    from kpo.train.run import _load_data

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"problem": "Compute 1/2.", "answer": "\\frac{1}{2}"}) + "\n")
    row = {"id": "0", "problem": "Compute 1/2.", "answer": "\\frac{1}{2}"}
    config = TrainConfig(dataset=str(data))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    train_prompt = _load_data(config, tok)[0][0]["prompt"]
    assert train_prompt == runner_mod._build_prompt(row, tok, DEFAULT_PROMPT_TEMPLATE, False)
    # With a chat template both wrap the same user turn (TRL renders train's message list the same way).
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    messages = _load_data(config, tok)[0][0]["prompt"]
    assert messages == [{"role": "user", "content": train_prompt}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        runner_mod._build_prompt(row, tok, DEFAULT_PROMPT_TEMPLATE, True)
    )
    # An empty template means plain text to both: train must not take any non-None template as chat.
    tok.chat_template = ""
    assert _load_data(config, tok)[0][0]["prompt"] == train_prompt
    assert runner_mod._use_chat_template(tok, "auto") is False


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--limit", "0"], "limit=0: must be a positive integer"),
        (["--limit", "-1"], "limit=-1: must be a positive integer"),
        (
            ["--task", "nterms=3"],
            "unknown task field(s) ['nterms']; valid fields: ['kind', 'n_terms', 'max_value']",
        ),
        (["--task", "n_terms=0"], "n_terms=0: must be an integer >= 1"),
        (["--task", "max_value=10"], "max_value=10: must be an integer in 1..9"),
        (["--data", "{bench}", "--task", "n_terms=3"], "only applies to data 'synthetic'"),
        (["--output", "{tmp}/res.md"], "res.md' ends in .md"),
        (["--model", "{tmp}/missing"], "missing': no such directory; give a Hugging Face model directory"),
        (["--model", "{tmp}"], "no config.json in this directory"),
    ],
)
def test_cli_reports_bad_arguments_without_a_traceback(tiny_model, tmp_path, capsys, argv, message):
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    base = {"--model": str(tiny_model), "--data": "synthetic", "--n": "1", "--k": "1", "--no-progress": None}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value.format(tmp=tmp_path, bench=bench)
    args = [x for flag, value in base.items() for x in (flag, value) if x is not None]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "res.md").exists()


def test_vllm_gets_the_token_ids_the_transformers_backend_uses(tiny_model, monkeypatch):
    # vLLM tokenizes a string prompt with special tokens (a second BOS after a chat template that has one):
    # the backend hands it token ids made without them. vLLM is not installed here: a stand-in module
    # records what it is given.
    import sys
    import types

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    seen = {}

    class LLM:
        def __init__(self, model, dtype):
            seen["init"] = (model, dtype)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=64))

        def get_tokenizer(self):
            return tokenizer

        def generate(self, prompts, params, use_tqdm):
            seen["prompts"], seen["seeds"] = prompts, [p.seed for p in params]
            done = types.SimpleNamespace(text="7", token_ids=[1, 2], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[done]) for _ in prompts]

    class SamplingParams:
        def __init__(self, temperature, top_p, max_tokens, seed):
            self.seed = seed

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    backend = backends_mod.VLLMBackend(tiny_model)
    out = backend.generate(["1+2=", "3+4="], [5, 6], temperature=1.0, top_p=1.0, max_new_tokens=4)
    assert out == [("7", 2, True), ("7", 2, True)] and seen["seeds"] == [5, 6]
    assert seen["init"] == (str(tiny_model), "auto") and backend.dtype == "auto"
    assert backend.context_length == 64  # vLLM's max_model_len bounds prompt + budget
    want = [tokenizer(p, add_special_tokens=False).input_ids for p in ("1+2=", "3+4=")]
    assert [p["prompt_token_ids"] for p in seen["prompts"]] == want


def test_progress_in_a_log_is_lines_not_a_bar_stream(tiny_model, capsys):
    evaluate(tiny_model, "synthetic", n=1, ks=(1,), limit=2, max_new_tokens=4)  # stderr here is no terminal
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "generate synthetic: 2/2 samples (100%)" in err and "grade synthetic: 2/2 problems (100%)" in err
