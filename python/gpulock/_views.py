"""Plain Python objects for ``gpulock.gpus()``, ``gpulock.status()`` and ``gpulock.queue()``.

They carry the fields of the CLI's JSON output (docs/json.md, schema version 1) under the same
names: sizes in bytes, times in Unix seconds, ``None`` where a reading is unknown. Fields the
JSON gains later are ignored until these classes gain them too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar

T = TypeVar("T")


def _build(cls: Type[T], data: Dict[str, Any], **converted: Any) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in data.items() if k in names}
    values.update(converted)
    return cls(**values)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU."""

    pid: int
    used_memory_bytes: Optional[int] = None
    user: Optional[str] = None  # status() only: "" when the process cannot be seen
    foreign: Optional[bool] = None  # status() only: not covered by the GPU's lease

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "GpuProcess":
        return _build(cls, data)


@dataclass(frozen=True)
class Gpu:
    """One GPU (or MIG instance) and its readings."""

    index: int
    uuid: str
    name: str = ""
    display_index: str = ""
    mig_index: Optional[int] = None
    parent_uuid: Optional[str] = None
    pci_bus_id: str = ""
    memory_total_bytes: Optional[int] = None
    memory_used_bytes: Optional[int] = None
    memory_free_bytes: Optional[int] = None
    utilization_percent: Optional[int] = None
    power_draw_watts: Optional[float] = None
    power_limit_watts: Optional[float] = None
    compute_mode: str = "unknown"
    mig_enabled: Optional[bool] = None
    processes: List[GpuProcess] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Gpu":
        return _build(cls, data, processes=[GpuProcess.from_json(p) for p in data.get("processes", [])])


@dataclass(frozen=True)
class Holder:
    """Who holds a leased GPU. Informational: any user can write these details."""

    lease_id: str
    user: str = ""
    uid: int = -1
    host: str = ""
    kind: str = ""  # "run", "detached" or "process" (a library user, e.g. Python)
    pid: int = 0
    pid_alive: bool = False
    member_pids: List[int] = field(default_factory=list)
    # A detached lease held for a session (`gpulock acquire` without --for-pid): its id.
    session: Optional[int] = None
    command: str = ""
    label: str = ""
    started_at: float = 0.0
    held_seconds: float = 0.0
    gpus: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Holder":
        return _build(cls, data)


@dataclass(frozen=True)
class QueueEntry:
    """A request waiting in the machine's queue."""

    position: int
    ticket_id: str
    user: str = ""
    uid: int = -1
    pid: int = 0
    priority: str = "normal"
    gpus_requested: int = 0
    memory_bytes: Optional[int] = None  # a shared request: the memory it asks for per GPU
    slots: Optional[int] = None  # ... or its slots
    gpus_named: List[str] = field(default_factory=list)
    label: str = ""
    command: str = ""
    waiting_since: float = 0.0
    standing: str = "waiting"
    reserved_gpus: List[str] = field(default_factory=list)
    blocked_by: str = ""

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "QueueEntry":
        return _build(cls, data)


@dataclass(frozen=True)
class Intruder:
    """A compute process on a leased GPU that the lease's process tree does not contain
    (reported only; gpulock kills nothing)."""

    pid: int
    user: Optional[str] = None  # None when the process cannot be seen (another container)
    used_memory_bytes: Optional[int] = None
    host: str = ""
    gpu: str = ""  # the GPU's display index
    uuid: str = ""
    lease_id: str = ""  # the lease holding the GPU
    holder_user: str = ""  # who holds it

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Intruder":
        return _build(cls, data)


@dataclass(frozen=True)
class GpuStatus(Gpu):
    """A GPU with its state: "free", "leased", "busy" (processes of people not using gpulock)
    or "excluded". A leased GPU whose utilisation has read 0 % since ``idle_since`` (Unix
    seconds) is ``idle`` once that lasted the config's ``idle_after``."""

    state: str = "free"
    note: Optional[str] = None
    lease_id: Optional[str] = None
    holder: Optional[Holder] = None
    reserved_for: Optional[QueueEntry] = None
    idle: bool = False
    idle_since: Optional[float] = None
    idle_seconds: Optional[float] = None

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "GpuStatus":
        holder = data.get("holder")
        reserved = data.get("reserved_for")
        return _build(
            cls,
            data,
            processes=[GpuProcess.from_json(p) for p in data.get("processes", [])],
            holder=Holder.from_json(holder) if holder else None,
            reserved_for=QueueEntry.from_json(reserved) if reserved else None,
        )


@dataclass(frozen=True)
class Status:
    """A snapshot of the machine's GPUs, their leases and the queue (``gpulock status``)."""

    host: str
    gpus: List[GpuStatus]
    device_source: str = ""
    simulated: bool = False
    lock_dir: str = ""
    spans_hosts: bool = False  # many hosts' GPUs behind a server (Redis), not this machine's
    taken_at: float = 0.0
    warnings: List[str] = field(default_factory=list)
    queue_length: int = 0
    queue_policy: str = "fair-share"
    idle_after_seconds: Optional[int] = None  # the config's idle_after
    intruders: List[Intruder] = field(default_factory=list)
    schema_version: int = 1

    @classmethod
    def from_json(cls, text: str) -> "Status":
        data = json.loads(text)
        queue = data.get("queue") or {}
        return _build(
            cls,
            data,
            gpus=[GpuStatus.from_json(g) for g in data.get("gpus", [])],
            queue_length=queue.get("length", 0),
            queue_policy=queue.get("policy", "fair-share"),
            intruders=[Intruder.from_json(i) for i in data.get("intruders", [])],
        )

    @property
    def idle(self) -> List[GpuStatus]:
        """The leased GPUs that have sat at 0 % for at least idle_after."""
        return [g for g in self.gpus if g.idle]

    @property
    def free(self) -> List[GpuStatus]:
        """The GPUs nobody holds or uses and the queue does not hold back."""
        return [g for g in self.gpus if g.state == "free" and g.reserved_for is None]


@dataclass(frozen=True)
class Queue:
    """The waiting requests in serving order (``gpulock queue``)."""

    waiting: List[QueueEntry]
    policy: str = "fair-share"
    config: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    schema_version: int = 1

    @classmethod
    def from_json(cls, text: str) -> "Queue":
        data = json.loads(text)
        return _build(cls, data, waiting=[QueueEntry.from_json(e) for e in data.get("waiting", [])])


def gpus_from_json(text: str) -> List[Gpu]:
    return [Gpu.from_json(g) for g in json.loads(text).get("gpus", [])]
