"""``kpo launch --nproc-per-node N COMMAND [ARGS...]`` (or ``python -m kpo.launch ...``): N processes of ``kpo COMMAND`` on this machine,
data-parallel over gloo on a CPU or NCCL on GPUs (one GPU each), e.g. ``kpo launch --nproc-per-node 2
train --config run.yaml`` or ``... eval --model M --data synthetic``. COMMAND is train or eval; any other kpo
command is refused in one line (it is not data-parallel: N copies would run it N times over the same files).

What it does that ``torchrun`` does not: Ctrl-C or SIGTERM reaches every process once and the launcher waits for
them, so ``kpo train`` stops them all at one generation-batch boundary with one checkpoint, rank 0's one line,
and exit status 130. (torchrun forwards the signal, kills the processes 30 s later whatever they are writing,
and exits 1 with a traceback; a terminal's Ctrl-C also reaches its processes directly, a second signal.)
The processes get the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), each in a process group of its own so that only the launcher hears the terminal. If one fails,
the others are stopped; the exit status is rank 0's, or the failed process's. A process killed by a signal the
launcher did not send (the kernel's out-of-memory killer, ``kill -9``) is named in one line, with its signal,
and the status is the shell's for that signal, 128 + N. More processes than the machine has GPUs (with CUDA) or
CPU cores (without) are refused before any starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from kpo.cli import CARRY_ON, COMMANDS

__all__ = ["main"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# What a launched process may run: the data-parallel commands. Each of the others would run N times over the same
# files (two `kpo task` writing one folder, two `kpo compare` training every run twice).
LAUNCHABLE = ("train", "eval")
# How long the other processes may take to end by themselves once one failed, before they are stopped.
FAILURE_GRACE_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slots() -> tuple[int, str]:
    """(how many processes this machine runs side by side, of what): a GPU each where CUDA is available (NCCL), else
    a CPU core each, of those this process may use (gloo)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs"
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return len(cores), "CPU cores"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kpo launch",
        description="Run a kpo command as N data-parallel processes on this machine.",
        allow_abbrev=False,
    )
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc",
        type=int,
        required=True,
        metavar="N",
        help="processes (GPUs on a GPU machine)",
    )
    p.add_argument("--master-port", type=int, default=None, help="rank 0's port (default: a free one)")
    p.add_argument("command", choices=LAUNCHABLE, help="the kpo command, followed by its arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the launcher's options end at the command's name: what follows is the command's (its --n is not ours)
    at = next((i for i, arg in enumerate(argv) if arg in COMMANDS), len(argv))
    if at < len(argv) and argv[at] not in LAUNCHABLE:
        print(
            f"kpo launch: {argv[at]} is not data-parallel (N processes would each run all of it, over the same "
            f"files); run `kpo {argv[at]} ...` without kpo launch (kpo launch runs {' and '.join(LAUNCHABLE)})",
            file=sys.stderr,
        )
        return 2
    args = _parser().parse_args(argv[: at + 1])
    if args.nproc < 1:
        print(f"kpo launch: --nproc-per-node {args.nproc}: must be >= 1", file=sys.stderr)
        return 2
    slots, kind = _slots()
    if args.nproc > slots:
        print(
            f"kpo launch: --nproc-per-node {args.nproc}: this machine has {slots} {kind}, one per process; use "
            f"--nproc-per-node {slots} or fewer",
            file=sys.stderr,
        )
        return 2
    command = [args.command, *argv[at + 1 :]]
    port = args.master_port or _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    procs = []
    received = []

    def forward(signum, frame):
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        for rank in range(args.nproc):
            env = {
                **base,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(args.nproc),
                "LOCAL_WORLD_SIZE": str(args.nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            procs.append(subprocess.Popen([sys.executable, "-m", "kpo", *command], env=env, process_group=0))
        status, killed = _wait(procs, received)
        if killed is not None:
            rank, number = killed
            name = signal.Signals(number).name
            why = (
                " (what the kernel's out-of-memory killer sends: see dmesg)"
                if number == signal.SIGKILL
                else ""
            )
            print(
                f"kpo launch: rank {rank} of {args.nproc} (pid {procs[rank].pid}) was killed by {name}{why}, and "
                f"the other ranks stopped; {CARRY_ON.get(args.command, 'run the command again')}",
                file=sys.stderr,
                flush=True,
            )
        return status
    finally:
        for p in procs:  # the launcher itself failed (or was killed by an exception): leave nothing behind
            if p.poll() is None:
                p.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(procs: list[subprocess.Popen], received: list[int]) -> tuple[int, tuple[int, int] | None]:
    """Every process's end: (exit status, (rank, signal) of the first process killed by a signal the launcher did
    not send, or None). The status is that signal's 128 + N, else rank 0's, or, where rank 0 succeeded or was
    stopped here, the first failure's. When one fails while no signal was sent, the others get FAILURE_GRACE_S to
    end too (an error that every rank finds ends them all), then SIGTERM, then SIGKILL after as long again: a
    process waiting in a collective for the failed one would wait for ever."""
    failed_at, first_failure, stopped, killed = None, None, set(), None
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and rank not in stopped and first_failure is None:
                first_failure, failed_at = code, time.monotonic()
            if code is not None and code < 0 and rank not in stopped and not received and killed is None:
                killed = (rank, -code)
        if all(c is not None for c in codes):
            status = (
                -killed[1] if killed else (first_failure or 0) if 0 in stopped or codes[0] == 0 else codes[0]
            )
            return (128 - status if status < 0 else status), killed  # killed by signal N: the shell's 128 + N
        waited = time.monotonic() - failed_at if failed_at is not None and not received else 0.0
        for rank, p in enumerate(procs):
            if p.poll() is None and waited > 2 * FAILURE_GRACE_S:
                p.kill()
            elif p.poll() is None and waited > FAILURE_GRACE_S and rank not in stopped:
                stopped.add(rank)
                p.terminate()
        time.sleep(0.05)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
