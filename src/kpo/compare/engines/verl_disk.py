"""The disk a ``kpo compare --engine verl`` run takes (:mod:`kpo.compare.engines.verl`), for the plan: at most
:data:`BYTES_PER_PARAMETER` a parameter per checkpoint, two on disk while one is written (docs/compare.md, "Scoring
and disk")."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from kpo.compare.contract import size_text

__all__ = ["BYTES_PER_PARAMETER", "checkpoint_bytes", "disk_line", "kept_bytes", "parameters"]

BYTES_PER_PARAMETER = 16  # float32 weights 4, Adam's moments 8, Hugging Face weights at most 4
HF_BYTES_PER_PARAMETER = 4
STATE_BYTES = 1 << 20  # verl's data.pt, extra state and tracker files (kilobytes), with room to spare


def parameters(model: Path) -> int | None:
    """The parameters of the model in the Hugging Face folder ``model``, counted from its safetensors files'
    headers (no weight is read); None where it has none here (a hub id, a path only the cluster sees)."""
    files = sorted(model.glob("*.safetensors")) if model.is_dir() else []
    if not files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def _other_files(model: Path) -> int:
    """The bytes of the model folder's files other than its weights (tokenizer, configuration)."""
    return sum(p.stat().st_size for p in model.iterdir() if p.is_file() and p.suffix != ".safetensors")


def checkpoint_bytes(model: Path, params: int) -> int:
    """One checkpoint of the actor of ``params`` parameters, at most: :data:`BYTES_PER_PARAMETER` a parameter, the
    model folder's other files, verl's state files."""
    return BYTES_PER_PARAMETER * params + _other_files(model) + STATE_BYTES


def kept_bytes(model: Path, params: int, keep: str, checkpoints: int) -> int:
    """What stays of a scored run's checkpoints under ``--keep``: the final Hugging Face weights (``hf``), all its
    ``checkpoints`` (``all``), nothing (``none``)."""
    return {
        "hf": HF_BYTES_PER_PARAMETER * params + _other_files(model),
        "all": checkpoints * checkpoint_bytes(model, params),
        "none": 0,
    }[keep]


def disk_line(model: Path, batches: int, save_freq: int, keep: str) -> str:
    """The plan's line on a run's disk: at most while it trains (two checkpoints: the last and the next while it
    is written; with ``--keep all`` every checkpoint of its ``batches`` verl steps at ``save_freq``; <= 0: kpo saves
    the last step only) and what ``keep`` leaves once it is scored."""
    params = parameters(model)
    if params is None:
        return f"disk per run: not estimated ({model} holds no safetensors weights on this machine)"
    freq = save_freq if save_freq > 0 else batches
    saves = batches // freq + (1 if batches % freq else 0)  # verl also saves the last step
    held = saves if keep == "all" else min(saves, 2)
    return (
        f"disk per run: at most {size_text(held * checkpoint_bytes(model, params))} while it trains ("
        f"{'one checkpoint' if held == 1 else f'{held} checkpoints'} of {params:,} parameters at "
        f"{BYTES_PER_PARAMETER} bytes each: float32 weights, Adam's two moments, Hugging Face weights), "
        f"{size_text(kept_bytes(model, params, keep, saves))} kept once scored (--keep {keep})"
    )
