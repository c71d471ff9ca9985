"""`kpo train` refuses, before any work, settings that make no sense (issue 41): rollout-correction bounds that
reject or down-weight every token at the on-policy step, a threshold or other setting that the run would ignore
without its companion, a rollout lag that no generation batch reaches. Each is one line naming the setting, why
and the fix. Nothing here trains: the command stops at its config check."""

from __future__ import annotations

import pytest

from kpo.train.cli import main

from .conftest import cli_flags


def _refused(config, capsys, *flags: str) -> list[str]:
    """The error lines `kpo train` prints for the tiny config with ``flags`` on top (it must refuse them)."""
    assert main([*cli_flags(config), "--progress", "false", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kpo train: invalid training config:") and "Traceback" not in err, err
    return [line.removeprefix("  - ") for line in err.splitlines()[1:]]


@pytest.mark.parametrize(
    "flags, line",
    [
        # every token rejected at every step: rollout_rs_masked_fraction 1.0 and nothing trained
        (
            ("--rollout-rs", "token", "--rollout-rs-threshold", "0.5"),
            "rollout correction: rollout_rs_threshold=0.5 < 1: it rejects every token whose sampler and trainer "
            "agree (ratio exactly 1, as on-policy without mismatch), so nothing would train; give an upper bound "
            ">= 1 (default 2.0)",
        ),
        (
            ("--rollout-rs", "sequence", "--rollout-rs-threshold-lower", "1.2"),
            "rollout correction: rollout_rs_threshold_lower=1.2 > 1: it rejects every token",
        ),
        (
            ("--rollout-rs", "token_k1", "--rollout-rs-threshold", "1.1_2.0"),
            "rollout correction: rollout_rs_threshold '1.1_2.0' for 'token_k1' keeps ratios in [1.1, 2], which "
            "excludes 1",
        ),
        # every on-policy token's loss halved
        (
            ("--rollout-is", "token", "--rollout-is-threshold", "0.5"),
            "rollout correction: rollout_is_threshold=0.5 < 1 caps every weight below 1",
        ),
    ],
)
def test_bounds_that_exclude_a_ratio_of_1_are_refused(tiny_config, capsys, flags, line):
    errors = _refused(tiny_config(), capsys, *flags)
    assert len(errors) == 1 and errors[0].startswith(line), errors


@pytest.mark.parametrize(
    "flags, line",
    [
        (
            ("--rollout-rs-threshold", "0.5"),
            "rollout_rs_threshold='0.5' is ignored without --rollout-rs (no token is rejected): drop "
            "--rollout-rs-threshold, or add --rollout-rs token (or sequence, or verl's options)",
        ),
        (
            ("--rollout-rs-threshold-lower", "0.5"),
            "rollout_rs_threshold_lower=0.5 is ignored without --rollout-rs",
        ),
        (
            ("--rollout-is-threshold", "3"),
            "rollout_is_threshold=3.0 is ignored without --rollout-is (no TIS weight to truncate): drop "
            "--rollout-is-threshold, or add --rollout-is token (or sequence)",
        ),
        (("--rollout-rs", "token", "--rollout-is-threshold", "3"), "rollout_is_threshold=3.0 is ignored"),
        (("--vllm-importance-sampling-clip-max", "5"), "vllm_importance_sampling_clip_max=5.0 is ignored"),
        (("--problem-key", "question"), "problem_key='question' is ignored without --dataset"),
        (("--instruction", "Think."), "instruction='Think.' is ignored without --dataset"),
    ],
)
def test_a_setting_without_its_companion_is_refused(tiny_config, capsys, flags, line):
    errors = _refused(tiny_config(), capsys, *flags)
    assert len(errors) == 1 and errors[0].startswith(line), errors


def test_embedded_settings_beside_a_model_or_dataset_are_refused(tiny_config, tmp_path):
    from kpo.train.config import ConfigError

    # the tiny config sets the embedded task, model shape and warm start; --model and --dataset replace them
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    with pytest.raises(ConfigError) as info:
        tiny_config(model=str(tmp_path), dataset=str(data)).validate()
    ignored = sorted(e.split("=")[0] for e in info.value.errors if " is ignored " in e)
    assert ignored == [
        "cache_dir",
        "max_value",
        "n_terms",
        "sft_epochs",
        "sft_examples",
        "task",
        "tiny_heads",
        "tiny_hidden_size",
        "tiny_layers",
    ]
    assert (
        "tiny_layers=1 is ignored with --model (it sets the embedded model and its warm start): drop "
        "--tiny-layers, or drop --model" in info.value.errors
    )


@pytest.mark.parametrize("lag", [2, 1_000_000])
def test_a_lag_that_no_generation_batch_reaches_is_refused(tiny_config, capsys, lag):
    # 4 steps of 2 mini-batches: 2 generation batches, sampled by the weights of batches max(0, g - lag)
    errors = _refused(tiny_config(), capsys, "--rollout-lag", str(lag))
    assert errors == [
        f"rollout_lag={lag}: the run has 2 generation batch(es) (max_steps=4 / minibatches=2), so none would be "
        f"sampled {lag} batches behind the trainer: the sampler would keep the starting weights all run; use "
        f"--rollout-lag 1 or less (0 = none), or --max-steps {2 * (lag + 1)} or more"
    ]


def test_a_lag_the_last_batch_reaches_is_accepted(tiny_config):
    tiny_config(rollout_lag=1).validate()  # batch 1 is sampled by batch 0's weights


def test_a_warm_start_larger_than_kpo_draws_is_refused_before_drawing_it(tmp_path, monkeypatch):
    """--sft-examples 100000000 hung in the config check, drawing the warm start's problems (hours)."""
    from data.draws import no_more_draws
    from kpo.train.config import ConfigError, TrainConfig

    no_more_draws(monkeypatch, 20_000)  # the RL split's 4096 problems of 12 digits: about 5000 draws
    config = TrainConfig(output_dir=str(tmp_path / "run"), n_terms=12, sft_examples=10**8, report_to="none")
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert info.value.errors == [
        "sft_examples=100000000: the synthetic task (running, n_terms=12, max_value=9) gives at most 1000000 "
        "distinct training problems for the warm start: lower --sft-examples to 1000000 or less"
    ]
