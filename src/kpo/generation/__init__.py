"""Fast autoregressive sampling for ``kpo train``'s rollouts and ``kpo eval``.

:func:`generate` runs a prompt pass and a decode loop specialised to the Qwen3 architecture (the embedded tiny
model's, on CPU; :mod:`kpo.generation.qwen3`): fused projections, a preallocated key/value cache, prompts
shared by a GRPO group run once. It keeps ``model.generate``'s semantics: the caller's sampler
(:class:`MultinomialSampler` is ``generate``'s own sampling step, random stream included) draws every row's
token at every step, ended rows are padded, and the loop stops when all rows have ended. A model it does not cover (:func:`unsupported_model`
says why) or a generation setting it does not reproduce (:func:`sampling_settings`) is left to transformers'
``generate``.
"""

from kpo.generation.loop import generate
from kpo.generation.qwen3 import unsupported as unsupported_model
from kpo.generation.sampling import MultinomialSampler, sampling_settings

__all__ = ["MultinomialSampler", "generate", "sampling_settings", "unsupported_model"]
