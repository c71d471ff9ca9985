"""Generation against the model's own forward pass over the same tokens, on the demo's warm start.

    .venv/bin/python benchmarks/bench_generation.py [--batch 128] [--prompt-len 129] [--new-tokens 129]
        [--group 8] [--threads 1] [--repeats 5] [--model DIR]

One process, one model, the same prompts (the embedded task's train prompts, each cut to its last --prompt-len
tokens; --group responses per prompt, as `kpo train` samples its groups: 8; 1 = every row its own prompt). It
times, interleaved and in rotating order so that machine load hits all alike, the minimum over --repeats of:
- forward: one teacher-forced forward over prompt + response tokens [batch, prompt_len + new tokens] (the
  responses kpo's path sampled), the arithmetic generation repeats token by token;
- generate: `model.generate` as `kpo train` calls it today (TRL's GenerationConfig: sampling at temperature 1,
  dynamic cache);
- generate static: the same with `cache_implementation="static"` (what transformers offers without a compile);
- kpo: `kpo.generation.generate` with `MultinomialSampler` (sampling included), what `kpo train`'s rollouts and
  `kpo eval` run.
kpo's path compiles nothing; its first (cold) call is reported beside its minimum. The last line is
`generation / forward: X.XX` for kpo's path.
"""

from __future__ import annotations

import argparse
import time

import torch


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128, help="sequences per generation call")
    p.add_argument("--prompt-len", type=int, default=129, help="prompt tokens per sequence")
    p.add_argument("--new-tokens", type=int, default=129, help="max_new_tokens")
    p.add_argument(
        "--group", type=int, default=8, help="responses per prompt (kpo train: 8); divides --batch"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (kpo train's default: 1)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", default=None, help="model directory (default: the demo's warm start)")
    args = p.parse_args(argv)
    if args.batch % args.group:
        p.error(f"--group {args.group} must divide --batch {args.batch}")
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from kpo.generation import MultinomialSampler, generate
    from kpo.testbed.task import load_split
    from kpo.train.config import TrainConfig
    from kpo.train.run import model_path

    config = TrainConfig(progress=False)
    path = args.model or model_path(config)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = load_split("train", n=args.batch // args.group, task=config.task_config())
    ids = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"][-args.prompt_len :] for r in rows]
    if min(map(len, ids)) < args.prompt_len:
        p.error(f"the task's prompts are shorter than --prompt-len {args.prompt_len}")
    input_ids = torch.tensor([x for x in ids for _ in range(args.group)])
    mask = torch.ones_like(input_ids)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    # what TRL's GRPOTrainer passes to generate (its generation_kwargs at kpo train's defaults)
    trl_config = dict(
        max_new_tokens=args.new_tokens,
        do_sample=True,
        pad_token_id=pad,
        bos_token_id=None,
        eos_token_id=[eos],
        temperature=config.temperature,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        disable_compile=True,
    )
    sampler = MultinomialSampler(temperature=config.temperature, top_k=0, top_p=1.0)

    def kpo():
        return generate(
            model,
            input_ids,
            mask,
            max_new_tokens=args.new_tokens,
            eos_token_ids=[eos],
            pad_token_id=pad,
            sample=sampler,
        )

    def hf(**extra):
        gc = GenerationConfig(**trl_config, **extra)
        return model.generate(input_ids=input_ids, attention_mask=mask, generation_config=gc)

    with torch.inference_mode():
        torch.manual_seed(0)
        start = time.perf_counter()
        completion = kpo()
        cold = time.perf_counter() - start
        full = torch.cat([input_ids, completion], dim=1)
        full_mask = torch.ones_like(full)
        runs = {
            "forward": lambda: model(input_ids=full, attention_mask=full_mask),
            "generate": hf,
            "generate static": lambda: hf(cache_implementation="static"),
            "kpo": kpo,
        }
        times = {name: [] for name in runs}
        names = list(runs)
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                torch.manual_seed(r)
                times[name].append(_timed(runs[name]))
    best = {name: min(ts) for name, ts in times.items()}
    n_new = completion.shape[1]
    ended = int((completion == eos).any(1).sum())
    print(
        f"model {path}: {sum(x.numel() for x in model.parameters()) / 1e6:.2f}M parameters; batch {args.batch} "
        f"({args.batch // args.group} prompts x {args.group}), prompts {args.prompt_len} tokens, up to "
        f"{args.new_tokens} new ({n_new} generated, {ended}/{args.batch} ended by eos); {args.threads} thread(s); "
        f"min of {args.repeats} interleaved repeats"
    )
    for name in names:
        ms = 1000 * best[name]
        print(f"{name:>16}: {ms:8.1f} ms  ({best[name] / best['forward']:.2f}x forward)")
    steps = max(n_new - 1, 1)
    print(
        f"kpo: cold first call {1000 * cold:.1f} ms (compiles nothing); ~{1000 * best['kpo'] / steps:.2f} ms a step"
    )
    print(f"generation / forward: {best['kpo'] / best['forward']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
