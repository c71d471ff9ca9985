"""KPO in a TRL user's own script: KPOConfig (GRPOConfig with kpo's settings) read by TRL's parser, every problem
reported at once (GRPOConfig options whose work KPOTrainer does its own way among them), KPOTrainer taking it
(memory="matched" at max_completion_length), the old constructor keywords refused with their fields, and
examples/trl_script.py training a few steps on the tests' warm start."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from trl import GRPOConfig, TrlParser

from kpo.train import ConfigError, KPOConfig, KPOTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_script.py"


def _config(tmp_path, **fields) -> KPOConfig:
    return KPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)


def test_memory_matched_scales_the_papers_memory_to_the_completion_length(tmp_path):
    # the paper's 1000 of 4096 tokens at 128: 1000 * 128 / 4096 = 31.25 (the paper's q=1e-6 is a memory of
    # 1000.00004 tokens: within 1e-7)
    config = _config(tmp_path, loss_kwargs={"memory": "matched", "v": 2}, max_completion_length=128)
    assert config.resolved_loss_kwargs() == {"memory": pytest.approx(31.25, rel=1e-7), "v": 2}
    assert config.resolved_agg_mode() == "seq-mean-token-mean"  # the protocol's, as kpo train
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, loss_kwargs={"memory": "matched"}, max_completion_length=None)
    assert info.value.errors == [
        "loss_kwargs for 'kpo': memory='matched' scales the paper's memory to max_completion_length, which is None: "
        "set max_completion_length, or give memory a number of tokens"
    ]
    # the loss's own checks run up front: a fit whose likelihood overflows (x0 = 1e308 from log-ratios of 0)
    with pytest.raises(ConfigError, match="loss_kwargs for 'kpo': the likelihood of q overflows float64"):
        _config(tmp_path, loss_kwargs={"memory": "auto", "x0": 1e308})


def test_trls_parser_reads_it_from_flags_and_a_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\nloss: gspo\nloss_kwargs: {{clip_ratio_low: 3e-4}}\n")
    [config] = TrlParser([KPOConfig]).parse_args_and_config(["--config", str(path), "--learning_rate", "2e-6"])
    assert (config.loss, config.loss_kwargs, config.learning_rate) == ("gspo", {"clip_ratio_low": 3e-4}, 2e-6)
    [config] = TrlParser([KPOConfig]).parse_args_and_config(
        ["--output_dir", str(tmp_path), "--use_cpu", "--loss_kwargs", "q=1e-4", "v=1", "--rollout_is", "token"]
    )
    assert (config.loss, config.loss_kwargs, config.rollout_is) == ("kpo", {"q": 1e-4, "v": 1}, "token")
    assert config.rollout_correction() == {"rollout_is": "token", "rollout_is_threshold": 2.0}


def test_every_problem_is_reported_at_once_with_its_fix(tmp_path):
    with pytest.raises(ConfigError) as info:
        _config(
            tmp_path,
            loss="kpo",
            loss_kwargs={"qq": 1},
            ratio_anchor="sampler",
            dump_ratios_every=-1,
            rollout_rs_threshold="3",
            epsilon=0.3,
            scale_rewards="none",
            beta=0.04,
        )
    errors = info.value.errors
    assert errors[0] == "dump_ratios_every=-1: must be >= 0 (0 = off)"
    assert errors[1].startswith("loss_kwargs ['qq'] not accepted by loss 'kpo'; it accepts: clip_ratio=None")
    assert "ratio_anchor='sampler': use one of trainer, rollout" in errors
    assert (
        "rollout_rs_threshold='3' is ignored without --rollout-rs (no token is rejected): drop "
        "--rollout-rs-threshold, or add --rollout-rs token (or sequence, or verl's options)" in errors
    )
    assert errors[-3:] == [
        "epsilon=0.3 would be ignored: KPOTrainer's loss is kpo.policy_loss(loss): set loss_kwargs clip_ratio_low "
        "(and clip_ratio_high)",
        "beta=0.04 would be ignored: the paper's protocol has no KL term (KPOTrainer's loss adds none): leave it at 0",
        "scale_rewards='none' would be ignored: KPOTrainer's advantages are kpo.compute_advantages(advantage): "
        "advantage='grpo' is TRL's group scaling, 'drgrpo' its none",
    ]
    assert len(errors) == 7, errors


def test_the_docs_list_every_refused_option():
    from kpo.train.trainer_config import REFUSED

    page = (Path(__file__).resolve().parents[2] / "docs" / "trl.md").read_text()
    table = page[page.index("| GRPOConfig option | use instead |") :]
    assert [name for name in REFUSED if f"`{name}`" not in table] == []


def test_the_trainer_takes_its_settings_from_the_config(tmp_path):
    from .test_rollout import _trainer

    trainer = _trainer(
        tmp_path, loss="kpo", loss_kwargs={"memory": "matched"}, advantage="rloo", dump_ratios_every=2
    )
    # max_completion_length 12: 1000 * 12 / 4096 = 2.9296875 tokens
    assert trainer.loss_kwargs == {"memory": pytest.approx(2.9296875, rel=1e-7)}
    assert (trainer.loss_name, trainer.loss_agg_mode, trainer.advantage) == ("kpo", "seq-mean-token-mean", "rloo")
    assert (trainer.dump_ratios_every, trainer.ratios_dir) == (2, tmp_path / "ratios")


def test_the_old_keywords_and_a_plain_grpo_config_are_refused_in_one_line(tmp_path):
    with pytest.raises(TypeError) as info:
        KPOTrainer("model", None, loss_name="kpo", rollout_correction={"rollout_is": "token"})
    assert str(info.value) == (
        "KPOTrainer(loss_name=, rollout_correction=...): kpo's settings are fields of its config now: pass "
        "args=kpo.train.KPOConfig(..., loss_name -> loss, rollout_correction -> rollout_is, rollout_is_threshold, "
        "rollout_rs, rollout_rs_threshold[_lower])"
    )
    with pytest.raises(TypeError, match=r"^KPOTrainer takes args=kpo.train.KPOConfig\(...\), got GRPOConfig: "):
        KPOTrainer("model", None, GRPOConfig(output_dir=str(tmp_path), use_cpu=True))


def test_the_example_trl_script_trains_with_kpo(tiny_config_in, tmp_path, monkeypatch, capsys):
    import runpy

    from kpo.train.run import model_path

    config = tiny_config_in(tmp_path)()
    out = tmp_path / "trl"
    flags = [
        *("--model_name_or_path", str(model_path(config)), "--task", "chain", "--n_terms", "2", "--max_value", "4"),
        *("--output_dir", str(out), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true"),
        *("--max_steps", "2", "--logging_steps", "1", "--learning_rate", "1e-2", "--max_completion_length", "8"),
        *("--per_device_train_batch_size", "8", "--num_generations", "4", "--steps_per_generation", "2"),
        *("--loss", "kpo", "--loss_kwargs", "memory=matched"),
    ]
    # in this process, as `python examples/trl_script.py FLAGS` (TrlParser reads sys.argv)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *flags])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert f"done: kpo, 2 steps; model in {out}" in capsys.readouterr().out and (out / "model.safetensors").is_file()
    rows = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [row for row in rows if "loss/pg_clipfrac" in row]  # kpo.policy_loss's metrics, one row a step
    assert [row["step"] for row in steps] == [1, 2]
    # the second step of the generation batch is off-policy: KPO's filter saw ratios away from 1
    assert steps[0]["loss/ratio_max"] == 1.0 and steps[1]["loss/ratio_max"] != 1.0
