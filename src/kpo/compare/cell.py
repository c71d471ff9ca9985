"""A regime of the sampler's mismatch, the off-policy depth and the learning rate: one cell of a regime map or a
study (each engine maps it to its own settings: :meth:`kpo.compare.engines.Engine.cell_settings`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

__all__ = ["MISMATCH", "Cell", "parse_cell"]

MISMATCH = ("none", "bf16", "fp8")  # the sampler's mismatch levels (docs/compare.md says what each is)


@dataclass(frozen=True)
class Cell:
    """One regime: the sampler's mismatch, the off-policy depth and the learning rate."""

    mismatch: str
    depth: int
    lr: float

    @functools.cached_property
    def name(self) -> str:
        return f"{self.mismatch}-depth{self.depth}-lr{self.lr:g}"


def parse_cell(text: str) -> Cell:
    """``none-depth4-lr0.0001`` (a cell's name) -> Cell; ValueError saying what is wrong with it otherwise (a part
    missing, or which part is not a mismatch level, an integer depth >= 1 or a finite learning rate > 0)."""
    mismatch, has_depth, rest = text.partition("-depth")
    depth, has_lr, lr = rest.partition("-lr")
    if not has_depth or not has_lr:
        problem = f"no '-{'depth' if not has_depth else 'lr'}' part"
    elif mismatch not in MISMATCH:
        problem = f"mismatch {mismatch!r} is not one of {', '.join(MISMATCH)}"
    elif not (depth.isdigit() and int(depth) >= 1):
        problem = f"depth {depth!r} is not an integer >= 1"
    else:
        try:
            rate = float(lr)
        except ValueError:
            rate = math.nan
        if rate > 0 and math.isfinite(rate):
            return Cell(mismatch, int(depth), rate)
        problem = f"lr {lr!r} is not a finite number > 0"
    raise ValueError(f"cell {text!r}: {problem}; write MISMATCH-depthN-lrX, e.g. none-depth4-lr0.0001")
