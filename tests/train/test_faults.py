"""What a kill or a full disk at any moment of `kpo train` leaves, and that `--resume` then repeats the
uninterrupted run's metrics step for step (kpo.train.checkpoints, kpo._files; issue 34).

The faults are injected deterministically into copies of one uninterrupted reference run (STEPS steps, a checkpoint
every 2, the last two kept):
- a kill during the save of checkpoint-STEPS: that checkpoint cut at each of its files in turn (the files before it
  whole, it half written, the rest absent), and all of them written but not yet recorded as complete;
- a kill while final/ or the last metrics row was written;
- a full disk during a save: a small tmpfs as the output dir, filled to leave the save too little room, where this
  machine lets the test mount one (root with mount rights); elsewhere the optimizer's write raises ENOSPC as the
  file system would (monkeypatched);
- an output dir on a read-only file system (a read-only tmpfs as root; a folder without write permission
  otherwise).
The resumed runs go through the command (`kpo.cli.main`) in this process, so its one-line messages and exit
statuses are checked too."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from kpo.cli import main as kpo
from kpo.train.checkpoints import RECORD
from kpo.train.config import TrainConfig

from .conftest import cli_flags

pytestmark = pytest.mark.slow

STEPS = 6
SAVE = ("--save-steps", "2", "--progress", "false")


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _trajectory(out: Path) -> list[dict]:
    """Every metric of every step but the wall-clock time."""
    return [{k: v for k, v in r.items() if k != "step_time"} for r in _rows(out)]


@pytest.fixture(scope="module")
def reference(tiny_config_in, tmp_path_factory) -> Path:
    """The uninterrupted run: STEPS steps, checkpoint-4 and checkpoint-6 kept, final/."""
    config = tiny_config_in(tmp_path_factory.mktemp("reference"))("full", max_steps=STEPS)
    assert kpo(["train", *cli_flags(config), *SAVE]) == 0
    out = Path(config.output_dir)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", f"checkpoint-{STEPS}"]
    return out


def _copy(run: Path, to: Path) -> Path:
    """A copy of ``run`` whose config.yaml names its new place."""
    shutil.copytree(run, to)
    config = TrainConfig.from_yaml(to / "config.yaml")
    config.output_dir = str(to)
    config.save_yaml(to / "config.yaml")
    return to


def _resume(out: Path, capsys) -> tuple[int, list[str]]:
    """`kpo train --config OUT/config.yaml --resume`: (exit status, its stderr lines), checking no traceback."""
    status = kpo(["train", "--config", str(out / "config.yaml"), "--resume", *SAVE])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return status, [line for line in err.splitlines() if line.startswith("kpo train: ")]


def _checkpoint_files(checkpoint: Path) -> list[str]:
    return list(json.loads((checkpoint / RECORD).read_text())["files"])


def test_a_complete_checkpoint_records_every_file_it_holds(reference):
    checkpoint = reference / f"checkpoint-{STEPS}"
    files = json.loads((checkpoint / RECORD).read_text())["files"]
    on_disk = {p.name: p.stat().st_size for p in checkpoint.iterdir() if p.name != RECORD}
    assert files == on_disk and {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(files)
    assert len(files) == FILES  # each is cut in turn below


# The files of a checkpoint of the tiny run (model, config, generation config, tokenizer (2), training args,
# optimizer, scheduler, random-number states, trainer state); each in turn is the one cut short, in the record's
# order, and None: all written, the record not yet.
FILES = 10
CUTS = [*range(FILES), None]


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: "no-record" if c is None else f"file{c}")
def test_a_checkpoint_cut_while_it_was_written_is_set_aside(reference, tmp_path, capsys, cut):
    """A kill during the save of checkpoint-6 (after row 6, before final/): the resume sets the cut checkpoint
    aside, says so, continues from checkpoint-4 and repeats steps 5 and 6 exactly."""
    out = _copy(reference, tmp_path / "run")
    shutil.rmtree(out / "final")
    checkpoint = out / f"checkpoint-{STEPS}"
    files = _checkpoint_files(checkpoint)
    (checkpoint / RECORD).unlink()
    if cut is not None:
        name = files[cut]
        data = (checkpoint / name).read_bytes()
        (checkpoint / name).write_bytes(data[: len(data) // 2])
        for later in files[cut + 1 :]:
            (checkpoint / later).unlink()

    status, lines = _resume(out, capsys)
    assert status == 0
    assert lines[0].startswith(
        f"kpo train: set aside checkpoint-{STEPS}, which is incomplete (no {RECORD}: its save was cut"
    ), lines
    assert lines[0].endswith(f"as incomplete-checkpoint-{STEPS}; delete it once you no longer need it")
    assert lines[1] == f"kpo train: resuming from checkpoint-4 (step 4 of {STEPS})"
    assert (out / f"incomplete-checkpoint-{STEPS}").is_dir()
    assert _trajectory(out) == _trajectory(reference)


def test_every_file_cut_short_or_missing_makes_a_checkpoint_incomplete(reference, tmp_path):
    """What the record catches besides its own absence: any listed file shorter, longer or gone (a save cut after
    the record cannot happen; a rotation cut while it deleted an old checkpoint can)."""
    from kpo.train.checkpoints import incomplete_reason, last_complete

    out = _copy(reference, tmp_path / "run")
    checkpoint = out / f"checkpoint-{STEPS}"
    assert incomplete_reason(checkpoint) is None and last_complete(out) == checkpoint
    for name in _checkpoint_files(checkpoint):
        path = checkpoint / name
        data = path.read_bytes()
        path.write_bytes(data[:-1])
        assert incomplete_reason(checkpoint) == (
            f"{name} has {len(data) - 1} bytes, not the {len(data)} it was saved with"
        )
        path.unlink()
        assert incomplete_reason(checkpoint) == f"{name} is missing"
        assert last_complete(out) == out / "checkpoint-4"
        path.write_bytes(data)
    (checkpoint / RECORD).write_text("{")
    assert incomplete_reason(checkpoint) == f"{RECORD} is not a checkpoint record"


def test_a_torn_last_metrics_row_is_dropped_on_resume(reference, tmp_path, capsys):
    """A kill while row 6 was appended (checkpoint-6 not begun): the half row is dropped, said once, and written
    again by the resumed run."""
    out = _copy(reference, tmp_path / "run")
    shutil.rmtree(out / f"checkpoint-{STEPS}")
    shutil.rmtree(out / "final")
    data = (out / "metrics.jsonl").read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1  # where row 6 begins
    torn = (len(data) - last) // 2
    (out / "metrics.jsonl").write_bytes(data[: last + torn])

    status, lines = _resume(out, capsys)
    assert status == 0
    assert lines[:2] == [
        f"kpo train: dropped the torn last line of {out / 'metrics.jsonl'} ({torn} bytes, cut while it was "
        "written)",
        f"kpo train: resuming from checkpoint-4 (step 4 of {STEPS})",
    ]
    assert _trajectory(out) == _trajectory(reference)


def test_a_run_cut_while_it_wrote_final_writes_it_on_resume(reference, tmp_path, capsys):
    """final/ is written aside and renamed: a kill leaves no final/ (and a partial folder beside it), and the
    resume writes it from checkpoint-6 without training."""
    out = _copy(reference, tmp_path / "run")
    shutil.move(out / "final", out / ".final.partial")
    (out / ".final.partial" / "model.safetensors").write_bytes(b"cut")

    status, lines = _resume(out, capsys)
    assert status == 0 and lines[0] == (
        f"kpo train: checkpoint-{STEPS} is the run's last step but final/ is missing (cut while it was written): "
        "writing it"
    )
    assert not (out / ".final.partial").exists()
    for name in ("model.safetensors", "tokenizer.json"):
        assert (out / "final" / name).read_bytes() == (reference / "final" / name).read_bytes()
    assert _trajectory(out) == _trajectory(reference)
    assert _resume(out, capsys)[1][0].startswith(f"kpo train: the run in {out} is already complete")


# Room left on the disk when checkpoint-6's save begins: its model (57 kB) fits, its optimizer (123 kB) does not.
ROOM = 100_000


def test_a_full_disk_during_a_save_is_one_line_and_the_run_resumes(
    reference, tiny_config, tmpfs, tmp_path, monkeypatch, capsys
):
    """The save of checkpoint-6 runs out of space: one line that names the checkpoint and what to do, exit 74,
    checkpoint-4 kept; once there is room, the same command with --resume repeats the uninterrupted run."""
    from kpo.train.trainer import KPOTrainer

    disk = tmpfs("disk", "size=4m")
    ballast = []
    save = KPOTrainer._save_checkpoint

    def fill_then_save(self, model, trial):
        if self.state.global_step == STEPS:
            if disk is None:  # no tmpfs here: the optimizer's write fails as a full disk's does
                import torch

                write = torch.save

                def no_space(obj, f, *args, **kwargs):
                    if str(f).endswith("optimizer.pt"):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    return write(obj, f, *args, **kwargs)

                monkeypatch.setattr(torch, "save", no_space)
            else:
                free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
                ballast.append(disk / "ballast")
                ballast[0].write_bytes(b"\0" * (free - ROOM))
        return save(self, model, trial)

    monkeypatch.setattr(KPOTrainer, "_save_checkpoint", fill_then_save)
    config = tiny_config(max_steps=STEPS, output_dir=str((disk or tmp_path) / "run"))
    status = kpo(["train", *cli_flags(config), *SAVE])
    err = capsys.readouterr().err
    out = Path(config.output_dir)
    assert status == 74 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"kpo train: {out}/checkpoint-{STEPS}: no space left on the device; free space there or write elsewhere, "
        "then continue the run with the same command and --resume (from its last complete checkpoint)"
    )
    assert not (out / "final").exists() and [r["step"] for r in _rows(out)] == list(range(1, STEPS + 1))

    monkeypatch.undo()
    for path in ballast:
        path.unlink()
    status, lines = _resume(out, capsys)
    assert status == 0 and lines[1] == f"kpo train: resuming from checkpoint-4 (step 4 of {STEPS})"
    assert _trajectory(out) == _trajectory(reference)


def test_an_output_dir_that_cannot_be_written_is_refused_up_front(tiny_config, read_only_dir, capsys):
    """Checked with the config, before the warm start or any training: one line, exit 2, nothing created."""
    folder, why = read_only_dir
    for out in (folder, folder / "run"):
        assert kpo(["train", *cli_flags(tiny_config(output_dir=str(out)))]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"  - output_dir={str(out)!r}: {str(folder)!r} {why}; choose another --output-dir"
        )
    assert not any(folder.iterdir())


def test_resume_into_a_missing_folder_creates_nothing(tiny_config, tmp_path, capsys):
    out = tmp_path / "no-such-run"
    assert kpo(["train", *cli_flags(tiny_config(output_dir=str(out))), "--resume"]) == 2
    assert f"resume: output_dir={str(out)!r} does not exist" in capsys.readouterr().err
    assert not out.exists()


def test_a_run_whose_only_checkpoint_was_cut_says_to_start_again(reference, tmp_path, capsys):
    """A full disk during the first save left checkpoint-N without its record: --resume sets it aside and says
    there is nothing to resume from (it was "ValueError: Can't find a valid checkpoint" and a traceback)."""
    out = _copy(reference, tmp_path / "run")
    shutil.rmtree(out / "final")
    shutil.rmtree(out / f"checkpoint-{STEPS}")
    (out / "checkpoint-4" / RECORD).unlink()
    assert kpo(["train", "--config", str(out / "config.yaml"), "--resume", *SAVE]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("kpo train: set aside checkpoint-4, which is incomplete") and err[1:] == [
        "kpo train: invalid training config:",
        f"  - resume: no complete checkpoint-* in {out}; start the run again with --overwrite (save_steps sets how "
        "often a run is checkpointed)",
    ]
    assert not list(out.glob("checkpoint-*"))
