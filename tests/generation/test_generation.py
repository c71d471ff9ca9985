"""kpo.generation against transformers: the decoder's logits against the model's own forward, its tokens against
``model.generate``'s under the same seed (float64, where rounding cannot flip a draw), the sampler against
transformers' warpers, the loop's end-of-sequence rules on a scripted sampler, and the settings it refuses."""

from __future__ import annotations

import pytest
import torch

from kpo.generation import MultinomialSampler, generate, sampling_settings, unsupported_model
from kpo.generation.qwen3 import Qwen3Decoder

from .qwen3_model import EOS, PAD
from .qwen3_model import random_qwen3 as _model

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(lengths: list[int], repeat: int = 1, width: int = 12):
    """Left-padded prompts [len(lengths) * repeat, width] of tokens 2..15, each repeated ``repeat`` times in a
    row (a GRPO group), and their mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(2, 16, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids.repeat_interleave(repeat, 0), mask.repeat_interleave(repeat, 0)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize(
    "lengths,repeat,rows",
    [
        ([12, 9, 5], 3, None),
        ([12, 12, 7, 3], 1, None),
        ([12, 9, 5], 1, [2, 0, 1, 0, 2, 1]),
        ([12, 9, 5], 1, [1, 0, 1, 2, 2, 1]),
    ],
)
def test_decoder_logits_match_the_models_forward(kv_heads, lengths, repeat, rows, monkeypatch):
    """Prompt pass and 10 decode steps against one forward of the model over prompt + tokens, with the positions
    generate gives left-padded rows (mask cumsum - 1). Groups of equal size share one prompt cache (3 x 3 rows
    in a row; 3 x 2 rows apart); distinct prompts, and repeats in groups of unequal sizes (3, 1 and 2 copies),
    have one cache each."""
    from kpo.generation import qwen3

    monkeypatch.setattr(qwen3, "CACHE_STEPS", 3)  # the response cache grows twice (3 -> 6 -> 11 tokens)
    model = _model(kv_heads=kv_heads)
    ids, mask = _prompts(lengths, repeat)
    if rows is not None:
        ids, mask = ids[rows], mask[rows]
    decoder = Qwen3Decoder(model)
    steps = [decoder.prefill(ids, mask, max_new_tokens=11)]
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(2, 16, (ids.shape[0], 10), generator=g)
    for t in range(10):
        steps.append(decoder.step(tokens[:, t]))
    full = torch.cat([ids, tokens], 1)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = model(input_ids=full, attention_mask=full_mask, position_ids=positions).logits[
            :, ids.shape[1] - 1 :
        ]
    got = torch.stack(steps, 1)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    # float32 rounding of logits of size ~10: the fused products sum in another order
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1.0, top_k=0, top_p=1.0),  # kpo train's
        dict(temperature=0.8, top_k=8, top_p=0.95),
        dict(temperature=1.3, min_p=0.05),
    ],
)
def test_tokens_equal_generates_under_the_same_seed(settings):
    """float64 weights: logits agree to ~1e-15, so no draw can flip, and the tokens, padding after the end token
    and the early stop must be generate's exactly (same warpers, same torch.multinomial stream)."""
    model = _model(torch.float64, sharpen=6.0)
    ids, mask = _prompts([12, 8, 4], repeat=4)
    torch.manual_seed(3)
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        max_new_tokens=40,
        pad_token_id=PAD,
        eos_token_id=[EOS],
        **settings,
    )[:, ids.shape[1] :]
    after_ref = torch.get_rng_state()
    torch.manual_seed(3)
    got = generate(
        model,
        ids,
        mask,
        max_new_tokens=40,
        eos_token_ids=[EOS],
        pad_token_id=PAD,
        sample=MultinomialSampler(**settings),
    )
    assert torch.equal(got, ref)
    # both leave torch's generator where the other does: what a run draws next does not depend on the path
    assert torch.equal(torch.get_rng_state(), after_ref)
    ended = (ref == EOS).any(1)
    assert ended.any() and not ended.all()  # the case covers rows padded after their end and rows cut at 40


def test_sampler_equals_transformers_warpers_and_multinomial():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(64, 16, generator=torch.Generator().manual_seed(4)) * 3
    warped = TopPLogitsWarper(0.8)(
        None, TopKLogitsWarper(6)(None, TemperatureLogitsWarper(0.5)(None, logits))
    )
    ref = torch.multinomial(warped.softmax(-1), 1, generator=torch.Generator().manual_seed(5)).squeeze(1)
    sampler = MultinomialSampler(0.5, 6, 0.8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(sampler(logits), ref)


def test_end_token_pads_the_row_and_the_loop_stops_when_all_have_ended():
    """A scripted sampler (tokens by step, whatever the logits): row 0 ends at step 1, row 1 at step 3, so row 0
    is padded at steps 2-3 and the loop stops after step 3 with 4 columns though 10 were allowed."""
    model = _model()
    ids, mask = _prompts([5, 5])
    script = iter([[5, 6], [EOS, 7], [8, 9], [10, EOS], [11, 12]])
    calls = []

    def sample(logits):
        calls.append(logits.shape)
        return torch.tensor(next(script))

    out = generate(model, ids, mask, max_new_tokens=10, eos_token_ids=[EOS], pad_token_id=PAD, sample=sample)
    assert out.tolist() == [[5, EOS, PAD, PAD], [6, 7, 9, EOS]]
    assert calls == [torch.Size([2, 16])] * 4  # every row drawn at every step, as generate draws


def test_settings_generate_cannot_reproduce_are_refused():
    from transformers import GenerationConfig

    trl_like = dict(
        max_new_tokens=8, do_sample=True, pad_token_id=PAD, eos_token_id=[EOS], top_k=0, top_p=1.0
    )
    assert sampling_settings(GenerationConfig(**trl_like, temperature=0.9, repetition_penalty=1.0)) == {
        "temperature": 0.9,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": None,
    }
    assert "repetition_penalty=1.2" in sampling_settings(GenerationConfig(**trl_like, repetition_penalty=1.2))
    assert "no_repeat_ngram_size=3" in sampling_settings(GenerationConfig(**trl_like, no_repeat_ngram_size=3))
    assert sampling_settings(GenerationConfig(max_new_tokens=8)) == "do_sample is not True"


def test_models_the_decoder_does_not_cover_are_named():
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    assert unsupported_model(llama) == "LlamaForCausalLM is not Qwen3ForCausalLM"
    model = _model()
    assert unsupported_model(model) is None
    assert unsupported_model(_model().to("meta")) == "the model is on meta, not the CPU"
    model.config.attention_bias = True
    assert unsupported_model(model) == "attention_bias=True"
    with pytest.raises(ValueError, match="Qwen3Decoder: attention_bias=True"):
        Qwen3Decoder(model)


def test_right_padded_prompts_are_an_error():
    model = _model()
    ids, mask = _prompts([5, 3])
    with pytest.raises(ValueError, match="left-padded"):
        Qwen3Decoder(model).prefill(ids.flip(1), mask.flip(1), 4)
