"""``kpo eval``: sample, grade and print avg@n / pass@k per benchmark (see :func:`kpo.evaluation.evaluate`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k {text!r}: give comma-separated integers, e.g. 1,16") from None
    if not ks:
        raise argparse.ArgumentTypeError("--k: give at least one k")
    return ks


def _task_field(text: str) -> tuple[str, int | str]:
    """``--task FIELD=VALUE``: kind=running|chain, or n_terms/max_value=INT."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if sep and key == "kind" and value:
        return key, value
    if not sep or not value.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"--task {text!r}: expected kind=running|chain or FIELD=INT, e.g. n_terms=3")
    return key, int(value)


def build_parser() -> argparse.ArgumentParser:
    from kpo.evaluation.runner import BACKENDS, DEFAULT_MATH_MAX_NEW_TOKENS, DTYPES

    p = argparse.ArgumentParser(
        prog="kpo eval",
        description="Sample N completions per problem, grade them (math-verify, or the synthetic task's grader) "
        "and report avg@N and pass@k per benchmark with the macro average. With --output (or --cache) the "
        "generations are cached batch by batch, so an interrupted run resumes where it stopped; without "
        "either, results are only printed and an interrupted run starts over.",
    )
    p.add_argument("--model", required=True, help="Hugging Face model directory (tokenizer beside it)")
    p.add_argument("--data", nargs="+", required=True, metavar="FILE",
                   help="benchmark files (.jsonl/.json/.parquet, format auto-detected) or 'synthetic'")  # fmt: skip
    p.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    p.add_argument("--k", type=_ks, default=[1, 16], help="comma-separated k for pass@k (default 1,16)")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature, 0 = greedy (default 1.0)"
    )
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"generation budget (default {DEFAULT_MATH_MAX_NEW_TOKENS} for math, "
                   "longest reference + 1 for synthetic)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=32, help="sequences per generate call (default 32)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the per-sample generators (default 0)")
    p.add_argument("--output", default=None, metavar="PATH.json",
                   help="results JSON, not ending in .md (a .md table and the generation cache are written "
                   "beside it); without it results are only printed, and an interrupted run cannot resume "
                   "unless --cache is given")  # fmt: skip
    p.add_argument(
        "--cache", default=None, help="generation cache jsonl (default <output>.generations.jsonl)"
    )
    p.add_argument("--prompt-template", default=None,
                   help="prompt text with {problem}; default: problem + 'Please reason step by step, and put "
                   "your final answer within \\boxed{}.'")  # fmt: skip
    p.add_argument("--chat-template", choices=("auto", "on", "off"), default="auto",
                   help="wrap math prompts in the tokenizer's chat template (auto: when it has one)")  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto: vLLM on a GPU when installed, else transformers")  # fmt: skip
    p.add_argument("--device", default="auto", help="transformers device: auto, cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="model dtype (default bfloat16 on GPU, float32 on CPU)")  # fmt: skip
    p.add_argument(
        "--limit", type=int, default=None, help="first N >= 1 problems per benchmark (synthetic: N problems)"
    )
    p.add_argument("--problem-key", default=None, help="field holding the problem (with --answer-key)")
    p.add_argument("--answer-key", default=None, help="field holding the answer (with --problem-key)")
    p.add_argument("--task", type=_task_field, action="append", default=[], metavar="FIELD=VALUE",
                   help="synthetic task field, repeatable (e.g. --task kind=chain --task n_terms=3; default: the "
                        "running task, 128 terms)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from kpo.evaluation.runner import evaluate, format_table

    if args.output is None and args.cache is None:
        print("kpo eval: warning: no --output: results are printed only and an interrupted run cannot "
              "resume; pass --output PATH.json", file=sys.stderr)  # fmt: skip
    try:
        results = evaluate(
            args.model,
            args.data,
            n=args.n,
            ks=args.k,
            temperature=args.temperature,
            top_p=args.top_p,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            seed=args.seed,
            output=args.output,
            cache=args.cache,
            prompt_template=args.prompt_template,
            show_progress=not args.no_progress,
            chat_template=args.chat_template,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            limit=args.limit,
            synthetic_kw=dict(args.task) or None,
            problem_key=args.problem_key,
            answer_key=args.answer_key,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"kpo eval: error: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.output:
        print(f"\nwrote {args.output} and {Path(args.output).with_suffix('.md')}")
    return 0
