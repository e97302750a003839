"""Views of the machine: its GPUs, their leases and the queue, as plain Python objects."""

from __future__ import annotations

from typing import List, Optional

from ._pool import default_pool
from ._views import Gpu, Queue, Status, gpus_from_json


def gpus(lock_dir: Optional[str] = None) -> List[Gpu]:
    """Every GPU of the machine with fresh readings (``gpulock gpus``)."""
    return gpus_from_json(default_pool(lock_dir).gpus_json())


def status(lock_dir: Optional[str] = None) -> Status:
    """Every GPU with its state, holder and processes, and the queue (``gpulock status``)."""
    return Status.from_json(default_pool(lock_dir).status_json())


def queue(lock_dir: Optional[str] = None) -> Queue:
    """The waiting requests in serving order (``gpulock queue``)."""
    return Queue.from_json(default_pool(lock_dir).queue_json())


def release(lease_id: str, lock_dir: Optional[str] = None) -> None:
    """Ends a detached lease taken with ``gpulock acquire`` (``gpulock release``)."""
    default_pool(lock_dir).release(lease_id)
