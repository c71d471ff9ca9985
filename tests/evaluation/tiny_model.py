"""A random tiny Qwen2 causal LM with a character-level tokenizer, saved to a directory for the eval tests."""

from __future__ import annotations

import string
from pathlib import Path

# One token per printable ASCII character, so math prompts tokenize without <unk>.
CHARS = string.printable


def save_tiny_model(path: Path, *, chat_template: str | None = None, seed: int = 0) -> Path:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<unk>", *CHARS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    config = Qwen2Config(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=None,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0, bos_token_id=None)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
