"""The decode loop: prompt pass, then one sampled token per step until every row has ended or the budget is
spent, with ``generate``'s end-of-sequence and padding rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from kpo.generation.qwen3 import Qwen3Decoder

__all__ = ["generate"]


def generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int],
    pad_token_id: int,
    sample: Callable[[torch.Tensor], torch.Tensor],
    fp8: bool = False,
) -> torch.Tensor:
    """New tokens [B, n] (int64, n <= max_new_tokens) after left-padded prompts ``input_ids`` [B, Tp] with
    ``attention_mask`` [B, Tp], as ``model.generate`` returns them after the prompt: ``sample(logits [B, V])``
    picks each step's tokens for every row; a row that has sampled an end token gets ``pad_token_id`` from then
    on (its draws still happen, as in ``generate``, so the random stream is ``generate``'s); the loop stops when
    every row has ended or after ``max_new_tokens``.

    ``model`` must be one :func:`kpo.generation.qwen3.unsupported` accepts (a ``Qwen3ForCausalLM``); ValueError
    otherwise. ``fp8``: run it as an FP8 engine (:class:`~kpo.generation.qwen3.Qwen3Decoder`).
    """
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=input_ids.device)
    if eos.numel() == 0:
        raise ValueError("generate: eos_token_ids is empty; name the token(s) that end a response")
    decoder = Qwen3Decoder(model, fp8=fp8)
    logits = decoder.prefill(input_ids, attention_mask, max_new_tokens)
    batch = input_ids.shape[0]
    out = torch.empty(batch, max_new_tokens, dtype=torch.long, device=input_ids.device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
    pad = torch.tensor(pad_token_id, dtype=torch.long, device=input_ids.device)
    for t in range(max_new_tokens):
        tokens = torch.where(unfinished, sample(logits), pad)
        out[:, t] = tokens
        unfinished &= ~torch.isin(tokens, eos)
        if t + 1 == max_new_tokens or not bool(unfinished.any()):
            break
        logits = decoder.step(tokens)
    return out[:, : t + 1]
