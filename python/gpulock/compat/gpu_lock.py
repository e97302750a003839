"""Drop-in for gpu_lock's ``lock_gpu``: ``from gpulock.compat import lock_gpu``.

As before, ``with lock_gpu(uid=0):`` locks GPU 0 and ``with lock_gpu():`` locks any free GPU,
raising ``RuntimeError`` (here ``gpulock.Unavailable``, a subclass) at once if it is taken, and
CUDA_VISIBLE_DEVICES is left alone: select the GPU yourself, e.g. ``.to(f"cuda:{gpu}")``.

What changes: the lock cannot go stale or be taken twice (it is a kernel lock that ends with
the process, SIGKILL included), a GPU you locked in another of your processes is not taken
from it, the lock is seen by ``gpulock status`` and by every gpulock user, and the context
manager yields the GPU's index. CUDA_DEVICE_ORDER is set to PCI_BUS_ID when unset, so that
``cuda:N`` is the GPU that nvidia-smi calls N. Optionally, ``wait=True`` (with ``timeout``
seconds) waits in the fair queue instead of failing.
"""

from __future__ import annotations

import contextlib
import os

from .._lease import lease

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Iterator, Optional


@contextlib.contextmanager
def lock_gpu(
    uid: Optional[int] = None, *, wait: bool = False, timeout: Optional[float] = None
) -> Iterator[int]:
    """Locks GPU ``uid`` (its nvidia-smi index), or any free GPU when ``uid`` is None, for the
    ``with`` block, and yields the GPU's index."""
    held = lease(
        gpus=None if uid is None else [uid],
        wait=wait,
        timeout=timeout,
        set_env=False,
        respect_visible_devices=False,
        label="gpu_lock",
        on_wait=None,
    )
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        yield held.indices[0]
    finally:
        held.release()
