"""Device numbering shared by the compat modules: which GPUs the caller's CUDA_VISIBLE_DEVICES
shows, and what CUDA number (``cuda:N``) a leased GPU has in the caller's process.

CUDA numbers the devices it can see from 0, in the order CUDA_VISIBLE_DEVICES lists them; with
the variable unset it sees every GPU, numbered like nvidia-smi when CUDA_DEVICE_ORDER is
PCI_BUS_ID (which the compat modules set for the block when it is unset).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._errors import Unsatisfiable

_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


_ENVIRON = object()  # "the value in os.environ"


def visible_entries(value: Any = _ENVIRON) -> Optional[List[str]]:
    """The entries of CUDA_VISIBLE_DEVICES (default: the caller's; or ``value``), indices or
    UUIDs, or None when unset. As CUDA does, an empty value shows no GPU and the list ends at
    the first empty entry."""
    if value is _ENVIRON:
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries: List[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            break
        entries.append(entry)
    return entries


def _matches(entry: str, index: int, uuid: str) -> bool:
    if entry.isdigit():
        return int(entry) == index
    return len(entry) >= 4 and uuid.startswith(entry)


def caller_numbers(indices: List[int], uuids: List[str]) -> List[int]:
    """The CUDA device numbers, in the caller's process, of the GPUs with these NVML indices
    and UUIDs: their positions in CUDA_VISIBLE_DEVICES, or their indices when it is unset."""
    entries = visible_entries()
    if entries is None:
        return list(indices)
    numbers = []
    for index, uuid in zip(indices, uuids):
        position = next((n for n, e in enumerate(entries) if _matches(e, index, uuid)), None)
        if position is None:  # the lease honours CUDA_VISIBLE_DEVICES: should not happen
            raise Unsatisfiable(
                f"GPU {index} ({uuid}) is not in CUDA_VISIBLE_DEVICES="
                f"{os.environ['CUDA_VISIBLE_DEVICES']}, so this process cannot use it"
            )
        numbers.append(position)
    return numbers


def physical_gpu(number: int) -> str:
    """The GPU (NVML index or UUID, as gpulock.lease(gpus=...) takes it) that the caller's
    ``cuda:number`` is."""
    entries = visible_entries()
    if entries is None:
        return str(number)
    if not 0 <= number < len(entries):
        raise Unsatisfiable(
            f"GPU {number} does not exist in this process: CUDA_VISIBLE_DEVICES="
            f"{os.environ['CUDA_VISIBLE_DEVICES']} shows {len(entries)} GPU(s), numbered from 0"
        )
    return entries[number]


def callers_visible_devices(values_set: Sequence[Sequence[Optional[str]]]) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES as the caller set it, looking through the values this process's own
    compat objects set: ``values_set`` lists [value set, value it replaced], innermost last."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    for set_value, before in reversed(values_set):
        if value != set_value:
            break
        value = before
    return value


class SavedEnvironment:
    """CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER as they were, to be put back at the end of a
    block (a value someone else changed in the meantime is left alone)."""

    def __init__(self) -> None:
        self._before: Dict[str, Optional[str]] = {n: os.environ.get(n) for n in _VARIABLES}
        self._set: Dict[str, str] = {}

    def set(self, name: str, value: str) -> None:
        os.environ[name] = value
        self._set[name] = value

    def default_device_order(self) -> None:
        """CUDA_DEVICE_ORDER=PCI_BUS_ID unless the caller chose an order."""
        if os.environ.get("CUDA_DEVICE_ORDER") is None:
            self.set("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

    def restore(self) -> None:
        for name, value in self._set.items():
            if os.environ.get(name) != value:
                continue
            before = self._before[name]
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        self._set = {}


def visible_gpus(machine: Sequence[Any], value: Any = _ENVIRON) -> List[Tuple[int, Any]]:
    """The GPUs of ``machine`` (``gpulock.gpus()`` or ``status().gpus``) that CUDA shows this
    process, each with its CUDA number here: all whole GPUs by index when CUDA_VISIBLE_DEVICES
    is unset, else its entries in order, up to the first that names no GPU (as CUDA does).
    ``value``: judge by this CUDA_VISIBLE_DEVICES value instead of the caller's."""
    entries = visible_entries(value)
    if entries is None:
        return [(g.index, g) for g in machine if g.mig_index is None]
    shown: List[Tuple[int, Any]] = []
    for number, entry in enumerate(entries):
        gpu = next((g for g in machine if _matches(entry, g.index, g.uuid)
                    and (g.mig_index is None or not entry.isdigit())), None)
        if gpu is None:
            break
        shown.append((number, gpu))
    return shown


# -- GPUs this process already holds ----------------------------------------------------------
#
# safe_gpu's GPUOwner and gpu_lock 0.2.1's lock_gpu() set CUDA_VISIBLE_DEVICES to the GPUs they
# lease, and so does `gpulock run` (or `eval "$(gpulock acquire …)"`) for the program it starts:
# from then on, those are the process's GPUs. A GPUScheduler or lock_gpu block inside, which
# may only choose among the GPUs the process can see, then gets one of those, lent for its
# block (as with the seed tools, which did not lock against their own process), instead of
# failing against its own process. {uuid: [index or None, lent?, source]}, where the source is
# a weakref to a compat object's lease, or the id of the enclosing lease named by
# GPULOCK_LEASE_ID and GPULOCK_GPUS.
_own: Dict[str, List[Any]] = {}


def register(held: Any) -> None:
    """Records the GPUs of ``held`` (a gpulock.Lease of a compat object) as this process's.
    GPUs lent to ``held`` (a Borrowed) stay lent to it until it ends."""
    if isinstance(held, Borrowed):
        return
    ref = weakref.ref(held)
    for index, uuid in zip(held.indices, held.gpus):
        _own[uuid] = [index, False, ref]


def _enclosing() -> Tuple[Optional[str], List[str]]:
    lease_id = os.environ.get("GPULOCK_LEASE_ID") or None
    return lease_id, os.environ.get("GPULOCK_GPUS", "").split(",") if lease_id else []


def _owned(uuid: str) -> Optional[List[Any]]:
    entry = _own.get(uuid)
    lease_id, enclosing = _enclosing()
    if entry is not None:
        source = entry[2]
        if isinstance(source, str):
            alive = source == lease_id and uuid in enclosing
        else:
            held = source()
            alive = held is not None and held.active
        if alive:
            return entry
        del _own[uuid]
    if lease_id is not None and uuid in enclosing:
        entry = _own[uuid] = [None, False, lease_id]
        return entry
    return None


class Borrowed:
    """GPUs lent to an inner compat block by an enclosing lease of this process; has the
    attributes of a gpulock.Lease that the compat modules use."""

    def __init__(self, uuids: List[str]) -> None:
        if any(_own[u][0] is None for u in uuids):
            from .._machine import gpus

            index_of = {g.uuid: g.index for g in gpus()}
            for u in uuids:
                _own[u][0] = index_of.get(u, _own[u][0])
        self.id = "borrowed"
        self.gpus = list(uuids)
        self.indices = [_own[u][0] for u in uuids]
        self.cuda_visible_devices = ",".join(str(i) for i in self.indices)
        self.active = True
        for u in uuids:
            _own[u][1] = True

    def release(self) -> None:
        if not self.active:
            return
        self.active = False
        for u in self.gpus:
            if u in _own:
                _own[u][1] = False


def _encloses(source: Any) -> bool:
    """True if ``source`` (of an _own entry) is the lease this process runs under: the one
    GPULOCK_LEASE_ID names (set by `gpulock run`, by `eval "$(gpulock acquire …)"`, and by a
    safe_gpu GPUOwner, whose lease exports it like CUDA_VISIBLE_DEVICES)."""
    if isinstance(source, str):
        return True
    held = source()
    lease_id = os.environ.get("GPULOCK_LEASE_ID") or None
    return held is not None and lease_id is not None and getattr(held, "id", None) == lease_id


def claim(
    count: int, candidates: List[str], exact: bool = False, lend: bool = True, **options: Any
) -> Any:
    """``count`` of the ``candidates`` (UUIDs, in order of preference; all of them when
    ``exact``). When every candidate is a GPU this process holds already (see above), they are
    lent, one block at a time, and a Borrowed is returned; otherwise a new gpulock lease of
    the candidates it does not hold (``options`` go to ``gpulock.lease``). ``lend=False``: only
    the enclosing lease's GPUs (GPULOCK_LEASE_ID's: `gpulock run`'s, a GPUOwner's) are lent,
    not other compat objects' (gpu_lock 0.2.1's nested locks each take a GPU of their own)."""
    from .._errors import Unavailable
    from .._lease import lease

    mine = [u for u in candidates if _owned(u) is not None]
    if not lend:
        mine = [u for u in mine if _encloses(_own[u][2])]
    if mine and len(mine) == len(candidates):
        lendable = [u for u in mine if not _own[u][1]]
        if len(lendable) >= (len(candidates) if exact else count):
            return Borrowed(lendable if exact else lendable[:count])
        raise Unavailable(
            f"the {len(mine)} GPU(s) this process can see (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')}) are its own, and "
            f"{len(mine) - len(lendable)} of them are in use by other blocks of it"
        )
    if exact:
        return lease(gpus=candidates, **options)
    others = [u for u in candidates if u not in mine]
    return lease(count=count, among=others or candidates, **options)
