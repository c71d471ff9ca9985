"""kpo.evaluation.expected: the exact expected accuracy against a float64 loop over prefixes, a hand-worked
product, and the sampling frequency it predicts."""

from __future__ import annotations

import pytest
import torch

from kpo.evaluation.expected import expected_accuracy, reference_probabilities
from kpo.testbed.tiny import TinyModelConfig, build_model, build_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    shape = TinyModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    return build_model(tok, shape, seed=3).eval(), tok


def _loop(model, tok, prompt: str, reference: str, temperature: float) -> list[float]:
    """Float64 reference: one forward per prefix, the next reference token's (then the end token's) probability."""
    ids = tok(prompt)["input_ids"]
    target = tok(reference)["input_ids"] + [tok.eos_token_id]
    out = []
    with torch.no_grad():
        for k, t in enumerate(target):
            logits = model(input_ids=torch.tensor([ids + target[:k]])).logits[0, -1].double()
            out.append(float(torch.softmax(logits / temperature, -1)[t]))
    return out


def test_matches_a_loop_over_prefixes_with_padding_and_temperature(tiny):
    model, tok = tiny
    # prompts of different lengths share a batch (right padding), and a batch of 2 splits the three rows
    prompts, refs = ["12=0", "3=0", "98765=0"], ["13", "30", "77"]
    probs = reference_probabilities(model, tok, prompts, refs, temperature=0.7, batch_size=2)
    assert probs.shape == (3, 3) and probs.dtype == torch.float64
    for i, (p, r) in enumerate(zip(prompts, refs)):
        assert probs[i].tolist() == pytest.approx(_loop(model, tok, p, r, 0.7), rel=1e-5)


def test_expected_accuracy_is_the_product_hand_worked():
    # problem 0: 0.5 x 0.5 = 0.25; problem 1: 1.0 x 0.2 = 0.2; mean 0.225; positions (0.75, 0.35)
    stats = expected_accuracy(torch.tensor([[0.5, 0.5], [1.0, 0.2]], dtype=torch.float64))
    assert stats["per_problem"] == pytest.approx([0.25, 0.2])
    assert stats["mean"] == pytest.approx(0.225)
    assert stats["position_accuracy"] == pytest.approx([0.75, 0.35])
    assert stats["min_position_accuracy"] == pytest.approx(0.35)


def test_it_predicts_the_sampling_frequency(tiny):
    model, tok = tiny
    # the random model is far from any answer, so take the reference it finds most likely: its greedy path
    prompt = "4=0"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    greedy = model.generate(ids, max_new_tokens=2, do_sample=False)[0, ids.shape[1] :].tolist()
    reference = tok.decode(greedy)
    [p] = expected_accuracy(reference_probabilities(model, tok, [prompt], [reference]))["per_problem"]
    torch.manual_seed(0)
    samples = model.generate(ids.repeat(4000, 1), max_new_tokens=3, do_sample=True, top_k=0, temperature=1.0)
    want = torch.tensor(greedy + [tok.eos_token_id])
    hits = float((samples[:, ids.shape[1] :] == want).all(dim=1).double().mean())
    # 4000 samples: the frequency's standard error is at most sqrt(0.25 / 4000) = 0.008
    assert hits == pytest.approx(p, abs=4 * (p * (1 - p) / 4000) ** 0.5 + 1e-3), (hits, p)


def test_references_of_different_lengths_are_refused(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match=r"reference 1 \('123'\) is 3 tokens, reference 0 is 2"):
        reference_probabilities(model, tok, ["1=0", "2=0"], ["12", "123"])
    with pytest.raises(ValueError, match="temperature=0"):
        reference_probabilities(model, tok, ["1=0"], ["1"], temperature=0)
