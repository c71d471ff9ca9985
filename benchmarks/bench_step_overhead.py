"""What one `kpo train` optimizer step costs on the embedded task, and what KPO adds to it over vanilla.

    .venv/bin/python benchmarks/bench_step_overhead.py [--task running|chain] [--repeats 20] [--threads 1]

On the task's cached warm start (built on first use) it samples one generation batch as `kpo train` does
(16 prompts x 8, temperature 1), then times, interleaved and in alternating order so machine load hits both
alike:
- a training step: forward of a 32-sequence mini-batch, per-token log-probs, `kpo.policy_loss`, backward and
  an AdamW step, with `vanilla`, with `kpo` (memory=matched, the filter acting) and with `kpo` at memory=auto
  as `kpo train` runs it (the loss at the step's q; the step's log-ratios handed to the fit, which at the
  step's end fits the next step's q: ``kpo.filter.fit.StepFit``, one micro-batch a step here);
- the loss call alone, KPO's filter call alone and memory=auto's fit of one step alone (their shares);
- generation as `kpo train`'s rollouts run it (kpo.generation; tokens/s), and the old-log-prob forward
  `kpo train` runs once per generation batch.
It prints min and median of each, the KPO/vanilla ratios of the training step and of the whole optimizer step
(training step + a quarter of the generation and old-log-prob time: `--minibatches 4`), and RL tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _log_probs(model, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[B, T_completion] log-probs of the completion tokens (TRL's: logits of the position before each)."""
    logits = model(input_ids=ids).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="running", choices=("running", "chain"))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads (kpo train's default: 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kpo import kalman_filter, policy_loss
    from kpo.advantages import compute_advantages
    from kpo.filter.fit import StepFit
    from kpo.generation import MultinomialSampler, generate
    from kpo.losses.kpo import add_to_fit, filter_settings, fixed_q_kwargs, step_fit
    from kpo.testbed.task import load_split
    from kpo.train.config import TrainConfig
    from kpo.train.run import model_path

    config = TrainConfig(task=args.task, progress=False, loss_kwargs={"memory": "matched"})
    path = model_path(config)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    task = config.task_config()
    rows = load_split("train", n=config.prompts_per_step, task=task)
    prompts = [r["prompt"] for r in rows for _ in range(config.num_generations)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    prompt_len = enc["input_ids"].shape[1]

    gen_times, old_times = [], []
    for _ in range(3):
        torch.manual_seed(0)
        with torch.no_grad():
            start = time.perf_counter()
            # kpo train's rollout: kpo's decoder with generate's sampling step (kpo.train.rollout)
            new = generate(
                model,
                enc["input_ids"],
                enc["attention_mask"],
                max_new_tokens=config.max_completion(),
                eos_token_ids=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id,
                sample=MultinomialSampler(temperature=config.temperature, top_k=0, top_p=1.0),
            )
            out = torch.cat([enc["input_ids"], new], dim=1)
            gen_times.append(time.perf_counter() - start)
            old_times.append(_timed(lambda ids=out: _log_probs(model, ids, prompt_len)))
    completion = out[:, prompt_len:]
    eos = completion == tokenizer.eos_token_id
    mask = torch.cumsum(eos, 1) - eos.long() == 0  # up to and including the first end token, as TRL's
    completion_tokens = int(mask.sum())
    answers = [r["answer"] for r in rows for _ in range(config.num_generations)]
    texts = tokenizer.batch_decode(completion, skip_special_tokens=True)
    rewards = torch.tensor([task.grade(t, a) for t, a in zip(texts, answers)])
    adv_all = compute_advantages("grpo", rewards, torch.arange(len(prompts)) // config.num_generations)

    mb = config.mini_batch
    ids, m, adv = out[:mb], mask[:mb], adv_all[:mb]
    with torch.no_grad():
        old = _log_probs(model, ids, prompt_len)
    kpo_kwargs = config.resolved_loss_kwargs()
    losses = {"vanilla": ("vanilla", {}), "kpo": ("kpo", kpo_kwargs), "kpo auto": ("kpo", {"memory": "auto"})}
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    common = dict(loss_agg_mode="seq-mean-token-mean", loss_scale_factor=config.max_completion())

    fit = step_fit("kpo", losses["kpo auto"][1], 1e-6, steps_per_batch=None)

    def train_step(name: str) -> None:
        opt.zero_grad(set_to_none=True)
        lp = _log_probs(model, ids, prompt_len)
        kwargs = losses[name][1] if name != "kpo auto" else fixed_q_kwargs(losses[name][1], fit.q)
        loss, _ = policy_loss(
            losses[name][0],
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=m,
            **common,
            **kwargs,
        )
        loss.backward()
        if name == "kpo auto":  # kpo train's: the step's log-ratios to the fit, which at the step's end fits
            add_to_fit(fit, lp, old, m)
            fit.finish()
        opt.step()

    def fit_one_step() -> None:
        one = StepFit(fallback_q=1e-6)
        one.add(z, m)
        one.finish()

    # log-probabilities (<= 0, as policy_loss requires) about 0.01 from the old ones
    lp_fixed = (old + 0.01 * torch.randn_like(old)).clamp(max=0.0).requires_grad_()
    filt = filter_settings("kpo", kpo_kwargs)
    z = (lp_fixed - old).detach()
    step = {n: [] for n in losses}
    call = {n: [] for n in losses}
    filter_times, fit_times = [], []
    for name in losses:  # warm-up: numba compiles, allocator settles
        train_step(name)
    for r in range(args.repeats):
        for name in list(losses) if r % 2 == 0 else list(losses)[::-1]:
            step[name].append(_timed(lambda n=name: train_step(n)))
            call[name].append(
                _timed(
                    lambda n=name: policy_loss(
                        losses[n][0],
                        log_prob=lp_fixed,
                        old_log_prob=old,
                        advantages=adv,
                        response_mask=m,
                        **common,
                        **(losses[n][1] if n != "kpo auto" else fixed_q_kwargs(losses[n][1], fit.q)),
                    )
                )
            )
        filter_times.append(_timed(lambda: kalman_filter(z, m, **filt)))
        fit_times.append(_timed(fit_one_step))

    def stat(xs):
        return min(xs), statistics.median(xs)

    print(
        f"task {args.task}: {len(prompts)} responses per generation batch, mini-batch {mb} x "
        f"{ids.shape[1]} tokens ({prompt_len} prompt + {completion.shape[1]} completion), "
        f"{completion_tokens / len(prompts):.1f} completion tokens per response, {args.threads} thread(s); "
        f"KPO with {kpo_kwargs} (q = {filt['q']:.3g})"
    )
    gen_min, gen_med = stat(gen_times)
    old_min, old_med = stat(old_times)
    print(
        f"generation: {gen_med:.2f} s per batch (min {gen_min:.2f}): {completion_tokens / gen_med:.0f} completion "
        f"tokens/s; old log-probs: {old_med:.2f} s per batch"
    )
    rows_out = []
    for name in losses:
        s_min, s_med = stat(step[name])
        c_min, c_med = stat(call[name])
        total = s_med + (gen_med + old_med) / config.minibatches
        train_tok = int(m.sum()) / s_med
        rows_out.append((name, s_min, s_med, c_min, c_med, total, train_tok))
        print(
            f"{name:9s} training step min {1e3 * s_min:7.1f} ms median {1e3 * s_med:7.1f} ms | loss call median "
            f"{1e3 * c_med:6.2f} ms | optimizer step with generation {total:.3f} s | training "
            f"{train_tok:.0f} completion tokens/s"
        )
    (_, _, v_step, _, v_call, v_total, _), (_, _, k_step, _, k_call, k_total, _), auto = rows_out
    f_min, f_med = stat(filter_times)
    print(
        f"kpo / vanilla: training step {k_step / v_step:.3f}, optimizer step with generation {k_total / v_total:.3f}; "
        f"loss call {k_call / v_call:.2f}x; the filter takes {1e3 * f_med:.2f} ms, {100 * f_med / k_call:.0f}% of "
        f"KPO's loss call and {100 * f_med / k_total:.3f}% of an optimizer step"
    )
    fit_med = stat(fit_times)[1]
    print(
        f"kpo auto / kpo: training step {auto[2] / k_step:.3f}, optimizer step with generation {auto[5] / k_total:.3f};"
        f" the fit of one step's q takes {1e3 * fit_med:.1f} ms, {100 * fit_med / auto[5]:.1f}% of an optimizer "
        f"step with generation, {100 * fit_med / auto[2]:.1f}% of a training step"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
