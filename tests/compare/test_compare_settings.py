"""`kpo compare` settings: checked before any run trains, and a finished run is reused only with its settings.
No test here trains (the `no_training` fixture fails a test that would)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from kpo.compare import CompareConfig, CompareError, Run, run_compare
from kpo.compare.claims import paper_claims
from kpo.compare.cli import config_from_args, main
from kpo.compare.contrasts import contrast
from kpo.compare.run import _stale_run_errors
from kpo.losses.kpo import KALMAN_LOSSES


@pytest.mark.parametrize("text", ["8,zero", "-3", "inf"])
def test_a_bad_sweep_memory_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as e:
        config_from_args(["--sweep-memory", text])
    assert e.value.code == 2
    assert "give memories in tokens (> 0), 'matched' or 'paper', comma-separated" in capsys.readouterr().err
    assert config_from_args(["--sweep-memory", "8, matched,8,paper"]).sweep_memory == (
        "8",
        "matched",
        "paper",
    )


def test_quick_mode_shrinks_only_what_is_not_set():
    assert (
        CompareConfig(quick=True).steps,
        CompareConfig().steps,
        CompareConfig(quick=True, steps=8).steps,
    ) == (40, 80, 8)
    seeds = ("seeds", "ablation_seeds", "aa_seeds")
    assert [getattr(CompareConfig(quick=True), k) for k in seeds] == [2, 1, 1]
    assert [getattr(CompareConfig(), k) for k in seeds] == [12, 4, 6]
    # fewer seeds than the ablations' and the A/A arm's defaults: they shrink with them
    assert [getattr(CompareConfig(seeds=3), k) for k in seeds] == [3, 3, 3]
    assert [getattr(config_from_args(["--quick", "--seeds", "5"]), k) for k in seeds] == [5, 1, 1]
    assert CompareConfig(quick=True, eval_n=8).eval_n == 8
    assert config_from_args(["--quick", "--eval-n", "8"]).eval_n == 8
    assert config_from_args([]).eval_n == 4
    assert config_from_args(["--aa-seeds", "0"]).aa_seeds == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--jobs", "-1"], "--jobs=-1: must be an integer >= 1 (or omit it for one per CPU)"),
        (["--jobs", "0"], "--jobs=0: must be an integer >= 1 (or omit it for one per CPU)"),
        (["--sweep-seeds", "0"], "--sweep-seeds=0: must be an integer in 1..12 (or omit it for all seeds)"),
        (["--aa-seeds", "13"], "--aa-seeds=13: must be an integer in 0..12 (or omit it for 6 seeds)"),
        (["--seeds", "2", "--ablation-seeds", "3"], "--ablation-seeds=3: must be an integer in 1..2"),
        # omitted, the A/A arm's and the ablations' seeds are at most --seeds (and --quick's)
        (["--aa-seeds", "3", "--seeds", "2"], "--aa-seeds=3: must be an integer in 0..2 (or omit it for 2 seeds)"),
        (["--quick", "--ablation-seeds", "5"], "--ablation-seeds=5: must be an integer in 1..2 (or omit it for 1 seed)"),
        (["--seeds", "2", "--sweep-seeds", "3"], "--sweep-seeds=3: must be an integer in 1..2"),
        (["--steps", "0"], "--steps=0: must be an integer >= 1 (or omit it for 80 steps)"),
        # The chain task (sums of two numbers up to 19) has 40 test problems.
        (
            ["--eval-limit", "41", "--", "--task", "chain"],
            "--eval-limit=41: n=41: 41 test problems requested but the task",
        ),
        (["--eval-n", "0"], "--eval-n=0: must be an integer >= 1"),
        (
            ["--steps", "4", "--dump-every", "5"],
            "--dump-every=5 is longer than --steps=4: no ratio dump would be written, so Table 2 would be "
            "empty: use --dump-every=4 (or more --steps)",
        ),
        (["--dump-every", "81"], "--dump-every=81 is longer than --steps=80"),
        (["--quick", "--dump-every", "41"], "--dump-every=41 is longer than --steps=40"),
        # 4 steps per generation batch: step 5 is the first of the second batch, on-policy
        (
            ["--steps", "8", "--dump-every", "5"],
            "--dump-every=5 with --steps=8 dumps only step 5, the first (on-policy) step of a generation batch "
            "of --minibatches=4; Table 2 analyzes off-policy steps: use --dump-every=4 (or more --steps)",
        ),
        (["--methods", ","], "--methods: give at least one loss name"),
        (["--ablation-arms", "clip_band,foo"], "--ablation-arms ['foo']: unknown; choose among clip_band,"),
        (
            ["--", "--max-steps", "5"],
            "-- --max-steps: kpo compare sets it for every run; use --steps instead",
        ),
        (["--", "--task", "chain", "--n-terms", "1"], "run vanilla-seed0: task/n_terms/max_value"),
        # a YAML file could set what compare owns (loss_kwargs, max_steps, resume) unseen
        (["--", "--config", "run.yaml"], "-- --config: a YAML file could set what kpo compare sets itself"),
        # sums of two numbers up to 1: too few problems for kpo train's warm start (its own check, per run)
        (["--", "--task", "chain", "--max-value", "1"], "run vanilla-seed0: sft_examples=200"),
        # up to 2: enough for a small warm start, too few for any test split
        (
            ["--", "--task", "chain", "--max-value", "2", "--sft-examples", "4", "--prompts-per-step", "4"],
            "held-out evaluation: the task",
        ),
    ],
)
def test_main_rejects_bad_settings_before_training(tmp_path, capsys, no_training, argv, message):
    out = tmp_path / "cmp"
    assert main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert not out.exists()  # no compare.json claiming settings that never ran


def test_seeds_out_of_range_blames_only_seeds(tmp_path, capsys, no_training):
    # the ablations' and the A/A arm's seeds follow --seeds when omitted: 0 seeds is one error, not three
    assert main(["--out", str(tmp_path / "cmp"), "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert "--seeds=0: must be an integer in 1..200 (or omit it for 12 seeds)" in err
    assert "--ablation-seeds" not in err and "--aa-seeds" not in err, err


@pytest.mark.parametrize(
    "steps, dump_every, minibatches",
    [(4, 4, 4), (4, 1, 2), (8, 7, 4), (12, 5, 4), (3, 3, 1), (None, 5, 4)],
)

def test_a_dump_period_with_an_off_policy_dump_is_accepted(compare_config, steps, dump_every, minibatches):
    compare_config(steps=steps, dump_every=dump_every, minibatches=minibatches, sweep_memory=()).validate()


def test_help_shows_each_default_once_and_as_used():
    from kpo.compare.cli import build_parser

    text = build_parser().format_help()
    # one block per option: its line and the wrapped help lines under it, whitespace normalized
    blocks = {
        b.split()[0]: " ".join(b.split())
        for b in re.split(r"\n(?=  -)", text.split("options:")[1])
        if b.strip()
    }
    for flag, block in blocks.items():
        if flag not in ("-h,", "--quick"):
            assert block.count("default") == 1, block
    assert "default: None" not in text and "default: False" not in text
    expected = {
        "--steps": "default: 80; --quick: 40",
        "--seeds": "default: 12; --quick: 2",
        "--ablation-seeds": "default: 4 or --seeds if fewer; --quick: 1",
        "--aa-seeds": "default: 6 or --seeds if fewer; --quick: 1",
        "--sweep-seeds": "default: 1",
        "--eval-n": "default: 4; --quick: 4",
        "--jobs": "default: one per CPU",
        "--sweep-memory": "default: none",
        "--dump-every": "default: 5",
        "--methods": "default: vanilla,gspo",
    }
    for flag, default in expected.items():
        assert default in blocks[flag], blocks[flag]


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


def test_a_finished_run_with_its_own_settings_is_reused(compare_config, fake_done_run):
    cfg = compare_config(methods=("kpo",)).validate()
    runs = [Run("kpo", 0), Run("kpo", 0, (("memory", 2.0),)), Run("kpo", 0, (("memory", "matched"),))]
    for run in runs:
        fake_done_run(cfg, run)
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
    compare_config, fake_done_run, tmp_path, no_training, change, expected
):
    old = compare_config(methods=("kpo",))
    folder = fake_done_run(old, Run("kpo", 0))
    if "train_args" in change:
        change = {"train_args": (*old.train_args, *change["train_args"].split())}
    with pytest.raises(CompareError) as e:
        run_compare(compare_config(methods=("kpo",), **change))
    message = str(e.value)
    assert f"run kpo-seed0 ({folder}) was made with other settings: {expected}" in message
    assert "use a new --out, or delete the run directories above" in message
    assert not (tmp_path / "cmp" / "compare.json").exists()


def _groups(methods, right: dict[str, int] | None = None) -> dict:
    """One flat-reward run per method, as the Figure 3 claim reads it, evaluated on 200 problems x 4 samples:
    ``right[m]`` problems (default 100) all 4 right, the others none."""
    summary = {"first": 0.5, "peak": 0.5, "final": 0.5, "entropy_first": 1.0, "entropy_final": 1.0}
    right = right or {}
    return {
        m: [
            {
                "summary": summary,
                "n": 4,
                "counts": [4] * right.get(m, 100) + [0] * (200 - right.get(m, 100)),
                "outcome": {"per_problem": [1.0] * right.get(m, 100) + [0.0] * (200 - right.get(m, 100))},
            }
        ]
        for m in methods
    }


def _claim_lines(methods, right=None, sweep=None) -> list[str]:
    """The claims as the report makes them for one seed of each method, kpo the subject."""
    groups = _groups(methods, right)
    baselines = [m for m in methods if m not in KALMAN_LOSSES]
    results = (
        {f"kpo - {b}": {"kind": "key", **contrast(groups["kpo"], groups[b], {})} for b in baselines}
        if "kpo" in methods
        else {}
    )
    return paper_claims(list(methods), groups, results, baselines, {}, sweep or {}, "kpo")


@pytest.mark.parametrize(
    "right, verdict",
    [
        # 100 of 200 problems each: the difference is exactly 0 on every problem, so "equivalent", not better
        ({"kpo": 100, "vanilla": 100, "gspo": 80}, "does not hold: points"),
        # kpo's right problems hold every baseline's (the same problems first), 40 more than the best: +20
        # points, whose interval over problems (one seed) is about +-6 points (sd 0.4 / sqrt(200) x 1.97)
        ({"kpo": 140, "vanilla": 100, "gspo": 90}, "holds: points"),
        ({"kpo": 80, "vanilla": 100, "gspo": 100}, "does not hold: points"),
    ],
)
def test_table1_verdict_comes_from_intervals_and_not_from_method_order(right, verdict):
    lines = {_claim_lines(order, right)[0] for order in itertools.permutations(right)}
    assert len(lines) == 1, lines
    [line] = lines
    assert line.startswith("- **Table 1: kpo has the best held-out accuracy** — " + verdict), line
    assert "kpo - vanilla " + format((right["kpo"] - right["vanilla"]) / 2, "+.1f") in line, line


@pytest.mark.parametrize(
    "methods, claim, reason",
    [
        (
            ["kpo", "gspo"],
            "Figure 3",
            "not tested: --methods has no vanilla (add it: --methods kpo,gspo,vanilla)",
        ),
        (
            ["vanilla", "gspo"],
            "Table 1",
            "not tested: --methods has no kpo (add it: --methods vanilla,gspo,kpo)",
        ),
        (["kpo"], "Table 1", "not tested: no baseline without a filter beside it (add e.g. vanilla,gspo)"),
        (["kpo"], "Figure 3", "not tested: --methods has no vanilla (add it: --methods kpo,vanilla)"),
        (["kpo"], "Table 2", "not tested: no method has off-policy ratio dumps (Table 2 says why)"),
        (["kpo"], "Figure 4", "not tested: no memory sweep (--sweep-memory '')"),
    ],
)
def test_a_claim_that_cannot_be_tested_says_why(methods, claim, reason):
    lines = _claim_lines(methods)
    # every claim has one line, in the order of the paper's sections
    assert [line.split(":")[0] for line in lines] == [
        "- **Table 1",
        "- **Figure 3",
        "- **Figure 3",
        "- **Table 2",
        "- **Figure 4",
    ]
    matching = [line for line in lines if line.startswith(f"- **{claim}:")]
    assert matching and all(reason in line for line in matching), matching


def test_a_sweep_of_one_q_is_not_tested():
    sweep = {"paper": {"memory": 1000.0, "final": (0.5, 0.0)}}
    lines = _claim_lines(["kpo"], sweep=sweep)
    assert (
        lines[-1].startswith("- **Figure 4:") and "not tested: --sweep-memory has one point" in lines[-1]
    ), lines


def test_sweep_values_that_would_share_a_run_directory_are_refused(compare_config, tmp_path, no_training):
    with pytest.raises(CompareError) as e:
        run_compare(compare_config(sweep_memory=("paper", "100", "100.0000001")))
    assert e.value.errors == [
        "--sweep-memory: 100, 100.0000001 would share the run directories kpo-memory100-seed0 (and the other "
        "seeds'); give memories that differ within 6 significant digits"
    ]
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize(
    ("finals", "verdict"),
    [
        ((0.2, 0.3, 0.4), "holds"),  # rising in memory
        ((0.3, 0.3, 0.3), "does not hold"),  # flat: the longest memory must beat the shortest
        ((0.2, 0.4, 0.3), "does not hold"),  # not monotone
        ((0.2, 0.2, 0.3), "holds"),  # non-decreasing and not flat
    ],
)
def test_figure4_claim_needs_a_rise_in_memory_that_is_not_flat(finals, verdict):
    memories = {"8": 8.0, "matched": 31.25, "paper": 1000.0}
    sweep = {p: {"memory": m, "final": (f, 0.0)} for (p, m), f in zip(memories.items(), finals)}
    sweep = dict(reversed(sweep.items()))  # given out of memory order: the rule sorts by memory
    line = _claim_lines(["kpo"], sweep=sweep)[-1]
    assert line.startswith("- **Figure 4:") and f"** — {verdict}: final training reward memory 8 (8)" in line


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file or directory"),
        ('{"contrasts": {}}\n{"contrasts": {}}\n', "not one JSON document"),
        ("[1, 2]", "a JSON list without 'contrasts'"),
        ('{"contrasts": {"a - b": {"kind": "key", "sd": null}}}', "no contrast with a finite measured sd"),
        # Python's json writes an infinite sd as Infinity: it would plan "+-inf points"
        ('{"contrasts": {"a - b": {"kind": "key", "sd": Infinity}}}', "no contrast with a finite measured sd"),
    ],
)
def test_a_pilot_that_is_not_a_finished_report_is_one_line_and_status_2(tmp_path, capsys, no_training, content, message):
    pilot = tmp_path / "report.json"
    if content is not None:
        pilot.write_text(content)
    assert main(["--plan", "--pilot", str(pilot), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert f"--pilot {pilot}: {message}" in err and "Traceback" not in err


def test_compares_advice_names_its_own_flag(tmp_path, capsys, no_training):
    """A run folder that cannot be made (--out is a file): the fix is another --out, kpo compare's flag, not kpo
    train's --output-dir."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--plan", "--out", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert "choose another --out" in err and "--output-dir" not in err


def test_a_pilot_reads_a_compare_s_contrasts_between_arms(tmp_path):
    from kpo.compare.plan import pilot_sd

    compare = tmp_path / "compare.json"
    compare.write_text('{"contrasts": {"a - b": {"kind": "key", "sd": 3.0}, "a - c": {"kind": "ablation", "sd": 4.0}, '
                       '"a - d": null, "a - warm": {"kind": "warm", "sd": 9.0}}}')
    assert pilot_sd(compare) == pytest.approx((12.5) ** 0.5)  # the root mean square of 3 and 4
