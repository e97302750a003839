"""The process's default pool: the machine's GPUs and lock directory, opened once.

Opening a pool loads the GPU driver (NVML) and reads the administrator's config, so it is kept
for the next call. It is opened again when one of the environment variables that choose the
pool changes, and in a child process after ``fork``.
"""

from __future__ import annotations

import os
import threading
TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (for a fast import)

from . import _native

if TYPE_CHECKING:
    from typing import Optional, Tuple

# The variables that decide which GPUs, which lock directory and which config a pool uses.
_POOL_VARIABLES = (
    "GPULOCK_DIR",
    "GPULOCK_FAKE_GPUS",
    "GPULOCK_NVML_LIBRARY",
    "GPULOCK_CONFIG",
    "GPULOCK_BACKEND",
    "GPULOCK_POOL",
    "GPULOCK_HOST",
    "GPULOCK_LEASE_TTL",
    "GPULOCK_REDIS_PASSWORD",
)

_lock = threading.Lock()
_cached: "Optional[Tuple[Tuple[Optional[str], ...], _native.Pool]]" = None


def _forget_after_fork() -> None:
    global _cached, _lock
    _cached = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def default_pool(lock_dir: Optional[str] = None) -> "_native.Pool":
    """The pool for ``lock_dir`` (default: GPULOCK_DIR, then the system's lock directory)."""
    global _cached
    key = tuple(os.environ.get(name) for name in _POOL_VARIABLES) + (lock_dir,)
    with _lock:
        if _cached is None or _cached[0] != key:
            _cached = (key, _native.Pool(lock_dir))
        return _cached[1]
