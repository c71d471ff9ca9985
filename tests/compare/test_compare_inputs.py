"""What kpo compare (and kpo compare regimes) refuses at plan time on a user's model, data and verl configuration,
and the settings that used to be dropped or planned twice (issue 48): each in one line naming the setting, what is
wrong and the fix, before anything trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kpo.compare import CompareConfig, CompareError
from kpo.compare.cell import parse_cell
from kpo.compare.cli import config_from_args, main
from kpo.compare.regimes import RegimeConfig


def _model(folder: Path, weights: str = "whole") -> Path:
    """A model folder as save_pretrained leaves it (config, tokenizer, weights), with its weights ``whole``,
    ``missing``, ``cut`` (the end of the file lost), ``garbage`` or ``shard missing`` (an index without its shard)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    if weights == "shard missing":
        index = {"weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        save_file({"w": torch.zeros(4)}, folder / "model-00001-of-00002.safetensors")
    elif weights != "missing":
        save_file({"w": torch.zeros(64)}, folder / "model.safetensors")
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes({"whole": data, "cut": data[:-16], "garbage": b"x" * 64}[weights])
    return folder


@pytest.fixture
def problems(tmp_path) -> Path:
    path = tmp_path / "test.jsonl"
    path.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": "4"}\n')
    return path


def _refused(tmp_path, capsys, *argv: str) -> str:
    """kpo compare ARGV --plan: status 2, no traceback, nothing written; its stderr."""
    out = tmp_path / "cmp"
    assert main(["--plan", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    return err


@pytest.mark.parametrize(
    "weights, message",
    [
        ("missing", "no weights there (one of model.safetensors, "),
        ("cut", "model.safetensors cannot be read (Error while deserializing header"),
        ("garbage", "model.safetensors cannot be read ("),
        ("shard missing", "model.safetensors.index.json lists model-00002-of-00002.safetensors, which are not there"),
    ],
)
def test_a_model_without_readable_weights_is_refused_at_plan_time(
    tmp_path, capsys, no_training, problems, weights, message
):
    """The plan passed (rc 0) and every run then died loading the model; it passes with whole weights."""
    args = ["--dataset", str(problems), "--eval-data", str(problems), "--seeds", "2", "--", "--prompts-per-step", "2"]
    whole = _model(tmp_path / "whole")
    assert main(["--plan", "--out", str(tmp_path / "ok"), "--model", str(whole), *args]) == 0
    capsys.readouterr()
    model = _model(tmp_path / "model", weights)
    err = _refused(tmp_path, capsys, "--model", str(model), *args)
    lines = err.splitlines()  # that line alone
    assert len(lines) == 2 and lines[1].startswith(f"  - --model {model}: {message}"), err
    # the same on verl's engine
    with pytest.raises(CompareError) as e:
        CompareConfig(out=str(tmp_path / "cmp"), engine="verl", model=str(model), eval_data=(str(problems),)).validate()
    assert f"--model {model}: {message}" in str(e.value)


def test_a_model_with_whole_weights_passes_the_check(tmp_path, problems):
    from kpo.compare.checks import _data_errors

    model = _model(tmp_path / "model")
    assert _data_errors(CompareConfig(model=str(model), eval_data=(str(problems),))) == []


def test_an_ablation_arm_listed_twice_is_refused(tmp_path, capsys, no_training):
    """It was planned twice: 8 runs for one contrast."""
    err = _refused(tmp_path, capsys, "--seeds", "2", "--ablation-arms", "auto_memory,auto_memory")
    assert "--ablation-arms: auto_memory listed more than once; list each arm once" in err


@pytest.mark.parametrize(
    "flags", [["--no-matched"], ["--no-ablations"], ["--no-matched", "--no-ablations"]]
)
def test_ablation_arms_that_would_not_run_are_refused(tmp_path, capsys, no_training, flags):
    """--no-matched / --no-ablations dropped the arms --ablation-arms asked for without a word."""
    err = _refused(tmp_path, capsys, *flags, "--ablation-arms", "auto_memory")
    assert f"--ablation-arms auto_memory: not run with {' and '.join(flags)}" in err, err
    # without --ablation-arms, the default ablations are simply left out, as --no-* says
    assert main(["--plan", "--out", str(tmp_path / "ok"), "--seeds", "2", *flags]) == 0


def test_an_empty_out_is_refused(tmp_path, capsys, no_training, monkeypatch):
    """`--out ''` wrote into the current folder (compare and the regime map)."""
    monkeypatch.chdir(tmp_path)
    assert main(["--plan", "--out", ""]) == 2
    assert "--out '': empty, so everything would be written into the current folder; give a folder" in (
        capsys.readouterr().err
    )
    assert main(["regimes", "--plan", "--out", "", "--cells", "none-depth4-lr0.0001"]) == 2
    assert "--out '': empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # the same refusal where the API is called: RegimeConfig checks it itself
    with pytest.raises(CompareError, match="--out '': empty"):
        RegimeConfig(out=" ", cells_only=("none-depth4-lr0.0001",)).validate()


def test_a_file_listed_twice_in_eval_data_is_read_once_with_a_note(tmp_path, capsys, problems, monkeypatch):
    """It was refused as "two files share a name; rename one"."""
    monkeypatch.chdir(problems.parent)
    cfg = config_from_args(["--eval-data", str(problems), problems.name, f"./{problems.name}"])
    assert cfg.eval_data == (str(problems),)
    assert capsys.readouterr().err == f"note: --eval-data lists {problems} more than once; each is read once\n"
    # given to the API twice, it is refused with what is wrong
    with pytest.raises(CompareError, match=f"--eval-data: {problems} listed more than once; list each file once"):
        CompareConfig(out=str(tmp_path / "cmp"), eval_data=(str(problems), str(problems))).validate()


@pytest.mark.parametrize("flag", ["--dataset", "--eval-data"])
def test_a_data_file_kpo_does_not_read_names_the_formats_it_reads(tmp_path, capsys, no_training, problems, flag):
    """`--dataset data.csv` got "row 0 (line 1): invalid JSON"."""
    data = tmp_path / "data.csv"
    data.write_text("problem,answer\n1+1,2\n")
    model = _model(tmp_path / "model")
    extra = ["--eval-data", str(problems)] if flag == "--dataset" else []
    err = _refused(tmp_path, capsys, "--model", str(model), flag, str(data), *extra)
    assert (
        f"{flag} {data}: a .csv file, which kpo does not read; convert it to one of .jsonl: one JSON object a line; "
        ".json: a list of objects; .parquet: a table of rows"
    ) in err, err
    assert "invalid JSON" not in err


def test_eval_data_of_an_undetected_format_is_told_a_fix_kpo_compare_has(tmp_path, capsys, no_training):
    """It suggested --problem-key/--answer-key, flags kpo compare does not have."""
    data = tmp_path / "bench.jsonl"
    data.write_text('{"q": "1+1", "a": "2"}\n')
    err = _refused(tmp_path, capsys, "--eval-data", str(data))
    assert (
        f"--eval-data {data}: row 0 (line 1): cannot detect the format from fields ['a', 'q']; kpo compare reads the "
        "formats kpo eval detects (docs/eval.md): rename the fields problem and answer"
    ) in err, err
    assert "--problem-key" not in err and "problem_key" not in err


def test_verl_s_dataset_is_its_parquet(tmp_path, problems):
    with pytest.raises(CompareError) as e:
        CompareConfig(out=str(tmp_path / "cmp"), engine="verl", dataset=str(problems), eval_data=(str(problems),)).validate()
    assert f"--dataset {problems}: a .jsonl file, which verl does not read; convert it to one of .parquet" in str(e.value)


@pytest.mark.parametrize("flag", ["--dataset", "--eval-data", "--verl-config"])
def test_a_folder_given_for_a_file_is_called_a_folder(tmp_path, capsys, no_training, problems, flag):
    """It was "no such file", though the path exists."""
    folder = tmp_path / "data"
    folder.mkdir()
    model = _model(tmp_path / "model")
    extra = {"--dataset": ["--eval-data", str(problems)], "--verl-config": ["--engine", "verl"]}.get(flag, [])
    err = _refused(tmp_path, capsys, "--model", str(model), flag, str(folder), *extra)
    assert f"{flag} {folder}: a folder" in err and "no such file" not in err, err


@pytest.mark.parametrize(
    "content, message",
    [
        ("42\n", "a YAML int (42), not a verl configuration; start it with `defaults: [ppo_trainer, _self_]`"),
        ("", "empty, not a verl configuration; start it with `defaults: [ppo_trainer, _self_]`"),
        ("data:\n  train_batch_size: 6\n", "its defaults do not name verl's ppo_trainer, so it lacks verl's settings"),
        ("defaults: [: x\n", "not YAML ("),
    ],
)
def test_a_verl_config_that_is_not_one_is_blamed_not_the_override(tmp_path, problems, content, message):
    """42 gave "OSError: Invalid loaded object type: int"; an empty YAML or one without verl's ppo_trainer gave
    "Could not override 'data.val_files'", blaming the override."""
    yaml = tmp_path / "ppo.yaml"
    yaml.write_text(content)
    with pytest.raises(CompareError) as e:
        CompareConfig(
            out=str(tmp_path / "cmp"), engine="verl", verl_config=str(yaml), eval_data=(str(problems),),
            train_args=(f"data.val_files={problems}",),
        ).validate()  # fmt: skip
    assert f"--verl-config {yaml}: {message}" in str(e.value), e.value
    assert "Could not override" not in str(e.value)


def test_verl_s_example_config_passes_the_check():
    from kpo.compare.engines.verl_config import verl_config_errors

    assert verl_config_errors(str(Path(__file__).parents[2] / "examples" / "verl" / "cpu_tiny.yaml")) == []


def test_steps_that_do_not_end_a_generation_batch_name_compare_s_flags(tmp_path, capsys, no_training):
    """It said "use max_steps=12", kpo train's field."""
    err = _refused(tmp_path, capsys, "--steps", "10")
    assert "--steps=10: must be a multiple of --minibatches=4 (a run ends with a whole generation batch): use " in err
    assert "--steps=12" in err and "max_steps" not in err


def test_an_out_under_a_file_is_said_once(tmp_path, capsys, no_training):
    """"choose another --out" was printed once per run (six lines for the default arms), and once per cell of a
    regime map."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--plan", "--quick", "--out", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.count("choose another --out") == 1 and f"--out: {str(blocker)!r} is a file" in err, err
    cells = "none-depth4-lr0.0001,bf16-depth2-lr0.001"
    assert main(["regimes", "--plan", "--out", str(blocker), "--cells", cells, "--seeds", "4"]) == 2
    assert capsys.readouterr().err.count("choose another --out") == 1


@pytest.mark.parametrize(
    "cell, problem",
    [
        ("none-depth4", "no '-lr' part"),
        ("none-4-lr0.001", "no '-depth' part"),
        ("nne-depth4-lr0.001", "mismatch 'nne' is not one of none, bf16, fp8"),
        ("none-depthx-lr0.001", "depth 'x' is not an integer >= 1"),
        ("none-depth0-lr0.001", "depth '0' is not an integer >= 1"),
        ("none-depth4-lrabc", "lr 'abc' is not a finite number > 0"),
        ("none-depth4-lr-1", "lr '-1' is not a finite number > 0"),
    ],
)
def test_a_cell_in_a_wrong_form_says_what_is_wrong_with_it(cell, problem):
    """A generic line with the format, not what was wrong."""
    with pytest.raises(ValueError) as e:
        parse_cell(cell)
    assert str(e.value) == f"cell {cell!r}: {problem}; write MISMATCH-depthN-lrX, e.g. none-depth4-lr0.0001"


def test_the_regime_map_keeps_of_each_run_what_keep_says(tmp_path, monkeypatch):
    """`kpo compare regimes` had no --keep: every cell kept the default (a map's hundreds of runs on a cluster)."""
    from kpo.compare.regimes import cli, map_plan
    from kpo.compare.study.plan import cell_config

    seen = {}

    def fake_run(cfg, **_):
        seen["cfg"] = cfg

    monkeypatch.setattr(cli, "run_regimes", fake_run)
    argv = ["regimes", "--out", str(tmp_path / "map"), "--cells", "none-depth4-lr0.0001,bf16-depth4-lr0.0005"]
    assert main([*argv, "--keep", "none"]) == 0
    plan = map_plan(seen["cfg"].validate())
    assert [cell_config(plan, cell, "GRPO", tmp_path).keep for cell in plan["cells"]] == ["none", "none"]
    assert main(argv) == 0 and seen["cfg"].keep == CompareConfig.keep == "hf"
