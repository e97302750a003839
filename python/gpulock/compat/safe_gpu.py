"""Drop-in for safe-gpu (BUTSpeechFIT/safe_gpu, 1.1 to 2.0): replace ``from safe_gpu import
safe_gpu`` with ``from gpulock.compat import safe_gpu``.

As before: ``safe_gpu.claim_gpus(nb_gpus)`` claims GPUs for the rest of the process and keeps
the ``GPUOwner`` in ``safe_gpu.gpu_owner``; ``safe_gpu.GPUOwner(nb_gpus)`` claims them while the
object lives; both set CUDA_VISIBLE_DEVICES to the GPUs' nvidia-smi indices, record them as
ints in ``devices_taken``, call ``placeholder_fn(device_no)`` for device_no 0 .. nb_gpus-1
after a ``debug_sleep`` and keep the results in ``placeholders``, log "acquiring lock", "lock
acquired", "Set CUDA_VISIBLE_DEVICES=…" and "lock released", and raise ``RuntimeError`` at once
if not enough GPUs are free. ``release_gpus()`` releases the placeholders through
``placeholder_fn.release``. Every public name of 1.x and 2.0 is here: the placeholder classes
(``PytorchPlaceholder``, ``TensorflowPlaceholder``, ``PyCudaPlaceholder``) and 1.x's functions
(``pytorch_placeholder``, ``tensorflow_placeholder``), ``get_free_gpus``, ``NvidiasmiError``,
``LOCK_FILENAME``, ``SafeLock``, ``SafeUmask``, ``get_nvidia_smi_value``,
``is_single_gpu_display_mode``.

As in the original, a claim lasts for the rest of the process unless released: a ``GPUOwner``
that is not kept in a variable, or that ``claim_gpus`` replaces in ``gpu_owner``, keeps its GPUs
(the original's placeholder CUDA context held them until the process ended); and a second claim
in the same process claims further free GPUs and sets CUDA_VISIBLE_DEVICES to them.

What changes, and why: the claim is a gpulock lease, not a placeholder's piece of GPU memory, so
it holds on GPUs that are not in exclusive compute mode, against other gpulock users, and ends
the moment the process ends; ``gpulock status`` shows it. So no placeholder is needed, and the
default ``placeholder_fn`` is None: none is allocated (a CUDA context per GPU costs hundreds of
MB of GPU memory) unless one is passed. ``release_gpus()`` also ends the lease and puts
CUDA_VISIBLE_DEVICES back (the original left it pointing at GPUs that were no longer its own).
An existing CUDA_VISIBLE_DEVICES limits which GPUs may be claimed (safe-gpu overwrote it and
could claim GPUs the job was not given). Inside ``gpulock run``, after ``eval "$(gpulock
acquire …)"`` or in a ``lock_gpu()`` block, where every GPU the process may see is already its
own, a claim is lent those GPUs instead of waiting for its own process. A busy GPU is one leased or running someone's compute
process; nvidia-smi is not called, and the single-display-GPU workaround is not needed: that GPU
is leased like any other. ``wait=True`` (with ``timeout`` seconds) waits in gpulock's fair queue
instead of failing.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from typing import Any, Callable, List, Optional

from .._machine import gpus as _gpus
from ._devices import SavedEnvironment, callers_visible_devices, claim, register, visible_gpus

# 2.0's lock file; gpulock's lock directory is used instead. Kept for code that reads it.
LOCK_FILENAME = "/tmp/safe_gpu/gpu-lock-magic-RaNdOM-This_Name-NEED_BE-THE_SAME-Across_Users"

# The GPUOwner made by claim_gpus(), as in safe-gpu 1.5 and later.
gpu_owner: Optional["GPUOwner"] = None

# Every claim not released: a GPUOwner that is garbage-collected keeps its GPUs for the rest of
# the process, as the original's placeholder context did.
_claims: List[Any] = []

# The CUDA_VISIBLE_DEVICES values GPUOwners of this process set, each with the value it
# replaced: a second claim chooses among the GPUs the caller could see, not only the first's.
_values_set: List[List[Optional[str]]] = []




class NvidiasmiError(Exception):
    """safe-gpu raised it when nvidia-smi failed; gpulock does not run nvidia-smi, so it is
    never raised here. Kept so that ``except safe_gpu.NvidiasmiError`` still works."""


def get_free_gpus() -> List[str]:
    """The nvidia-smi indices (strings, sorted) of the GPUs nobody leases or computes on now.
    A snapshot: claim GPUs with ``claim_gpus`` or ``GPUOwner``."""
    from .._machine import status

    return sorted(str(g.index) for g in status().gpus if g.state == "free" and g.mig_index is None)


class _Placeholder:
    def __init__(self, logger: Any = logging) -> None:
        self.logger = logger

    def release(self, placeholder: Any) -> None:
        self.logger.info(
            f"Did nothing, {self._framework} doesn't expose interface for releasing GPUs"
        )

    _framework = ""


class PytorchPlaceholder(_Placeholder):
    """A one-element PyTorch tensor on ``cuda:device_no`` (safe-gpu 2.0's default)."""

    _framework = "PyTorch"

    def __call__(self, device_no: int) -> Any:
        import torch  # only when asked for: gpulock does not need PyTorch

        return torch.zeros((1,), device=f"cuda:{device_no}")


class TensorflowPlaceholder(_Placeholder):
    """A one-element TensorFlow constant on ``GPU:device_no``."""

    _framework = "TensorFlow"

    def __call__(self, device_no: int) -> Any:
        import tensorflow as tf  # only when asked for

        with tf.device(f"GPU:{device_no}"):
            return tf.constant([1.0])


class PyCudaPlaceholder(_Placeholder):
    """A pycuda context on device ``device_no``; ``release`` detaches it."""

    def __call__(self, device_no: int) -> Any:
        import pycuda.driver as cuda  # only when asked for

        cuda.init()
        return cuda.Device(device_no).make_context()

    def release(self, placeholder: Any) -> None:
        placeholder.detach()
        self.logger.info("Released a CUDA context")


def pytorch_placeholder(device_no: int) -> Any:
    """safe-gpu 1.x's placeholder function: a PyTorch tensor on ``cuda:device_no``."""
    return PytorchPlaceholder()(device_no)


def tensorflow_placeholder(device_no: int) -> Any:
    """safe-gpu 1.x's placeholder function: a TensorFlow constant on ``GPU:device_no``."""
    return TensorflowPlaceholder()(device_no)


class SafeLock:
    """safe-gpu's helper: an exclusive ``lockf`` on an open file for a ``with`` block."""

    def __init__(self, fd: Any, logger: Any = None) -> None:
        self.logger = logger if logger else logging
        self._fd = fd

    def __enter__(self) -> None:
        self.logger.info("acquiring lock")
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        self.logger.info("lock acquired")

    def __exit__(self, *exc_info: object) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self.logger.info("lock released")


class SafeUmask:
    """safe-gpu's helper: ``os.umask(working_mask)`` for a ``with`` block."""

    def __init__(self, working_mask: int) -> None:
        self.old_mask: Optional[int] = None
        self.working_mask = working_mask

    def __enter__(self) -> None:
        self.old_mask = os.umask(self.working_mask)

    def __exit__(self, *exc_info: object) -> None:
        if self.old_mask is not None:
            os.umask(self.old_mask)


def get_nvidia_smi_value(nvidia_smi_lines: List[str], key: str) -> str:
    """The last word of the first line containing ``key`` (``nvidia-smi -q`` output)."""
    for line in nvidia_smi_lines:
        if key in line:
            return line.split()[-1]
    raise KeyError(f'"{key}" not found in the provided nvidia-smi output')


def is_single_gpu_display_mode() -> bool:
    """Always False: gpulock leases a machine's only GPU like any other, display or not."""
    return False


class GPUOwner:
    """Claims ``nb_gpus`` GPUs for as long as this object lives (or until ``release_gpus``)."""

    def __init__(
        self,
        nb_gpus: int = 1,
        placeholder_fn: Optional[Callable[[int], Any]] = None,
        logger: Any = None,
        debug_sleep: float = 0.0,
        *,
        wait: bool = False,
        timeout: Optional[float] = None,
    ) -> None:
        self.logger = logger if logger is not None else logging
        self.debug_sleep = debug_sleep
        self.placeholder_fn = placeholder_fn
        self.devices_taken: List[int] = []
        self.placeholders: List[Any] = []
        self._environment = SavedEnvironment()  # before the lease exports its variables
        self._value_before = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._value_set: Optional[List[Optional[str]]] = None
        self.logger.info("acquiring lock")
        # Among the GPUs the caller could see; lent from the process's own lease where those are
        # all its own already (gpulock run, a lock_gpu block), else a new lease of free ones.
        shown = [g.uuid for _, g in visible_gpus(_gpus(), callers_visible_devices(_values_set))]
        self.lease: Any = claim(nb_gpus, shown, wait=wait, timeout=timeout, label="safe_gpu",
                                on_wait=None, respect_visible_devices=False)
        self.logger.info("lock acquired")
        register(self.lease)  # blocks inside may use these GPUs (GPUScheduler, lock_gpu)
        _claims.append(self.lease)
        try:
            self.allocate_gpus([str(i) for i in self.lease.indices])
        except BaseException:
            self._give_back()
            raise

    @property
    def gpu_ids(self) -> List[int]:
        """The claimed GPUs' nvidia-smi indices (the same as ``devices_taken``)."""
        return list(self.devices_taken)

    def allocate_gpus(self, gpu_device_numbers: List[str]) -> None:
        """Sets CUDA_VISIBLE_DEVICES to ``gpu_device_numbers``, waits ``debug_sleep`` seconds,
        makes the placeholders (if ``placeholder_fn``) and records ``devices_taken``. Called by
        the constructor with the leased GPUs."""
        before = getattr(self, "_value_before", os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._environment.set("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self._environment.set("CUDA_VISIBLE_DEVICES", ",".join(str(n) for n in gpu_device_numbers))
        self._value_set = [os.environ["CUDA_VISIBLE_DEVICES"], before]
        _values_set.append(self._value_set)
        self.logger.info(f"Set CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}")
        time.sleep(self.debug_sleep)
        if self.placeholder_fn is not None:
            try:
                self.placeholders.extend(
                    self.placeholder_fn(device_no) for device_no in range(len(gpu_device_numbers))
                )
            except RuntimeError:
                self.logger.error(
                    "Failed to acquire placeholder. Was CUDA already initialized when "
                    "calling `claim_gpus()`?"
                )
                raise
        self.devices_taken.extend(int(n) for n in gpu_device_numbers)

    def release_gpus(self) -> None:
        """Releases the placeholders (``placeholder_fn.release``, where it has one), then the
        GPUs, and puts CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER back as they were."""
        release = getattr(self.placeholder_fn, "release", None)
        for i, placeholder in enumerate(self.placeholders):
            self.logger.info(f"Releasing placeholder on CUDA device: {self.devices_taken[i]}")
            if release is not None:
                release(placeholder)
        self.placeholders = []
        if self.lease.active:
            self._give_back()
            self.logger.info("lock released")

    def release(self) -> None:
        """Gives the GPUs back now: ``release_gpus()``."""
        self.release_gpus()

    def _give_back(self) -> None:
        self.lease.release()  # a lease of its own also puts back the variables it exported
        self._environment.restore()
        if self._value_set in _values_set:
            _values_set.remove(self._value_set)
        if self.lease in _claims:
            _claims.remove(self.lease)


def claim_gpus(
    nb_gpus: int = 1,
    placeholder_fn: Optional[Callable[[int], Any]] = None,
    logger: Any = None,
    debug_sleep: float = 0.0,
    *,
    wait: bool = False,
    timeout: Optional[float] = None,
) -> None:
    """Claims ``nb_gpus`` GPUs for the rest of the process, sets CUDA_VISIBLE_DEVICES, and
    keeps the ``GPUOwner`` in ``safe_gpu.gpu_owner``. Call it before CUDA is initialised."""
    global gpu_owner
    gpu_owner = GPUOwner(nb_gpus, placeholder_fn, logger, debug_sleep, wait=wait, timeout=timeout)


def release_gpus() -> None:
    """``gpu_owner.release_gpus()`` for the GPUs ``claim_gpus`` claimed."""
    if gpu_owner is None:
        raise RuntimeError("release_gpus(): no GPUs were claimed with claim_gpus()")
    gpu_owner.release_gpus()
