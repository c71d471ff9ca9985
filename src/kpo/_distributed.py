"""Several processes of one kpo command (``kpo launch``, ``torchrun``): who this process is, from the
launcher's environment, and the few collectives kpo itself needs besides the ones TRL makes.

Every helper is a no-op in a single process (``WORLD_SIZE`` unset or 1), so callers need no branch of their own.
One machine only: rank 0 writes the run's files, and the ranks share its file system.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

__all__ = [
    "LAUNCHER_ENV",
    "DataParallelSum",
    "barrier",
    "gather_objects",
    "is_main",
    "join",
    "leave",
    "local_rank",
    "max_over_ranks",
    "mesh_position",
    "peer_lost",
    "rank",
    "single_process",
    "sum_over_ranks",
    "world_size",
]

# What torchrun and kpo.launch put in each process's environment that accelerate and torch.distributed read to
# decide that the process is one of several.
LAUNCHER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)


# How a collective says that the process on its other side ended: gloo ("Read error [...]: Connection reset by peer"),
# NCCL's ("remote process exited or there was a network error"), a socket of either.
_PEER_LOST = ("reset by peer", "closed by peer", "Broken pipe", "remote process exited")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """Whether this process writes the files and prints the lines of the command (rank 0)."""
    return rank() == 0


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """Run what is inside as a process of its own: the launcher's variables are hidden, so a Trainer built there
    (the embedded warm start's SFT, which rank 0 alone builds) sees one process instead of waiting for the others
    in a collective. Accelerate's shared state is cleared on the way out, so the next TrainingArguments build
    the launched processes' state. Enter it before :func:`join` (no process group may exist yet)."""
    hidden = {k: os.environ.pop(k) for k in LAUNCHER_ENV if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)
        if hidden:
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=True)


def join(*, cpu: bool) -> None:
    """Join the other processes: the process group accelerate builds for ``cpu`` (gloo on a CPU, NCCL on GPUs),
    which TRL's Trainer then reuses, and a barrier, so that what rank 0 wrote before it is there for all."""
    if world_size() == 1:
        return
    from accelerate import PartialState

    PartialState(cpu=cpu)
    _destroy_at_exit()
    barrier()


def _destroy_at_exit() -> None:
    """Take the process group down when the process ends: a gloo group still alive at interpreter shutdown can
    abort the process after its work is done ("terminate called without an active exception", status -6)."""
    import atexit

    atexit.register(_destroy)


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def leave(code: int) -> NoReturn:
    """End one of several processes with ``code`` once its command returned: the exit handlers run (the process
    group is taken down, files are closed), then the process ends without the interpreter's own teardown. There,
    C++ threads of torch's process group could still abort a process whose work was done ("terminate called
    without an active exception", status -6: seen under load in the 2-process eval and train tests, after their
    results were written)."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised in one of several processes, is a collective's failure because another process of the
    run ended (its own status says why; ``kpo launch`` names it): not this process's fault."""
    dist = sys.modules.get("torch.distributed")
    network = dist is not None and isinstance(exc, dist.DistNetworkError)
    return world_size() > 1 and (
        network or (isinstance(exc, RuntimeError) and any(s in str(exc) for s in _PEER_LOST))
    )


def _init_gloo() -> None:
    """A process group for kpo's own collectives where no library builds one (``kpo eval``): gloo, which
    gathers Python objects on any device."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
        _destroy_at_exit()


def barrier() -> None:
    if world_size() == 1:
        return
    import torch.distributed as dist

    _init_gloo()
    dist.barrier()


def _device():
    """Where this process's collectives put their tensors: its GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_over_ranks(value: int) -> int:
    """The largest ``value`` any process passed (every process must call it at the same point)."""
    if world_size() == 1:
        return value
    import torch
    import torch.distributed as dist

    _init_gloo()
    tensor = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def gather_objects(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every process (picklable objects; every process calls it)."""
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    _init_gloo()
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def sum_over_ranks(values, group=None):
    """``values`` (float64 numpy [n]) summed over every process of ``group`` (None: torch.distributed's default
    group), where one is initialised with more than one process (TRL's under ``kpo launch``, verl's workers); else
    ``values``. Every process of the group calls it at the same point."""
    import numpy as np
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return values
    tensor = torch.as_tensor(np.asarray(values, dtype=np.float64), device=_device()).clone()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor.cpu().numpy()


def mesh_position(dp_size: int) -> tuple[int, int]:
    """(data-parallel rank, sequence-parallel rank) of this process in a (dp, sp) device mesh of the default
    group's processes, ``dp_size`` rows of sp = world / dp_size ranks each, rank = dp rank x sp + sp rank (torch's
    ``init_device_mesh(mesh_shape=(dp, sp))``, as verl's Ulysses sequence parallelism builds it); (0, 0) in one
    process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 0
    sp = max(dist.get_world_size() // dp_size, 1)
    return divmod(dist.get_rank(), sp)


class DataParallelSum:
    """``values`` (float64 numpy [n]) -> their sum over this process's data-parallel group of a (dp, sp) mesh
    (:func:`mesh_position`): the ranks of one sequence-parallel group hold the same rows (verl gathers their
    outputs before the loss), so a sum over every process would count each row sp times. Its group is built at the
    first call, which every process of the default group makes at the same point (torch builds a group with all
    processes taking part)."""

    def __init__(self, dp_size: int):
        self.dp_size = dp_size
        self.group = None

    def __call__(self, values):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == self.dp_size:
            return sum_over_ranks(values)
        if self.group is None:
            sp = dist.get_world_size() // self.dp_size
            for j in range(sp):  # every process builds every group, in one order
                group = dist.new_group([j + k * sp for k in range(self.dp_size)])
                if dist.get_rank() % sp == j:
                    self.group = group
        return sum_over_ranks(values, self.group)
