"""A random tiny causal LM with a character-level tokenizer, saved to a directory for the eval tests: the
embedded model of ``kpo.testbed.tiny``, narrower, over every printable ASCII character (math prompts tokenize
without <unk>)."""

from __future__ import annotations

import string
from pathlib import Path

from kpo.testbed.tiny import TinyModelConfig, build_model, build_tokenizer

SHAPE = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=512
)


def save_tiny_model(
    path: Path, *, chat_template: str | None = None, seed: int = 0, context: int = 512
) -> Path:
    """Save the model (``context`` positions) and its tokenizer to ``path``; returns ``path``."""
    from dataclasses import replace

    tok = build_tokenizer(string.printable)
    if chat_template is not None:
        tok.chat_template = chat_template
    build_model(tok, replace(SHAPE, max_position_embeddings=context), seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path
