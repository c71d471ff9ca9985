"""What runs on the user's Ray cluster for ``kpo compare --engine verl --ray-address``: the entrypoint of each Ray
job kpo submits, ``python3 -m kpo.compare.engines.verl_job`` (kpo is installed on every node, as verl's plugin
needs). Client side: :mod:`kpo.compare.engines.verl_cluster`.

- ``run --lease FILE --stale S -- COMMAND...``: COMMAND (verl's ``main_ppo``) as a child, for as long as the kpo
  compare that submitted it renews its lease: FILE, on the filesystem every node shares, whose text the compare
  rewrites every few seconds. A compare stopped by a signal it can handle stops its jobs itself (Ray's
  ``stop_job``); one killed with SIGKILL runs no code, and its jobs would train on for nobody. So when FILE's text
  has not changed for S seconds (this process's clock: the nodes' clocks may disagree), COMMAND is stopped
  (SIGTERM, SIGKILL after :data:`STOP_SECONDS`); the job then ends with status :data:`LEASE_LOST`, and Ray ends
  the actors of its driver. Otherwise the job ends with COMMAND's status.
- ``probe --dir DIR``: what the plan checks of the cluster, printed as one JSON line after :data:`PROBE_MARK`: every
  alive node (its id, host name and resources) and, from a task pinned to each, whether it could write a file in
  DIR (a folder under ``--out``; the compare then reads each node's file back) and whether it could take DIR's lock
  file while the compare holds it (it could: ``flock`` does not reach across those nodes).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["LEASE_LOST", "LOCK_NAME", "PROBE_MARK", "STOP_SECONDS", "main"]

LEASE_LOST = 3  # the job's status when its compare stopped renewing the lease
STOP_SECONDS = 60  # how long COMMAND may take to stop after SIGTERM before SIGKILL
POLL_SECONDS = 2.0  # how often the lease is read
PROBE_MARK = "kpo-probe: "  # the line of the probe's job log that holds its findings
LOCK_NAME = "lock"  # the file in the probe's folder that the compare holds locked during the probe


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(lease: Path, stale: float, command: list[str]) -> int:
    """COMMAND's exit status, or :data:`LEASE_LOST` once the lease went ``stale`` seconds unrenewed."""
    seen = _read(lease)
    if seen is None:
        print(
            f"kpo: the lease {lease} is not there on this node ({socket.gethostname()}): kpo compare's --out must "
            "be on a filesystem every node of the cluster shares",
            flush=True,
        )
        return LEASE_LOST
    proc = subprocess.Popen(command)
    # Ray stops a job with SIGTERM to its process group, which holds COMMAND too: wait for it, then end
    signal.signal(signal.SIGTERM, lambda *_: (_stop(proc), sys.exit(128 + signal.SIGTERM)))
    renewed = time.monotonic()
    while proc.poll() is None:
        time.sleep(POLL_SECONDS)
        text = _read(lease)
        if text is not None and text != seen:
            seen, renewed = text, time.monotonic()
        elif time.monotonic() - renewed > stale:
            print(
                f"kpo: the kpo compare that submitted this job stopped renewing its lease {lease} {stale:g} s ago "
                "(killed?): stopping verl's main_ppo; a rerun of the compare resumes the run",
                flush=True,
            )
            _stop(proc)
            return LEASE_LOST
    return proc.returncode


def _node_check(folder: str, node_id: str) -> dict:
    """On one node: write ``folder/<node id>`` (its host name), and try the lock the compare holds."""
    found = {"node": node_id, "host": socket.gethostname(), "wrote": None, "lock_taken": False}
    try:
        (Path(folder) / node_id).write_text(found["host"])
    except OSError as e:
        found["wrote"] = f"{type(e).__name__}: {e}"
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDWR)
    except OSError:
        return found  # not there: the write above says why
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        found["lock_taken"] = True
    except OSError:
        pass  # held by the compare (BlockingIOError), or no lock here at all: either way it excludes
    finally:
        os.close(fd)
    return found


def probe(folder: Path) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init()
    nodes = [n for n in ray.nodes() if n["Alive"]]
    check = ray.remote(num_cpus=0)(_node_check)
    tasks = [
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(folder), n["NodeID"]
        )
        for n in nodes
    ]
    found = {"nodes": [{"node": n["NodeID"], "resources": n["Resources"]} for n in nodes], "checks": ray.get(tasks)}
    print(PROBE_MARK + json.dumps(found), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kpo.compare.engines.verl_job")
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--lease", type=Path, required=True)
    r.add_argument("--stale", type=float, required=True)
    r.add_argument("command", nargs=argparse.REMAINDER)
    q = sub.add_parser("probe")
    q.add_argument("--dir", type=Path, required=True)
    args = p.parse_args(argv)
    if args.what == "probe":
        return probe(args.dir)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return run(args.lease, args.stale, command)


if __name__ == "__main__":
    sys.exit(main())
