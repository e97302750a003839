"""Drop-in for gpu_lock (idsc-frazzoli/gpu_lock): ``from gpulock.compat import lock_gpu``, or
``from gpulock.compat.gpu_lock import *`` for every public name.

Both released APIs work, told apart by what the caller passes:

* 0.2.1 (what ``pip install git+…/gpu_lock.git`` installs): ``lock_gpu(n=1, n_system_gpus=8)``.
  ``lock_gpu()``, ``lock_gpu(3)`` and ``lock_gpu(n=3)`` lease that many GPUs when called
  (``RuntimeError`` at once if they are not free), set CUDA_VISIBLE_DEVICES to them and
  CUDA_DEVICE_ORDER=PCI_BUS_ID inside the ``with`` block, and the object has ``.uid``: the
  GPUs' nvidia-smi indices (an int for one GPU, a list for more), as 0.2.1 returned them.
* 0.0.1 (the 2020 README): ``lock_gpu(uid=0)`` locks that GPU when the block starts, and
  ``lock_gpu(uid=None)`` any free GPU (leased when called); CUDA_VISIBLE_DEVICES is left
  alone: select the GPU yourself, e.g. ``.to(f"cuda:{gpu}")`` with ``with … as gpu``.

What changes, and why: the lock is a gpulock lease, a kernel lock that ends with the process
(SIGKILL included), so it cannot go stale, be taken by two processes at once (0.2.1 let a
process of the same user take over a lock of the same PID), or be deleted by others; it is
seen by ``gpulock status``. A positional ``lock_gpu(2)`` means two GPUs (0.2.1), not GPU 2
(0.0.1): the released version wins; write ``uid=2`` for a GPU. ``uid`` is a CUDA number in the
caller's process: with CUDA_VISIBLE_DEVICES=2,3 already set, ``uid=0`` is GPU 2, so that
``cuda:0`` is the locked GPU. The 0.2.1 form chooses only among the GPUs CUDA_VISIBLE_DEVICES
already shows, and the block puts both variables back as they were (0.2.1 left
``CUDA_VISIBLE_DEVICES=""`` behind). The object yielded by ``with`` is also the GPU number as
an int (one GPU) or a list of numbers, so ``with lock_gpu() as gpu: f"cuda:{gpu}"`` works.
``wait=True`` (with ``timeout`` seconds) waits in gpulock's fair queue instead of failing.
``LOCKDIR`` is kept for code that reads it; gpulock's lock directory is used instead.
"""

from __future__ import annotations

import getpass
import logging
import os
from typing import Any, List, Optional, Union

from .._errors import InvalidRequest, Unsatisfiable
from .._machine import gpus as _gpus
from ._devices import (SavedEnvironment, caller_numbers, callers_visible_devices, claim, register,
                       visible_gpus)

# The originals' module names. LOCKDIR and N_GPUS are not used: gpulock's lock directory
# (GPULOCK_DIR) and the machine's GPUs are.
LOCKDIR = "/var/tmp/gpu_lock"
N_GPUS = 8  # 0.0.1's number of GPUs tried by lock_gpu()
version = "0.2.1"  # the gpu_lock release this module follows
logger = logging.getLogger("gpu_locking")

__all__ = ["LOCKDIR", "N_GPUS", "lock_gpu", "logger", "version"]


class _GPULock(int):
    """One locked GPU: an int (the GPU's number) with 0.2.1's attributes ``uid``, ``user`` and
    ``pid``, and ``lease``, the gpulock lease (None until it is taken)."""

    uid: Any
    lease: Any  # a gpulock.Lease, or GPUs lent by an enclosing block; None until taken

    def __new__(cls, uid: int, **kwargs: Any) -> "_GPULock":
        return super().__new__(cls, uid)

    def __init__(
        self,
        uid: int,
        *,
        sets_env: bool,
        wait: bool,
        timeout: Optional[float],
        held: Any = None,
    ) -> None:
        self.uid = uid
        self.user: str = getpass.getuser()
        self.pid: int = os.getpid()
        self.lease = held
        self._sets_env = sets_env
        self._wait = wait
        self._timeout = timeout
        self._environment: Optional[SavedEnvironment] = None

    def _take(self) -> Any:
        """The lease of GPU ``uid``: 0.0.1 takes it on entry, 0.2.1 again on a second entry."""
        if self._sets_env:  # 0.2.1's uid is an nvidia-smi index
            shown = [g for _, g in visible_gpus(_gpus(), _callers_visible_devices())]
            gpu = next((g for g in shown if g.index == self.uid), None)
        else:  # 0.0.1's uid: cuda:uid in this process
            shown = [g for _, g in visible_gpus(_gpus())]
            gpu = shown[self.uid] if self.uid < len(shown) else None
        if gpu is None:
            raise Unsatisfiable(
                f"GPU {self.uid} does not exist in this process: CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')} shows {len(shown)} GPU(s)"
            )
        return claim(1, [gpu.uuid], exact=True, wait=self._wait, timeout=self._timeout,
                     set_env=False, label="gpu_lock", on_wait=None)

    def check_lock_availability(self) -> None:
        """Raises ``RuntimeError`` unless this object's GPU is leased to it, or free."""
        if self.lease is not None and self.lease.active:
            return
        probe = self._take()
        probe.release()

    @staticmethod
    def check_pid_alive(pid: int) -> bool:
        """True if process ``pid`` exists (one of another user's counts too)."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def __enter__(self) -> "_GPULock":
        if self.lease is None or not self.lease.active:
            self.lease = self._take()
        if self._sets_env:
            self._environment = _export(self.lease)
        else:  # so that cuda:N is the GPU nvidia-smi calls N, for the block
            self._environment = SavedEnvironment()
            self._environment.default_device_order()
        logger.debug(f"Aquired lock on GPU {self.uid}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._environment is not None:
            _unexport(self._environment)
            self._environment = None
        if self.lease is not None:
            self.lease.release()
        logger.debug(f"Released GPU {self.uid} lock")

    def __repr__(self) -> str:
        held = self.lease is not None and self.lease.active
        return f"<gpu_lock {self.uid} ({'held' if held else 'not held'})>"


class _MultiGPULock(list):  # type: ignore[type-arg]
    """Several locked GPUs (0.2.1, ``n > 1``): a list of their numbers, with ``uid`` (the
    same list), ``locks`` (one ``_GPULock`` per GPU) and ``lease``."""

    def __init__(self, held: Any) -> None:
        super().__init__(held.indices)
        self.lease = held
        self.uid: List[int] = list(held.indices)
        self.locks: List[_GPULock] = [
            _GPULock(i, sets_env=False, wait=False, timeout=None, held=held) for i in held.indices
        ]
        self._environment: Optional[SavedEnvironment] = None

    def __enter__(self) -> "_MultiGPULock":
        if not self.lease.active:
            self.lease = claim(len(self.uid), list(self.lease.gpus), exact=True, wait=False,
                               set_env=False, label="gpu_lock", on_wait=None)
        self._environment = _export(self.lease)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._environment is not None:
            _unexport(self._environment)
            self._environment = None
        self.lease.release()


# The CUDA_VISIBLE_DEVICES values that 0.2.1-style blocks of this process set, innermost last,
# each with the value it replaced: a lock taken inside such a block is not limited to the
# outer block's GPUs, and joins them in CUDA_VISIBLE_DEVICES, as in 0.2.1.
_blocks: List[List[Optional[str]]] = []


def _callers_visible_devices() -> Optional[str]:
    """CUDA_VISIBLE_DEVICES as the caller set it, looking through 0.2.1-style blocks."""
    return callers_visible_devices(_blocks)


def _export(held: Any) -> SavedEnvironment:
    """0.2.1's side effect: CUDA_VISIBLE_DEVICES = the locked GPUs (joined to an enclosing
    block's), CUDA_DEVICE_ORDER=PCI_BUS_ID (so the indices mean what nvidia-smi says), until
    the block ends."""
    saved = SavedEnvironment()
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    value = held.cuda_visible_devices
    if _blocks and current == _blocks[-1][0] and current:
        value = current + "," + value
    saved.set("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    saved.set("CUDA_VISIBLE_DEVICES", value)
    block: List[Optional[str]] = [value, current]
    _blocks.append(block)
    saved.block = block  # type: ignore[attr-defined]
    return saved


def _unexport(saved: SavedEnvironment) -> None:
    # This block's own entry, even if the caller changed CUDA_VISIBLE_DEVICES in the block: a
    # stale entry would make a later block misread the caller's value.
    block = getattr(saved, "block", None)
    for n in range(len(_blocks) - 1, -1, -1):
        if _blocks[n] is block:
            del _blocks[n]
            break
    saved.restore()


def _candidates(n_system_gpus: int) -> List[str]:
    """The GPUs 0.2.1 may lock: GPUs 0 .. n_system_gpus-1 that the caller's
    CUDA_VISIBLE_DEVICES shows."""
    shown = visible_gpus(_gpus(), _callers_visible_devices())
    allowed = [g.uuid for _, g in shown if g.index < n_system_gpus]
    if not allowed:
        raise Unsatisfiable(
            f"no GPU to lock: n_system_gpus={n_system_gpus} and CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')} leave none of this machine's GPUs"
        )
    return allowed


_ANY = object()  # uid not passed: the 0.2.1 API


def lock_gpu(
    n: Optional[int] = 1,
    n_system_gpus: int = 8,
    *,
    uid: Any = _ANY,
    wait: bool = False,
    timeout: Optional[float] = None,
) -> Union[_GPULock, _MultiGPULock]:
    """0.2.1: leases ``n`` GPUs now (among the first ``n_system_gpus``) and returns a lock whose
    ``with`` block sets CUDA_VISIBLE_DEVICES to them. 0.0.1: ``uid=N`` returns a lock of GPU N
    (``cuda:N`` in this process), taken when the block starts, and ``uid=None`` one of any free
    GPU, taken now; CUDA_VISIBLE_DEVICES unchanged. Raises ``RuntimeError`` (``gpulock.Unavailable``) if the GPUs are taken."""
    if uid is None:  # 0.0.1's "any free GPU": leased now, numbered as in this process
        shown = visible_gpus(_gpus())
        held = claim(1, [g.uuid for _, g in shown], wait=wait, timeout=timeout, set_env=False,
                     label="gpu_lock", on_wait=None)
        number = caller_numbers(held.indices, held.gpus)[0]
        return _GPULock(number, sets_env=False, wait=wait, timeout=timeout, held=held)
    if uid is not _ANY:
        if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
            raise InvalidRequest(f"uid must be a GPU number (0, 1, ...) or None, not {uid!r}")
        return _GPULock(uid, sets_env=False, wait=wait, timeout=timeout)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidRequest(f"n must be a positive number of GPUs, not {n!r}")
    if isinstance(n_system_gpus, bool) or not isinstance(n_system_gpus, int) or n_system_gpus < 1:
        raise InvalidRequest(f"n_system_gpus must be a positive integer, not {n_system_gpus!r}")
    held = claim(n, _candidates(n_system_gpus), lend=False, wait=wait, timeout=timeout,
                 set_env=False, label="gpu_lock", on_wait=None)
    register(held)  # the process's GPUs while it holds them: see _devices.claim
    if n == 1:
        return _GPULock(held.indices[0], sets_env=True, wait=wait, timeout=timeout, held=held)
    return _MultiGPULock(held)
