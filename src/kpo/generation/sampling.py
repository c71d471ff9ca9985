"""Samplers for :func:`kpo.generation.generate`: next-token logits [B, V] (float32) in, tokens [B] out.

:class:`MultinomialSampler` is transformers' ``generate(do_sample=True)`` step itself: the same logits warpers
(transformers' own classes, in the order ``generate`` builds them), softmax and ``torch.multinomial`` on the same
generator, so on equal logits it draws the very tokens ``generate`` draws, random stream included (what TRL's
rollouts sample, and what a resumed run must repeat). :func:`sampling_settings` reads a ``GenerationConfig`` and
refuses any field it does not reproduce, so a config the fast path cannot honour goes to ``generate`` instead.
"""

from __future__ import annotations

import torch

__all__ = ["MultinomialSampler", "sampling_settings"]

# GenerationConfig fields (as GenerationConfig.to_diff_dict() names them) that sampling_settings reproduces or that
# do not change what is sampled; any other non-default field sends generation to transformers' generate.
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p")
_INERT_FIELDS = frozenset(
    {
        "max_new_tokens",
        "max_length",  # max_new_tokens, which every caller passes, takes precedence
        "do_sample",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "use_cache",
        "cache_implementation",
        "disable_compile",
        "compile_config",
        "transformers_version",
    }
)


def sampling_settings(generation_config) -> dict | str:
    """``{"temperature", "top_k", "top_p", "min_p"}`` of a sampling ``GenerationConfig`` (the effective one: the
    model's generation config with the caller's fields on top), or a string saying which field
    :class:`MultinomialSampler` cannot reproduce (greedy decoding, a repetition penalty, banned words, ...)."""
    fields = generation_config.to_diff_dict()
    if not fields.get("do_sample", False):
        return "do_sample is not True"
    penalty = fields.get("repetition_penalty")
    if penalty is not None and penalty != 1.0:
        return f"repetition_penalty={penalty}"
    other = sorted(set(fields) - _INERT_FIELDS - set(_SAMPLING_FIELDS) - {"repetition_penalty"})
    if other:
        return "generation config field(s) " + ", ".join(f"{k}={fields[k]!r}" for k in other)
    return {k: getattr(generation_config, k, None) for k in _SAMPLING_FIELDS}


class MultinomialSampler:
    """``generate``'s sampling step: transformers' temperature, top-k, top-p and min-p warpers where set (as
    ``generate`` adds them: temperature != 1, top_k != 0, top_p < 1, min_p set), softmax, then one
    ``torch.multinomial`` draw per row from ``generator`` (None: torch's default generator, as ``generate``).

    ``__call__(logits [B, V] float32) -> tokens [B] int64``. With ``record_log_probs``, each call also appends
    the drawn tokens' log-probabilities under the distribution they were drawn from ([B] float32: the log-softmax
    of the warped logits, what vLLM returns as processed log-probs) to ``log_probs``, one tensor per step.
    """

    def __init__(
        self,
        temperature: float | None = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        generator: torch.Generator | None = None,
        record_log_probs: bool = False,
    ):
        from transformers import LogitsProcessorList
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.warpers = LogitsProcessorList()
        if temperature is not None and temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_k is not None and top_k != 0:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p is not None and top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))
        if min_p is not None:
            self.warpers.append(MinPLogitsWarper(min_p=min_p))
        self.generator = generator
        self.log_probs: list[torch.Tensor] | None = [] if record_log_probs else None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        # the warpers read no token history (input_ids): none is passed
        scores = self.warpers(None, logits) if self.warpers else logits
        probs = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, num_samples=1, generator=self.generator)
        if self.log_probs is not None:  # draws nothing: the random stream is generate's either way
            self.log_probs.append(torch.log_softmax(scores, dim=-1).gather(1, tokens).squeeze(1))
        return tokens.squeeze(1)
