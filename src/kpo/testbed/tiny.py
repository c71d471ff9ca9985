"""The embedded tiny model: a character-level tokenizer and a small Qwen3-architecture causal LM built from a
config (nothing downloaded), its context sized by the task (:func:`context_length`).

Its supervised warm start on the synthetic task is a training run and lives in the training layer
(:mod:`kpo.train.warm_start`); this module holds what the domain needs to build the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from kpo.testbed.task import ALPHABET, TaskConfig

__all__ = [
    "COMPLETION_SLACK",
    "TinyModelConfig",
    "TINY_LAYERS",
    "build_tokenizer",
    "build_model",
    "context_length",
]

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the embedded Qwen3-architecture model (defaults: about 0.8M parameters).

    Attributes:
        hidden_size: model width.
        num_layers: decoder layers.
        num_heads: attention heads (``hidden_size`` must divide by it); key/value heads are the same.
        intermediate_size: MLP width.
        max_position_embeddings: longest prompt + response in tokens (:func:`context_length` of the task).
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 128


# Each task kind's decoder layers: two suffice for the running sum (one reads the term a fixed distance back,
# one the previous digit) and learn it in fewer steps than four; the chain task keeps its original four.
TINY_LAYERS = {"running": 2, "chain": 4}


# Tokens an embedded-task response may run past its longest reference before it is cut (the model's context
# covers them).
COMPLETION_SLACK = 4


def context_length(task: TaskConfig, completion_slack: int = COMPLETION_SLACK) -> int:
    """Positions the embedded model needs for ``task``: its longest prompt, its longest response plus
    ``completion_slack`` tokens (RL samples up to that many past the longest reference), and an end token,
    rounded up to a multiple of 16."""
    return -(-(task.max_sequence_tokens() + completion_slack) // 16) * 16


def build_tokenizer(alphabet: str = ALPHABET):
    """One token per character of ``alphabet`` (default: the synthetic task's) plus ``<pad>``, ``<eos>``,
    ``<unk>``; the evaluation tests pass ``string.printable`` to read math prompts.

    Returns a ``PreTrainedTokenizerFast`` (``save_pretrained``/``AutoTokenizer.from_pretrained`` round-trip).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *dict.fromkeys(alphabet)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Fuse joins the characters back without the spaces WordLevel would insert.
    core.decoder = decoders.Fuse()
    # Left padding: decoder-only generation continues every prompt from its last real token.
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def build_model(tokenizer, shape: TinyModelConfig | None = None, seed: int = 0):
    """A freshly initialised Qwen3 causal LM sized by ``shape`` (default TinyModelConfig()), vocabulary from
    ``tokenizer``."""
    shape = shape or TinyModelConfig()
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    if shape.hidden_size % shape.num_heads:
        raise ValueError(f"hidden_size={shape.hidden_size} must be divisible by num_heads={shape.num_heads}")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        head_dim=shape.hidden_size // shape.num_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model
