"""End-to-end runs of `kpo train` on a seconds-sized tiny model (see conftest.tiny_config)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kpo.losses import get_loss_spec, list_losses
from kpo.train.config import TrainConfig

from .conftest import TINY_FIELDS, cli_flags

pytestmark = pytest.mark.slow

REQUIRED = (
    "step",
    "reward_mean",
    "reward_std",
    "entropy",
    "clip_frac",
    "pg_loss",
    "ppo_kl",
    "response_length",
    "step_time",
)
# One name per registered loss (aliases train the same function).
LOSSES = sorted({get_loss_spec(name).name for name in list_losses()})


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains_and_logs_finite_metrics(tiny_config, loss):
    from kpo.train import run_training

    out = run_training(tiny_config(loss, loss=loss, max_steps=2))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in REQUIRED:
            assert row[key] is not None and math.isfinite(row[key]), (loss, key, row)
        assert "pg_clipfrac" in row and "ratio_max" in row  # the loss's own metrics are passed through
    # step 1 is on-policy: old log-probs are the current ones, so ppo_kl is exactly 0
    assert rows[0]["ppo_kl"] == 0.0 and rows[0]["ratio_max"] == pytest.approx(1.0, abs=1e-6)


def test_outputs_and_off_policy_ratios(tiny_config):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kpo import kalman_filter
    from kpo.train import run_training

    # p0, x0 off their defaults (x0 inside the on band, so on-policy steps still do not clip)
    filt = {"q": 1.0, "v": 1.0, "p0": 0.5, "x0": 1e-5}
    out = run_training(tiny_config(loss="kpo", loss_kwargs=dict(filt), dump_ratios_every=1))
    for name in ("config.yaml", "metrics.jsonl", "training_dynamics.png", "final/config.json"):
        assert (out / name).exists(), name
    assert list(out.glob("checkpoint-*"))
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    assert tokenizer.decode(tokenizer("12+3=").input_ids) == "12+3="
    assert model.config.model_type == "qwen3"

    dumps = sorted((out / "ratios").glob("step_*.safetensors"))
    assert [p.name for p in dumps] == [f"step_{s:06d}.safetensors" for s in (1, 2, 3, 4)]
    for step, path in enumerate(dumps, start=1):
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            z, filtered, mask = (f.get_tensor(k) for k in ("log_ratio", "filtered_log_ratio", "mask"))
        assert meta["step"] == str(step) and meta["loss"] == "kpo" and meta["mask_mode"] == "skip"
        assert {k: float(meta[k]) for k in filt} == filt  # every setting kpo analyze needs to re-filter
        assert z.dtype == torch.float32 and mask.dtype == torch.uint8 and z.shape == mask.shape
        assert z.shape[0] == 16  # a mini-batch: 8 prompts x 4 responses / 2 mini-batches
        expected = kalman_filter(z.double(), mask.bool(), **filt).float()
        torch.testing.assert_close(filtered, expected, rtol=1e-5, atol=1e-7)
        valid = z[mask.bool()]
        if step % 2 == 1:
            # first mini-batch of a generation batch: on-policy, ratio exactly 1, and the dump says so
            assert valid.abs().max().item() == 0.0 and meta["on_policy"] == "1"
        else:
            # second mini-batch: the policy moved after step 1, so ratios differ from 1
            assert valid.abs().max().item() > 1e-3 and meta["on_policy"] == "0"
    rows = _rows(out)
    # KPO clips the filtered ratio off-policy (q = v makes the filter follow z closely, past the 4e-4 band)
    assert max(rows[1]["clip_frac"], rows[3]["clip_frac"]) > 0.0
    assert rows[0]["clip_frac"] == rows[2]["clip_frac"] == 0.0
    assert rows[1]["ppo_kl"] != 0.0


@pytest.mark.parametrize("loss", ["vanilla", "gspo"])
def test_clipped_losses_clip_off_policy(tiny_config, loss):
    from kpo.train import run_training

    rows = _rows(run_training(tiny_config(loss, loss=loss)))
    off_policy = [r for r in rows if r["step"] % 2 == 0]
    assert all(r["clip_frac"] == 0.0 for r in rows if r["step"] % 2 == 1)
    assert max(r["clip_frac"] for r in off_policy) > 0.0


def test_resume_reproduces_uninterrupted_run(tiny_config, tiny_cache, tmp_path):
    """A run stopped at step 4, moved to another directory and resumed to step 6 with every setting that does
    not touch the trajectory changed (where and how often it writes, the warm-start cache path) matches the
    uninterrupted run."""
    import shutil

    from kpo.train import run_training

    full = _rows(run_training(tiny_config("full", save_steps=2, max_steps=6)))
    part = tiny_config("part", save_steps=2, max_steps=4)
    run_training(part)
    # simulate a crash after step 4's checkpoint was written, move the run... and continue to step 6
    moved = tmp_path / "moved"
    shutil.move(part.output_dir, moved)
    (tmp_path / "cache-link").symlink_to(tiny_cache)  # another cache_dir holding the same warm start
    part.max_steps, part.resume, part.output_dir, part.cache_dir = (
        6,
        True,
        str(moved),
        str(tmp_path / "cache-link"),
    )
    part.save_steps, part.save_total_limit, part.dump_ratios_every, part.report_to = 0, 1, 1, "tensorboard"
    resumed = _rows(run_training(part))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    skip = {"step_time"}
    for a, b in zip(full, resumed):
        assert {k: v for k, v in a.items() if k not in skip} == pytest.approx(
            {k: v for k, v in b.items() if k not in skip}, rel=1e-5, abs=1e-7
        ), a["step"]


def test_resume_refuses_changed_config(tiny_config):
    from kpo.train import ConfigError, run_training

    config = tiny_config("x", max_steps=2)
    run_training(config)
    config.resume, config.learning_rate = True, 0.5
    with pytest.raises(ConfigError, match="learning_rate: 0.01 -> 0.5"):
        run_training(config)


def test_resume_refuses_a_checkpoint_inside_a_generation_batch(tiny_config):
    """A checkpoint at step 3 of 2-step generation batches (written by an older version) lost the rest of
    batch 2: resuming would regenerate it and silently diverge, so it is refused before anything loads."""
    from kpo.train import ConfigError, run_training
    from kpo.train.checkpoints import mark_complete

    config = tiny_config("mid", max_steps=4, resume=True)
    out = Path(config.output_dir)
    (out / "checkpoint-3").mkdir(parents=True)
    mark_complete(out / "checkpoint-3")
    config.save_yaml(out / "config.yaml")
    with pytest.raises(ConfigError, match="checkpoint-3 ends inside a generation batch .*minibatches=2"):
        run_training(config)


def test_cli_main(tiny_config, capsys):
    from kpo.train.cli import main

    config = tiny_config("cli", max_steps=2, loss="kpo_unclipped")
    # --sft-noise none: the task's own teacher noise, as leaving it out (the same warm start)
    argv = ["--loss-kwargs", "q=1e-3", "--sft-noise", "none", *cli_flags(config, (*TINY_FIELDS, "progress", "loss"))]
    assert main(argv) == 0
    assert "training_dynamics.png" in capsys.readouterr().out
    # 32 sequences do not split into 3 mini-batches; the run dir exists too: both reported, exit code 2
    assert main([*argv, "--minibatches", "3"]) == 2
    err = capsys.readouterr().err
    assert "not divisible by minibatches=3" in err and "already holds a run" in err


def test_real_run_path_with_model_and_dataset(tiny_config, tmp_path):
    """--model PATH and --dataset FILE: problems from kpo.data.math, reward from kpo.rewards.math_reward."""
    pytest.importorskip("math_verify")
    from kpo.train import run_training
    from kpo.train.run import math_reward_fn

    # math_reward on TRL's completion shapes: plain text and chat turns; answers arrive JSON-encoded
    assert math_reward_fn(
        ["so \\boxed{4}", [{"role": "assistant", "content": "\\boxed{5}"}]], answer=['"4"', '"4"']
    ) == [1.0, 0.0]
    warm = run_training(tiny_config("warm", max_steps=2)) / "final"
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(f'{{"problem": "{a}+{b}", "answer": "{a + b}"}}\n' for a in range(3) for b in range(3))
    )
    # without the tiny config's embedded task, model shape and warm start: --model and --dataset replace them
    embedded = ("task", "n_terms", "max_value", "tiny_hidden_size", "tiny_layers", "tiny_heads", "cache_dir")
    config = tiny_config(
        "real",
        model=str(warm),
        dataset=str(data),
        max_steps=2,
        prompts_per_step=4,
        max_completion_length=8,
        instruction="",
        **{k: getattr(TrainConfig(), k) for k in (*embedded, "sft_examples", "sft_epochs")},
    )
    rows = _rows(run_training(config))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["reward_mean"]) for r in rows)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_gradient_accumulation_matches_whole_mini_batch(tiny_config, agg):
    """micro_batch_size splits each 16-sequence mini-batch in two; the loss (and the entropy metric) divide by
    the whole mini-batch's counts, so the trajectory equals the unsplit run's up to float rounding. Under
    token-mean the halves hold different token counts: a mean of per-half entropies would differ."""
    from kpo.train import run_training

    kw = {"loss": "vanilla", "max_steps": 4, "loss_agg_mode": agg}
    whole = _rows(run_training(tiny_config("whole", **kw)))
    split = _rows(run_training(tiny_config("split", micro_batch_size=8, **kw)))
    for a, b in zip(whole, split):
        for key in ("reward_mean", "pg_loss", "ppo_kl", "clip_frac", "entropy", "grad_norm", "ratio_max"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), (a["step"], key)


def test_dr_grpo_divides_by_the_longest_allowed_response(tiny_config, monkeypatch):
    """seq-mean-token-sum-norm's constant is max_completion_length for every batch, not the batch's padded width
    (which changes from batch to batch and with GPU padding)."""
    import kpo.train.trainer as trainer_mod
    from kpo.train import run_training

    real, seen = trainer_mod.policy_loss, []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("loss_scale_factor"))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_mod, "policy_loss", spy)
    config = tiny_config(
        "drgrpo",
        loss="vanilla",
        loss_agg_mode="seq-mean-token-sum-norm",
        max_steps=2,
        max_completion_length=9,
    )
    run_training(config)
    assert seen and set(seen) == {9}


def _snapshot(out: Path) -> dict:
    """Every file under out with its bytes and modification time."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()}


def test_resume_of_a_finished_run_changes_nothing(tiny_config, capsys):
    """Resuming at the last checkpoint's step is a no-op that says so (exit 0); resuming with max_steps below it
    is refused with both numbers and the fix. Neither trains a step, writes a checkpoint or touches a file."""
    from kpo.train import ConfigError, run_training
    from kpo.train.cli import main

    config = tiny_config("done", max_steps=4)
    out = run_training(config)
    before = _snapshot(out)
    config.resume = True
    assert run_training(config) == out
    assert "already complete (checkpoint-4, max_steps=4)" in capsys.readouterr().err
    config.max_steps = 2
    with pytest.raises(
        ConfigError,
        match=r"already trained 4 steps \(checkpoint-4\), past max_steps=2; to train "
        r"further raise --max-steps above 4, or start a new --output-dir",
    ):
        run_training(config)
    assert main(["--config", str(out / "config.yaml"), "--resume"]) == 0
    assert f"the run in {out} is already complete" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4]


def test_weights_load_in_float32_whatever_the_checkpoint_dtype(tiny_config, tmp_path):
    # bf16 training is autocast over float32 masters: an AdamW step at lr 1e-6 is below a bf16 weight's
    # resolution, so training bf16 weights directly would leave most of them unchanged.
    from kpo.testbed.tiny import build_model, build_tokenizer
    from kpo.train.run import _load_model

    tokenizer = build_tokenizer()
    build_model(tokenizer).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    model, _ = _load_model(tmp_path / "bf16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_vllm_mismatch_metrics_reach_metrics_jsonl(tiny_config, monkeypatch):
    # TRL's vLLM path logs its importance-sampling correction once per generation batch under sampling/...:
    # here TRL's generation logs it as that path does (0.9 for the first batch, 0.8 for the second), and the
    # real logging path must write it to every optimizer step trained on that batch
    from trl import GRPOTrainer

    from kpo.train import run_training

    generate = GRPOTrainer._generate_and_score_completions
    values = iter([0.9, 0.8])

    def generate_with_vllm_metrics(self, inputs):
        output = generate(self, inputs)
        if self.model.training:
            self._metrics["train"]["sampling/importance_sampling_ratio/mean"].append(next(values))
            self._metrics["train"]["sampling/unknown"].append(1.0)  # not a metric kpo knows: left out
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate_with_vllm_metrics)
    rows = _rows(run_training(tiny_config(max_steps=4)))  # 2 optimizer steps per generation batch
    assert [r["sampling/importance_sampling_ratio/mean"] for r in rows] == [0.9, 0.9, 0.8, 0.8]
    assert all("sampling/unknown" not in r for r in rows)
