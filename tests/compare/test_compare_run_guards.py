"""What guards a comparison's runs, on written folders and small processes (no trainer): verl's rows merged by
step, the regime statistics of rows that cover a generation batch, the run lock, the death of a trainer with its
compare, --keep and the disk a run takes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from kpo.compare.contract import keep_errors, size_text
from kpo.compare.engines import KEEP, engine_of
from kpo.compare.engines.kpo import KpoEngine
from kpo.compare.engines.verl_metrics import merge_rows, metrics_rows
from kpo.compare.guards import LOCK_FILE, lock_run, unlock_run
from kpo.compare.plan import CompareConfig, CompareError, Run, plan_runs
from kpo.compare.run import Job, _execute, disk_bytes, train_jobs


def _train_row(step: int, **data) -> dict:
    return {"step": step, "data": {"critic/score/mean": 0.5, "actor/pg_clipfrac": 0.1, **data}}


def test_a_validation_row_never_replaces_a_training_row():
    # attempt 0 trains steps 1-2 (checkpoint at 1), is killed; attempt 1 (val_before_train) validates the
    # checkpoint at step 1, then redoes step 2 and trains 3
    rows = [
        {"step": 0, "data": {"val-core/test/reward/mean@1": 0.1}},
        _train_row(1),
        _train_row(2, **{"actor/pg_clipfrac": 0.9}),
        {"step": 1, "data": {"val-core/test/reward/mean@1": 0.3}},
        _train_row(2, **{"actor/pg_clipfrac": 0.2}),
        _train_row(3),
    ]
    merged = metrics_rows(merge_rows(rows), 2)
    assert [r["step"] for r in merged] == [2, 4, 6]  # training rows only (the start model's validation: step 0)
    assert merged[0]["reward_mean"] == 0.5 and merged[0]["clip_frac"] == 0.1  # kept its training metrics
    assert merged[0]["val-core/test/reward/mean@1"] == 0.3  # and got the resumed attempt's validation
    assert merged[1]["clip_frac"] == 0.2  # the step the resumed attempt redid: its row
    assert all(r["reward_mean"] == 0.5 for r in merged)


def test_the_engines_declare_what_a_metrics_row_covers():
    assert KpoEngine.rows == "optimizer step"
    assert engine_of(CompareConfig(engine="verl")).rows == "generation batch"


# ------------------------------------------------------------------ no two processes write one run
def test_a_run_is_locked_while_a_process_writes_it(tmp_path):
    folder = tmp_path / "runs" / "vanilla-seed0"
    fd = lock_run(folder)
    assert fd is not None and lock_run(folder) is None  # a second open of the file cannot take it
    assert (folder / LOCK_FILE).read_text().strip() == str(os.getpid())
    cfg = CompareConfig(out=str(tmp_path))
    job = Job(cfg, Run("vanilla", 0), folder, "vanilla-seed0")
    with pytest.raises(CompareError, match=f"being written by process {os.getpid()}"):
        train_jobs([job], 1)
    with pytest.raises(RuntimeError, match="two processes must not write one run"):
        _execute(cfg, job.run, folder)  # a worker that finds it taken writes nothing
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]
    unlock_run(folder)
    assert lock_run(folder) is not None  # free again once the holder let go
    unlock_run(folder)


def test_a_trainer_dies_with_the_process_that_started_it(tmp_path):
    """A SIGKILL of the parent (kpo compare's worker: no handler runs) takes the trainer it started with it."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import functools, os, subprocess, sys, time
            from kpo.compare.guards import die_with_parent
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     preexec_fn=functools.partial(die_with_parent, os.getpid()),
                                     start_new_session=True)
            print(child.pid, flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    child = psutil.Process(int(parent.stdout.readline()))
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    child.wait(timeout=60)  # returns once the child has ended (psutil.TimeoutExpired if it outlived its parent)
    assert not child.is_running()


def test_a_child_whose_parent_died_before_it_could_ask_ends_at_once():
    """The parent's pid is read in the parent, before the fork: the old check read getppid() twice in the child,
    both times after its adoption when the parent died first, and the child lived on (issue 54)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is no longer anyone's parent: as a parent that ended before the child's check
    code = textwrap.dedent(f"""
        from kpo.compare.guards import die_with_parent
        die_with_parent({gone.pid})
        print("lived on", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")  # ended by the check, not by an error


def test_runs_are_locked_with_pid_files_where_flock_is_missing(tmp_path, monkeypatch, capsys):
    """A filesystem without flock (ENOLCK): one line, then an exclusive pid file per run, which a second process
    cannot take, and which a gone process of this host leaves for the next to take over (issue 54)."""
    import errno

    from kpo.compare import guards

    # set, so that monkeypatch restores it unset at the end, whatever the test turns on (delenv of an unset
    # variable records nothing to restore)
    monkeypatch.setenv(guards.PID_FILES_ENV, "0")

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(guards.fcntl, "flock", no_flock)
    folder = tmp_path / "runs" / "vanilla-seed0"
    assert lock_run(folder) is True
    assert "has no flock (No locks available); each run is locked with an exclusive pid file" in capsys.readouterr().out
    assert os.environ[guards.PID_FILES_ENV] == "1"
    assert lock_run(folder) is None  # held
    assert f"being written by process {os.getpid()} on " in guards.busy(folder)
    unlock_run(folder)
    assert guards.busy(folder) is None and not (folder / guards.PID_FILE).exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (folder / guards.PID_FILE).write_text(f"{gone.pid} {guards.socket.gethostname()}\n")
    assert lock_run(folder) is True  # a killed compare's file, on this host: taken over
    unlock_run(folder)
    (folder / guards.PID_FILE).write_text(f"{gone.pid} another-host\n")
    assert lock_run(folder) is None  # another host's: only the user knows whether it is gone


# ------------------------------------------------------------------ --keep
def test_keep_names_what_stays():
    assert keep_errors(CompareConfig()) == [] and CompareConfig().keep == "hf"
    (err,) = keep_errors(CompareConfig(keep="weights"))
    assert err.startswith("--keep weights: unknown; use hf (") and all(k in err for k in KEEP)


@pytest.mark.parametrize("keep", ["hf", "all", "none"])
def test_kpo_runs_keep_their_final_model_and_drop_checkpoints(tmp_path, keep):
    for name in ("final/model.safetensors", "checkpoint-4/optimizer.pt", "metrics.jsonl", "eval.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 10)
    assert disk_bytes(tmp_path) == 40 and size_text(40) == "0.04 kB" and size_text(1_234_000_000) == "1.23 GB"
    KpoEngine().prune(CompareConfig(keep=keep), tmp_path)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    expected = {
        "all": ["checkpoint-4/optimizer.pt", "eval.json", "final/model.safetensors", "metrics.jsonl"],
        "hf": ["eval.json", "final/model.safetensors", "metrics.jsonl"],
        "none": ["eval.json", "metrics.jsonl"],
    }
    assert left == expected[keep] and disk_bytes(tmp_path) == 10 * len(left)


def test_compare_takes_keep_on_its_command_line():
    from kpo.compare.cli import config_from_args

    assert config_from_args(["--keep", "none"]).keep == "none" and config_from_args([]).keep == "hf"


def test_a_second_compare_on_one_folder_is_refused_before_anything(compare_config, fake_done_run, no_training):
    """Two kpo compare on one --out: the second stops in one line naming the first's process, before it reads or
    writes a run (it used to start, then end in a RuntimeError traceback when the runs' own locks met)."""
    from kpo.compare.run import run_compare

    cfg = compare_config(sweep_memory=())
    for run in plan_runs(cfg):
        fake_done_run(cfg, run)
    out = Path(cfg.out)
    assert lock_run(out) is not None  # the first kpo compare holds the folder
    try:
        with pytest.raises(CompareError, match=f"process {os.getpid()} is running kpo compare here"):
            run_compare(cfg)
        assert not (out / "report.md").exists()
    finally:
        unlock_run(out)


def test_seeds_beyond_the_most_a_comparison_runs_are_refused_at_once(compare_config, no_training):
    """--seeds 1000000 --plan planned (and stat'ed) a million run folders; now it is one line."""
    with pytest.raises(CompareError, match=r"--seeds=1000000: must be an integer in 1\.\.200"):
        compare_config(seeds=1_000_000).validate()


def test_adding_seeds_until_decided_is_a_study(capsys, no_training):
    """`kpo compare --max-seeds` had its own looks and spending beside the study's; now it says where they are."""
    from kpo.compare.cli import main

    assert main(["--max-seeds", "12", "--plan"]) == 2
    assert "--max-seeds 12: a comparison that adds seeds until it is decided is a study" in capsys.readouterr().err
