"""A random 2-layer Qwen3 language model for the tests of kpo's decoder (tests/generation) and of the rollout
sampler (tests/train/test_sampler_units.py)."""

from __future__ import annotations

import torch

PAD, EOS = 0, 1


def random_qwen3(dtype=torch.float32, kv_heads: int = 2, seed: int = 0, sharpen: float = 20.0):
    """A random 2-layer Qwen3 LM over 16 tokens (0 pad, 1 eos), 4 query heads of 8 over ``kv_heads`` key/value
    heads (2: grouped-query attention), its embeddings ``sharpen`` times the init's (logits of size ~10, not the
    init's near-uniform ~0.1)."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    config = Qwen3Config(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(sharpen)
    model.generation_config = GenerationConfig(eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None)
    return model
