"""Exact expected accuracy on a task with one right response: the probability that sampling gives it.

When a problem has exactly one correct token sequence (the embedded running-sum task: every digit of the
reference, then the end token), the chance that a sample at temperature ``T`` is correct is the product of the
model's probabilities of the reference tokens, each given the reference prefix (teacher forcing)::

    P(correct) = prod_{k=0..L} softmax(logits_k / T)[ref_k]       (ref_L = the end token)

So one forward pass gives, with no sampling noise, what avg@n estimates from n samples: ``E[avg@n] =
P(correct)`` and ``E[pass@k] = 1 - (1 - P(correct))^k`` for independent samples. The per-position factors say
where a model fails (``position_accuracy``). Sampling with top-p < 1 or top-k below the vocabulary changes the
distribution, so this is the expectation for top-p = 1 only; a completion that decodes to the reference through
other tokens (special tokens skipped in decoding) is not counted, so the value is a lower bound by that much.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["reference_probabilities", "expected_accuracy", "expected_on_rows"]


@torch.no_grad()
def reference_probabilities(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    *,
    temperature: float = 1.0,
    batch_size: int = 64,
) -> torch.Tensor:
    """Float64 ``[N, L + 1]``: the probability of each reference token and then of the end token, given the
    prompt and the reference before it. Every reference must have the same token length ``L`` (the embedded
    task's do); a ValueError names the first that does not."""
    if len(prompts) != len(references) or not prompts:
        raise ValueError(
            f"give one reference per prompt, at least one: {len(prompts)} prompts, {len(references)} references"
        )
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: must be > 0")
    eos = tokenizer.eos_token_id
    rows = [
        (tokenizer(p)["input_ids"], tokenizer(r)["input_ids"] + [eos]) for p, r in zip(prompts, references)
    ]
    length = len(rows[0][1])
    for i, (_, target) in enumerate(rows):
        if len(target) != length:
            raise ValueError(
                f"reference {i} ({references[i][:40]!r}) is {len(target) - 1} tokens, reference 0 is {length - 1}: "
                "pass references of one length"
            )
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(p) for p, _ in chunk) + length
        # right padding keeps every row's positions 0.. as in generation from an unpadded prompt
        ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for j, (p, t) in enumerate(chunk):
            ids[j, : len(p) + length] = torch.tensor(p + t)
            attention[j, : len(p) + length] = 1
        logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits.double()
        logp = torch.log_softmax(logits / temperature, dim=-1)
        # the logits at position i predict token i + 1: a row's targets sit after its prompt
        at = torch.tensor([[len(p) - 1 + k for k in range(length)] for p, _ in chunk], device=device)
        target = torch.tensor([t for _, t in chunk], device=device)
        picked = logp.gather(1, at[:, :, None].expand(-1, -1, logp.shape[-1]))
        out.append(picked.gather(2, target[:, :, None])[:, :, 0].exp().cpu())
    return torch.cat(out)


def expected_accuracy(probs: torch.Tensor) -> dict:
    """From :func:`reference_probabilities`' ``[N, L + 1]``: ``per_problem`` (P(correct) of each problem, a list),
    ``mean`` (the expected avg@n), ``position_accuracy`` (mean probability of the right token at each position,
    the end token last; a list) and its ``min_position_accuracy``."""
    per_problem = probs.prod(dim=1)
    position = probs.mean(dim=0)
    return {
        "per_problem": per_problem.tolist(),
        "mean": float(per_problem.mean()),
        "position_accuracy": position.tolist(),
        "min_position_accuracy": float(position.min()),
    }


def expected_on_rows(model, tokenizer, rows: Sequence[dict], **kwargs) -> dict:
    """:func:`expected_accuracy` of ``model`` on task rows (``prompt`` and ``solution`` fields, as
    :func:`kpo.testbed.task.load_split` gives them); ``kwargs`` go to :func:`reference_probabilities`."""
    probs = reference_probabilities(
        model, tokenizer, [r["prompt"] for r in rows], [r["solution"] for r in rows], **kwargs
    )
    return expected_accuracy(probs)
