"""``gpulock.lease()``: exclusive use of GPUs for this process, as a context manager.

The lease is a set of kernel locks held by this process. It ends when the ``with`` block ends,
when ``release()`` is called, when the object is garbage-collected, or when the process ends in
any way (SIGKILL and the OOM killer included): it can never go stale. Child processes made with
``fork`` (e.g. ``multiprocessing`` workers) share it, and the GPUs stay leased until the last of
them ends; programs started with ``subprocess`` do not hold it.
"""

from __future__ import annotations

import os
import sys
import warnings
TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (for a fast import)

from . import _native
from ._errors import CudaAlreadyInitializedWarning, InvalidRequest
from ._pool import default_pool

if TYPE_CHECKING:  # typing and logging are imported only when needed: `import gpulock` is fast
    from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

    GpuSpec = Union[None, int, str, Iterable[Union[int, str]]]
    SizeSpec = Union[None, int, str]


def _gpu_list(gpus: GpuSpec, name: str = "gpus") -> List[str]:
    if gpus is None:
        return []
    if isinstance(gpus, bool):
        raise InvalidRequest(f"{name} must be GPU indices or UUIDs, not a bool")
    if isinstance(gpus, int):
        return [str(gpus)]
    if isinstance(gpus, str):
        return list(_native.parse_gpu_list(gpus))
    entries: List[str] = []
    for gpu in gpus:
        if isinstance(gpu, bool) or not isinstance(gpu, (int, str)):
            raise InvalidRequest(f"{name}: {gpu!r} is neither a GPU index nor a UUID")
        entries.extend(_native.parse_gpu_list(str(gpu)))
    if not entries:
        raise InvalidRequest(f"{name} is empty: name at least one GPU, or pass None for any")
    return entries


def _size_in_bytes(size: SizeSpec, name: str) -> Optional[int]:
    if size is None:
        return None
    if isinstance(size, bool):
        raise InvalidRequest(f"{name} must be a number of bytes or a size such as '20G'")
    if isinstance(size, int):
        if size < 0:
            raise InvalidRequest(f"{name} must not be negative")
        return size
    if isinstance(size, str):
        return int(_native.parse_size(size))
    raise InvalidRequest(f"{name} must be a number of bytes or a size such as '20G', not {size!r}")


_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def _shell_word(word: str) -> str:
    if word and all(c in _SHELL_SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def _command_line() -> str:
    """What `gpulock status` shows for the lease, quoted as a shell would need it: e.g.
    "python3 train.py --lr 0.1". (Quoted here: shlex would cost 4 ms of imports.)"""
    program = os.path.basename(sys.executable) or "python"
    return " ".join(_shell_word(str(a)) for a in [program] + sys.argv)[:1000]


def _host_list(host: Union[None, str, Sequence[str]]) -> List[str]:
    if host is None:
        return []
    names = host.split(",") if isinstance(host, str) else list(host)
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise InvalidRequest(f"host must be a host name, a list of them, or 'any', not {host!r}")
    return [n.strip() for n in names]


def cuda_initialized() -> bool:
    """True if CUDA is already initialised in this process (by any framework), so that
    CUDA_VISIBLE_DEVICES can no longer take effect in it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return True
        except Exception:  # an unusual torch build; the driver check below still applies
            pass
    return bool(_native.cuda_initialized())


def _log_progress(progress: Dict[str, Any]) -> None:
    import logging

    logging.getLogger("gpulock").info(
        "waiting %.0fs, position %d of %d: %s",
        progress["waited"],
        progress["position"],
        progress["queue_length"],
        progress["blocked_by"],
    )


class Lease:
    """GPUs leased to this process. Use as a context manager, or call ``release()``."""

    def __init__(self, native: "_native.Lease", visible: str, set_env: bool) -> None:
        self._native = native
        gpus = native.gpus
        self.id: str = native.id
        self.gpus: List[str] = [g["uuid"] for g in gpus]
        self.indices: List[int] = [g["index"] for g in gpus]
        self.display_indices: List[str] = [g["display_index"] for g in gpus]
        self.names: List[str] = [g["name"] for g in gpus]
        self.started_at: float = native.started_at
        self.cuda_visible_devices: str = native.cuda_visible_devices(visible)
        self._environment: Dict[str, str] = dict(native.environment(visible))
        self._saved: Optional[Dict[str, Optional[str]]] = None
        if set_env:
            self._set_environment()
            if native.memory_bytes:
                self._limit_torch_memory()

    @property
    def active(self) -> bool:
        """True until the lease is released."""
        return bool(self._native.active)

    @property
    def fencing_token(self) -> int:
        """Redis backend: the lease's fencing token, strictly increasing per pool (0 with the
        local backend). Storage a job writes to can refuse writes with an older token."""
        return int(self._native.fencing_token)

    @property
    def host(self) -> str:
        """Redis backend: the host whose GPUs these are ("" with the local backend). A lease on
        another host is a reservation: start the work there."""
        return str(self._native.host)

    @property
    def lost(self) -> bool:
        """Redis backend: True once the lease expired before it could be renewed (Redis
        unreachable or paused for a whole TTL) or was released by someone else. Its GPUs may
        then be given to others. Always False with the local backend."""
        return bool(self._native.lost)

    def verify(self) -> int:
        """Confirms with the backend, in one round trip, that the lease still holds every one of
        its GPUs, and returns its fencing token: call it just before a write that a lost lease
        must not make. With the local backend the kernel holds the lease: nothing is asked and 0
        is returned. Raises NotFound when the lease is lost (``lost`` is then True), SetupError
        when Redis cannot be asked, InvalidRequest after ``release()``."""
        return int(self._native.verify())

    @property
    def environment(self) -> Dict[str, str]:
        """What the lease sets: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GPULOCK_LEASE_ID and
        GPULOCK_GPUS, e.g. for ``subprocess.run(..., env={**os.environ, **lease.environment})``."""
        return dict(self._environment)

    def _set_environment(self) -> None:
        if cuda_initialized():
            warnings.warn(
                CudaAlreadyInitializedWarning(
                    f"gpulock: CUDA was initialised in this process before lease {self.id} set "
                    f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}, so this process still sees "
                    "every GPU. Take the lease before the first CUDA call (e.g. before "
                    "torch.cuda is used), or select the device explicitly, e.g. "
                    f"torch.device('cuda:{self.indices[0]}') with CUDA_DEVICE_ORDER=PCI_BUS_ID."
                ),
                stacklevel=4,
            )
        self._saved = {name: os.environ.get(name) for name in self._environment}
        os.environ.update(self._environment)

    @property
    def memory_bytes(self) -> int:
        """A shared lease: the memory it reserves on each GPU; 0 for whole GPUs."""
        return int(self._native.memory_bytes)

    def _limit_torch_memory(self) -> None:
        # Only when the program uses torch already: importing it here would cost seconds.
        torch = sys.modules.get("torch")
        fraction = self._environment.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
        if torch is None or fraction is None or not hasattr(torch, "cuda"):
            return
        try:
            for device in range(len(self._native.gpus)):
                torch.cuda.set_per_process_memory_fraction(float(fraction), device)
        except Exception as error:  # no CUDA here, an old torch: the limit stays cooperative
            warnings.warn(f"gpulock: could not limit torch's memory: {error}", stacklevel=4)

    def _restore_environment(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        for name, value in self._environment.items():
            if os.environ.get(name) != value:
                continue  # changed by someone else since: leave their value
            previous = saved.get(name)
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous

    def release(self) -> None:
        """Releases the GPUs now (forked children that share the lease keep holding it), and
        restores the environment variables the lease set. Releasing twice is harmless."""
        self._restore_environment()
        self._native.release()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "active" if self.active else "released"
        return f"<gpulock.Lease {self.id} GPUs {','.join(self.display_indices)} {state}>"


def lease(
    count: int = 1,
    gpus: GpuSpec = None,
    min_free_mem: SizeSpec = None,
    max_util: Optional[int] = None,
    timeout: Optional[float] = None,
    wait: bool = True,
    label: Optional[str] = None,
    *,
    max_power: Optional[float] = None,
    allow_foreign: bool = False,
    priority: str = "normal",
    visible: str = "index",
    set_env: bool = True,
    respect_visible_devices: bool = True,
    among: GpuSpec = None,
    lock_dir: Optional[str] = None,
    on_wait: Optional[Callable[[Dict[str, Any]], None]] = _log_progress,
    host: Union[None, str, Sequence[str]] = None,
    mem: SizeSpec = None,
    slots: Optional[int] = None,
    spread: bool = False,
) -> Lease:
    """Leases GPUs for this process, waiting in the machine's fair queue until they are free.

    ``count`` GPUs of any kind, or exactly ``gpus`` (an index, a UUID or its unique prefix, a
    list of them, or a string such as ``"0,2"``; ``count`` is then ignored). Health filters:
    ``min_free_mem`` (bytes, or a size such as ``"20G"``), ``max_util`` (percent), ``max_power``
    (watts); GPUs running processes of people not using gpulock are skipped unless
    ``allow_foreign``. ``timeout`` (seconds) bounds the wait; ``wait=False`` fails at once
    (``Unavailable``) unless the GPUs are free now. ``priority="low"`` waits behind every
    normal request. ``label`` is shown by ``gpulock status``.

    Unless ``set_env=False``, sets CUDA_VISIBLE_DEVICES (indices, or UUIDs with
    ``visible="uuid"``), CUDA_DEVICE_ORDER=PCI_BUS_ID, GPULOCK_LEASE_ID and GPULOCK_GPUS in
    ``os.environ`` until the lease ends, and warns (``CudaAlreadyInitializedWarning``) if CUDA
    is already initialised here. If CUDA_VISIBLE_DEVICES is set already, only those GPUs are
    candidates unless ``respect_visible_devices=False``. ``among`` (GPUs as for ``gpus``)
    limits the candidates for ``count`` GPUs instead.

    Redis backend (GPULOCK_BACKEND=redis://...): ``host`` names the hosts whose GPUs may serve
    the request (a name, a list, or ``"any"``; default this host). A lease on another host is a
    reservation: ``Lease.host`` names it, and the work must be started there.

    A shared lease: ``mem`` (bytes, or a size such as ``"10G"``) of each GPU instead of whole
    GPUs, on a GPU shared with other jobs while their reservations fit its memory; ``slots``
    caps the shared leases per GPU (without ``mem``, each takes 1/``slots`` of it); ``spread``
    prefers the emptiest GPUs (default: fill partly used ones first). The lease also sets
    GPULOCK_MEMORY_LIMIT_BYTES, XLA_PYTHON_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_PREALLOCATE
    and TF_FORCE_GPU_ALLOW_GROWTH, and when torch is imported already, calls
    ``torch.cuda.set_per_process_memory_fraction`` for each leased GPU. The limit is
    cooperative: nothing stops a job from using more (see docs/design.md, "Shared leases").

    ``on_wait`` is called with a dict (``waited``, ``position``, ``queue_length``,
    ``standing``, ``blocked_by``, ``blocking``) when a wait starts and whenever what blocks it
    changes; by default it logs to the ``gpulock`` logger at INFO level.

    Raises ``Timeout``, ``Unavailable``, ``Unsatisfiable``, ``InvalidRequest`` (all
    ``gpulock.Error``); Ctrl-C during the wait raises ``KeyboardInterrupt``.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidRequest(f"count must be a positive integer, not {count!r}")
    if max_util is not None and (isinstance(max_util, bool) or not isinstance(max_util, int)):
        raise InvalidRequest(f"max_util must be an integer percentage, not {max_util!r}")
    if max_util is not None and not 0 <= max_util <= 100:
        raise InvalidRequest(f"max_util must be between 0 and 100, not {max_util}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise InvalidRequest(f"timeout must be a number of seconds or None, not {timeout!r}")
        if not 0 <= timeout <= 1e9:  # NaN fails too
            raise InvalidRequest(f"timeout must be between 0 and 1e9 seconds, not {timeout}")
    if max_power is not None and (
        isinstance(max_power, bool) or not isinstance(max_power, (int, float))
    ):
        raise InvalidRequest(f"max_power must be a number of watts or None, not {max_power!r}")
    if not isinstance(priority, str):
        raise InvalidRequest(f"priority must be 'normal' or 'low', not {priority!r}")
    if label is not None and not isinstance(label, str):
        raise InvalidRequest(f"label must be a string or None, not {label!r}")
    if visible not in ("index", "uuid"):
        raise InvalidRequest(f"visible must be 'index' or 'uuid', not {visible!r}")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise InvalidRequest(f"slots must be a positive integer or None, not {slots!r}")
    if among is not None:
        candidates: Optional[str] = ",".join(_gpu_list(among, "among"))
    elif respect_visible_devices:
        candidates = os.environ.get("CUDA_VISIBLE_DEVICES")
    else:
        candidates = None
    native = default_pool(lock_dir).acquire(
        count=count,
        gpus=_gpu_list(gpus),
        min_free_memory=_size_in_bytes(min_free_mem, "min_free_mem"),
        max_utilization=max_util,
        max_power=None if max_power is None else float(max_power),
        allow_foreign=bool(allow_foreign),
        timeout=None if timeout is None else float(timeout),
        wait=bool(wait),
        priority=priority,
        label=label or "",
        command=_command_line(),
        visible_devices=candidates,
        enclosing_lease=os.environ.get("GPULOCK_LEASE_ID"),
        hosts=_host_list(host),
        on_progress=on_wait,
        memory=_size_in_bytes(mem, "mem"),
        slots=slots,
        spread=bool(spread),
    )
    try:
        return Lease(native, visible, set_env)
    except BaseException:
        native.release()  # e.g. the CUDA warning made an error: keep no GPU behind it
        raise
