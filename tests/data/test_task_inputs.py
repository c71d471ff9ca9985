"""What `kpo task` refuses before it builds a warm start or writes a file (issue 48): one line naming the setting,
what is wrong and the fix, never kpo train's usage or a traceback."""

from __future__ import annotations

import re

import pytest

from kpo.cli import main


@pytest.fixture
def no_warm_start(monkeypatch):
    """Fail the test instead of building a warm start: what kpo task must refuse before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("kpo task built a warm start")

    monkeypatch.setattr("kpo.train.run.model_path", refuse)


# the chain task: kpo train's checks of the default (running) task draw its splits, about 10 s
CHAIN = ("--", "--task", "chain")


def _refused(capsys, *argv: str) -> str:
    """kpo task ARGV: status 2, one line on stderr (no usage, no traceback); that line."""
    assert main(["task", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys, no_warm_start):
    """A traceback (FileExistsError)."""
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    err = _refused(capsys, "--out", str(blocker), *CHAIN)
    assert err == f"kpo task: --out {blocker}: {str(blocker)!r} is a file, not a folder; choose another --out\n"
    assert blocker.read_text() == "mine"


def test_an_empty_out_is_refused(tmp_path, capsys, monkeypatch, no_warm_start):
    """`--out ''` wrote into the current folder and replaced ./model."""
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, "--out", "", *CHAIN)
    assert err.startswith("kpo task: --out '': empty, so the files would replace ./model")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry, kind", [("model", "a file"), ("train.parquet", "a folder")])
def test_an_entry_of_the_other_kind_in_out_is_refused_and_left_as_it_is(tmp_path, capsys, no_warm_start, entry, kind):
    """D/model a file of the user's: the message named kpo's .model.partial, which was left behind."""
    out = tmp_path / "D"
    out.mkdir()
    (out / entry).mkdir() if kind == "a folder" else (out / entry).write_text("mine")
    err = _refused(capsys, "--out", str(out), *CHAIN)
    assert f"--out {out}: {str(out / entry)!r} is {kind}, where kpo task writes its" in err
    assert "choose another --out" in err and ".partial" not in err
    assert sorted(p.name for p in out.iterdir()) == [entry]


@pytest.mark.parametrize(
    "flags, message",
    [
        # settings of RL, which kpo task does not run: they were ignored
        (["--learning-rate", "5"], "-- --learning-rate: kpo task writes the task and its warm start and trains no "),
        (["--task", "chain", "--loss", "gspo"], "-- --loss: kpo task writes the task and its warm start"),
        (["--config", "run.yaml"], "-- --config: kpo task writes .* give the task's settings of the YAML as flags"),
        # kpo train's 50 lines of usage came before the error
        (["--bogus-flag", "1"], "-- --bogus-flag 1: not a kpo train flag; kpo task takes --task, --n-terms, "),
        (["--seed", "abc"], "-- argument --seed: invalid int value: 'abc'"),
        # numpy's "Seed must be between 0 and 2**32 - 1" came after 10 s of building the warm start
        (["--seed", "-5"], r"-- seed=-5: must be in \[0, 4294967295\] \(numpy's seed range\)"),
        (["--task", "bogus"], "-- task/n_terms/max_value: invalid TaskConfig: kind='bogus'"),
    ],
)
def test_task_flags_are_checked_in_one_line_before_the_warm_start(tmp_path, capsys, no_warm_start, flags, message):
    err = _refused(capsys, "--out", str(tmp_path / "t"), "--", *flags)
    assert err.startswith("kpo task: ") and re.search(message, err), err
    assert "usage:" not in err and not (tmp_path / "t").exists()


def test_a_split_too_small_is_refused_before_the_warm_start(tmp_path, capsys, no_warm_start):
    err = _refused(capsys, "--out", str(tmp_path / "t"), "--n-train", "100000", *CHAIN)
    assert err.startswith("kpo task: --n-train / --n-test: n=100000: 100000 train problems requested"), err


def test_the_task_and_warm_start_settings_pass(tmp_path):
    """kpo train's defaults of what kpo task does not use (the RL batch) do not refuse a task it can write."""
    from kpo.testbed.cli import task_config

    config, errors = task_config(["--task", "chain", "--n-terms", "2", "--max-value", "4", "--sft-examples", "12"])
    assert errors == [] and (config.task, config.max_value, config.sft_examples) == ("chain", 4, 12)
