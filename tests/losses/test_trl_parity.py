"""kpo's losses against TRL 1.16's own GRPOTrainer._compute_loss on the embedded tiny model: the same inputs
through TRL's loss and through kpo.policy_loss on the log-probs TRL computes, then loss and the gradient on
every model parameter compared. Covers the loss types of kpo.losses.aggregation.TRL_LOSS_TYPES (bnpo is the
local token mean), delta, the off-policy mask (reading the sampling log-probs when given, else the old ones)
and the top-entropy mask.
"""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is kpo's train extra")

from kpo import policy_loss  # noqa: E402
from kpo.losses.aggregation import TRL_LOSS_TYPES  # noqa: E402

B, PROMPT, T, MAX_LEN = 6, 5, 9, 12
NO_DUAL_CLIP = {"clip_ratio_c": 1e9}  # TRL's clipped losses have no dual clip


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from kpo.testbed.tiny import TinyModelConfig, build_model, build_tokenizer
    from kpo.train.progress import checkpointing_arg

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    )
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        use_cpu=True,
        per_device_train_batch_size=B,
        num_generations=B,
        max_completion_length=MAX_LEN,
        beta=0.0,
        report_to=[],
        **checkpointing_arg(False),  # TRL's default recomputes the forward; nothing to save on this model
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+2="] * B}),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training_step; one micro-batch here
    return trainer


def _inputs(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (B, PROMPT), generator=g)  # 0-2: pad, end, unknown
    completion_ids = torch.randint(3, vocab, (B, T), generator=g)
    lengths = torch.tensor([T, 3, T - 2, 5, 1, T - 1])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=g),
    }, g


def _log_probs(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    lp, entropy, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, attention, T, compute_entropy=True
    )
    return lp, entropy


def _grads(model):
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def _both(trainer, inputs, trl_settings, name, mode, **kpo_kw):
    """(TRL loss, TRL grads), (kpo loss, kpo grads) for one input batch."""
    saved = {k: getattr(trainer, k) for k in trl_settings if hasattr(trainer, k)}
    saved_args = {k: getattr(trainer.args, k) for k in ("delta",)}
    for key, value in trl_settings.items():
        setattr(trainer.args if key == "delta" else trainer, key, value)
    try:
        trainer.model.zero_grad(set_to_none=True)
        trl_loss = trainer._compute_loss(trainer.model, inputs)
        trl_loss.backward()
        trl_out = (trl_loss.item(), _grads(trainer.model))
    finally:
        for key, value in saved.items():
            setattr(trainer, key, value)
        for key, value in saved_args.items():
            setattr(trainer.args, key, value)
    lp, entropy = _log_probs(trainer, inputs)
    if kpo_kw.pop("entropy", False):
        kpo_kw["token_entropy"] = entropy
    loss, metrics = policy_loss(
        name,
        log_prob=lp,
        old_log_prob=inputs["old_per_token_logps"],
        advantages=inputs["advantages"],
        response_mask=inputs["completion_mask"],
        loss_agg_mode=mode,
        **kpo_kw,
    )
    loss.backward()
    return trl_out, (loss.item(), _grads(trainer.model)), metrics


def _assert_equal(trl_out, kpo_out):
    (lt, gt), (lk, gk) = trl_out, kpo_out
    assert lk == pytest.approx(lt, rel=1e-5, abs=1e-7)
    assert len(gt) == len(gk) > 0
    for a, b in zip(gt, gk):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def _with_old(trainer, seed, scale=0.3):
    inputs, g = _inputs(seed, len(trainer.processing_class))
    with torch.no_grad():
        lp, _ = _log_probs(trainer, inputs)
    inputs["old_per_token_logps"] = lp + scale * torch.randn(lp.shape, generator=g)
    return inputs, g


CLIP = {"epsilon_low": 0.2, "epsilon_high": 0.28}
KPO_CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_clipped_loss_types(trainer, loss_type):
    inputs, _ = _with_old(trainer, 0)
    name, mode = TRL_LOSS_TYPES[loss_type]
    kw = dict(KPO_CLIP, **NO_DUAL_CLIP)
    if loss_type == "dr_grpo":
        kw["loss_scale_factor"] = MAX_LEN
    if loss_type == "dapo":  # TRL divides by the generation batch's tokens
        inputs["num_items_in_batch"] = torch.tensor(float(inputs["completion_mask"].sum() + 7))
        kw["global_num_tokens"] = float(inputs["num_items_in_batch"])
    trl_out, kpo_out, metrics = _both(trainer, inputs, dict(CLIP, loss_type=loss_type), name, mode, **kw)
    _assert_equal(trl_out, kpo_out)
    assert 0 < metrics["pg_clipfrac"] < 1  # both clip branches occur


def test_delta(trainer):
    inputs, _ = _with_old(trainer, 1, scale=0.6)
    trl_out, kpo_out, _ = _both(
        trainer,
        inputs,
        dict(CLIP, loss_type="grpo", delta=1.4),
        "vanilla",
        "seq-mean-token-mean",
        delta=1.4,
        **KPO_CLIP,
    )
    _assert_equal(trl_out, kpo_out)
    without = _both(
        trainer, inputs, dict(CLIP, loss_type="grpo"), "vanilla", "seq-mean-token-mean", **KPO_CLIP
    )[0]
    assert without[0] != pytest.approx(trl_out[0])  # the cap binds on these inputs


@pytest.mark.parametrize("delta", [None, 1.05])
def test_luspo(trainer, delta):
    inputs, _ = _with_old(trainer, 2, scale=0.1)
    settings = dict(CLIP, loss_type="luspo", importance_sampling_level="sequence", delta=delta)
    trl_out, kpo_out, _ = _both(trainer, inputs, settings, "luspo", None, delta=delta, **KPO_CLIP)
    _assert_equal(trl_out, kpo_out)


@pytest.mark.parametrize("with_sampling", [False, True])
@pytest.mark.parametrize("loss_type", ["bnpo", "sapo"])
def test_off_policy_mask(trainer, loss_type, with_sampling):
    inputs, g = _with_old(trainer, 3, scale=0.2)
    inputs["advantages"] = -inputs["advantages"].abs()  # the mask only drops rows with A < 0
    settings = dict(CLIP, loss_type=loss_type, off_policy_mask_threshold=0.02)
    name, mode = TRL_LOSS_TYPES[loss_type]
    kw = {"off_policy_mask_threshold": 0.02} | ({} if loss_type == "sapo" else dict(KPO_CLIP, **NO_DUAL_CLIP))
    if with_sampling:
        # vLLM's log-probs: TRL masks with them and weights by its token_truncate importance ratio; kpo reads
        # them as rollout_log_prob, whose default is the same truncated token IS (threshold 2).
        sampling = inputs["old_per_token_logps"] + 0.3 * torch.randn(
            inputs["old_per_token_logps"].shape, generator=g
        )
        inputs["sampling_per_token_logps"] = sampling
        inputs["importance_sampling_ratio"] = torch.exp(inputs["old_per_token_logps"] - sampling).clamp(
            max=2.0
        )
        settings |= {"use_vllm": True, "vllm_importance_sampling_correction": True}
        kw |= {"rollout_log_prob": sampling, "rollout_is": "token", "rollout_is_threshold": 2.0}
    trl_out, kpo_out, metrics = _both(trainer, inputs, settings, name, mode, **kw)
    _assert_equal(trl_out, kpo_out)
    assert 0 < metrics["off_policy_masked_fraction"] < 1


def test_top_entropy_quantile(trainer):
    inputs, _ = _with_old(trainer, 4)
    settings = dict(CLIP, loss_type="bnpo", top_entropy_quantile=0.4)
    trl_out, kpo_out, metrics = _both(
        trainer,
        inputs,
        settings,
        "vanilla",
        "token-mean",
        top_entropy_quantile=0.4,
        entropy=True,
        **KPO_CLIP,
        **NO_DUAL_CLIP,
    )
    _assert_equal(trl_out, kpo_out)
    assert 0.5 < metrics["entropy_masked_fraction"] < 0.7  # about 60% of the tokens dropped


def test_kpo_train_and_compare_accept_every_loss_and_trl_keywords():
    from kpo import list_losses
    from kpo.compare.checks import _canonical_methods
    from kpo.train import TrainConfig
    from kpo.train.checks import loss_errors

    for name in list_losses():
        assert loss_errors(TrainConfig(loss=name)) == [], name
    names = tuple(n for n in list_losses() if n not in ("grpo", "ppo", "geo_mean"))  # aliases name one loss
    assert _canonical_methods(names) == (names, [])
    # The trainer supplies token_entropy, so the entropy mask validates without it.
    trl_kw = {"top_entropy_quantile": 0.2, "delta": 1.5, "off_policy_mask_threshold": 0.5}
    assert loss_errors(TrainConfig(loss="vanilla", loss_kwargs=trl_kw)) == []
    (error,) = loss_errors(TrainConfig(loss="luspo", loss_kwargs={"top_entropy_quantile": 2.0}))
    assert "top_entropy_quantile must lie in [0, 1], got 2.0" in error
