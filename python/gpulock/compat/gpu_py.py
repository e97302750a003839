"""``gpulock-gpu``: GPU.py (kulvait/GPUGET) over gpulock leases, so that a GPU.py script runs
unchanged after replacing the command name:

    read GPUID < <(gpulock-gpu --get)      # waits for a GPU, prints its id
    kct-krylov -p 0:$GPUID ...
    gpulock-gpu --release $GPUID

Same options, same lines on stdout, same exit statuses as GPU.py. Installed with the Python
package as the console command ``gpulock-gpu`` (also: ``python3 -m gpulock.compat.gpu_py``).
``--get`` runs ``gpulock acquire --print-ids`` (the ``gpulock`` command: GPULOCK_BINARY, else
PATH), so the lease is a gpulock lease: it waits in gpulock's fair queue, shows in ``gpulock
status``, and is held by a detached holder until ``--release`` or until the script that asked
for it exits (GPU.py kept a GPU until an explicit release, and lost it for good when the
script died first). The backend is gpulock's own (lock files, or GPULOCK_BACKEND); giving
``--redis-server``, ``--redis-port`` or ``--redis-db`` selects ``redis://SERVER:PORT/DB``, and
``--redis-prefix`` the pool. Differences, each with its reason, are in docs/migration.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
from typing import Any, List, Optional, Sequence

GPU_PY_CONNECT_ERROR = "Can not connect to Redis server, try to start server first."
EXIT_GPU_PY_ERROR = 255  # GPU.py's exit(-1)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpulock-gpu",
        description="GPU.py's commands over gpulock leases (file or Redis backend)",
    )
    parser.add_argument("--gpu-count", action="store_true",
                        help="Print the number of GPUs in the system")
    parser.add_argument("--managed-gpu-count", action="store_true",
                        help="Print the number of GPUs gpulock manages (not excluded)")
    parser.add_argument("--redis-server", type=str, default=None,
                        help="Redis server address (selects the Redis backend; default: "
                        "gpulock's own backend)")
    parser.add_argument("--redis-port", type=int, default=None,
                        help="Redis server port (selects the Redis backend; 6379 if only "
                        "--redis-server is given)")
    parser.add_argument("--redis-db", type=int, default=None,
                        help="Redis server db (selects the Redis backend; 0 by default)")
    parser.add_argument("--redis-prefix", type=str, default=None,
                        help="The gpulock pool (GPULOCK_POOL) of the Redis backend")
    manage = parser.add_mutually_exclusive_group()
    manage.add_argument("--redis-manage-all", action="store_true",
                        help="Print the number of GPUs gpulock manages (nothing to initialise)")
    manage.add_argument("--redis-manage", type=str,
                        help="Not supported: exclude GPUs in gpulock's config instead")
    manage.add_argument("--redis-manage-count", type=int,
                        help="Not supported: exclude GPUs in gpulock's config instead")
    parser.add_argument("--force", action="store_true", help="Accepted with --redis-manage-all")
    parser.add_argument("--get", action="store_true",
                        help="Wait for a free GPU, lease it for the calling script, print its id")
    parser.add_argument("--release", default=None, type=int,
                        help="Release the GPU with this id (a lease taken with --get)")
    parser.add_argument("--log", action="store_true",
                        help="Print when each GPU now leased was acquired, and by which PID")
    parser.add_argument("--info", action="store_true", help="Print GPUs summary.")
    parser.add_argument("--idle", action="store_true", help="Print idle GPUs.")
    parser.add_argument("--managed", action="store_true", help="Print managed GPUs.")
    parser.add_argument("--active", action="store_true", help="Print active GPUs.")
    parser.add_argument("--redis-delete", action="store_true",
                        help="Nothing to delete: gpulock keeps no GPU.py objects")
    parser.add_argument("--redis-purge", action="store_true",
                        help="Nothing to purge: gpulock leases end with their processes")
    return parser


# -- the script that asked --------------------------------------------------------------------

def _stat_fields(pid: int) -> List[str]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read().decode("utf-8", "replace")
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) "


def _cmdline(pid: int) -> Optional[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def script_pid() -> int:
    """The process a ``--get`` lease is held for: GPU.py's parent PID, or, when that parent is
    a subshell (``$(…)``, ``<(…)``, a pipeline), the shell it was forked from, which lives as
    long as the script. A subshell is a fork of its shell: same command line as its parent."""
    pid = os.getppid()
    while True:
        try:
            parent = int(_stat_fields(pid)[1])
        except (OSError, ValueError, IndexError):
            return pid
        if parent <= 1:
            return pid
        mine, theirs = _cmdline(pid), _cmdline(parent)
        if mine is None or mine != theirs:
            return pid
        pid = parent


# -- gpulock ----------------------------------------------------------------------------------

def _binary() -> str:
    found = os.environ.get("GPULOCK_BINARY") or shutil.which("gpulock")
    if not found:
        raise SystemExit(
            "gpulock-gpu: --get needs the gpulock command, which is neither on PATH nor named "
            "by GPULOCK_BINARY; install gpulock's CLI (scripts/build, then build/gpulock)"
        )
    return found


def _is_redis() -> bool:
    return os.environ.get("GPULOCK_BACKEND", "").startswith("redis")


class _Unreachable(Exception):
    pass


def _status() -> Any:
    import gpulock

    try:
        return gpulock.status()
    except gpulock.SetupError:
        if _is_redis():
            raise _Unreachable() from None
        raise


def _whole_gpus(status: Any) -> List[Any]:
    return [g for g in status.gpus if g.mig_index is None]


def _managed(status: Any) -> List[Any]:
    return [g for g in _whole_gpus(status) if g.state != "excluded"]


def _idle(status: Any) -> List[Any]:
    return [g for g in _managed(status) if g.state == "free" and g.reserved_for is None]


def _ids(gpus: Sequence[Any]) -> List[str]:
    return sorted(str(g.index) for g in gpus)


def _time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _holder_pid(holder: Any) -> int:
    """GPU.py's PID of a lease: the process a detached lease is held for, else the holder."""
    found = re.search(r"--for-pid (\d+)", holder.command or "")
    return int(found.group(1)) if found else holder.pid


def _get() -> int:
    command = [_binary(), "acquire", "-n", "1", "--for-pid", str(script_pid()), "--print-ids",
               "--label", "GPU.py"]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode == 69 and _is_redis():
        print(GPU_PY_CONNECT_ERROR)
        return EXIT_GPU_PY_ERROR
    if result.returncode < 0:  # killed by a signal: a shell's 128+N, not sys.exit(-N)'s 256-N
        return 128 - result.returncode
    if result.returncode != 0:
        return result.returncode  # gpulock said why on stderr
    print(result.stdout.strip())
    return 0


def _release(gpu_id: int) -> int:
    import gpulock

    status = _status()
    gpu = next((g for g in _managed(status) if g.index == gpu_id), None)
    if gpu is not None and gpu.state == "free":
        print("GPU %d is already idle." % gpu_id)
        return 0
    if gpu is None or gpu.state != "leased" or gpu.holder is None or gpu.lease_id is None:
        # not a GPU, excluded, or busy with processes of someone not using gpulock
        print("GPU %d is not managed." % gpu_id)
        return 0
    if gpu.holder.kind != "detached":
        print(
            "gpulock-gpu: GPU %d is leased by %s's running process %d (%s), not by "
            "--get: stop that process to release it" % (
                gpu_id, gpu.holder.user, gpu.holder.pid, gpu.holder.command or gpu.holder.kind),
            file=sys.stderr,
        )
        return 1
    try:
        gpulock.release(gpu.lease_id)
    except gpulock.PermissionDenied as e:
        print("gpulock-gpu: %s" % e, file=sys.stderr)
        return 1
    print("GPU %d released." % gpu_id)
    return 0


def _log() -> None:
    """GPU.py printed its event list; gpulock keeps no history of ended leases, so this is
    what its records hold: when each GPU now leased was acquired, and by whom."""
    events = []
    for g in _whole_gpus(_status()):
        if g.state == "leased" and g.holder is not None:
            events.append((g.holder.started_at, g.index, _holder_pid(g.holder)))
    for started, index, pid in sorted(events):
        print("%s: GPU %d acquired by PID %d." % (_time(started), index, pid))


def _active() -> None:
    active = [g for g in _managed(_status()) if g.state in ("leased", "busy")]
    active.sort(key=lambda g: g.index)
    if not active:
        print("There are no active GPUs.")
        return
    ids = ",".join(str(g.index) for g in active)
    print("There is %d ACTIVE GPUs, IDs: %s" % (len(active), ids))
    for g in active:
        if g.holder is not None:
            print("GPU %d acquired by PID %d at %s" % (g.index, _holder_pid(g.holder),
                                                       _time(g.holder.started_at)))
        else:
            print("GPU %d acquired by unknown process." % g.index)


def _select_backend(args: argparse.Namespace) -> None:
    if args.redis_server is not None or args.redis_port is not None or args.redis_db is not None:
        os.environ["GPULOCK_BACKEND"] = "redis://%s:%d/%d" % (
            args.redis_server or "localhost",
            6379 if args.redis_port is None else args.redis_port,
            0 if args.redis_db is None else args.redis_db,
        )
    if args.redis_prefix is not None:
        os.environ["GPULOCK_POOL"] = args.redis_prefix


def run(args: argparse.Namespace) -> int:
    """Does what GPU.py does for ``args``, in GPU.py's order of precedence."""
    _select_backend(args)
    if args.gpu_count:
        import gpulock

        print(len([g for g in gpulock.gpus() if g.mig_index is None]))
        return 0
    status = _status()  # GPU.py pinged Redis here
    if args.managed_gpu_count:
        print(len(_managed(status)))
        return 0
    if args.redis_manage or args.redis_manage_count:
        print(
            "gpulock-gpu: gpulock manages every GPU that the administrator's config does not "
            "exclude: set exclude_gpus in /etc/gpulock/config.toml (docs/queue.md) instead of "
            "--redis-manage/--redis-manage-count",
            file=sys.stderr,
        )
        return EXIT_GPU_PY_ERROR
    if args.redis_manage_all:
        print(len(_managed(status)))  # nothing to initialise: leases need no set-up
        return 0
    if args.get:
        return _get()
    if args.release is not None:
        return _release(args.release)
    if args.log:
        _log()
        return 0
    if args.idle:
        ids = _ids(_idle(status))
        print("There is %d IDDLE GPUs, IDs: %s" % (len(ids), ",".join(ids)))
        return 0
    if args.managed:
        ids = _ids(_managed(status))
        print("There is %d MANAGED GPUs, IDs: %s" % (len(ids), ",".join(ids)))
        return 0
    if args.info:
        total, managed = len(_whole_gpus(status)), len(_managed(status))
        if managed == 0:
            print("GPU total:%d no managed" % total)
        else:
            print("GPU total:%d managed:%d idle:%d" % (total, managed, len(_idle(status))))
        return 0
    if args.redis_delete:
        print("Nothing to delete: gpulock keeps no GPU.py objects.")
        return 0
    if args.redis_purge:
        return 0  # a gpulock lease ends with its holder: there is nothing stale to purge
    if args.active:
        _active()
        return 0
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except _Unreachable:
        print(GPU_PY_CONNECT_ERROR)
        return EXIT_GPU_PY_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # gpulock.Error and the like: one line, not a traceback
        print("gpulock-gpu: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
