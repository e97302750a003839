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
from ._lazy import lazy_attributes
from ._native import __version__

# The views and their dataclasses are loaded on first use: `import gpulock` stays fast for the
# programs that only take a lease.
_LAZY = {
    "Job": "_jobs",
    "jobs": "_jobs",
    "submit": "_jobs",
    "gpus": "_machine",
    "queue": "_machine",
    "release": "_machine",
    "status": "_machine",
    "Gpu": "_views",
    "GpuProcess": "_views",
    "GpuStatus": "_views",
    "Holder": "_views",
    "Intruder": "_views",
    "Queue": "_views",
    "QueueEntry": "_views",
    "Status": "_views",
}


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY)

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:  # what type checkers and IDEs see of the lazy names
    from ._jobs import Job, jobs, submit
    from ._machine import gpus, queue, release, status
    from ._views import Gpu, GpuProcess, GpuStatus, Holder, Intruder, Queue, QueueEntry, Status

__all__ = [
    "ConfigError",
    "CudaAlreadyInitializedWarning",
    "Error",
    "Gpu",
    "GpuProcess",
    "GpuStatus",
    "Holder",
    "InternalError",
    "Intruder",
    "InvalidRequest",
    "Job",
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
    "jobs",
    "lease",
    "queue",
    "release",
    "status",
    "submit",
]
