"""What kpo compare does with its runs' workers, without training: the worker function (`_execute`) is run in
this process with training and evaluation replaced."""

from __future__ import annotations

import pytest

import kpo.compare
from kpo.compare import Run, _execute


@pytest.fixture
def in_process(monkeypatch):
    """Run `_execute` here: its output stays in this process (no fd redirection to the run's log)."""
    monkeypatch.setattr(kpo.compare, "_log_to", lambda out: out.mkdir(parents=True, exist_ok=True))


def test_a_failed_run_leaves_its_traceback_in_its_log(compare_config, tmp_path, monkeypatch, in_process):
    def deep_inner():
        raise KeyError("missing key")

    monkeypatch.setattr("kpo.train.run.run_training", lambda config: deep_inner())
    out = tmp_path / "run"
    with pytest.raises(KeyError):
        _execute(compare_config(), Run("vanilla", 0), out)
    log = (out / "log.txt").read_text()
    assert "Traceback (most recent call last)" in log and "deep_inner" in log and "KeyError: 'missing key'" in log


def test_evaluation_uses_the_transformers_backend(compare_config, tmp_path, monkeypatch, in_process):
    seen = {}

    def evaluate(model, data, **kwargs):
        seen.update(kwargs)
        return {"macro": {}}

    monkeypatch.setattr("kpo.train.run.run_training", lambda config: None)
    monkeypatch.setattr("kpo.evaluation.evaluate", evaluate)
    _execute(compare_config(), Run("vanilla", 0), tmp_path / "run")
    assert seen["backend"] == "transformers"
