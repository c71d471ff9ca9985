"""``kpo compare --engine verl`` on a Ray cluster the user started, the compare's side: each run attempt is a job of
that cluster (:class:`RunJob`, found again by its :func:`submission_id`), submitted to its dashboard with Ray's job
submission API as verl's multi-node recipe submits ``main_ppo``, under a lease the compare renews every
:data:`RENEW_SECONDS` (a killed compare's jobs stop :data:`LEASE_SECONDS` later); the plan checks the cluster first
(:func:`cluster_errors`). What runs on the cluster: :mod:`kpo.compare.engines.verl_job`. The whole behaviour:
docs/compare.md, "On a Ray cluster you started".
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import time
import uuid
from pathlib import Path

from kpo._files import write_json
from kpo.compare.engines.verl_config import select

__all__ = ["ADDRESS_ENV", "ClusterError", "RunJob", "cluster_address", "cluster_errors", "connect", "run_resources",
           "runtime_env", "submission_id"]

ADDRESS_ENV = "RAY_ADDRESS"
LEASE_ENV = "KPO_RAY_LEASE_SECONDS"  # how long a job outlives a compare that stopped renewing its lease
LEASE_SECONDS = 60.0
RENEW_SECONDS = 5.0  # how often a compare renews its jobs' leases (and reads their status)
LOG_SECONDS = 30.0  # how often it fetches a job's log into the run's log.txt
PROBE_SECONDS = 300.0  # how long the plan waits for the cluster to run its probe
LEASE_FILE = "ray-lease"
JOBS_FILE = "ray-jobs.json"  # a run's jobs, one submission id per attempt, in order
PYTHON = "python3"  # the cluster's Python, as verl's recipe (`ray job submit -- python3 -m verl.trainer.main_ppo`)
LIVE = ("PENDING", "RUNNING")


class ClusterError(RuntimeError):
    """The cluster cannot be used as asked: one line naming what and the fix."""


def cluster_address(cfg) -> str | None:
    """The cluster the runs are jobs of: ``--ray-address``, else ``RAY_ADDRESS``; None: main_ppo as a child."""
    return cfg.ray_address or os.environ.get(ADDRESS_ENV) or None


@functools.lru_cache(maxsize=8)
def connect(address: str):
    """Ray's ``JobSubmissionClient`` of the cluster at ``address``; :class:`ClusterError` in one line when the
    dashboard cannot be reached or refuses kpo."""
    from ray._raylet import AuthenticationTokenLoader
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    where = f"--ray-address {address}"
    # the token Ray's own loader finds, whatever RAY_AUTH_MODE says here (a cluster that asks for none ignores it)
    headers = dict(AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True))
    if not address.startswith(("http://", "https://")):
        # `auto` or the head's GCS address: Ray finds the dashboard through the GCS, whose calls carry the token
        # only in token mode; turned on as ray.init turns it on for such an address (where a token is found)
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        return JobSubmissionClient(address, headers=headers)
    except AuthenticationError as e:
        if not headers:
            raise ClusterError(
                f"{where}: the cluster asks for Ray's authentication token and none is here where Ray looks "
                "(RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token); copy the cluster's "
                "token there (`ray get-auth-token` on its head node)"
            ) from None
        raise ClusterError(
            f"{where}: the cluster refused the Ray token found here ({str(e).splitlines()[0]}); use the cluster's "
            "token (`ray get-auth-token` on its head node)"
        ) from None
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(
            f"{where}: no Ray dashboard answers there ({' '.join(str(e).split())[:200]}); give the address of the "
            "cluster's dashboard (http://HEAD:8265) or of its head node, with the cluster running"
        ) from None


def submission_id(out: Path, attempt: int) -> str:
    """The job of attempt ``attempt`` of the run in ``out``: the same for every compare of that folder."""
    digest = hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:10]
    return f"kpo-{re.sub(r'[^A-Za-z0-9_-]', '_', out.name)}-{digest}-{attempt}"


def run_resources(composed) -> dict:
    """What one run asks the cluster for: ``gpus`` (trainer.nnodes x trainer.n_gpus_per_node, Ray's resource
    "GPU"), on ``nodes`` nodes of ``gpus_per_node`` each, and ``cpus``: one per verl worker slot's colocated
    roles (3, verl's FSDP pool), the TaskRunner and TransferQueue's controller, and one per TransferQueue storage
    unit (the v1 trainer): docs/verl.md's CPU rule."""
    nodes, per_node = int(select(composed, "trainer.nnodes")), int(select(composed, "trainer.n_gpus_per_node"))
    units = 0
    if select(composed, "trainer.use_v1") is not False:
        units = int(select(composed, "transfer_queue.backend.SimpleStorage.num_data_storage_units") or 0)
    return {"nodes": nodes, "gpus_per_node": per_node, "gpus": nodes * per_node, "cpus": 2 + units + 3 * nodes * per_node}


def runtime_env(cfg, out_root: Path, env_vars: dict[str, str]) -> dict:
    """A run's job's runtime environment: the user's ``--ray-runtime-env`` file, or the directory kpo compare
    runs in as its working directory (the comparison's folder left out), with ``env_vars`` added."""
    env = _runtime_env_file(cfg.ray_runtime_env) if cfg.ray_runtime_env else {"working_dir": str(Path.cwd())}
    if isinstance(env.get("working_dir"), str) and Path(env["working_dir"]).is_dir():
        folder = Path(env["working_dir"]).resolve()
        if out_root.resolve().is_relative_to(folder):  # the runs' checkpoints would be uploaded with the code
            env["excludes"] = [*env.get("excludes", []), f"/{out_root.resolve().relative_to(folder)}/"]
    return {**env, "env_vars": {**env.get("env_vars", {}), **env_vars}}


def _runtime_env_file(path: str) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text()) or {}


def runtime_env_errors(cfg, owned: tuple[str, ...]) -> list[str]:
    """``--ray-runtime-env``: a YAML or JSON mapping Ray takes, setting none of the variables kpo sets per run
    (``owned``); and the option without a cluster."""
    if cfg.ray_runtime_env is None:
        return []
    where = f"--ray-runtime-env {cfg.ray_runtime_env}"
    if cluster_address(cfg) is None:
        return [f"{where}: runs are Ray jobs only with --ray-address (or RAY_ADDRESS); give one or drop it"]
    import yaml

    try:
        env = _runtime_env_file(cfg.ray_runtime_env)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return [f"{where}: not readable as YAML or JSON ({' '.join(str(e).split())[:160]}); give Ray's runtime_env"]
    if not isinstance(env, dict) or not isinstance(env.get("env_vars", {}), dict):
        return [f"{where}: not a mapping of Ray's runtime_env fields (working_dir, env_vars, pip, ...); give one"]
    taken = sorted(set(env.get("env_vars", {})) & set(owned))
    return [f"{where}: env_vars sets {', '.join(taken)}, which kpo compare sets for each run; drop it"] if taken else []


# ------------------------------------------------------------------ the plan's checks
def cluster_errors(cfg, composed, out: Path) -> list[str]:
    """What keeps the cluster from running this comparison, each in one line: it cannot be reached (or refuses
    kpo's token), it lacks the resources one run asks for, or ``out`` is not on a filesystem all its nodes and
    this machine share. Where ``flock`` does not exclude across the nodes, the runs' locks become pid files
    (said in one line)."""
    address = cluster_address(cfg)
    try:
        client = connect(address)
        found = _probe(client, out, runtime_env(cfg, out, {"RAY_USAGE_STATS_ENABLED": "0"}))
    except ClusterError as e:
        return [str(e)]
    errors = _resource_errors(address, found["nodes"], run_resources(composed))
    unseen = [c for c in found["checks"] if c["wrote"] or not c["seen"]]
    for check in unseen:
        why = check["wrote"] or "its file is not seen here"
        errors.append(
            f"--out {cfg.out}: node {check['host']} ({check['node'][:12]}) cannot share it ({why}); put --out on a "
            "filesystem every node of the cluster and this machine mount at the same path"
        )
    if not unseen and any(c["lock_taken"] for c in found["checks"]):
        from kpo.compare.guards import use_pid_files

        use_pid_files()
        print(
            f"kpo compare: flock on {out} does not exclude across the cluster's nodes; each run is locked with an "
            "exclusive pid file instead (kpo-compare.pid)",
            flush=True,
        )
    return errors


def _resource_errors(address: str, nodes: list[dict], need: dict) -> list[str]:
    gpus = sorted((n["resources"].get("GPU", 0) for n in nodes), reverse=True)
    cpus = sum(n["resources"].get("CPU", 0) for n in nodes)
    fit = [g for g in gpus if g >= need["gpus_per_node"]]
    errors = []
    if len(fit) < need["nodes"]:
        errors.append(
            f"--ray-address {address}: one run asks for {need['nodes']} node(s) of {need['gpus_per_node']} GPU(s) "
            f"(trainer.nnodes x trainer.n_gpus_per_node) and the cluster has {len(fit)} such node(s) (GPUs per node: "
            f"{', '.join(f'{g:g}' for g in gpus) or 'none'}); lower them or add nodes"
        )
    if cpus < need["cpus"]:
        errors.append(
            f"--ray-address {address}: one run asks for {need['cpus']} logical CPUs (docs/verl.md's rule: 2 + "
            f"TransferQueue's storage units + 3 per GPU) and the cluster has {cpus:g}; start its nodes with more "
            "(`ray start --num-cpus N`) or lower transfer_queue.backend.SimpleStorage.num_data_storage_units"
        )
    return errors


def _probe(client, out: Path, env: dict) -> dict:
    """Run :func:`kpo.compare.engines.verl_job.probe` as a job in the runs' runtime environment ``env``, holding its
    folder's lock meanwhile; its findings, each node's with ``seen``: whether its file is seen here."""
    from kpo.compare.engines.verl_job import LOCK_NAME, PROBE_MARK

    folder = out.resolve() / f".kpo-probe-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # no flock here at all: the runs' own lock falls back to a pid file (kpo.compare.guards)
        try:
            job = client.submit_job(
                entrypoint=shlex.join([PYTHON, "-m", "kpo.compare.engines.verl_job", "probe", "--dir", str(folder)]),
                runtime_env=env,
            )
        except RuntimeError as e:  # Ray's job server refused the job: a runtime environment it cannot set up
            raise ClusterError(
                f"the cluster refused kpo's check job ({' '.join(str(e).split())[:300]}); fix the runs' runtime "
                "environment (--ray-runtime-env; without it the current directory is uploaded as working_dir)"
            ) from None
        deadline = time.monotonic() + PROBE_SECONDS
        while str(status := client.get_job_status(job)) in LIVE:
            if time.monotonic() > deadline:
                client.stop_job(job)
                raise ClusterError(
                    f"the cluster did not run kpo's check of it (a job asking for no resources) in {PROBE_SECONDS:g} s "
                    f"(its status: {status}); see `ray job logs {job}`"
                )
            time.sleep(1.0)
        log = client.get_job_logs(job)
        lines = [line for line in log.splitlines() if line.startswith(PROBE_MARK)]
        if str(status) != "SUCCEEDED" or not lines:
            tail = " | ".join(log.strip().splitlines()[-3:])[:400]
            raise ClusterError(
                f"kpo's check of the cluster failed as a Ray job ({status}: {tail}); each node needs kpo[verl] in "
                f"its {PYTHON} (the environment the runs' main_ppo and kpo's plugin run in)"
            )
        found = json.loads(lines[-1][len(PROBE_MARK) :])
        for check in found["checks"]:
            check["seen"] = (folder / check["node"]).is_file()
        return found
    finally:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------ the runs' jobs
class RunJob:
    """The jobs of one run (in its folder ``out``): each attempt's submission id in :data:`JOBS_FILE` (written
    whole), the lease the compare renews while it follows one."""

    def __init__(self, address: str, out: Path):
        self.out, self.client = out, connect(address)

    def ids(self) -> list[str]:
        path = self.out / JOBS_FILE
        return json.loads(path.read_text()) if path.exists() else []

    def status(self, job: str) -> str | None:
        """The job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), None where the cluster has no such job
        (a cluster restarted since)."""
        try:
            return str(self.client.get_job_status(job))
        except RuntimeError as e:
            if "does not exist" in str(e):
                return None
            raise

    def last(self) -> tuple[str, str | None] | None:
        """(submission id, status) of the run's last job, None where it has none."""
        ids = self.ids()
        return (ids[-1], self.status(ids[-1])) if ids else None

    def stop_live(self) -> None:
        """Stop every job of the run that still runs, and wait until each has ended."""
        for job in self.ids():
            if self.status(job) in LIVE:
                self.client.stop_job(job)
                self._until_ended(job)

    def _until_ended(self, job: str) -> str | None:
        while (status := self.status(job)) in LIVE:
            time.sleep(1.0)
        return status

    def submit(self, command: list[str], env: dict) -> str:
        """Submit the next attempt's job: ``command`` (main_ppo's) under :mod:`kpo.compare.engines.verl_job`'s
        lease, in runtime environment ``env``; its submission id (the first of this run's the cluster does not
        know), recorded before it is submitted (a kill between the two leaves an id the cluster does not know,
        which a rerun's :meth:`last` reports as gone)."""
        ids = self.ids()
        attempt = len(ids)
        while self.status(job := submission_id(self.out, attempt)) is not None:
            attempt += 1  # an id of an earlier attempt whose record is gone (the run folder was cleared)
        write_json(self.out / JOBS_FILE, [*ids, job])
        self.renew()
        entrypoint = [PYTHON, "-m", "kpo.compare.engines.verl_job", "run", "--lease", str(self.out / LEASE_FILE),
                      "--stale", f"{float(os.environ.get(LEASE_ENV) or LEASE_SECONDS):g}", "--", *command]  # fmt: skip
        self.client.submit_job(entrypoint=shlex.join(entrypoint), submission_id=job, runtime_env=env)
        return job

    def renew(self) -> None:
        """Rewrite the lease's text (a new one each time: the job watches for a change)."""
        (self.out / LEASE_FILE).write_text(f"{os.getpid()} {time.time_ns()}\n")

    def follow(self, job: str) -> None:
        """Renew the lease and copy the job's new log lines to this process's output until the job ends; a
        RuntimeError naming why unless it succeeded. An interrupt (KeyboardInterrupt) stops the job first."""
        printed = 0
        fetched = 0.0
        try:
            while True:
                status = self.status(job)
                if time.monotonic() - fetched > LOG_SECONDS or status not in LIVE:
                    printed, fetched = self._print_log(job, printed), time.monotonic()
                if status not in LIVE:
                    break
                self.renew()
                time.sleep(RENEW_SECONDS)
        except BaseException:
            self.client.stop_job(job)
            self._until_ended(job)
            raise
        if status != "SUCCEEDED":
            info = self.client.get_job_info(job)
            message = " ".join(str(info.message).split())[:300]
            raise RuntimeError(f"Ray job {job} ended {info.status}: {message} (its log is above, in this log)")

    def _print_log(self, job: str, printed: int) -> int:
        log = self.client.get_job_logs(job)
        if len(log) > printed:
            print(log[printed:], end="" if log.endswith("\n") else "\n", flush=True)
        return len(log)
