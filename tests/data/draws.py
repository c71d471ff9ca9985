"""``no_more_draws(monkeypatch, most)``: a synthetic split whose size is checked before anything is drawn passes;
one built first fails fast instead of running for hours (``kpo.testbed.task.load_split`` draws a problem, then
asks which split it hashes to)."""

from __future__ import annotations

import kpo.testbed.task as synthetic


def no_more_draws(monkeypatch, most: int) -> None:
    """Fail the test (AssertionError) at the ``most + 1``-th problem ``load_split`` draws in it."""
    drawn = 0
    is_test = synthetic._is_test

    def counted(problem: str) -> bool:
        nonlocal drawn
        drawn += 1
        assert drawn <= most, f"more than {most} problems drawn: a size was not checked before building"
        return is_test(problem)

    monkeypatch.setattr(synthetic, "_is_test", counted)
