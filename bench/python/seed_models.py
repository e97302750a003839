"""Models of two older GPU-locking tools, for comparison in lease_bench.py. NOT their code.

Each function below was written for gpulock's benchmarks from the description of the tool's
algorithm in its seed document (shared/seeds/000*, 002*); the tools' source was neither
available nor used. A model does what the document says the tool does, in the most direct
stdlib Python, so that its cost is a fair estimate of what that approach costs per lock. Where a
document leaves a detail open, the choice is noted and made cheap, so the models flatter the
tools rather than the opposite. They keep the tools' known defects (check-then-create races,
locks that a SIGKILL leaves behind): use them to measure, never to lock real GPUs.

- ``gpu_lock_model`` (seed 000, "GPU Lock"): one JSON file per GPU, ``gpu_{i}.json`` in a lock
  directory (the tool's is /var/tmp/gpu_locks). To lock GPU i: if the file is missing, create
  it; if it exists, parse it and take it over when it is this user's own or its owner PID is
  dead; otherwise fail with RuntimeError. The file holds user, time, id and owner (PID). The
  lock ends with the ``with`` block (the document says it is "closed"; the model removes the
  file). Open details, chosen here: the user name comes
  from getpass.getuser(); "PID dead" is os.kill(pid, 0) raising; with no uid, GPUs are tried
  in index order and the count is given (how the tool counts GPUs is not documented, so the
  model does not pay for it).

- ``pid_file_model`` (seed 002, "Exclusive GPU allocation"): one file per GPU,
  ``gpu_{i}.lock`` in ``.gpu_locks/``, holding the worker's PID. To claim: remove stale lock
  files (read the PID, os.kill(pid, 0), remove if the process is gone), then create the first
  GPU's lock file that does not exist and register an atexit handler that removes it. Left
  out: the tool first scans every GPU's free memory (> 4 GB), which needs a GPU and
  nvidia-smi or PyTorch and is not possible here; the model's figure is therefore a lower
  bound of the tool's.
"""

from __future__ import annotations

import atexit
import contextlib
import getpass
import json
import os
import time
from collections.abc import Iterator  # not typing: its import would dominate the models' import


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


# --- seed 000: gpu_lock --------------------------------------------------------------------


def _gpu_lock_may_take(path: str, user: str) -> bool:
    """The documented check: a missing file, this user's own lock, or a dead owner."""
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return True
    if record.get("user") == user or not _pid_alive(int(record.get("owner", 0))):
        os.remove(path)
        return True
    return False


@contextlib.contextmanager
def gpu_lock_model(
    uid: int | None = None, lock_dir: str = "/var/tmp/gpu_locks", gpu_count: int = 1
) -> Iterator[int]:
    """Locks GPU ``uid`` (or the first free one) for the ``with`` block, as seed 000 says."""
    os.makedirs(lock_dir, exist_ok=True)
    user = getpass.getuser()
    for gpu in [uid] if uid is not None else range(gpu_count):
        path = os.path.join(lock_dir, f"gpu_{gpu}.json")
        if _gpu_lock_may_take(path, user):
            with open(path, "w") as f:
                json.dump({"user": user, "time": int(time.time()), "id": gpu,
                           "owner": os.getpid()}, f)
            break
    else:
        raise RuntimeError("no free GPU")
    try:
        yield gpu
    finally:
        os.remove(path)


# --- seed 002: PID lock files with atexit cleanup ------------------------------------------


class PidFileClaim:
    """A claimed GPU: its lock file, removed by ``release()`` or at interpreter exit."""

    def __init__(self, gpu: int, path: str) -> None:
        self.gpu = gpu
        self.path = path
        atexit.register(self.release)

    def release(self) -> None:
        atexit.unregister(self.release)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def _remove_stale_pid_files(lock_dir: str) -> None:
    for name in os.listdir(lock_dir):
        if not name.endswith(".lock"):
            continue
        path = os.path.join(lock_dir, name)
        try:
            with open(path) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if not _pid_alive(pid):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def pid_file_model(lock_dir: str = ".gpu_locks", gpu_count: int = 1) -> PidFileClaim | None:
    """Claims the first unclaimed GPU as seed 002 says, or returns None if all are claimed
    (the tool's worker then exits). The tool's free-memory scan is left out (see above)."""
    os.makedirs(lock_dir, exist_ok=True)
    _remove_stale_pid_files(lock_dir)
    for gpu in range(gpu_count):
        path = os.path.join(lock_dir, f"gpu_{gpu}.lock")
        if os.path.exists(path):
            continue
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        return PidFileClaim(gpu, path)
    return None
