"""``kpo train``'s rollouts on :func:`kpo.generation.generate` in place of TRL's ``model.generate`` call.

:class:`~kpo.train.trainer.KPOTrainer` overrides TRL's ``_generate_single_turn`` (the narrowest method that
calls ``generate``) with :func:`generate_single_turn`: where :func:`fast_rollout_unsupported` finds nothing
against it (no vLLM, no continuous batching, a text-only Qwen3 model outside DeepSpeed/FSDP, a generation config
the sampler reproduces) the prompts are padded as TRL pads them and sampled by kpo's decoder with
``MultinomialSampler``: ``generate``'s sampling step on torch's default generator, so the tokens drawn are a
sample of the same distribution, from the same random stream that checkpoints save and a resume restores.
Otherwise TRL's own path runs.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["fast_rollout_unsupported", "generate_single_turn"]


def _sampling(trainer) -> dict | str:
    """The sampler settings of ``trainer``'s generation, or why they cannot be reproduced. ``generate`` reads the
    model's generation config with TRL's ``generation_kwargs`` put over it (TRL does so around each call)."""
    from kpo.generation import sampling_settings

    model = trainer.accelerator.unwrap_model(trainer.model)
    effective = copy.deepcopy(model.generation_config)
    effective.update(**trainer.generation_kwargs)
    return sampling_settings(effective)


def fast_rollout_unsupported(trainer, images, multimodal_fields) -> str | None:
    """Why ``trainer``'s generation must stay TRL's (None: kpo's path applies)."""
    from kpo.generation import unsupported_model

    if trainer.use_vllm:
        return "vLLM generation"
    if trainer.use_transformers_continuous_batching:
        return "continuous batching"
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        return "DeepSpeed/FSDP (sharded parameters)"
    if images is not None or multimodal_fields:
        return "multimodal inputs"
    reason = unsupported_model(trainer.accelerator.unwrap_model(trainer.model))
    if reason is not None:
        return reason
    settings = _sampling(trainer)
    return settings if isinstance(settings, str) else None


def generate_single_turn(
    trainer, prompt_ids: list[list[int]], model
) -> tuple[list[list[int]], list[list[float]]]:
    """TRL's ``_generate_single_turn`` result from kpo's decoder sampling ``model`` (the policy, or the rollout
    sampler's copy of it: :mod:`kpo.train.sampler`): completion token lists, each up to and including its first
    end token, and the sampler's log-probability of each of those tokens (TRL's sampling log-probs, as vLLM
    returns them). Call only where :func:`fast_rollout_unsupported` is None."""
    from trl.extras.profiling import profiling_context
    from trl.trainer.utils import pad

    from kpo.generation import MultinomialSampler, generate

    device = trainer.accelerator.device
    prompts = [torch.tensor(ids) for ids in prompt_ids]
    # as TRL pads them for generate (left, to its multiple)
    input_ids = pad(
        prompts,
        padding_value=trainer._tokenizer.pad_token_id,
        padding_side="left",
        pad_to_multiple_of=trainer.pad_to_multiple_of,
    ).to(device)
    mask = pad(
        [torch.ones_like(t) for t in prompts],
        padding_value=0,
        padding_side="left",
        pad_to_multiple_of=trainer.pad_to_multiple_of,
    ).to(device)
    sampler = MultinomialSampler(**_sampling(trainer), record_log_probs=True)
    with profiling_context(trainer, "kpo.generate"), torch.no_grad():
        completion = generate(
            model,
            input_ids,
            mask,
            max_new_tokens=trainer.max_completion_length,
            eos_token_ids=trainer.eos_token_ids,
            pad_token_id=trainer._tokenizer.pad_token_id,
            sample=sampler,
            fp8=trainer.sampler.fp8,
        )
    log_probs = torch.stack(sampler.log_probs, dim=1).float().cpu()  # [B, n]
    eos = torch.isin(completion, torch.tensor(trainer.eos_token_ids, device=completion.device))
    # up to and including the first end token, as TRL cuts generate's output
    keep = ((eos.cumsum(1) - eos.long()) == 0).cpu()
    completion = completion.cpu()
    return (
        [c[m].tolist() for c, m in zip(completion, keep, strict=True)],
        [lp[m].tolist() for lp, m in zip(log_probs, keep, strict=True)],
    )
