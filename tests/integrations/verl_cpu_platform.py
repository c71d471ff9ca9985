"""A CPU platform for verl 0.9.1, so verl's own trainer runs on a machine without accelerators (test-only).

verl resolves its device through ``verl.plugin.platform``: with no accelerator found it falls back to "nvidia",
and everything then asks ``torch.cuda``. Importing this module registers ``PlatformCPU`` under the name "cpu";
``VERL_PLATFORM=cpu`` selects it. It is loaded in the driver and in every Ray worker through verl's own hook,
``VERL_USE_EXTERNAL_MODULES=tests.integrations.verl_cpu_platform`` (``import verl`` imports the listed modules),
with the repository root on ``PYTHONPATH``.

What it maps, and why:

- device "cpu", collectives "gloo". verl's workers build their process group as ``cpu:gloo,<device>:<backend>``
  (``verl.utils.distributed.initialize_global_process_group_ray``), which would be ``cpu:gloo,cpu:gloo``, a
  string torch rejects (a device named twice). So this module wraps that function to pass ``backend="cpu:gloo"``
  on this platform, as verl's own checkpoint engine does: gloo for everything, the same FSDP2 code path NCCL
  takes on GPUs. The wrapper must be in place before ``verl.workers.engine_workers`` imports the function,
  which loading through ``VERL_USE_EXTERNAL_MODULES`` (during ``import verl``) ensures.
- the Ray resource stays "GPU": verl's trainer builds its worker pools with ``use_gpu=True`` and asks Ray for
  ``num_gpus`` per worker, so the test starts Ray with as many fake GPUs as workers
  (``+ray_kwargs.ray_init.num_gpus=N``); Ray only counts them.
- verl's FSDP engine (``FSDPEngineWithLMHead``, strategies fsdp and fsdp2) is registered for device "cpu" as
  well: verl registers it for cuda and npu only, though nothing in it needs either (on the CPU, FSDP1 still
  fails: verl hard-codes ``sync_module_states=True``, which broadcasts from a GPU; the test uses fsdp2).
- ``device_module`` is ``torch.cpu`` plus the calls verl makes on its device module that ``torch.cpu`` lacks
  (:class:`CPUDeviceModule`).
- no IPC, no profiler, no allocator settings: the CPU has none of them, so those calls do nothing.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform
from verl.utils import distributed as verl_distributed

__all__ = ["CPUDeviceModule", "PlatformCPU", "initialize_global_process_group_ray"]


class CPUDeviceModule(ModuleType):
    """``torch.cpu`` with the device-module calls verl 0.9.1 makes that it lacks.

    The CPU allocator keeps no cache and no per-device counters: ``empty_cache``/``ipc_collect`` have nothing to
    free, the ``memory_*`` counters verl logs read 0, and ``mem_get_info`` is the host's (free, total) bytes.
    Anything else is looked up on ``torch.cpu``.
    """

    def __init__(self):
        super().__init__("kpo_test_cpu_device")

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def memory_allocated(device=None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device=None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device=None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device=None) -> int:
        return 0

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"


_DEVICE_MODULE = CPUDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface on the host CPU (module docstring: what is mapped and why)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it, so a GPU machine keeps its real platform.
        return False

    def current_device(self) -> str:
        # verl passes this to ``tensor.to(...)`` / ``device=``: an index would mean cuda:0. torch.cpu's own
        # current_device() is "cpu" too.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors that hold (fake) GPUs; verl reads it to name devices. Harmless on a CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


_verl_initialize_process_group_ray = verl_distributed.initialize_global_process_group_ray


def initialize_global_process_group_ray(timeout_second=None, backend=None):
    """verl's initializer, with ``backend="cpu:gloo"`` on the CPU platform (module docstring: why)."""
    if backend is None and get_platform().device_name == "cpu":
        backend = "cpu:gloo"
    return _verl_initialize_process_group_ray(timeout_second=timeout_second, backend=backend)


if "verl.workers.engine_workers" in sys.modules:
    raise ImportError(
        "tests.integrations.verl_cpu_platform must be imported before verl.workers.engine_workers (load it "
        "with VERL_USE_EXTERNAL_MODULES), or verl's workers keep the unwrapped process-group initializer"
    )
verl_distributed.initialize_global_process_group_ray = initialize_global_process_group_ray

# After the wrapper: the engine package must not be what first imports engine_workers.
from verl.workers.engine import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp import FSDPEngineWithLMHead  # noqa: E402

EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
    FSDPEngineWithLMHead
)
