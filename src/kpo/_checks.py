"""Input checks shared by the public entry points (the filter, the policy losses, the commands' paths)."""

from __future__ import annotations

import os
from pathlib import Path


def file_in_the_way(folder: Path) -> Path | None:
    """The file that stands where ``folder`` or one of its parents must be a directory, or None."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    return None if existing.is_dir() else existing


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in ``folder`` (created if missing), or None: its nearest existing folder is on a
    read-only file system or not writable by this user (root writes any folder of a writable file system)."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    why = "is on a read-only file system" if os.statvfs(existing).f_flag & os.ST_RDONLY else "is not writable"
    return f"{str(existing)!r} {why}"


# Files that hold a tokenizer's vocabulary, one of which save_pretrained writes (fast, BPE, WordPiece,
# SentencePiece). Without any, AutoTokenizer builds a one-token tokenizer from the model's config instead of
# failing, and generation fails later on empty prompts.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")


def no_tokenizer(model: Path) -> str | None:
    """What is missing when the model directory ``model`` holds no tokenizer, or None."""
    if any((model / name).is_file() for name in TOKENIZER_FILES):
        return None
    return (
        f"no tokenizer files in this directory (one of {', '.join(TOKENIZER_FILES)}); save the tokenizer beside "
        "the model (tokenizer.save_pretrained(DIR))"
    )


def with_values(**tensors) -> None:
    """ValueError naming the first of ``tensors`` (name -> tensor, or anything else, which passes) that is on the
    meta device: a shape without values (a model built under ``torch.device("meta")``), which kpo cannot compute
    on. Torch-free: reads ``is_meta``."""
    for name, tensor in tensors.items():
        if getattr(tensor, "is_meta", False):
            raise ValueError(
                f"{name} is on the meta device (a shape without values, as a model built under "
                "torch.device('meta') gives): kpo computes on values; load the weights, or move it to cpu or cuda"
            )


def bool_mask(mask):
    """``mask`` as a bool tensor of the same shape: bool as is, 0/1 of any dtype converted.

    ValueError when it holds anything else, naming how many such entries and the first one's index and value.
    """
    import torch

    if mask.dtype == torch.bool:
        return mask
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"mask must hold only 0 and 1 (or be bool): {int(bad.sum())} other value(s), first "
            f"{mask[first].item()!r} at index {first}"
        )
    return mask != 0


# What kpo reads as problems (kpo.data.math.load_problems)
PROBLEM_FILES = {
    ".jsonl": "one JSON object a line",
    ".json": "a list of objects",
    ".parquet": "a table of rows",
}


def file_errors(flag: str, path: str, kinds: dict[str, str], what: str, reader: str = "kpo") -> list[str]:
    """A file setting that is a folder, missing, or of a kind ``reader`` does not read (``kinds``: suffix -> what
    it holds)."""
    found = Path(path)
    accepted = "; ".join(f"{suffix}: {text}" for suffix, text in kinds.items())
    if found.is_dir():
        return [f"{flag} {path}: a folder, not a file; give {what} as a file ({accepted})"]
    if not found.is_file():
        return [f"{flag} {path}: no such file; give {what} ({accepted})"]
    if found.suffix.lower() not in kinds:
        return [
            f"{flag} {path}: a {found.suffix or 'suffix-less'} file, which {reader} does not read; convert it to one of "
            f"{accepted}"
        ]
    return []
