"""Jobs from Python: ``gpulock.submit()`` queues a command as ``gpulock submit`` does, and
``gpulock.jobs()`` lists the machine's jobs as ``gpulock jobs --json`` does (docs/jobs.md).

A job outlives the Python process that submitted it: its supervisor is a ``gpulock`` process of
its own (the command of the same name, found as ``gpulock-gpu`` finds it), so ``submit()`` runs
that command, and ``jobs()`` reads the job store directly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _errors, _native
from ._views import _build

JobIds = Union[int, Sequence[int]]


@dataclass(frozen=True)
class Job:
    """One job: the fields of ``gpulock jobs --json`` (times in Unix seconds, ``None`` until
    they happen). A record that cannot be read has only ``id``, ``user``, ``uid``,
    ``directory`` and ``problem``."""

    id: int
    user: str = ""
    uid: int = 0
    directory: str = ""
    name: str = ""
    state: str = ""
    command: List[str] = field(default_factory=list)
    lease_options: List[str] = field(default_factory=list)
    working_directory: str = ""
    submitted: Optional[int] = None
    started: Optional[int] = None
    ended: Optional[int] = None
    after: List[int] = field(default_factory=list)
    after_any: List[int] = field(default_factory=list)
    begin: Optional[int] = None
    resubmitted_from: Optional[int] = None
    lease_id: Optional[str] = None
    gpus: List[str] = field(default_factory=list)
    exit_status: Optional[int] = None
    reason: str = ""
    stdout: str = ""
    stderr: str = ""
    problem: Optional[str] = None

    @property
    def ended_ok(self) -> bool:
        return self.state == "done"

    def output(self, stderr: bool = False) -> str:
        """What the job wrote so far to stdout (or stderr), as ``gpulock logs`` shows it."""
        with open(self.stderr if stderr else self.stdout, encoding="utf-8",
                  errors="replace") as f:
            return f.read()

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Job":
        return _build(cls, data)


def jobs(all_users: bool = False, state: Union[None, str, Sequence[str]] = None) -> List[Job]:
    """The caller's jobs (every user's with ``all_users``), by id; ``state`` keeps only jobs in
    that state or those states (``"running"``, ``["done", "failed"]``)."""
    import json

    listed = [Job.from_json(j) for j in json.loads(_native.jobs_json(all_users))["jobs"]]
    if state is None:
        return listed
    wanted = {state} if isinstance(state, str) else set(state)
    return [j for j in listed if j.problem is None and j.state in wanted]


def _ids(value: Optional[JobIds]) -> Optional[str]:
    if value is None:
        return None
    return str(value) if isinstance(value, int) else ",".join(str(v) for v in value)


def submit(
    command: Sequence[str],
    *,
    count: Optional[int] = None,
    gpus: Union[None, int, str, Sequence[Union[int, str]]] = None,
    name: Optional[str] = None,
    array: Optional[str] = None,
    after: Optional[JobIds] = None,
    after_any: Optional[JobIds] = None,
    begin: Optional[str] = None,
    time: Optional[str] = None,
    mem: Union[None, int, str] = None,
    min_free_mem: Union[None, int, str] = None,
    timeout: Optional[str] = None,
    priority: Optional[str] = None,
    label: Optional[str] = None,
    readable_logs: bool = False,
    options: Sequence[str] = (),
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
) -> Union[int, List[int]]:
    """Queues ``command`` (a list: the program and its arguments) as a job and returns its id
    at once; with ``array`` (``"1-150"``, ``"1-150%4"``), the list of the array's ids. The job
    waits in the machine's fair queue, then runs detached in ``cwd`` (default: here) with
    ``env`` (default: this process's environment) and ``CUDA_VISIBLE_DEVICES`` set.

    The keywords are ``gpulock submit``'s options: ``count`` (-n), ``gpus``, ``name``,
    ``array``, ``after``/``after_any`` (job ids), ``begin`` ("30m", "22:30"), ``time`` (a limit,
    "2h"), ``mem``/``min_free_mem`` ("20G" or bytes), ``timeout``, ``priority``, ``label``,
    ``readable_logs``; ``options`` passes any other option as given (``["--spread"]``).
    Raises ``InvalidRequest`` for a malformed request, ``NotFound`` for an unknown job in
    ``after``, and ``SetupError`` when the job store or the ``gpulock`` command is unusable."""
    if isinstance(command, str):
        raise _errors.InvalidRequest(
            "submit() takes the command as a list of arguments, e.g. ['python', 'train.py']")
    if not command:
        raise _errors.InvalidRequest("submit() needs a command")
    args: List[str] = []
    gpu_list = None
    if gpus is not None:
        gpu_list = str(gpus) if isinstance(gpus, (int, str)) else ",".join(str(g) for g in gpus)
    for option, value in (("--count", count), ("--gpus", gpu_list), ("--name", name),
                          ("--array", array), ("--after", _ids(after)),
                          ("--after-any", _ids(after_any)), ("--begin", begin),
                          ("--time", time), ("--mem", mem), ("--min-free-mem", min_free_mem),
                          ("--timeout", timeout), ("--priority", priority),
                          ("--label", label)):
        if value is not None:
            args.append("%s=%s" % (option, value))
    if readable_logs:
        args.append("--readable-logs")
    args.extend(options)
    done = subprocess.run([_command(), "submit", *args, "--", *command], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise _error_of(done.returncode, done.stderr)
    ids = [int(line) for line in done.stdout.split()]
    return ids if array is not None else ids[0]


def _command() -> str:
    """The gpulock command: GPULOCK_BINARY; else the one installed with this package (the
    virtualenv's bin, or /usr/bin for the Debian package), built from the same sources; else
    the first on PATH."""
    beside = os.path.join(sys.prefix, "bin", "gpulock")
    found = (os.environ.get("GPULOCK_BINARY")
             or (beside if os.access(beside, os.X_OK) and not os.path.isdir(beside) else None)
             or shutil.which("gpulock"))
    if not found:
        raise _errors.SetupError(
            "submit() needs the gpulock command, which is neither installed with this package "
            "nor on PATH nor named by GPULOCK_BINARY")
    return found


def _error_of(status: int, stderr: str) -> _errors.Error:
    """The exception for a failed ``gpulock submit``: its exit status and its message."""
    message = "\n".join(line[len("gpulock: "):] if line.startswith("gpulock: ") else line
                        for line in stderr.strip().splitlines()) or "gpulock submit failed"
    if status == 64:
        return _errors.InvalidRequest(message)
    if status == 78:
        return _errors.ConfigError(message)
    if status == 69:
        return _errors.NotFound(message) if message.startswith("no job") else \
            _errors.SetupError(message)
    error = _errors.Error(message)
    error.exit_status = status
    return error
