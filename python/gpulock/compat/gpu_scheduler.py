"""Drop-in for gpu_scheduler: replace ``from gpu_scheduler import GPUScheduler`` (and
``get_gpu_info``, ``find_free_gpus``, ...) with ``from gpulock.compat import ...``.

As before, ``with GPUScheduler(num_gpus=2, memory_free_threshold_gb=10) as gpu_ids:`` waits
for healthy GPUs and yields their numbers as PyTorch counts them (``f"cuda:{gpu_ids[0]}"`` is
the right device), makes ``torch.cuda`` default to the first, and leaves CUDA_VISIBLE_DEVICES
alone. ``specific_gpus``, ``BANNED_GPUS`` and the utilities' ``gpu_id`` use the same numbers.

What changes, and why: the numbers are always valid in the caller's process: with
CUDA_VISIBLE_DEVICES already set (Slurm, a container, ``safe_gpu``, ``gpulock run``) only the
GPUs it shows are candidates and ``gpu_ids`` are their positions in it (gpu_scheduler picked
among all the machine's GPUs and could hand back a GPU the process cannot see, or one it sees
under another number). ``torch.cuda.set_device`` is called also when PyTorch is first imported
inside the block, and the previous device is made current again after it if CUDA was initialised
before the block (if not, the block's device stays current: making device 0 current would
create a CUDA context on a GPU that may be someone else's); CUDA_DEVICE_ORDER is
PCI_BUS_ID for the block when unset, then removed again. No nvidia-smi polling
(``poll_interval`` is accepted and unused): the wait is in gpulock's fair queue, woken when a
lease ends, with health re-read every 2 s; the lock cannot go stale and is seen by every gpulock
user; GPUs running processes of people not using gpulock are skipped too (``debug_mode=True``
skips every check, as before). Exceeding ``max_wait_time`` raises ``gpulock.Timeout``, a
``TimeoutError``. ``timeout`` (the seed's lock-file timeout) is accepted and unused: gpulock's
own lock is held for microseconds. Banned GPUs are better set for everyone in the
administrator's config (``exclude_gpus``); ``BANNED_GPUS`` and ``BANNED_GPU_NAMES`` below still
work per process.
"""

from __future__ import annotations

import importlib.abc
import math
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .._errors import Unsatisfiable
from .._machine import gpus as _gpus
from .._machine import status as _status
from ._devices import SavedEnvironment, caller_numbers, claim, visible_gpus

# GPU numbers (as PyTorch counts them in this process) and model names this process never uses
# (the seed's gpu_info.py settings).
BANNED_GPUS: List[int] = []
BANNED_GPU_NAMES: List[str] = []

_MIB = 1024 * 1024
_GIB = 1024 * _MIB


def _allowed(number: int, gpu: Any, specific_gpus: Optional[Iterable[int]]) -> bool:
    if number in BANNED_GPUS or gpu.name in BANNED_GPU_NAMES:
        return False
    return specific_gpus is None or number in set(specific_gpus)


def _healthy(
    gpu: Any,
    memory_free_threshold_gb: float,
    power_threshold_w: Optional[float],
    utilization_threshold_percent: float,
) -> bool:
    if gpu.memory_free_bytes is None or gpu.memory_free_bytes < memory_free_threshold_gb * _GIB:
        return False
    if power_threshold_w is not None and (
        gpu.power_draw_watts is None or gpu.power_draw_watts > power_threshold_w
    ):
        return False
    return gpu.utilization_percent is not None and (
        gpu.utilization_percent <= utilization_threshold_percent
    )


def _mib(value: Optional[int]) -> Optional[int]:
    return None if value is None else value // _MIB


def get_gpu_info() -> List[Dict[str, Any]]:
    """One dict per GPU this process can see: gpu_id (its number here), name, uuid,
    memory_free / memory_used / memory_total (MiB), power_draw / power_limit (W), utilization
    (%); None where the driver gives no reading."""
    return [
        {
            "gpu_id": number,
            "name": g.name,
            "uuid": g.uuid,
            "memory_free": _mib(g.memory_free_bytes),
            "memory_used": _mib(g.memory_used_bytes),
            "memory_total": _mib(g.memory_total_bytes),
            "power_draw": g.power_draw_watts,
            "power_limit": g.power_limit_watts,
            "utilization": g.utilization_percent,
        }
        for number, g in visible_gpus(_gpus())
    ]


def get_total_num_gpus() -> int:
    """How many GPUs this process can see (MIG instances not counted unless named in
    CUDA_VISIBLE_DEVICES)."""
    return len(visible_gpus(_gpus()))


def get_gpu_names() -> List[str]:
    return [info["name"] for info in get_gpu_info()]


def get_gpu_memory_usage() -> List[Dict[str, Any]]:
    """Per GPU: gpu_id, memory_used, memory_free, memory_total (MiB)."""
    keys = ("gpu_id", "memory_used", "memory_free", "memory_total")
    return [{k: info[k] for k in keys} for info in get_gpu_info()]


def get_gpu_power_usage() -> List[Optional[float]]:
    """Per GPU, the power draw in watts."""
    return [info["power_draw"] for info in get_gpu_info()]


def get_gpu_utilization() -> List[Optional[int]]:
    """Per GPU, the utilisation in percent."""
    return [info["utilization"] for info in get_gpu_info()]


def find_free_gpus(
    memory_free_threshold_gb: float = 20,
    power_threshold_w: Optional[float] = 80,
    utilization_threshold_percent: float = 1,
    specific_gpus: Optional[List[int]] = None,
    debug_mode: bool = False,
) -> List[int]:
    """Numbers (as in this process) of the GPUs that pass the health checks, that nobody
    leases or uses outside gpulock, and that the queue does not hold back for a waiting
    request. A snapshot: use ``GPUScheduler`` to actually take one."""
    free: List[int] = []
    for number, g in visible_gpus(_status().gpus):
        if g.state != "free" or g.reserved_for is not None:
            continue
        if not _allowed(number, g, specific_gpus):
            continue
        if debug_mode or _healthy(
            g, memory_free_threshold_gb, power_threshold_w, utilization_threshold_percent
        ):
            free.append(number)
    return free


class _SetDeviceOnImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(torch)`` right after ``import torch`` runs, when PyTorch is first
    imported inside a GPUScheduler block; installed in ``sys.meta_path`` for the block."""

    def __init__(self, callback: Callable[[Any], None]) -> None:
        self._callback = callback

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self._callback)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[Any], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


def _cuda_of(torch: Any) -> Any:
    """``torch.cuda`` if PyTorch can use CUDA here, else None."""
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_available() else None
    except Exception:  # a broken CUDA set-up: PyTorch will say so when it is used
        return None


class GPUScheduler:
    """Waits for ``num_gpus`` healthy GPUs and holds them for the ``with`` block."""

    def __init__(
        self,
        memory_free_threshold_gb: float = 20,
        power_threshold_w: Optional[float] = 80,
        utilization_threshold_percent: float = 1,
        max_wait_time: float = float("inf"),
        poll_interval: int = 10,
        specific_gpus: Optional[List[int]] = None,
        timeout: int = 10,
        num_gpus: int = 1,
        debug_mode: bool = False,
    ) -> None:
        self.memory_free_threshold_gb = memory_free_threshold_gb
        self.power_threshold_w = power_threshold_w
        self.utilization_threshold_percent = utilization_threshold_percent
        self.max_wait_time = max_wait_time
        self.poll_interval = poll_interval  # unused: see the module's documentation
        self.specific_gpus = specific_gpus
        self.timeout = timeout  # unused
        self.num_gpus = num_gpus
        self.debug_mode = debug_mode
        self.gpu_ids: List[int] = []
        self._lease: Any = None  # a gpulock.Lease, or GPUs lent by an enclosing block
        self._environment: Optional[SavedEnvironment] = None
        self._hook: Optional[_SetDeviceOnImport] = None
        self._previous_device: Optional[Tuple[Any, int]] = None

    def _candidates(self) -> List[str]:
        shown: Sequence[Tuple[int, Any]] = visible_gpus(_gpus())
        allowed = [g.uuid for n, g in shown if _allowed(n, g, self.specific_gpus)]
        if not allowed:
            raise Unsatisfiable(
                "no GPU is allowed: specific_gpus, BANNED_GPUS, BANNED_GPU_NAMES and "
                "CUDA_VISIBLE_DEVICES exclude all of this machine's GPUs"
            )
        return allowed

    def _set_device(self, torch: Any) -> None:
        cuda = _cuda_of(torch)
        if cuda is None or not self.gpu_ids:
            return
        try:
            if self._previous_device is None and cuda.is_initialized():
                self._previous_device = (cuda, cuda.current_device())
        except Exception:
            pass
        cuda.set_device(self.gpu_ids[0])

    def __enter__(self) -> List[int]:
        health: Dict[str, Any] = {}
        if not self.debug_mode:
            health = {
                "min_free_mem": int(math.ceil(self.memory_free_threshold_gb * _GIB)),
                "max_util": int(math.floor(self.utilization_threshold_percent)),
                "max_power": self.power_threshold_w,
            }
        self._lease = claim(
            self.num_gpus,
            self._candidates(),
            timeout=None if math.isinf(self.max_wait_time) else self.max_wait_time,
            allow_foreign=self.debug_mode,
            set_env=False,
            label="gpu_scheduler",
            on_wait=None,
            **health,
        )
        try:
            self.gpu_ids = caller_numbers(self._lease.indices, self._lease.gpus)
            self._environment = SavedEnvironment()
            self._environment.default_device_order()
            torch = sys.modules.get("torch")
            if torch is not None:
                self._set_device(torch)
            else:
                self._hook = _SetDeviceOnImport(self._set_device)
                sys.meta_path.insert(0, self._hook)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return list(self.gpu_ids)

    def __exit__(self, *exc_info: object) -> None:
        if self._hook is not None:
            if self._hook in sys.meta_path:
                sys.meta_path.remove(self._hook)
            self._hook = None
        previous, self._previous_device = self._previous_device, None
        if previous is not None:
            try:
                previous[0].set_device(previous[1])
            except Exception:
                pass
        if self._environment is not None:
            self._environment.restore()
            self._environment = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None
