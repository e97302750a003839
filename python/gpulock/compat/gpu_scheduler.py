"""Drop-in for gpu_scheduler: replace ``from gpu_scheduler import GPUScheduler`` (and
``get_gpu_info``, ``find_free_gpus``, ...) with ``from gpulock.compat import ...``.

As before, ``with GPUScheduler(num_gpus=2, memory_free_threshold_gb=10) as gpu_ids:`` waits
for healthy GPUs and yields their nvidia-smi indices, makes ``torch.cuda`` default to the first
when PyTorch is loaded, and leaves CUDA_VISIBLE_DEVICES alone, so ``f"cuda:{gpu_ids[0]}"`` is
the right device.

What changes: no nvidia-smi polling (``poll_interval`` is accepted and unused): the wait is in
gpulock's fair queue, woken when a lease ends, with health re-read every 2 s; the lock cannot go
stale and is seen by every gpulock user; GPUs running processes of people not using gpulock are
skipped too (``debug_mode=True`` skips every check, as before); CUDA_DEVICE_ORDER is set to
PCI_BUS_ID when unset, so that ``cuda:N`` is the GPU nvidia-smi calls N. Exceeding
``max_wait_time`` raises ``gpulock.Timeout``, a ``TimeoutError``. ``timeout`` (the seed's
lock-file timeout) is accepted and unused: gpulock's own lock is held for microseconds.
Banned GPUs are better set for everyone in the administrator's config (``exclude_gpus``);
``BANNED_GPUS`` and ``BANNED_GPU_NAMES`` below still work per process.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Dict, Iterable, List, Optional

from .._errors import Unsatisfiable
from .._lease import Lease, lease
from .._machine import gpus as _gpus
from .._machine import status as _status
from .._views import Gpu

# GPU indices and model names this process never uses (the seed's gpu_info.py settings).
BANNED_GPUS: List[int] = []
BANNED_GPU_NAMES: List[str] = []

_MIB = 1024 * 1024
_GIB = 1024 * _MIB


def _allowed(gpu: Gpu, specific_gpus: Optional[Iterable[int]]) -> bool:
    if gpu.mig_index is not None or gpu.index in BANNED_GPUS or gpu.name in BANNED_GPU_NAMES:
        return False
    return specific_gpus is None or gpu.index in set(specific_gpus)


def _healthy(
    gpu: Gpu,
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
    """One dict per GPU: gpu_id, name, memory_free / memory_used / memory_total (MiB),
    power_draw / power_limit (W), utilization (%); None where the driver gives no reading."""
    return [
        {
            "gpu_id": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "memory_free": _mib(g.memory_free_bytes),
            "memory_used": _mib(g.memory_used_bytes),
            "memory_total": _mib(g.memory_total_bytes),
            "power_draw": g.power_draw_watts,
            "power_limit": g.power_limit_watts,
            "utilization": g.utilization_percent,
        }
        for g in _gpus()
        if g.mig_index is None
    ]


def get_total_num_gpus() -> int:
    """How many GPUs the machine has (MIG instances not counted)."""
    return sum(1 for g in _gpus() if g.mig_index is None)


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
    """Indices of the GPUs that pass the health checks, that nobody leases or uses outside
    gpulock, and that the queue does not hold back for a waiting request. A snapshot: use
    ``GPUScheduler`` to actually take one."""
    free: List[int] = []
    for g in _status().gpus:
        if g.state != "free" or g.reserved_for is not None or not _allowed(g, specific_gpus):
            continue
        if debug_mode or _healthy(
            g, memory_free_threshold_gb, power_threshold_w, utilization_threshold_percent
        ):
            free.append(g.index)
    return free


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
        del poll_interval, timeout  # see the module's documentation
        self.memory_free_threshold_gb = memory_free_threshold_gb
        self.power_threshold_w = power_threshold_w
        self.utilization_threshold_percent = utilization_threshold_percent
        self.max_wait_time = max_wait_time
        self.specific_gpus = specific_gpus
        self.num_gpus = num_gpus
        self.debug_mode = debug_mode
        self.gpu_ids: List[int] = []
        self._lease: Optional[Lease] = None

    def __enter__(self) -> List[int]:
        candidates = [g.index for g in _gpus() if _allowed(g, self.specific_gpus)]
        if not candidates:
            raise Unsatisfiable(
                "no GPU is allowed: specific_gpus, BANNED_GPUS and BANNED_GPU_NAMES exclude all "
                "of this machine's GPUs"
            )
        health: Dict[str, Any] = {}
        if not self.debug_mode:
            health = {
                "min_free_mem": int(math.ceil(self.memory_free_threshold_gb * _GIB)),
                "max_util": int(math.floor(self.utilization_threshold_percent)),
                "max_power": self.power_threshold_w,
            }
        self._lease = lease(
            count=self.num_gpus,
            among=candidates,
            timeout=None if math.isinf(self.max_wait_time) else self.max_wait_time,
            allow_foreign=self.debug_mode,
            set_env=False,
            label="gpu_scheduler",
            **health,
        )
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self.gpu_ids = list(self._lease.indices)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.set_device(self.gpu_ids[0])
        return list(self.gpu_ids)

    def __exit__(self, *exc_info: object) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
