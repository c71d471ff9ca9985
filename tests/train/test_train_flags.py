"""`kpo train`'s command line on TRL's parser: the flags of its help are the ones it had before (kpo_train_flags.txt,
captured from the hand-built parser it replaced, plus TRL's --no-progress), `none` sets any optional field, the YAML
file under --config is read as TRL's scripts read theirs, and the flags given are told apart from defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kpo.train.flags import build_parser, parse_args

BEFORE = Path(__file__).with_name("kpo_train_flags.txt")


def _help_flags(text: str) -> set[str]:
    """The option strings of an argparse help text's option lines ("  -h, --help", "  --a A, --b A   help")."""
    flags = set()
    for line in text.splitlines():
        if re.match(r"  -", line):
            invocation = re.split(r"\s{2,}", line.strip())[0]
            flags |= {part.split()[0] for part in invocation.split(", ")}
    return flags


def test_help_lists_the_flags_of_the_parser_it_replaced(capsys):
    from kpo.train.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    shown = _help_flags(capsys.readouterr().out)
    before = set(BEFORE.read_text().split())
    assert len(before) == 98 and "--loss-kwargs" in before and "--sft_noise" in before
    # TRL's parser adds the complement of a true-by-default bool; nothing else changes
    assert shown - before == {"--no_progress", "--no-progress"}
    assert before - shown == set()


def test_none_sets_any_optional_field():
    config = parse_args(
        ["--sft-noise", "none", "--micro-batch-size", "None", "--rollout-is", "null", "--bf16", "none"]
    )
    assert (config.sft_noise, config.micro_batch_size, config.rollout_is, config.bf16) == (None, None, None, None)
    assert parse_args(["--sft-noise", "0.05"]).sft_noise == 0.05
    # a bare bool flag is true, bf16's too (an optional bool); TRL's --no-progress is false
    assert parse_args(["--bf16", "--resume"]).bf16 is True
    assert parse_args(["--no-progress"]).progress is False
    # report_to is text, not optional: its "none" is the text
    assert parse_args(["--report-to", "none"]).report_to == "none"


def test_the_yaml_file_is_read_as_trl_reads_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KPO_TEST_FLAG", raising=False)
    path = tmp_path / "run.yaml"
    path.write_text(
        "env: {KPO_TEST_FLAG: set}\n"  # TRL's: environment variables
        "learning_rate: 1e-4\n"  # YAML 1.1 text, a number
        "rollout_rs_threshold: 2.0\n"  # a number, for a text field
        "micro_batch_size: none\n"
        "loss_kwargs: {q: 1e-4, mask_mode: zero}\n"
    )
    config = parse_args(["--config", str(path), "--loss-kwargs", "v=2", "--loss-kwargs", "p0=0.5"])
    assert config.learning_rate == 1e-4 and config.rollout_rs_threshold == "2.0"
    assert config.micro_batch_size is None
    # the command line's pairs on top of the file's mapping, each --loss-kwargs on the ones before
    assert config.loss_kwargs == {"q": 1e-4, "mask_mode": "zero", "v": 2, "p0": 0.5}
    import os

    assert os.environ["KPO_TEST_FLAG"] == "set"


def test_a_parser_without_defaults_says_which_flags_were_given(tmp_path):
    given = vars(build_parser("kpo compare --", defaults=False).parse_args(["--max-steps", "4", "--no-progress"]))
    assert given == {"max_steps": 4, "progress": False}
    with_file = build_parser(defaults=False).parse_args(["--config", "x.yaml", "--loss-kwargs", "q=1"])
    assert vars(with_file) == {"config": "x.yaml", "loss_kwargs": {"q": 1}}
