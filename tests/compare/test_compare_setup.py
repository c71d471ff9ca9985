"""kpo compare on a user's setup: --model/--dataset/--eval-data with kpo's trainer (end to end on the embedded task
written as files by `kpo task`), the outcome of a model (kpo.compare.outcome), and what --engine verl refuses before
anything trains (no verl needed: tests/integrations/test_verl_compare.py runs verl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kpo.cli import main as kpo_main
from kpo.compare import CompareConfig, CompareError, run_compare
from kpo.compare.engines.verl import PAPER_CLIP
from kpo.compare.engines.verl_metrics import metrics_rows
from kpo.compare.outcome import load_outcome

from .conftest import TOY_TRAIN

# TOY_TRAIN's task and warm-start flags (kpo task's), and its RL flags (kpo compare's `--`), with a response budget
# that fits the toy model's context (kpo task prints it)
TASK_FLAGS = TOY_TRAIN[: TOY_TRAIN.index("--prompts-per-step")]
RL_FLAGS = (*TOY_TRAIN[TOY_TRAIN.index("--prompts-per-step") :], "--max-completion-length", "12")


@pytest.fixture
def task_files(tmp_path, capsys) -> dict[str, Path]:
    """`kpo task`: the toy task's 12 training and 2 held-out problems as files, and its warm start."""
    out = tmp_path / "task"
    assert (
        kpo_main(
            [
                "task",
                "--out",
                str(out),
                "--n-train",
                "12",
                "--n-test",
                "2",
                "--",
                *TASK_FLAGS,
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    assert "--max-completion-length 12" in capsys.readouterr().out
    return {"model": out / "model", "train": out / "train.parquet", "test": out / "test.parquet"}


@pytest.mark.slow
def test_kpo_engine_on_your_model_data_and_benchmarks(task_files, tmp_path):
    cfg = CompareConfig(
        out=str(tmp_path / "cmp"),
        methods=("vanilla", "kpo"),
        seeds=2,
        steps=4,
        minibatches=2,
        matched=False,
        ablations=False,
        aa_seeds=0,
        eval_n=2,
        dump_every=1,
        jobs=2,
        model=str(task_files["model"]),
        dataset=str(task_files["train"]),
        eval_data=(str(task_files["test"]),),
        train_args=RL_FLAGS,
    )
    _graded_by_the_task(task_files)
    report = run_compare(cfg)
    data = json.loads((report.parent / "report.json").read_text())
    # paired by seed, on the held-out file's problems, avg@n (no exact accuracy off the embedded task)
    contrast = data["contrasts"]["kpo - vanilla"]
    assert contrast["seeds"] == 2 and len(contrast["per_seed"]) == 2
    assert "held-out avg@2 over the 2 problems of test" in report.read_text()
    runs = Path(cfg.out) / "runs"
    for name in ("vanilla-seed0", "kpo-seed0", "vanilla-seed1", "kpo-seed1"):
        config = (runs / name / "config.yaml").read_text()
        assert str(task_files["model"]) in config and str(task_files["train"]) in config
        outcome = load_outcome(runs / name)
        assert outcome is not None and not outcome["exact"] and len(outcome["per_problem"]) == 2
        assert (runs / name / "ratios").is_dir()
    # every seed starts from --model: evaluated once, the same start row for both seeds
    assert (runs / "warm_start-seed0" / "eval.json").read_text() == (
        runs / "warm_start-seed1" / "eval.json"
    ).read_text()
    assert set(data["table1"]["rows"]) == {"warm start (no RL)", "vanilla", "kpo"}


def _graded_by_the_task(task_files) -> None:
    """The files kpo task wrote are graded by the task's grader (kpo.testbed.files), not math-verify."""
    from kpo.data.math import load_problems
    from kpo.testbed.files import compute_score, task_of_rows

    rows = load_problems(task_files["test"])
    task = task_of_rows(rows)
    assert task is not None and task.kind == "chain"
    answer = rows[0]["answer"]
    assert compute_score("kpo_chain", answer, answer) == 1.0 and compute_score("kpo_chain", "0+0=0", "7") == 0.0
    with pytest.raises(ValueError, match="grades the embedded task's rows"):
        compute_score("math500", answer, answer)
    with pytest.raises(ValueError, match="rows of several graders"):
        task_of_rows([*rows, {"id": "x", "problem": "1+1", "answer": "2"}])


@pytest.mark.parametrize(
    "setup, message",
    [
        (dict(eval_data=("missing.jsonl",)), r"--eval-data missing.jsonl: .*no such file"),
        (dict(verl_config="ppo.yaml"), "--verl-config ppo.yaml: a verl configuration needs --engine verl"),
        (
            dict(engine="verl", train_args=("actor_rollout_ref.actor.clip_ratio_high=0.28",)),
            r"-- actor_rollout_ref.actor.clip_ratio_high=...: kpo compare sets it for every run; use --methods",
        ),
        (
            dict(engine="verl", train_args=("data.seed=3",)),
            "-- data.seed=...: kpo compare sets it .* use --seeds",
        ),
        (
            dict(engine="verl", model="m", train_args=("actor_rollout_ref.model.path=m",)),
            "both set the same thing; give it once",
        ),
        (dict(engine="verl", methods=("vanilla", "cispo")), "--methods cispo: not mapped to verl"),
        (dict(engine="verl"), "--engine verl: give the held-out benchmarks with --eval-data"),
        (
            dict(train_args=("--model", "m")),
            r"-- --model: kpo compare sets it for every run; use --model instead",
        ),
    ],
)
def test_a_setup_that_cannot_run_is_refused_before_anything_trains(tmp_path, no_training, setup, message):
    with pytest.raises(CompareError, match=message):
        CompareConfig(out=str(tmp_path / "cmp"), seeds=2, **setup).validate()
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("method", sorted(PAPER_CLIP))
def test_the_clip_range_verl_runs_is_the_method_s_paper_one(method):
    # kpo.losses defaults each method to its paper band; verl's actor config defaults every loss to 0.2/0.2, so the
    # verl engine sets PAPER_CLIP: the loss with it given must equal the loss's default, value and clip fractions,
    # and differ from another band (ratios within a few percent of 1; KPO with a short memory, so its filtered
    # ratios move too)
    from kpo import policy_loss

    g = torch.Generator().manual_seed(0)
    old = torch.full((4, 9), -1.0)  # log-probabilities: at most 0
    new = old + torch.randn(4, 9, generator=g) * 0.05
    adv, mask = torch.randn(4, generator=g), torch.ones(4, 9, dtype=torch.bool)
    extra = {"memory": 2.0} if method == "kpo" else {}
    low, high = PAPER_CLIP[method]
    other = 0.02 if low == 0.2 else 0.2
    batch = {"log_prob": new, "old_log_prob": old, "advantages": adv, "response_mask": mask}
    default = policy_loss(method, **batch, **extra)
    given = policy_loss(method, **batch, clip_ratio_low=low, clip_ratio_high=high, **extra)
    elsewhere = policy_loss(method, **batch, clip_ratio_low=other, clip_ratio_high=other, **extra)
    assert torch.equal(default[0], given[0]) and default[1] == given[1]
    assert default[1]["pg_clipfrac"] != elsewhere[1]["pg_clipfrac"]


def test_verl_metrics_become_kpo_rows():
    rows = [{"step": 1, "data": {"critic/score/mean": 0.5, "actor/entropy": 1.2, "actor/pg_clipfrac": 0.1}}]
    (row,) = metrics_rows(rows, steps_per_batch=4)
    assert (row["step"], row["reward_mean"], row["entropy"], row["clip_frac"]) == (4, 0.5, 1.2, 0.1)
    assert row["critic/score/mean"] == 0.5 and row["pg_loss"] is None


def test_the_outcome_is_the_exact_accuracy_else_avg_at_n(tmp_path):
    results = {
        "params": {"n": 4},
        "benchmarks": {
            "a": {"problems": 2, "per_problem": [{"correct": 4}, {"correct": 1}]},
            "b": {"problems": 1, "per_problem": [{"correct": 0}]},
        },
    }
    assert load_outcome(tmp_path) is None
    (tmp_path / "eval.json").write_text(json.dumps(results))
    found = load_outcome(tmp_path)
    assert found["per_problem"] == [1.0, 0.25, 0.0] and found["mean"] == pytest.approx(1.25 / 3)
    assert found["metric"] == "held-out avg@4 over the 3 problems of a, b" and not found["exact"]
    (tmp_path / "expected.json").write_text(json.dumps({"mean": 0.3, "per_problem": [0.2, 0.4]}))
    assert load_outcome(tmp_path)["per_problem"] == [0.2, 0.4] and load_outcome(tmp_path)["exact"]


@pytest.mark.slow
def test_a_regime_map_on_the_chain_task_finishes(tmp_path, capsys):
    # the chain task has no exact accuracy: collapses, pairing and "done" read kpo eval's avg@n (the map used to
    # train every run and stay pending for ever); its warm starts are the chain task's, checked as a study's
    from kpo.compare.cli import main

    out = tmp_path / "map"
    argv = ["regimes", "--out", str(out), "--cells", "none-depth2-lr0.01", "--seeds", "2", "--batches", "2"]
    argv += [
        "--eval-n",
        "2",
        "--eval-limit",
        "2",
        "--jobs",
        "2",
        "--",
        # the toy's settings but its learning rate, which the cell sets (lr0.01)
        *(flag for i, flag in enumerate(TOY_TRAIN) if "--learning-rate" not in TOY_TRAIN[max(i - 1, 0) : i + 1]),
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main(argv) == 0
    found = json.loads((out / "report.json").read_text())
    assert found["ended"] and found["runs"] == 4 * 2
    (cell,) = found["descriptive"]["stable"]["cells"].values()
    assert all(len(arm["accuracy"]) == 2 for arm in cell.values())
    # one learning rate: the stable questions, tested on avg@2 at 2 seeds; the stress and bf16 ones not asked
    assert set(found["questions"]) == {"kpo_vs_grpo", "kpo_vs_gspo", "auto_vs_grpo", "auto_vs_gspo", "matched_vs_auto"}
    assert all(q["looks"][-1]["seeds"] == 2 for q in found["questions"].values())
