"""Progress shown by kpo's commands, and the libraries' own bars.

On a terminal: tqdm bars. In a log (the stream is not a terminal): a line each time a bar passes another tenth
of its total, never tqdm's carriage-return stream, which fills a log with every redraw. With progress off:
nothing. The trainer's own output is :mod:`kpo.train.progress`, built on the same rules.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

__all__ = ["LineBar", "clock", "library_bars", "progress_bar"]

LINES_PER_BAR = 10  # outside a terminal: a line every tenth of a bar's total,
MIN_SECONDS = 1.0  # but not more often than this (a fast loop gets its first and last line only)


def clock(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def library_bars(enabled: bool, stream: TextIO | None = None) -> None:
    """Turn off, process-wide, the progress bars of transformers, huggingface_hub and datasets unless
    ``enabled`` and ``stream`` (default stderr) is a terminal; otherwise leave them as they are (so an
    ``HF_*_DISABLE_PROGRESS_BARS`` setting is respected)."""
    if enabled and (stream or sys.stderr).isatty():
        return
    import datasets
    from transformers.utils import logging

    logging.disable_progress_bar()  # also huggingface_hub's
    datasets.disable_progress_bars()


def progress_bar(total: int, desc: str, unit: str, *, enabled: bool = True, stream: TextIO | None = None):
    """A tqdm bar on a terminal, a :class:`LineBar` elsewhere, a silent one when not ``enabled``. ``stream``
    defaults to stderr, where tqdm draws."""
    stream = stream or sys.stderr
    if enabled and stream.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=stream)
    return LineBar(total, desc, unit, stream if enabled else None)


class LineBar:
    """The part of tqdm's interface kpo uses (``n``, ``update``, ``refresh``, ``set_postfix``, ``write``,
    ``close``, ``with``) as lines ``desc: n/total unit (p%), m:ss elapsed[, postfix]``: at the start, each time
    ``n`` passes another tenth of ``total`` at least ``min_seconds`` after the last line, and at the end.
    ``stream`` None: silent (``write`` still prints)."""

    def __init__(
        self, total: int, desc: str, unit: str, stream: TextIO | None, min_seconds: float = MIN_SECONDS
    ):
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.n, self.postfix = 0, ""
        self._every, self._min_seconds = max(1, math.ceil(total / LINES_PER_BAR)), min_seconds
        self._next, self._printed = 0, None
        self._start = self._last = time.monotonic()
        self.refresh()

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def refresh(self) -> None:
        """Print a line if ``n`` reached the next tenth (and ``min_seconds`` passed), or the end."""
        now = time.monotonic()
        end = self.n >= self.total
        due = end or self._printed is None or (self.n >= self._next and now - self._last >= self._min_seconds)
        if self.stream is None or self.total <= 0 or not due or self._printed == self.n:
            return
        percent = 100 * self.n // self.total
        extra = f", {self.postfix}" if self.postfix else ""
        print(
            f"{self.desc}: {self.n}/{self.total} {self.unit} ({percent}%), {clock(now - self._start)} elapsed{extra}",
            file=self.stream,
            flush=True,
        )
        self._printed, self._last, self._next = self.n, now, (self.n // self._every + 1) * self._every

    def write(self, text: str) -> None:
        """A message between progress lines (as ``tqdm.write``: to stdout)."""
        print(text, flush=True)

    def close(self) -> None:
        self.stream = None

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
