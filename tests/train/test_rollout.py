"""kpo train's rollouts on kpo's decoder: KPOTrainer takes that path for the embedded model, it returns what
TRL's own generate path returns under the same seed (tokens up to the first end token, the generator left in
the same state), and settings it does not reproduce go back to TRL."""

from __future__ import annotations

import math

import pytest
import torch
from trl import GRPOTrainer

from kpo.testbed.tiny import TinyModelConfig, build_model, build_tokenizer
from kpo.train.rollout import fast_rollout_unsupported, generate_single_turn
from kpo.train.trainer import KPOTrainer
from kpo.train.trainer_config import KPOConfig


def _trainer(tmp_path, generation_kwargs=None, **settings):
    """A KPOTrainer on a random 1-layer embedded-architecture model: 4 prompts x 4 responses of up to 12
    tokens at temperature 1 (kpo train's sampling settings, and ``generation_kwargs`` on top), the vanilla loss
    (or kpo's ``settings``)."""
    from datasets import Dataset

    tokenizer = build_tokenizer()
    shape = TinyModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, intermediate_size=96, max_position_embeddings=64
    )
    model = build_model(tokenizer, shape, seed=0)
    args = KPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=12,
        temperature=1.0,
        beta=0.0,
        report_to=[],
        generation_kwargs=generation_kwargs,
        **({"loss": "vanilla", "loss_agg_mode": "seq-mean-token-mean"} | settings),
    )
    data = Dataset.from_list([{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)])
    return KPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )


pytestmark = pytest.mark.usefixtures("one_thread")


def test_rollouts_equal_trls_generate_under_the_same_seed(tmp_path):
    trainer = _trainer(tmp_path)
    assert fast_rollout_unsupported(trainer, None, {}) is None
    # prompts of unequal lengths (left padding), each num_generations times in a row, as TRL passes them
    prompt_ids = [
        trainer._tokenizer(p)["input_ids"] for p in ("1+1=", "12+3=", "7+45=", "2+2=") for _ in range(4)
    ]
    torch.manual_seed(5)
    ours, logprobs = generate_single_turn(trainer, prompt_ids, trainer.accelerator.unwrap_model(trainer.model))
    after_ours = torch.get_rng_state()
    torch.manual_seed(5)
    theirs, _ = GRPOTrainer._generate_single_turn(trainer, prompt_ids, None, {}, 4)
    assert ours == theirs
    assert torch.equal(torch.get_rng_state(), after_ours)  # recording the log-probs draws nothing
    # the sampler's log-probability of each kept token, as vLLM returns them
    assert [len(lp) for lp in logprobs] == [len(c) for c in ours]
    assert all(math.isfinite(x) and x <= 0 for lp in logprobs for x in lp)
    eos = trainer.eos_token_ids[0]
    assert any(c[-1] == eos for c in ours)  # some rows ended (cut after their end token) ...
    assert any(len(c) == 12 and eos not in c for c in ours)  # ... and some ran to the budget


def test_settings_the_sampler_cannot_reproduce_stay_with_trl(tmp_path):
    trainer = _trainer(tmp_path, {"repetition_penalty": 1.1})
    assert fast_rollout_unsupported(trainer, None, {}) == "repetition_penalty=1.1"
    assert fast_rollout_unsupported(_trainer(tmp_path), [[None]], {}) == "multimodal inputs"
