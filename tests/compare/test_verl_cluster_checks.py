"""``kpo compare --engine verl --ray-address``'s side of a Ray cluster, without one: the lease that stops a job whose
compare was killed (:mod:`kpo.compare.engines.verl_job`, run by the cluster's python3) and the jobs' runtime
environment. The plan's reading of its probe of the nodes: tests/integrations/test_verl_compare_checks.py; the
real cluster: tests/integrations/test_verl_compare.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from kpo.compare.engines import verl_cluster, verl_job
from kpo.compare.engines.verl_job import LEASE_LOST, run
from kpo.compare.plan import CompareConfig


def test_a_job_stops_its_command_once_the_lease_goes_unrenewed(tmp_path, capsys):
    lease = tmp_path / "ray-lease"
    lease.write_text("1\n")
    pid_file = tmp_path / "pid"
    command = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(600)"]  # fmt: skip
    assert run(lease, 3.0, command) == LEASE_LOST
    assert not psutil.pid_exists(int(pid_file.read_text())) or psutil.Process(int(pid_file.read_text())).status() == (
        psutil.STATUS_ZOMBIE
    )
    assert "stopped renewing its lease" in capsys.readouterr().out


def test_a_renewed_lease_lets_the_command_finish_with_its_status(tmp_path, monkeypatch):
    # The job's clock is the test's: each poll's sleep advances it 2 s and renews the lease, so the command outlives
    # the 2 s stale limit many times over however slowly this machine runs (a renewer thread on a loaded machine
    # could miss a poll and stop it, which is the lease working, not failing).
    lease, go = tmp_path / "ray-lease", tmp_path / "go"
    lease.write_text("0\n")
    clock = {"now": 0.0, "polls": 0}

    def sleep(seconds):
        clock["now"] += seconds
        clock["polls"] += 1
        lease.write_text(f"{clock['polls']}\n")
        if clock["now"] > 10.0:  # five times the stale limit: the command may end now
            go.touch()
        time.sleep(0.05)

    monkeypatch.setattr(verl_job, "time", SimpleNamespace(monotonic=lambda: clock["now"], sleep=sleep))
    command = [sys.executable, "-c", f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
               "sys.exit(7)"]  # fmt: skip
    assert verl_job.run(lease, 2.0, command) == 7
    assert clock["now"] > 10.0


def test_a_lease_the_node_cannot_see_stops_the_job_at_once(tmp_path, capsys):
    assert run(tmp_path / "elsewhere" / "ray-lease", 60.0, ["true"]) == LEASE_LOST
    assert "must be on a filesystem every node of the cluster shares" in capsys.readouterr().out


@pytest.mark.parametrize("given", [None, "runtime.yaml"])
def test_the_runtime_env_needs_a_cluster_and_leaves_kpo_s_variables_to_kpo(tmp_path, monkeypatch, given):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = tmp_path / "runtime.yaml"
    path.write_text("env_vars:\n  KPO_COMPARE_RUN: /x\n  MINE: '1'\n")
    cfg = CompareConfig(engine="verl", ray_runtime_env=str(path), ray_address=None if given is None else "auto")
    (err,) = verl_cluster.runtime_env_errors(cfg, ("KPO_COMPARE_RUN",))
    if given is None:
        assert "runs are Ray jobs only with --ray-address (or RAY_ADDRESS)" in err
    else:
        assert err.endswith("env_vars sets KPO_COMPARE_RUN, which kpo compare sets for each run; drop it")


def test_a_job_s_runtime_env_uploads_the_working_directory_without_the_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = verl_cluster.runtime_env(CompareConfig(out="runs/cmp"), Path("runs/cmp"), {"KPO_COMPARE_RUN": "/r"})
    assert env == {"working_dir": str(tmp_path), "excludes": ["/runs/cmp/"], "env_vars": {"KPO_COMPARE_RUN": "/r"}}


def test_the_plan_s_disk_per_run_counts_the_model_s_parameters(tmp_path):
    """16 bytes a parameter (float32 weights, Adam's two moments, Hugging Face weights) for each checkpoint held at
    once: one while a run trains, every one with --keep all (verl's default kept them all: issue 54)."""
    import torch
    from safetensors.torch import save_file

    from kpo.compare.engines.verl_disk import STATE_BYTES, checkpoint_bytes, disk_line, parameters

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("x" * 100)
    assert parameters(tmp_path) == 17 and parameters(tmp_path / "missing") is None
    one = checkpoint_bytes(tmp_path, 17)
    assert one == 16 * 17 + 100 + STATE_BYTES
    line = disk_line(tmp_path, batches=10, save_freq=3, keep="hf")
    # verl writes the next checkpoint whole before it removes the last: two on disk while one is written
    assert line.startswith("disk per run: at most 2.1 MB while it trains (2 checkpoints of 17 parameters")
    assert line.endswith("0.168 kB kept once scored (--keep hf)")  # 4 bytes a parameter and the other files
    every = disk_line(tmp_path, batches=10, save_freq=3, keep="all")  # steps 3, 6, 9 and the last, 10
    assert "(4 checkpoints of 17 parameters" in every
    once = disk_line(tmp_path, batches=3, save_freq=3, keep="hf")  # one save, the last step's
    assert once.startswith("disk per run: at most 1.05 MB while it trains (one checkpoint of 17 parameters")
    assert "not estimated" in disk_line(tmp_path / "hub-id", batches=10, save_freq=3, keep="hf")


def test_a_resumed_run_keeps_only_the_checkpoint_it_resumes_from(tmp_path):
    """verl removes only the checkpoints its own process saved: what a killed attempt left before its last complete
    checkpoint (the tracker's step) goes before the next attempt, and a checkpoint cut short by the kill (global_step_3,
    never tracked) goes too; without a tracker nothing goes."""
    from kpo.compare.engines.verl import _prune_older

    for step in (1, 2, 3):
        (tmp_path / "checkpoints" / f"global_step_{step}" / "actor").mkdir(parents=True)
    _prune_older(tmp_path)  # no tracker yet: no checkpoint is known complete, so none goes
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    _prune_older(tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "global_step_2", "latest_checkpointed_iteration.txt"
    ]  # fmt: skip


@pytest.mark.parametrize("end", ["SUCCEEDED", "FAILED"])
def test_following_a_job_copies_its_log_and_raises_unless_it_succeeded(tmp_path, monkeypatch, capsys, end):
    """The compare follows a run's job until it ends, renewing its lease and copying its log; a job that did not
    succeed is a RuntimeError naming its status and Ray's message (the run fails, its log says why)."""
    statuses = iter(["PENDING", "RUNNING", end])

    class Client:
        def get_job_status(self, job):
            return next(statuses)

        def get_job_logs(self, job):
            return "step 1\nstep 2\n"

        def get_job_info(self, job):
            return SimpleNamespace(status=end, message="Job entrypoint command failed\n with exit code 1")

    monkeypatch.setattr(verl_cluster, "connect", lambda address: Client())
    monkeypatch.setattr(verl_cluster, "RENEW_SECONDS", 0.0)
    jobs = verl_cluster.RunJob("http://head:8265", tmp_path)
    if end == "SUCCEEDED":
        assert jobs.follow("kpo-job-0") is None
    else:
        with pytest.raises(RuntimeError, match=r"^Ray job kpo-job-0 ended FAILED: Job entrypoint command failed with "
                           r"exit code 1 \(its log is above, in this log\)$"):
            jobs.follow("kpo-job-0")
    assert capsys.readouterr().out.count("step 2") == 1  # the log, copied once however often it was read
    assert (tmp_path / verl_cluster.LEASE_FILE).exists()  # renewed while the job ran
