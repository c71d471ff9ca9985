from __future__ import annotations

import re

import pytest

from kpo.train.config import ConfigError, TrainConfig
from kpo.train.flags import parse_args


def test_validator_reports_every_error_at_once(tmp_path):
    config = TrainConfig(
        output_dir=str(tmp_path),
        prompts_per_step=3,  # 3 x 8 = 24 sequences, not divisible by 5 mini-batches
        minibatches=5,
        loss="kpo",
        loss_kwargs={"qq": 1.0},  # misspelt q
        sft_noise=1.5,
        save_steps=3,  # not a multiple of minibatches
        advantage="ppo",
    )
    with pytest.raises(ConfigError) as info:
        config.validate()
    errors = info.value.errors
    text = str(info.value)
    assert len(errors) >= 5, text
    assert "not divisible by minibatches=5" in text
    assert (
        "'qq'" in text and "q=None" in text and "memory=None" in text
    )  # names the bad key and lists the accepted ones
    assert "sft_noise=1.5" in text
    assert "save_steps=3 must be a multiple of minibatches=5" in text
    assert "advantage='ppo'" in text


def test_max_steps_must_end_a_generation_batch(tmp_path):
    # The last checkpoint is written at max_steps: mid-batch it could not resume (the batch's rest is lost).
    with pytest.raises(
        ConfigError, match=r"max_steps=3 must be a multiple of minibatches=2 .*use max_steps=4"
    ):
        TrainConfig(output_dir=str(tmp_path), minibatches=2, max_steps=3).validate()
    TrainConfig(output_dir=str(tmp_path), minibatches=2, max_steps=4, save_steps=2).validate()


def test_only_settings_that_keep_the_trajectory_may_change_on_resume():
    from kpo.train.config import TRAJECTORY_FIELDS

    free = {
        "output_dir",
        "resume",
        "overwrite",
        "max_steps",
        "cache_dir",
        "save_steps",
        "save_total_limit",
        "dump_ratios_every",
        "report_to",
        "num_threads",
        "progress",
    }
    assert not free & set(TRAJECTORY_FIELDS)
    assert {"seed", "loss", "loss_kwargs", "minibatches", "learning_rate", "model", "instruction"} <= set(
        TRAJECTORY_FIELDS
    )


def test_unknown_loss_and_bad_value_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="unknown policy loss 'nope'.*valid names: .*kpo"):
        TrainConfig(output_dir=str(tmp_path), loss="nope").validate()
    # a value the loss itself rejects (the filter needs q > 0) is found up front by a dry run of the loss
    with pytest.raises(ConfigError, match=r"q \(process noise\) must be > 0"):
        TrainConfig(output_dir=str(tmp_path), loss="kpo", loss_kwargs={"q": -1.0}).validate()
    # GMPO aggregates per sequence only
    with pytest.raises(ConfigError, match="loss_agg_mode='token-mean' not allowed for loss 'gmpo'"):
        TrainConfig(output_dir=str(tmp_path), loss="gmpo", loss_agg_mode="token-mean").validate()


def test_protocol_aggregation_default():
    # seq-mean-token-mean (the paper's protocol) where the loss allows it, else the loss's own mode
    assert TrainConfig(loss="vanilla").resolved_agg_mode() == "seq-mean-token-mean"
    assert TrainConfig(loss="gmpo").resolved_agg_mode() == "seq-mean"
    assert TrainConfig(loss="vanilla", loss_agg_mode="token-mean").resolved_agg_mode() == "token-mean"


def test_cli_overrides_yaml_and_parses_loss_kwargs(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("loss: gspo\nmax_steps: 7\nloss_kwargs: {clip_ratio_low: 0.001}\nseed: 3\n")
    config = parse_args(
        ["--config", str(path), "--max-steps", "9", "--loss_kwargs", "clip_ratio_high=4e-4", "--resume"]
    )
    assert config.loss == "gspo" and config.seed == 3
    assert config.max_steps == 9  # flag beats file
    assert config.loss_kwargs == {"clip_ratio_low": 0.001, "clip_ratio_high": 4e-4}
    assert config.resume is True
    assert parse_args(["--micro-batch-size", "none"]).micro_batch_size is None
    assert parse_args(["--progress", "false"]).progress is False


def test_cli_rejects_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("los: kpo\nmax-steps: 3\n")
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['los', 'max-steps'\]; valid fields: .*'loss'"):
        parse_args(["--config", str(bad)])
    good = tmp_path / "good.yaml"
    good.write_text("max_steps: 8\n")
    for flags, line in (
        (["--loss-kwargs", "q"], "loss kwarg 'q': write NAME=VALUE, e.g. q=1e-4"),  # no '='
        (["--loss-kwargs", "q=1", "q=2"], "['q'] given more than once; give each name once"),
        (["--max-steps", "many"], "argument --max_steps/--max-steps: invalid int value: 'many'"),
        (["--config", str(good), "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        ([f"--config={good}"], f"argument --config: give one YAML file as `--config {good}`"),
        (["--config"], "argument --config: expected one argument"),
    ):
        with pytest.raises(SystemExit):
            parse_args(flags)
        assert line in capsys.readouterr().err, flags
    broken = tmp_path / "broken.yaml"
    broken.write_text("loss: [kpo\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        parse_args(["--config", str(broken)])
    listing = tmp_path / "list.yaml"
    listing.write_text("- loss\n")
    with pytest.raises(ConfigError, match="list.yaml: Config file .*list.yaml must contain a YAML mapping"):
        parse_args(["--config", str(listing)])
    # every text that is not its field's type, at once, before the other checks
    text = tmp_path / "text.yaml"
    text.write_text("max_steps: ten\nprogress: maybe\nlearning_rate: 1e-4\nsft_noise: none\n")
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", str(text)])
    assert info.value.errors == [
        f"{text}: max_steps='ten' is not a number",
        f"{text}: progress='maybe' is not true or false",
    ]


def test_cli_reports_a_missing_config_file(tmp_path, capsys):
    from kpo.train.cli import main

    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml' not found" in err and "Traceback" not in err


def test_a_model_without_tokenizer_files_is_named(tmp_path):
    # it was an IndexError from the decoder's tokenizer lookup once training had started (issue 34, case 7)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="model='.*model': no tokenizer files in this directory"):
        TrainConfig(output_dir=str(tmp_path / "out"), model=str(model)).validate()


def test_malformed_dataset_row_names_the_row(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"}\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    config = TrainConfig(output_dir=str(tmp_path / "out"), model=str(model), dataset=str(data))
    with pytest.raises(ConfigError, match="row 1 \\(line 2\\): missing field 'answer'"):
        config.validate()


def test_dataset_without_math_verify_is_refused_before_training(tmp_path, monkeypatch):
    # its rewards are graded by math-verify; finding out at the first reward would waste the model load
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else find_spec(name, *a)
    )
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    with pytest.raises(
        ConfigError, match="math-verify, which is not installed: pip install 'kpo\\[train\\]'"
    ):
        TrainConfig(output_dir=str(tmp_path / "out"), dataset=str(data)).validate()


def test_dataset_without_model_and_existing_run_are_refused(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError) as info:
        TrainConfig(output_dir=str(tmp_path), dataset=str(data)).validate()
    assert "pass --model PATH" in str(info.value)
    assert "--resume to continue it" in str(info.value)


def test_every_field_is_type_checked_against_its_annotation(tmp_path):
    """Wrong YAML value types give one error per field (field, value, expected type) instead of a traceback
    from numpy or a comparison, or a value accepted as is; the other config errors are listed with them."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "seed: 1.5\ntemperature: null\nlearning_rate: [1]\nprogress: 7\nnum_generations: 2.5\n"
        "loss_kwargs: [q]\nmax_grad_norm: .inf\nminibatches: 3\nmax_steps: 3\n"
        f"output_dir: {tmp_path / 'out'}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", str(path)]).validate()
    errors = info.value.errors
    for expected in (
        "seed=1.5: expected an integer, got float",
        "temperature=None: expected a finite number, got NoneType",
        "learning_rate=[1]: expected a finite number, got list",
        "progress=7: expected true/false, got int",
        "num_generations=2.5: expected an integer, got float",
        "loss_kwargs=['q']: expected a mapping, got list",
        "max_grad_norm=inf: expected a finite number, got float",
    ):
        assert expected in errors, (expected, errors)
    # num_generations is reported once: no divisibility message about a value already reported as wrong
    assert not any("divisible" in e or "max_steps" in e for e in errors), errors
    assert len(errors) == 7, errors
    # Optional fields take None; ints pass as floats
    TrainConfig(output_dir=str(tmp_path / "ok"), micro_batch_size=None, learning_rate=1).validate()


def test_numeric_ranges_are_checked(tmp_path):
    config = parse_args(
        [
            "--weight-decay",
            "-1",
            "--seed",
            "-2",
            "--num-generations",
            "1",
            "--output-dir",
            str(tmp_path / "out"),
            "--learning-rate",
            "0",
        ]
    )
    with pytest.raises(ConfigError) as info:
        config.validate()
    errors = info.value.errors
    assert "weight_decay=-1.0: must be >= 0" in errors
    assert "seed=-2: must be in [0, 4294967295] (numpy's seed range)" in errors
    assert any(e.startswith("num_generations=1: must be >= 2") for e in errors)
    assert "learning_rate=0.0: must be > 0" in errors


def test_synthetic_task_too_small_for_the_run_is_a_config_error(tmp_path):
    # the chain task, 19 x 19 = 361 problems: at most 180 distinct warm-start problems, not its default 200
    with pytest.raises(ConfigError) as info:
        TrainConfig(output_dir=str(tmp_path / "a"), task="chain", max_value=18).validate()
    assert info.value.errors == [
        "sft_examples=200: the synthetic task (chain, n_terms=2, max_value=18) gives at most 180 distinct training "
        "problems for the warm start: lower --sft-examples to 180 or less, or raise --max-value / --n-terms"
    ]
    # 16 problems: 8 training prompts, fewer than a generation batch of 16 distinct prompts
    with pytest.raises(
        ConfigError, match=r"prompts_per_step=16: .* gives 8 training prompts .*--prompts-per-step"
    ):
        TrainConfig(output_dir=str(tmp_path / "b"), task="chain", max_value=3, sft_examples=8).validate()
    TrainConfig(output_dir=str(tmp_path / "c"), task="chain", max_value=18, sft_examples=180).validate()
    # the running task's terms are digits; its 4^128 problems supply any warm start
    with pytest.raises(ConfigError, match=r"max_value=18: must be an integer in 1..9"):
        TrainConfig(output_dir=str(tmp_path / "d"), max_value=18).validate()
    TrainConfig(output_dir=str(tmp_path / "e"), max_value=3).validate()


def test_report_to_is_checked_before_training(tmp_path, monkeypatch):
    import transformers.integrations

    with pytest.raises(ConfigError, match="report_to='bogus': unknown; use none, all or one of .*wandb"):
        TrainConfig(output_dir=str(tmp_path), report_to="bogus").validate()
    monkeypatch.setattr(
        transformers.integrations, "get_available_reporting_integrations", lambda: ["tensorboard"]
    )
    with pytest.raises(
        ConfigError,
        match="report_to='wandb': wandb is not installed.*--report-to none or one of"
        " the installed tensorboard",
    ):
        TrainConfig(output_dir=str(tmp_path), report_to="wandb").validate()
    TrainConfig(output_dir=str(tmp_path), report_to="none").validate()


def test_output_dir_that_is_a_file_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("")
    for out in ("file", "file/run"):
        with pytest.raises(ConfigError, match=r"output_dir=.*/file' is a file, not a directory"):
            TrainConfig(output_dir=str(tmp_path / out)).validate()


def test_help_shows_each_default_and_flags_still_merge_with_yaml(tmp_path):
    from kpo.train.flags import build_parser

    text = " ".join(build_parser().format_help().split())
    assert re.search(r"--max-steps MAX_STEPS Optimizer steps[^-]*\(default: 1000\)", text)
    for shown in (  # TRL's parser shows them as Python writes them
        "(default: 1000)",
        "(default: runs/kpo-tiny)",
        "(default: None)",
        "(default: True)",
        "(default: {})",
        "(default: 0.0001)",
        "(default: tensorboard)",
    ):
        assert shown in text, shown
    assert "--loss-kwargs q=1e-4 v=1" in text and "loss_kwargs: {q: 1.0e-4, v: 1}" in text
    assert "ratios/step_000012.safetensors" in text
    # an unset flag does not override the YAML file with its default
    path = tmp_path / "run.yaml"
    path.write_text("max_steps: 8\nprogress: false\n")
    config = parse_args(["--config", str(path)])
    assert config.max_steps == 8 and config.progress is False


def test_vllm_settings_are_checked_and_reach_trl(tmp_path, monkeypatch):
    import torch
    from trl import GRPOConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = parse_args(
        [
            "--use-vllm",
            "--vllm-importance-sampling-mode",
            "seq_mask",
            "--vllm-gpu-memory-utilization",
            "1.5",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    with pytest.raises(ConfigError) as info:
        config.validate()
    errors = info.value.errors
    assert "use_vllm=True needs a CUDA GPU (vLLM generates on it); drop --use-vllm on this machine" in errors
    assert any(
        e.startswith("vllm_importance_sampling_mode='seq_mask': must be one of token_truncate")
        for e in errors
    )
    assert "vllm_gpu_memory_utilization=1.5: must be in [0, 1] (a share of GPU memory)" in errors
    # run.py hands these fields to TRL under the same names: the pinned TRL must know them
    names = (
        "vllm_gpu_memory_utilization",
        "vllm_importance_sampling_mode",
        "vllm_importance_sampling_clip_max",
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "g"), use_cpu=True, **{n: getattr(TrainConfig(), n) for n in names}
    )
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == (
        "sequence_mask",
        3.0,
    )
