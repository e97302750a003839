"""Drop-in replacements for the APIs of the tools gpulock replaces; change one import:

    from gpu_lock import lock_gpu                  ->  from gpulock.compat import lock_gpu
    from safe_gpu import safe_gpu                  ->  from gpulock.compat import safe_gpu
    from gpu_scheduler import GPUScheduler         ->  from gpulock.compat import GPUScheduler
    GPU.py --get (kulvait/GPUGET)                  ->  gpulock-gpu --get   (gpu_py.py)

Each module's documentation says what stays and what changes; docs/migration.md has the
before/after for each tool and every behavioural difference with its reason.
"""

from __future__ import annotations

from .._lazy import lazy_attributes

# Each name is loaded from its module on first use, so that `from gpulock.compat import
# lock_gpu` loads only what lock_gpu needs.
_HOME = {
    "lock_gpu": "gpu_lock",
    "GPUOwner": "safe_gpu",
    "claim_gpus": "safe_gpu",
    "GPUScheduler": "gpu_scheduler",
    "find_free_gpus": "gpu_scheduler",
    "get_gpu_info": "gpu_scheduler",
    "get_gpu_memory_usage": "gpu_scheduler",
    "get_gpu_names": "gpu_scheduler",
    "get_gpu_power_usage": "gpu_scheduler",
    "get_gpu_utilization": "gpu_scheduler",
    "get_total_num_gpus": "gpu_scheduler",
}
_HOME.update({name: name for name in ("gpu_lock", "gpu_py", "gpu_scheduler", "safe_gpu")})

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _HOME)

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:  # what type checkers and IDEs see of the lazy names
    from . import gpu_lock, gpu_py, gpu_scheduler, safe_gpu
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
    "gpu_py",
    "gpu_scheduler",
    "lock_gpu",
    "safe_gpu",
]
