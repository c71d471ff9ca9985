"""A local Ray cluster for the tests, started as a user starts one (``ray start --head``, Ray 2.60's token
authentication on) in a temporary folder, with a few logical CPUs and as many fake GPUs as runs at once (the CPU
platform of verl_cpu_platform.py asks Ray for "GPU"), on free ports so that it sits beside any other Ray of the
machine.

It is stopped by the process that started it, by pid: ``ray start --block`` stops its node when it gets SIGTERM,
and whatever of its processes survived is killed by pid. (``ray stop`` would stop every Ray of the machine,
another test's or another user's among them.)
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

START_SECONDS = 180  # a cold start on 2 busy cores takes 15-60 s
STOP_SECONDS = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """``ray start --head --block`` in ``folder``: :attr:`address` (its dashboard), :attr:`env` (what a client
    of it needs: the token's path and the cluster's Python first on PATH)."""

    def __init__(self, folder: Path, *, cpus: int, gpus: int):
        folder.mkdir(parents=True, exist_ok=True)
        token = folder / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),  # the jobs' python3: this venv's
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        dashboard = _free_port()
        self.address = f"http://127.0.0.1:{dashboard}"
        argv = [
            str(Path(bin_dir) / "ray"), "start", "--head", "--block", "--temp-dir", str(folder / "ray"),
            "--port", str(_free_port()), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
            "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()),
            "--metrics-export-port", str(_free_port()), "--num-cpus", str(cpus), "--num-gpus", str(gpus),
            "--object-store-memory", str(1 << 30), "--include-dashboard", "true", "--disable-usage-stats",
        ]  # fmt: skip
        self.log = folder / "head.log"
        with open(self.log, "w") as sink:
            self.head = subprocess.Popen(argv, env=self.env, stdout=sink, stderr=sink, start_new_session=True)
        self.processes: set[psutil.Process] = set()
        self._token = token.read_text()
        try:
            self._wait_up()
        except BaseException:
            self.stop()
            raise

    def _wait_up(self) -> None:
        import requests

        deadline = time.monotonic() + START_SECONDS
        while True:
            self._note_processes()
            assert self.head.poll() is None, f"ray start ended: {self.log.read_text()[-3000:]}"
            try:
                headers = {"Authorization": f"Bearer {self._token}"}
                if requests.get(f"{self.address}/api/version", headers=headers, timeout=5).ok:
                    return
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"no dashboard in {START_SECONDS} s: {self.log.read_text()[-3000:]}"
            time.sleep(1.0)

    def _note_processes(self) -> None:
        """Remember every process of the cluster seen so far (ray start's descendants), to stop them by pid."""
        try:
            self.processes |= {psutil.Process(self.head.pid), *psutil.Process(self.head.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def stop(self) -> list[str]:
        """Stop the cluster; the command lines of its processes that had to be killed (none: it stopped itself)."""
        self._note_processes()
        if self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)
            try:
                self.head.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.head.kill()
                self.head.wait()
        _, alive = psutil.wait_procs([p for p in self.processes if p.is_running()], timeout=30)
        killed = []
        for proc in alive:
            try:
                killed.append(" ".join(proc.cmdline())[:120])
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return killed


_LEFT = """
import json, sys
from ray.util.state import list_actors, list_jobs
address, prefix = sys.argv[1], sys.argv[2]
jobs = [j for j in list_jobs(address=address) if (j.submission_id or "").startswith(prefix)]
ids = {j.job_id for j in jobs if j.job_id}
actors = [a for a in list_actors(address=address, limit=10000) if a.job_id in ids]
print(json.dumps({
    "jobs": {j.submission_id: str(j.status) for j in jobs},
    "alive": [f"{a.class_name} ({a.state}, job {a.job_id})" for a in actors if a.state != "DEAD"],
}))
"""


def leftovers(cluster: LocalCluster, prefix: str) -> dict:
    """From Ray's own state API: the cluster's jobs whose submission id starts with ``prefix`` (id -> status) and
    the actors of those jobs that are not dead (``alive``). Asked from a process of the cluster's environment
    (token authentication on)."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", _LEFT, cluster.address, prefix], env=cluster.env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
