"""`kpo compare` settings: checked before any run trains, and a finished run is reused only with its settings.
No test here trains (the `no_training` fixture fails a test that would)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kpo.compare import (
    CompareConfig,
    CompareError,
    Run,
    _stale_run_errors,
    _train_argv,
    config_from_args,
    main,
    run_compare,
)
from kpo.compare_report import _claims
from kpo.train.config import parse_args


def test_quick_mode_shrinks_only_what_is_not_set():
    assert (CompareConfig(quick=True).steps, CompareConfig(quick=True).sweep_seeds) == (120, 1)
    assert CompareConfig(quick=True).eval_n == 4
    assert CompareConfig().eval_n == 8
    assert CompareConfig(quick=True, eval_n=8).eval_n == 8
    assert config_from_args(["--quick", "--eval-n", "8"]).eval_n == 8
    assert config_from_args(["--quick"]).eval_n == 4
    assert config_from_args([]).eval_n == 8


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--jobs", "-1"], "--jobs=-1: must be an integer >= 1 (or omit it for one per CPU)"),
        (["--jobs", "0"], "--jobs=0: must be an integer >= 1 (or omit it for one per CPU)"),
        (["--sweep-seeds", "0"], "--sweep-seeds=0: must be an integer in 1..3 (or omit it for all seeds)"),
        (["--seeds", "2", "--sweep-seeds", "3"], "--sweep-seeds=3: must be an integer in 1..2"),
        (["--steps", "0"], "--steps=0: must be an integer >= 1 (or omit it for kpo train's default)"),
        # The default task (sums of two numbers up to 19) has 40 test problems.
        (
            ["--eval-limit", "41"],
            "--eval-limit=41: more problems than the task's test split can supply; use 1..40",
        ),
        (["--eval-n", "0"], "--eval-n=0: must be an integer >= 1"),
        (["--methods", ","], "--methods: give at least one loss name"),
        (
            ["--", "--max-steps", "5"],
            "-- --max-steps: kpo compare sets it for every run; use --steps instead",
        ),
        (["--", "--n-terms", "1"], "run vanilla-seed0: n_terms/max_value"),
        # a YAML file could set what compare owns (loss_kwargs, max_steps, resume) unseen
        (["--", "--config", "run.yaml"], "-- --config: a YAML file could set what kpo compare sets itself"),
        # sums of two numbers up to 1: too few problems for any test split
        (["--", "--max-value", "1"], "held-out evaluation: the task"),
    ],
)
def test_main_rejects_bad_settings_before_training(tmp_path, capsys, no_training, argv, message):
    out = tmp_path / "cmp"
    assert main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert not out.exists()  # no compare.json claiming settings that never ran


def test_every_bad_setting_is_reported_at_once(compare_config):
    with pytest.raises(CompareError) as e:
        compare_config(jobs=0, steps=0, sweep_seeds=0).validate()
    assert [err.split("=")[0] for err in e.value.errors] == ["--steps", "--sweep-seeds", "--jobs"]


def test_eval_limit_up_to_the_test_split_is_accepted(tmp_path):
    CompareConfig(out=str(tmp_path), eval_limit=40).validate()


def test_aliases_become_canonical_names(compare_config):
    cfg = compare_config(methods=("grpo", "kpo")).validate()
    assert cfg.methods == ("vanilla", "kpo")


@pytest.mark.parametrize(
    "methods, message",
    [
        (("kpo", "kpo"), "--methods: kpo, kpo all name the loss 'kpo'; list each loss once"),
        (("vanilla", "grpo"), "--methods: vanilla, grpo all name the loss 'vanilla'; list each loss once"),
        (("vanilla", "nope"), "--methods: unknown policy loss 'nope'"),
    ],
)
def test_duplicate_and_unknown_methods_are_rejected(compare_config, tmp_path, no_training, methods, message):
    with pytest.raises(CompareError, match=message):
        run_compare(compare_config(methods=methods))
    assert not (tmp_path / "cmp").exists()


def _fake_done_run(cfg: CompareConfig, run: Run, problems: int = 2) -> Path:
    """A run directory as a finished run leaves it (config.yaml, metrics.jsonl, eval.json), made with ``cfg``."""
    folder = Path(cfg.out) / "runs" / run.name
    folder.mkdir(parents=True)
    parse_args(_train_argv(cfg, run, folder)).save_yaml(folder / "config.yaml")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    results = {"params": {"n": cfg.eval_n}, "benchmarks": {"synthetic": {"problems": problems}}}
    (folder / "eval.json").write_text(json.dumps(results))
    return folder


def test_a_finished_run_with_its_own_settings_is_reused(compare_config):
    cfg = compare_config(methods=("kpo",)).validate()
    runs = [Run("kpo", 0), Run("kpo", 0, (("q", 1e-2),))]
    for run in runs:
        _fake_done_run(cfg, run)
    # config.yaml round-trips (loss_kwargs floats, None fields): the same settings are not a change.
    assert _stale_run_errors(cfg, runs, Path(cfg.out)) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"steps": 6}, "max_steps: 4 -> 6"),
        ({"minibatches": 1}, "minibatches: 2 -> 1"),
        ({"train_args": "--learning-rate 2e-2"}, "learning_rate: 0.01 -> 0.02"),
        ({"eval_n": 3}, "eval_n: 2 -> 3"),
        ({"eval_limit": 1}, "held-out problems: 2 -> 1"),
        # the report analyzes the ratio dumps at the period compare.json records
        ({"dump_every": 2}, "dump_ratios_every: 1 -> 2"),
    ],
)
def test_a_finished_run_with_other_settings_is_refused(
    compare_config, tmp_path, no_training, change, expected
):
    old = compare_config(methods=("kpo",))
    folder = _fake_done_run(old, Run("kpo", 0))
    if "train_args" in change:
        change = {"train_args": (*old.train_args, *change["train_args"].split())}
    with pytest.raises(CompareError) as e:
        run_compare(compare_config(methods=("kpo",), **change))
    message = str(e.value)
    assert f"run kpo-seed0 ({folder}) was made with other settings: {expected}" in message
    assert "use a new --out, or delete the run directories above" in message
    assert not (tmp_path / "cmp" / "compare.json").exists()


def _table1(means: dict[str, float]) -> dict:
    return {"eval_keys": ["avg@2"], "rows": {m: {"avg@2": (v, 0.0)} for m, v in means.items()}}


@pytest.mark.parametrize(
    "means, verdict",
    [
        (
            {"kpo": 0.5, "vanilla": 0.5, "gspo": 0.4},
            "does not hold (kpo ties with vanilla): kpo 50.0, best other (vanilla) 50.0; best overall: kpo, vanilla",
        ),
        (
            {"kpo": 0.6, "vanilla": 0.5, "gspo": 0.5},
            "holds: kpo 60.0, best other (gspo) 50.0; best overall: kpo.",
        ),
        (
            {"kpo": 0.4, "vanilla": 0.5, "gspo": 0.5},
            "does not hold: kpo 40.0, best other (gspo) 50.0; best overall: gspo, vanilla",
        ),
    ],
)
def test_table1_verdict_does_not_depend_on_method_order(means, verdict):
    lines = {
        tuple(_claims(list(order), {}, _table1(means), {}, {})) for order in itertools.permutations(means)
    }
    assert len(lines) == 1, lines
    [line] = lines.pop()
    assert verdict in line, line
