"""gpulock: exclusive, never-stale GPU leases on shared machines, waiting in a fair queue.

    import gpulock

    with gpulock.lease(count=2, min_free_mem="20G", timeout=3600) as lease:
        print(lease.cuda_visible_devices)   # also set in os.environ
        train()

Leases taken here are the same as the CLI's (``gpulock run``): ``gpulock status`` shows them
and they wait in the same queue. Drop-in replacements for other tools' APIs are in
``gpulock.compat``. Documentation: docs/python.md.
"""

from __future__ import annotations

from . import _errors  # first: the native module looks its exception classes up here
from ._errors import (
    ConfigError,
    CudaAlreadyInitializedWarning,
    Error,
    InternalError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    SetupError,
    Timeout,
    Unavailable,
    Unsatisfiable,
)
from ._lease import Lease, cuda_initialized, lease
from ._machine import gpus, queue, release, status
from ._native import __version__
from ._views import Gpu, GpuProcess, GpuStatus, Holder, Queue, QueueEntry, Status

__all__ = [
    "ConfigError",
    "CudaAlreadyInitializedWarning",
    "Error",
    "Gpu",
    "GpuProcess",
    "GpuStatus",
    "Holder",
    "InternalError",
    "InvalidRequest",
    "Lease",
    "NotFound",
    "PermissionDenied",
    "Queue",
    "QueueEntry",
    "SetupError",
    "Status",
    "Timeout",
    "Unavailable",
    "Unsatisfiable",
    "__version__",
    "cuda_initialized",
    "gpus",
    "lease",
    "queue",
    "release",
    "status",
]
