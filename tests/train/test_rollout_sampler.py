"""kpo train's rollout sampler (kpo.train.sampler): a bf16/FP8 copy of the policy whose log-probs are kept, the
mismatch they make with the trainer's (rollout_corr/* in metrics.jsonl), the PPO anchor (the trainer's or the
sampler's log-probs), and TIS fed with the sampler's log-probs. Three tiny runs of the toy chain task, shared by
the module's tests."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kpo.protocol import on_policy_step

MINIBATCHES = 2
TIS_THRESHOLD = 1.0005  # below most bf16 ratios above 1, so truncation is exercised


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tiny_config_in, tmp_path_factory, request):
    """float32 sampler (today's default); bf16 sampler with the trainer's anchor and token TIS (every policy_loss
    call recorded); bf16 sampler with its own log-probs as the anchor."""
    from kpo.train import run_training

    make = tiny_config_in(tmp_path_factory.mktemp("sampler"))
    calls = []
    monkeypatch = pytest.MonkeyPatch()
    import kpo.train.trainer as trainer_module

    real = trainer_module.policy_loss

    def recording(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls.append((args, kwargs, loss.detach()))
        return loss, metrics

    out = {"float32": run_training(make("f32", minibatches=MINIBATCHES))}
    monkeypatch.setattr(trainer_module, "policy_loss", recording)
    try:
        out["tis"] = run_training(
            make(
                "tis",
                loss="vanilla",
                minibatches=MINIBATCHES,
                rollout_dtype="bfloat16",
                rollout_is="token",
                rollout_is_threshold=TIS_THRESHOLD,
            )
        )
    finally:
        monkeypatch.undo()
    out["bypass"] = run_training(
        make("bypass", minibatches=MINIBATCHES, rollout_dtype="bfloat16", ratio_anchor="rollout")
    )
    return {name: _rows(path) for name, path in out.items()}, calls


def test_every_batch_logs_the_mismatch_under_verl_names(runs):
    rows, _ = runs
    for name, found in rows.items():
        for row in found:
            for key in ("kl", "k3_kl", "log_ppl_diff", "chi2_token", "on_policy_clip_frac"):
                assert math.isfinite(row[f"rollout_corr/{key}"]), (name, row)
    # float32: the decoder against the transformers forward, rounding only; bf16 is a real mismatch
    assert max(r["rollout_corr/k3_kl"] for r in rows["float32"]) < 1e-9
    assert min(r["rollout_corr/k3_kl"] for r in rows["bypass"]) > 1e-7


def test_with_the_trainers_anchor_a_batch_starts_on_policy_whatever_the_sampler(runs):
    rows, _ = runs
    for name in ("float32", "tis"):
        for row in rows[name]:
            if on_policy_step(row["step"], MINIBATCHES):
                assert row["ratio_min"] == 1.0 and row["ratio_max"] == 1.0, (name, row)
                assert row["rollout_corr/on_policy_clip_frac"] == 0.0


def test_with_the_samplers_anchor_the_mismatch_reaches_the_first_step(runs):
    rows, _ = runs
    first = rows["bypass"][0]
    assert first["ratio_min"] < 1.0 < first["ratio_max"]
    # the same first batch is drawn in both runs: the same prompts, the same random stream, different rounding
    floor = rows["float32"][0]["rollout_corr/k3_kl"]
    assert first["rollout_corr/k3_kl"] >= 100 * floor


def test_token_tis_multiplies_the_loss_by_min_of_trainer_over_sampler_and_threshold(runs):
    from kpo import policy_loss

    _, calls = runs
    assert calls
    truncated = 0
    tensors = ("log_prob", "old_log_prob", "advantages", "response_mask")
    for _, kwargs, loss in calls:
        log_prob, old, adv, mask = (kwargs[k] for k in tensors)
        rollout = kwargs["rollout_log_prob"]
        assert kwargs["rollout_is"] == "token" and kwargs["rollout_is_threshold"] == TIS_THRESHOLD
        # verl's TIS weight per token, by hand: min(pi_trainer / pi_sampler, threshold)
        weights = torch.exp(old.double() - rollout.double()).clamp(max=TIS_THRESHOLD).float() * mask
        truncated += int(((old - rollout).exp() > TIS_THRESHOLD)[mask.bool()].sum())
        plain = {
            k: v
            for k, v in kwargs.items()
            if k not in ("rollout_log_prob", "rollout_is", "rollout_is_threshold", *tensors)
        }
        expected, _ = policy_loss(
            "vanilla",
            log_prob=log_prob.detach(),
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            rollout_is_weights=weights,
            **plain,
        )
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)
    assert truncated > 0


def test_sampler_settings_are_checked(tiny_config):
    from kpo.train import ConfigError

    bad = {
        "rollout_dtype": ("float16", "rollout_dtype='float16'"),
        "ratio_anchor": ("sampler", "ratio_anchor='sampler'"),
    }
    for field, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message):
            tiny_config(**{field: value}).validate()
    with pytest.raises(ConfigError, match="already corrects the mismatch"):
        tiny_config(ratio_anchor="rollout", rollout_is="token").validate()
    with pytest.raises(ConfigError, match="rollout correction: rollout_rs='token_k9'"):
        tiny_config(rollout_rs="token_k9", rollout_rs_threshold="2.0").validate()
    # verl's k1 rejection spec is accepted, and a YAML number for the threshold is its text
    from kpo.train.config import TrainConfig

    assert tiny_config(
        rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"
    ).validate().rollout_correction() == {
        "rollout_is": None,  # and no TIS threshold: the loss refuses one without rollout_is
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.5_2.0",
        "rollout_rs_threshold_lower": None,
    }
    assert TrainConfig.from_dict({"rollout_rs_threshold": 2.0}).rollout_rs_threshold == "2.0"


def test_a_lagging_sampler_resumes_on_its_trajectory(tiny_config):
    # rollout_lag=1: batch g is sampled by the weights of batch g - 1, which the checkpoint must carry
    from kpo.train import run_training

    lagged = {"rollout_lag": 1, "ratio_anchor": "rollout", "save_steps": 2}
    full = _rows(run_training(tiny_config("full", max_steps=6, **lagged)))
    part = tiny_config("part", max_steps=4, **lagged)
    run_training(part)
    part.max_steps, part.resume = 6, True
    resumed = _rows(run_training(part))
    for a, b in zip(full, resumed, strict=True):
        assert {k: v for k, v in a.items() if k != "step_time"} == pytest.approx(
            {k: v for k, v in b.items() if k != "step_time"}, rel=1e-5, abs=1e-7
        ), a["step"]
    # the first batch is sampled by the policy's own weights (float32: rounding only), the later ones by stale ones
    assert full[0]["rollout_corr/k3_kl"] < 1e-9 < full[2]["rollout_corr/k3_kl"]
