"""What kpo compare does with its runs' workers, without training: the worker function (`_execute`) run in
this process with training and evaluation replaced, and run_compare with forked workers that fake the runs."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import kpo.compare.run
from kpo.compare import Run, run_compare
from kpo.compare.engines.kpo import train_argv
from kpo.compare.run import _execute
from kpo.train.checkpoints import mark_complete
from kpo.train.flags import parse_args


@pytest.fixture
def in_process(monkeypatch):
    """Run `_execute` here: its output stays in this process (no fd redirection to the run's log)."""
    monkeypatch.setattr(kpo.compare.run, "_log_to", lambda out: out.mkdir(parents=True, exist_ok=True))


def test_a_failed_run_leaves_its_traceback_in_its_log(compare_config, tmp_path, monkeypatch, in_process):
    def deep_inner():
        raise KeyError("missing key")

    monkeypatch.setattr("kpo.train.run.run_training", lambda config: deep_inner())
    out = tmp_path / "run"
    with pytest.raises(KeyError):
        _execute(compare_config(), Run("vanilla", 0), out)
    log = (out / "log.txt").read_text()
    assert (
        "Traceback (most recent call last)" in log
        and "deep_inner" in log
        and "KeyError: 'missing key'" in log
    )


def test_evaluation_uses_the_transformers_backend(compare_config, tmp_path, monkeypatch, in_process):
    seen = {}

    def evaluate(model, data, **kwargs):
        seen.update(kwargs)
        return {"macro": {}}

    monkeypatch.setattr("kpo.train.run.run_training", lambda config: None)
    monkeypatch.setattr("kpo.evaluation.evaluate", evaluate)
    _execute(compare_config(), Run("vanilla", 0), tmp_path / "run")
    assert seen["backend"] == "transformers"


# What the fake worker of a run does instead of finishing it (run name -> mode); set before the pool forks.
MODES: dict[str, str] = {}


def fake_execute(cfg, run, out, resume=False) -> dict:
    """A worker that trains nothing: it logs its start as `_execute` does, then finishes the run (the files of
    a done run) or fails as MODES says."""
    from .conftest import write_fake_run

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.txt", "a") as log:
        log.write("started\n")
    if (
        out / "metrics.jsonl"
    ).exists() != resume:  # stale steps for a fresh run; a resumed one keeps its rows
        raise AssertionError(f"{run.name}: metrics.jsonl {'missing' if resume else 'stale'} at the start")
    (out / "resumed").write_text(str(resume))
    mode = MODES.get(run.name)
    if mode == "exit":
        sys.exit(3)
    if mode == "kill":
        os._exit(3)
    if mode == "slow":  # trains until a signal stops it, as kpo train does
        try:
            (out / "training").touch()  # inside the try: a signal from now on is caught as kpo train's would be
            time.sleep(120)
        except KeyboardInterrupt:
            (out / "interrupted").write_text("stopped by a signal")
            raise
    write_fake_run(cfg, run)
    return {"run": run.name, "seconds": 0.0, "macro": {"avg@2": 0.5}, "disk": {"written": 0, "kept": 0}}


def no_warm_start(cfg, seed) -> None:
    pass


@pytest.fixture
def fake_workers(monkeypatch):
    """Workers forked from this process (so they run `fake_execute`), with the run modes ``modes``."""

    def use(modes: dict[str, str]) -> None:
        monkeypatch.setattr(
            kpo.compare.run, "get_context", lambda method: multiprocessing.get_context("fork")
        )
        monkeypatch.setattr(kpo.compare.run, "_execute", fake_execute)
        monkeypatch.setattr(kpo.compare.run, "_warm_start", no_warm_start)
        for name, mode in modes.items():
            monkeypatch.setitem(MODES, name, mode)

    return use


def test_a_run_that_exits_is_a_failed_run(compare_config, fake_workers):
    fake_workers({"vanilla-seed0": "exit"})
    with pytest.raises(RuntimeError) as e:
        run_compare(compare_config(sweep_memory=()))
    message = str(e.value)
    assert "vanilla-seed0: SystemExit: 3 (traceback in its log:" in message, message
    assert "kpo-seed0" not in message  # the other run finished


def test_a_killed_worker_is_blamed_on_its_run_only(compare_config, fake_workers):
    # One worker: vanilla-seed0 runs first and kills it, the others never start.
    fake_workers({"vanilla-seed0": "kill"})
    cfg = compare_config(sweep_memory=("paper", "2"), jobs=1)
    with pytest.raises(RuntimeError) as e:
        run_compare(cfg)
    lines = str(e.value).splitlines()[1:]
    log = Path(cfg.out) / "runs" / "vanilla-seed0" / "log.txt"
    assert lines == [
        f"  vanilla-seed0: its worker process died (killed by a signal, out of memory, or os._exit; logs: {log})",
        "  not run, as the pool stopped when that worker died: kpo-seed0, kpo-memory2-seed0 (rerun kpo compare "
        "to run them; finished runs are reused)",
    ], lines


def test_an_unfinished_run_restarts_without_its_stale_metrics(compare_config, fake_workers):
    fake_workers({})
    cfg = compare_config(sweep_memory=())
    stale = Path(cfg.out) / "runs" / "kpo-seed0"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"step": 1}\n' * 99)  # an interrupted run (no eval.json)
    run_compare(cfg)
    assert len((stale / "metrics.jsonl").read_text().splitlines()) == cfg.steps


@pytest.mark.parametrize("inherited", [signal.default_int_handler, signal.SIG_IGN], ids=["sigint", "sigint-ignored"])
def test_an_interrupt_of_kpo_compare_stops_its_workers(compare_config, fake_workers, monkeypatch, inherited):
    # kpo compare alone is signalled (`kill PID`, `timeout`): its workers, in process groups of their own, must
    # hear of it from kpo compare, once, and stop, instead of training on while the pool waits for them; also
    # when kpo compare was started in the background (`&`, nohup: SIGINT ignored, and its workers inherit that)
    previous = signal.signal(signal.SIGINT, inherited)
    fake_workers({"vanilla-seed0": "slow"})
    cfg = compare_config(methods=("vanilla",), seeds=1, sweep_memory=(), jobs=1)
    folder = Path(cfg.out) / "runs" / "vanilla-seed0"

    def interrupted_wait(*args, **kwargs):
        while not (folder / "training").exists():  # the worker is training (log.txt alone raced the signal)
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(kpo.compare.run, "wait", interrupted_wait)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_compare(cfg)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (folder / "interrupted").read_text() == "stopped by a signal"


def test_a_run_an_interrupt_stopped_resumes_from_its_checkpoint(compare_config, fake_workers):
    fake_workers({})
    cfg = compare_config(methods=("vanilla", "gspo"), sweep_memory=())
    runs = Path(cfg.out) / "runs"
    for name, extra in (("vanilla", ()), ("gspo", ("--learning-rate", "0.5"))):
        folder = runs / f"{name}-seed0"
        folder.mkdir(parents=True)
        parse_args(train_argv(cfg, Run(name, 0), folder) + list(extra)).save_yaml(folder / "config.yaml")
        (folder / "checkpoint-2").mkdir()  # what an interrupt at step 2 leaves: a complete checkpoint
        mark_complete(folder / "checkpoint-2")
        (folder / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    run_compare(cfg)
    # vanilla's checkpoint has this compare's settings: resumed; gspo's was made at another learning rate: redone
    assert (runs / "vanilla-seed0" / "resumed").read_text() == "True"
    assert (runs / "gspo-seed0" / "resumed").read_text() == "False"


def test_a_resumed_run_trains_with_resume_not_overwrite(compare_config, tmp_path, monkeypatch, in_process):
    seen = []
    monkeypatch.setattr("kpo.train.run.run_training", lambda config: seen.append(config))
    monkeypatch.setattr(kpo.compare.run, "_evaluate", lambda *args: {"macro": {}})
    for resume in (True, False):
        _execute(compare_config(), Run("vanilla", 0), tmp_path / "run", resume)
    assert [(c.resume, c.overwrite) for c in seen] == [(True, False), (False, True)]


def test_a_rerun_keeps_the_plan_fixed_before_the_runs(compare_config, fake_workers, monkeypatch):
    # The planned half-widths are the pre-registration: re-reporting a finished compare (after the stored sd
    # changed) must not rewrite them; a compare with more seeds is another design and gets its own plan.
    fake_workers({})
    cfg = compare_config(sweep_memory=())
    run_compare(cfg)
    plan = Path(cfg.out) / "plan.json"
    first = plan.read_text()
    monkeypatch.setattr(kpo.compare.run, "DIFF_SD", 99.0)
    run_compare(cfg)
    assert plan.read_text() == first
    run_compare(compare_config(sweep_memory=(), seeds=2))
    assert '"diff_sd": 99.0' in plan.read_text()


def test_an_interrupt_starts_none_of_the_runs_queued_behind_it(compare_config, monkeypatch):
    # the pool hands a worker its next run before the current one ends; after kpo compare is interrupted that run
    # must not start (on verl it would train for hours while kpo compare waits for its workers)
    from kpo.compare.engines.kpo import KpoEngine

    def train(self, cfg, run, out, resume):
        (out / "started").write_text(run.name)
        time.sleep(120)  # until the interrupt

    monkeypatch.setattr(kpo.compare.run, "get_context", lambda method: multiprocessing.get_context("fork"))
    monkeypatch.setattr(kpo.compare.run, "_warm_start", no_warm_start)
    monkeypatch.setattr(kpo.compare.run, "_log_to", lambda out: out.mkdir(parents=True, exist_ok=True))
    monkeypatch.setattr(KpoEngine, "train", train)
    cfg = compare_config(methods=("vanilla", "gspo"), seeds=1, sweep_memory=(), jobs=1)
    runs = Path(cfg.out) / "runs"

    def interrupted_wait(*args, **kwargs):
        while not (runs / "vanilla-seed0" / "started").exists():
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(kpo.compare.run, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        run_compare(cfg)
    assert not (runs / "gspo-seed0" / "started").exists()
