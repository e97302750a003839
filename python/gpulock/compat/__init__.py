"""Drop-in replacements for the APIs of the tools gpulock replaces; change one import:

    from gpu_lock import lock_gpu                  ->  from gpulock.compat import lock_gpu
    from safe_gpu import safe_gpu                  ->  from gpulock.compat import safe_gpu
    from gpu_scheduler import GPUScheduler         ->  from gpulock.compat import GPUScheduler

Each module's documentation says what stays and what changes; docs/python.md has the table.
"""

from __future__ import annotations

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
_MODULES = ("gpu_lock", "gpu_scheduler", "safe_gpu")


def __getattr__(name: str) -> object:
    import importlib

    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'gpulock.compat' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_HOME) | set(_MODULES))


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
