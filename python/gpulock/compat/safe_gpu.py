"""Drop-in for safe-gpu: replace ``from safe_gpu import safe_gpu`` with
``from gpulock.compat import safe_gpu``; ``safe_gpu.GPUOwner(nb_gpus)`` and
``safe_gpu.claim_gpus(nb_gpus)`` work as before.

As before, the GPUs are claimed for as long as the ``GPUOwner`` lives (or, with
``claim_gpus``, the process), CUDA_VISIBLE_DEVICES is set to them, and a ``RuntimeError``
(here ``gpulock.Unavailable``, a subclass) is raised at once if not enough GPUs are free.

What changes: the claim is a gpulock lease, not a piece of GPU memory, so no placeholder is
needed and none is allocated unless ``placeholder_fn`` is given; it works on machines where
GPUs are not in exclusive compute mode and for people who use other tools; it ends the moment
the process ends; it is seen by ``gpulock status``. Optionally, ``wait=True`` (with ``timeout``
seconds) waits in the fair queue instead of failing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

from .._lease import Lease, lease

# Claims made with claim_gpus(), kept for the life of the process.
_process_claims: List["GPUOwner"] = []


def pytorch_placeholder(device_no: int) -> Any:
    """A tiny PyTorch tensor on ``cuda:device_no`` (the seed's default placeholder)."""
    import torch  # only when asked for: gpulock does not need PyTorch

    return torch.zeros((1,), device=f"cuda:{device_no}")


def tensorflow_placeholder(device_no: int) -> Any:
    """A tiny TensorFlow constant on ``GPU:device_no``."""
    import tensorflow as tf  # only when asked for

    with tf.device(f"GPU:{device_no}"):
        return tf.constant([1.0])


class GPUOwner:
    """Claims ``nb_gpus`` GPUs for as long as this object lives."""

    def __init__(
        self,
        nb_gpus: int = 1,
        placeholder_fn: Optional[Callable[[int], Any]] = None,
        logger: Optional[logging.Logger] = None,
        debug_sleep: float = 0.0,
        *,
        wait: bool = False,
        timeout: Optional[float] = None,
    ) -> None:
        self.logger = logger if logger is not None else logging.getLogger("gpulock.compat.safe_gpu")
        self.logger.info("acquiring lock")
        # debug_sleep made the seed's race visible; there is no race to show here.
        del debug_sleep
        self.lease: Lease = lease(
            count=nb_gpus,
            wait=wait,
            timeout=timeout,
            label="safe_gpu",
            on_wait=None,
        )
        self.logger.info("lock acquired")
        self.gpu_ids: List[int] = list(self.lease.indices)
        self.logger.info(f"Set CUDA_VISIBLE_DEVICES={self.lease.cuda_visible_devices}")
        self.placeholders = (
            [placeholder_fn(device_no) for device_no in range(nb_gpus)] if placeholder_fn else []
        )

    def release(self) -> None:
        """Gives the GPUs back now (the seed only did so when the object was collected)."""
        self.placeholders = []
        self.lease.release()
        self.logger.info("lock released")

    def __del__(self) -> None:
        lease_ = getattr(self, "lease", None)
        if lease_ is not None and lease_.active:
            lease_.release()


def claim_gpus(
    nb_gpus: int = 1,
    placeholder_fn: Optional[Callable[[int], Any]] = None,
    logger: Optional[logging.Logger] = None,
    *,
    wait: bool = False,
    timeout: Optional[float] = None,
) -> None:
    """Claims ``nb_gpus`` GPUs for the rest of the process and sets CUDA_VISIBLE_DEVICES."""
    _process_claims.append(
        GPUOwner(nb_gpus, placeholder_fn, logger, wait=wait, timeout=timeout)
    )
