"""A complete GRPO-style loop around kpo's loss library, without TRL: generate, score, advantages, old
log-probs, then a few minibatch steps of which all but the first are off-policy, with any registered loss.

    python examples/custom_loop.py --loss kpo --steps 8                      # under a minute once the warm start is cached
    python examples/custom_loop.py --loss gspo --steps 200                   # long enough to see the reward rise
    python examples/custom_loop.py --loss kpo --loss-kwargs memory=31.25     # KPO at the length-matched memory

It runs the embedded tiny model on the 128-token running-sum task (the warm start is built and cached on first
use, 2-4 minutes on 2 cores), or any causal LM checkpoint with --model. `kpo train` runs the same protocol on
TRL's GRPOTrainer, with checkpoints, resume, metrics files and vLLM.
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import kpo
from kpo.testbed.task import load_split
from kpo.train import TrainConfig
from kpo.train.run import model_path

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--loss", default="kpo", choices=kpo.list_losses(), help="any registered policy loss")
parser.add_argument(
    "--loss-kwargs", nargs="*", default=[], metavar="KEY=VALUE", help="the loss's hyperparameters"
)
parser.add_argument("--steps", type=int, default=8, help="optimizer steps (a multiple of --minibatches)")
parser.add_argument("--prompts", type=int, default=16, help="prompts per generation batch")
parser.add_argument("--group", type=int, default=8, help="responses per prompt")
parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps per generation batch")
parser.add_argument("--lr", type=float, default=1e-4)
parser.add_argument("--model", default=None, help="a checkpoint directory (default: the embedded warm start)")
parser.add_argument("--task", default="running", choices=("running", "chain"))
parser.add_argument("--n-terms", type=int, default=None)
parser.add_argument("--max-value", type=int, default=None)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
if args.steps % args.minibatches or (args.prompts * args.group) % args.minibatches:
    parser.error("--steps and --prompts x --group must be multiples of --minibatches")
# "memory=31.25" -> {"memory": 31.25}; a value that is not a number stays a string ("mask_mode=zero")
loss_kwargs = {}
for item in args.loss_kwargs:
    key, sep, value = item.partition("=")
    if not sep:
        parser.error(f"--loss-kwargs {item!r}: expected KEY=VALUE")
    try:
        loss_kwargs[key] = float(value)
    except ValueError:
        loss_kwargs[key] = value

torch.manual_seed(args.seed)
torch.set_num_threads(args.threads)
# kpo train's defaults for the task: the same warm start (one cache) and the same task.
config = TrainConfig(task=args.task, n_terms=args.n_terms, max_value=args.max_value, seed=args.seed)
task = config.task_config()
path = args.model or model_path(config)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
rows = load_split("train", task=task, seed=args.seed)
max_new_tokens = task.max_response_chars() + 1  # the response and its end token


def token_log_probs(input_ids, attention_mask, n_prompt):
    """log p(token | prefix) of every response token: [B, T] from ids [B, n_prompt + T]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, n_prompt - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, n_prompt:, None]).squeeze(-1)


step, t0 = 0, time.time()
while step < args.steps:
    # 1. Generate a group of responses per prompt (left-padded prompts, sampling at temperature 1).
    batch = [rows[(step // args.minibatches * args.prompts + i) % len(rows)] for i in range(args.prompts)]
    group_rows = [row for row in batch for _ in range(args.group)]
    prompts = [row["prompt"] for row in group_rows]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    model.eval()
    with torch.no_grad():
        ids = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    n_prompt = enc["input_ids"].shape[1]
    completion = ids[:, n_prompt:]
    # A response runs up to and including its first end token; what follows is padding.
    is_eos = completion == tokenizer.eos_token_id
    mask = (torch.cumsum(is_eos, dim=1) - is_eos.long()) == 0
    attention_mask = torch.cat([enc["attention_mask"], mask.long()], dim=1)

    # 2. Score each response, and GRPO advantages within each prompt's group.
    texts = tokenizer.batch_decode(completion * mask, skip_special_tokens=True)
    rewards = torch.tensor([task.grade(text, row["answer"]) for text, row in zip(texts, group_rows)])
    group_ids = torch.arange(len(prompts)) // args.group
    advantages = kpo.compute_advantages("grpo", rewards, group_ids).float()

    # 3. The old log-probs, once: the policy that generated the batch.
    with torch.no_grad():
        old_log_prob = token_log_probs(ids, attention_mask, n_prompt)

    # 4. Minibatch steps over a shuffled batch: the first is on-policy (ratio 1), the others off-policy.
    model.train()
    order = torch.randperm(len(prompts)).chunk(args.minibatches)
    for idx in order:
        log_prob = token_log_probs(ids[idx], attention_mask[idx], n_prompt)
        old, adv, m = old_log_prob[idx], advantages[idx], mask[idx]
        loss, metrics = kpo.policy_loss(
            args.loss, log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=m, **loss_kwargs
        )
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        print(
            f"step {step:4d}/{args.steps}  reward {rewards.mean():.3f}  loss {loss.item():+.4f}  "
            f"clip {metrics['pg_clipfrac']:.4f}  ratio max {metrics.get('ratio_max', 1.0):.4f}  "
            f"grad {grad_norm:.3f}  {time.time() - t0:5.1f}s",
            flush=True,
        )

print(f"done: {args.loss}, {step} steps, last batch's reward {rewards.mean():.3f}, {time.time() - t0:.1f}s")
