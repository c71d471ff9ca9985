"""Checkpoints that are whole or absent.

transformers writes ``checkpoint-N`` in place, file by file (model, optimizer, scheduler, random-number states,
``trainer_state.json``), so a kill or a full disk during a save leaves a folder that looks like a checkpoint and
cannot be resumed. :func:`save_whole` therefore lets transformers write, waits for every process's part, flushes
the files to the disk and then records them, each with its size, in ``kpo_checkpoint.json`` (written aside and
renamed: present means complete). A checkpoint is complete when that record is there and every file it lists has
its size (:func:`incomplete_reason`; this also catches a checkpoint that rotation was deleting when the process
died). ``kpo train --resume`` continues from the newest complete checkpoint and sets the others aside
(:func:`set_aside_incomplete`), renamed, never deleted. Old checkpoints are rotated out (``save_total_limit``)
only once the new one is complete, so the last complete checkpoint survives a cut save.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from kpo._files import flush_to_disk, replacing, writing

__all__ = [
    "RECORD",
    "SET_ASIDE_PREFIX",
    "continue_command",
    "incomplete_reason",
    "last_complete",
    "mark_complete",
    "processes_of",
    "save_whole",
    "set_aside_incomplete",
    "step_of",
]

RECORD = "kpo_checkpoint.json"
# Set-aside checkpoints are renamed out of transformers' "checkpoint-*" (its rotation would count and delete them).
SET_ASIDE_PREFIX = "incomplete-"
_NAME = re.compile(r"checkpoint-(\d+)")


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("-")[-1])


def _checkpoints(out: Path) -> list[Path]:
    """Every ``checkpoint-N`` folder of ``out``, oldest step first."""
    found = [p for p in out.iterdir() if _NAME.fullmatch(p.name) and p.is_dir()] if out.is_dir() else []
    return sorted(found, key=step_of)


def mark_complete(checkpoint: Path) -> None:
    """Record ``checkpoint``'s files and sizes once they are on the disk: from now on it is complete."""
    flush_to_disk(checkpoint)
    files = {
        p.relative_to(checkpoint).as_posix(): p.stat().st_size
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and p.name != RECORD
    }
    with replacing(checkpoint / RECORD) as partial:
        partial.write_text(json.dumps({"step": step_of(checkpoint), "files": files}, indent=1) + "\n")


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed, or None when it is complete."""
    try:
        files = json.loads((checkpoint / RECORD).read_text())["files"]
    except FileNotFoundError:
        return f"no {RECORD}: its save was cut (a kill or a full disk) or kpo did not write it"
    except (ValueError, KeyError, TypeError):
        return f"{RECORD} is not a checkpoint record"
    for name, size in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, not the {size} it was saved with"
    return None


def last_complete(out: Path) -> Path | None:
    """The newest complete checkpoint of ``out``, or None."""
    return next((c for c in reversed(_checkpoints(out)) if incomplete_reason(c) is None), None)


def processes_of(checkpoint: Path) -> int:
    """How many processes wrote ``checkpoint``: transformers saves each one's random-number generators, as
    rng_state_{rank}.pth when there are several and rng_state.pth when there is one."""
    return len(list(checkpoint.glob("rng_state_*.pth"))) or 1


def continue_command(out: Path) -> str:
    """The command that carries on the unfinished run in ``out``: ``--resume`` from its last complete checkpoint, on
    as many processes as wrote it (a resume needs them), or, with no checkpoint, ``--overwrite`` to start again."""
    ckpt = last_complete(out)
    n = 1 if ckpt is None else processes_of(ckpt)
    launch = "kpo train" if n == 1 else f"kpo launch --nproc-per-node {n} train"
    return f"{launch} --config {shlex.quote(str(out / 'config.yaml'))} {'--overwrite' if ckpt is None else '--resume'}"


def set_aside_incomplete(out: Path) -> list[str]:
    """Rename every incomplete checkpoint of ``out`` to ``incomplete-checkpoint-N`` (``-2``, ... if taken); one line
    for each, saying what and why."""
    lines = []
    for checkpoint in _checkpoints(out):
        reason = incomplete_reason(checkpoint)
        if reason is None:
            continue
        target = out / f"{SET_ASIDE_PREFIX}{checkpoint.name}"
        n = 1
        while target.exists():
            n += 1
            target = out / f"{SET_ASIDE_PREFIX}{checkpoint.name}-{n}"
        checkpoint.rename(target)
        lines.append(f"set aside {checkpoint.name}, which is incomplete ({reason}), as {target.name}")
    return lines


def save_whole(trainer, save: Callable[[], None]) -> None:
    """Run ``save()`` (transformers' ``_save_checkpoint`` of ``trainer``, on every process) so that the checkpoint it
    writes is whole or absent (module docstring). A file-system fault raised while writing names the checkpoint
    (:func:`kpo._files.writing`)."""
    from transformers.trainer_utils import rotate_checkpoints

    args = trainer.args
    folder = Path(args.output_dir) / f"checkpoint-{trainer.state.global_step}"
    limit, args.save_total_limit = args.save_total_limit, None  # no rotation before the new one is complete
    try:
        with writing(folder):
            save()
    finally:
        args.save_total_limit = limit
    trainer.accelerator.wait_for_everyone()  # every process's random-number states are written
    if args.should_save:
        with writing(folder):
            mark_complete(folder)
        # as transformers rotates (at the end of the save it replaces)
        rotate_checkpoints(
            output_dir=args.output_dir,
            save_total_limit=limit,
            best_model_checkpoint=trainer.state.best_model_checkpoint,
            use_mtime=True,
        )
