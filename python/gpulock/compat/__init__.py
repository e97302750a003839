"""Drop-in replacements for the APIs of the tools gpulock replaces; change one import:

    from gpu_lock import lock_gpu                  ->  from gpulock.compat import lock_gpu
    from safe_gpu import safe_gpu                  ->  from gpulock.compat import safe_gpu
    from gpu_scheduler import GPUScheduler         ->  from gpulock.compat import GPUScheduler

Each module's documentation says what stays and what changes; docs/python.md has the table.
"""

from __future__ import annotations

from . import gpu_lock, gpu_scheduler, safe_gpu
from .gpu_lock import lock_gpu
from .gpu_scheduler import (
    GPUScheduler,
    find_free_gpus,
    get_gpu_info,
    get_gpu_memory_usage,
    get_gpu_names,
    get_gpu_power_usage,
    get_gpu_utilization,
    get_total_num_gpus,
)
from .safe_gpu import GPUOwner, claim_gpus

__all__ = [
    "GPUOwner",
    "GPUScheduler",
    "claim_gpus",
    "find_free_gpus",
    "get_gpu_info",
    "get_gpu_memory_usage",
    "get_gpu_names",
    "get_gpu_power_usage",
    "get_gpu_utilization",
    "get_total_num_gpus",
    "gpu_lock",
    "gpu_scheduler",
    "lock_gpu",
    "safe_gpu",
]
