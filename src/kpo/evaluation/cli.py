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
        raise argparse.ArgumentTypeError(
            f"--task {text!r}: expected kind=running|chain or FIELD=INT, e.g. n_terms=3"
        )
    return key, int(value)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one option per :class:`EvalConfig` field (its ``dest``), defaults from the dataclass."""
    from kpo.evaluation.backends import BACKENDS, DTYPES
    from kpo.evaluation.config import CHAT_MODES, DEFAULT_MATH_MAX_NEW_TOKENS, EvalConfig

    d = EvalConfig()
    p = argparse.ArgumentParser(
        prog="kpo eval",
        description="Sample N completions per problem, grade them (math-verify, or the synthetic task's grader) "
        "and report avg@N and pass@k per benchmark with the macro average. With --output (or --cache) the "
        "generations are cached batch by batch, so an interrupted run resumes where it stopped; without "
        "either, results are only printed and an interrupted run starts over.",
    )
    p.add_argument("--model", required=True, help="Hugging Face model directory (tokenizer beside it)")
    p.add_argument(
        "--data",
        nargs="+",
        required=True,
        metavar="FILE",
        help="benchmark files (.jsonl/.json/.parquet, format auto-detected) or 'synthetic'",
    )
    p.add_argument("--n", type=int, default=d.n, help="samples per problem (default %(default)s)")
    p.add_argument(
        "--k",
        dest="ks",
        type=_ks,
        default=list(d.ks),
        help=f"comma-separated k for pass@k (default {','.join(map(str, d.ks))})",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=d.temperature,
        help="sampling temperature, 0 = greedy (default %(default)s)",
    )
    p.add_argument("--top-p", type=float, default=d.top_p, help="nucleus mass (default %(default)s)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.max_new_tokens,
        help=f"generation budget (default {DEFAULT_MATH_MAX_NEW_TOKENS} for math, longest reference "
        "+ 1 for synthetic, capped to what the model's context leaves)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help="sequences per generate call (default %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="base seed of the per-sample generators (default %(default)s)",
    )
    p.add_argument(
        "--output",
        default=d.output,
        metavar="PATH.json",
        help="results JSON, not ending in .md (a .md table and the generation cache are written "
        "beside it); without it results are only printed, and an interrupted run cannot resume "
        "unless --cache is given",
    )
    p.add_argument(
        "--cache", default=d.cache, help="generation cache jsonl (default <output>.generations.jsonl)"
    )
    p.add_argument(
        "--prompt-template",
        default=d.prompt_template,
        help="prompt text with {problem}; default: problem + 'Please reason step by step, and put "
        "your final answer within \\boxed{}.'",
    )
    p.add_argument(
        "--chat-template",
        choices=CHAT_MODES,
        default=d.chat_template,
        help="wrap math prompts in the tokenizer's chat template (auto: when it has one)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=d.backend,
        help="auto: vLLM on a GPU when installed, else transformers",
    )
    p.add_argument("--device", default=d.device, help="transformers device: auto, cpu, cuda, cuda:1 ...")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=d.dtype,
        help="model dtype (default bfloat16 on GPU, float32 on CPU)",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=d.limit,
        help="first N >= 1 problems per benchmark (synthetic: N problems)",
    )
    p.add_argument(
        "--problem-key", default=d.problem_key, help="field holding the problem (with --answer-key)"
    )
    p.add_argument("--answer-key", default=d.answer_key, help="field holding the answer (with --problem-key)")
    p.add_argument(
        "--task",
        dest="synthetic_kw",
        type=_task_field,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="synthetic task field, repeatable (e.g. --task kind=chain --task "
        "n_terms=3; default: the running task, 128 terms)",
    )
    p.add_argument("--no-progress", dest="show_progress", action="store_false", help="hide progress bars")
    return p


def main(argv: list[str]) -> int:
    """``kpo eval``; on several processes (``kpo launch``) rank 0 alone prints, the others exit with
    the same status."""
    args = vars(build_parser().parse_args(argv))
    from kpo._distributed import is_main
    from kpo.evaluation.config import EvalConfig
    from kpo.evaluation.runner import evaluate, format_table

    model, data = args.pop("model"), args.pop("data")
    args["synthetic_kw"] = dict(args["synthetic_kw"]) or None
    config = EvalConfig(**args)  # every other option is a field of the same name
    main_process = is_main()
    if config.output is None and config.cache is None and main_process:
        print(
            "kpo eval: warning: no --output: results are printed only and an interrupted run cannot "
            "resume; pass --output PATH.json",
            file=sys.stderr,
        )
    try:
        results = evaluate(model, data, config)
    except (ValueError, FileNotFoundError) as e:
        if main_process:
            print(f"kpo eval: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if main_process:
            raise  # kpo's one line on an interrupt
        from kpo._exit import INTERRUPTED

        return INTERRUPTED
    if not main_process:
        return 0
    print(format_table(results))
    if config.output:
        print(f"\nwrote {config.output} and {Path(config.output).with_suffix('.md')}")
    return 0
