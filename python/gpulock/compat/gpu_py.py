"""``gpulock-gpu``: GPU.py (kulvait/GPUGET) over gpulock leases, so that a GPU.py script runs
unchanged after replacing the command name:

    read GPUID < <(gpulock-gpu --get)      # waits for a GPU, prints its id
    kct-krylov -p 0:$GPUID ...
    gpulock-gpu --release $GPUID

Same options, same lines on stdout, same exit statuses as GPU.py. Installed with the Python
package as the console command ``gpulock-gpu`` (also: ``python3 -m gpulock.compat.gpu_py``).
``--get`` runs ``gpulock acquire --print-ids`` (the ``gpulock`` command: GPULOCK_BINARY, else
the one installed beside this command, else PATH), so the lease is a gpulock lease: it waits
in gpulock's fair queue, shows in ``gpulock status``, and is held by a detached holder until
``--release``, or until no process of the caller's session is left: held as GPU.py held it,
until released, whatever shape the script has (``read I < <(…)``, background subshells,
``nohup``, ``os.system``, one make recipe line per shell), and never past the end of the last
process that could use it (GPU.py lost a GPU for good when its script died first). ``--log``
reads gpulock's usage journal. The backend is gpulock's own (lock files, or GPULOCK_BACKEND);
giving ``--redis-server``, ``--redis-port`` or ``--redis-db`` selects
``redis://SERVER:PORT/DB``, and ``--redis-prefix`` the pool. On Redis it warns (once a day)
when the server also holds GPU.py's own keys: the two do not see each other's GPUs.
Differences, each with its reason, are in docs/migration.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

# Each task of a sweep starts this module twice (--get, --release): typing, shutil and datetime
# are imported only where they are needed, as `import gpulock` itself does.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence

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
                        help="Print when each GPU was acquired and released (gpulock's journal)")
    parser.add_argument("--info", action="store_true", help="Print GPUs summary.")
    parser.add_argument("--idle", action="store_true", help="Print idle GPUs.")
    parser.add_argument("--managed", action="store_true", help="Print managed GPUs.")
    parser.add_argument("--active", action="store_true", help="Print active GPUs.")
    parser.add_argument("--redis-delete", action="store_true",
                        help="Nothing to delete: gpulock keeps no GPU.py objects")
    parser.add_argument("--redis-purge", action="store_true",
                        help="Nothing to purge: gpulock leases end with their processes")
    return parser


# -- gpulock ----------------------------------------------------------------------------------

def _binary() -> str:
    """The gpulock command: GPULOCK_BINARY; else the one installed beside this command (the
    same venv's bin, or /usr/bin for the Debian package), which is built from the same sources
    as this module; else the first on PATH."""
    import shutil

    beside = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0] or "")), "gpulock")
    found = (os.environ.get("GPULOCK_BINARY")
             or (beside if os.access(beside, os.X_OK) and not os.path.isdir(beside) else None)
             or shutil.which("gpulock"))
    if not found:
        raise SystemExit(
            "gpulock-gpu: --get needs the gpulock command, which is neither on PATH nor named "
            "by GPULOCK_BINARY; install gpulock's CLI (scripts/build, then build/gpulock)"
        )
    return found


def _pool_on_a_server() -> bool:
    """Whether gpulock's pool is kept by a server (Redis, chosen by GPULOCK_BACKEND or the
    config's ``backend``), as gpulock decides: then an unavailable pool is GPU.py's "cannot
    connect". Opening the pool reaches no server."""
    import gpulock
    from gpulock import _pool

    try:
        return _pool.default_pool().spans_hosts
    except gpulock.Error:
        return False  # gpulock itself says what is wrong with its set-up


class _Unreachable(Exception):
    pass


def _status() -> Any:
    import gpulock

    try:
        return gpulock.status()
    except gpulock.SetupError:
        if _pool_on_a_server():
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
    import datetime

    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


_HELD_FOR = re.compile(r"acquire (?:--for-pid|for session) (\d+)")


def _holder_pid(holder: Any) -> int:
    """GPU.py's PID of a lease (the script that asked): the session or the process a detached
    lease is held for, else the holder."""
    if holder.session is not None:
        return int(holder.session)
    found = _HELD_FOR.search(holder.command or "")
    return int(found.group(1)) if found else holder.pid


def _get() -> int:
    # Held for this session: as long as any process that could use the id lives, or --release.
    command = [_binary(), "acquire", "-n", "1", "--print-ids", "--label", "GPU.py"]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode == 69 and _pool_on_a_server():
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


def _journal() -> Dict[str, Any]:
    """Every record of gpulock's usage journal (`gpulock log --json`), oldest first."""
    import json  # only here: every --get and --release starts a Python

    result = subprocess.run([_binary(), "log", "--since", "0", "--json"], stdout=subprocess.PIPE,
                            text=True)
    if result.returncode == 69 and _pool_on_a_server():
        raise _Unreachable()
    if result.returncode != 0:
        raise RuntimeError("gpulock log failed (exit status %d)" % result.returncode)
    return json.loads(result.stdout)


def _log() -> None:
    """GPU.py's event list, from gpulock's usage journal: when each whole GPU was acquired and
    released, by the PID of the script that asked (its session, or --for-pid's process), else
    by the user. Ends the journal inferred (the whole job was killed) say so."""
    starts: Dict[str, Any] = {}  # lease id -> (its whole GPUs' indices, who asked)
    for record in _journal().get("records", []):
        if record.get("event") == "start":
            found = _HELD_FOR.search(record.get("command") or "")
            who = "PID %s" % found.group(1) if found else str(record.get("user") or "unknown")
            indices = [g["index"] for g in record.get("gpus") or [] if g.get("index") is not None
                       and not str(g.get("uuid", "")).startswith("MIG-")]
            starts[record.get("lease_id")] = (indices, who)
            for index in indices:
                print("%s: GPU %d acquired by %s." % (_time(record["time"]), index, who))
        elif record.get("event") == "end" and record.get("lease_id") in starts:
            indices, who = starts.pop(record["lease_id"])
            how = record.get("how") or "released"
            why = "" if how == "released" and not record.get("inferred") else " (%s%s)" % (
                how.replace("_", " "), ", inferred" if record.get("inferred") else "")
            for index in indices:
                print("%s: GPU %d released by %s%s." % (_time(record["time"]), index, who, why))


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


# -- GPU.py's own keys on the same server -----------------------------------------------------

GPU_PY_KEYS = ("%s_IDLE", "%s_MANAGED", "%s_INIT")  # GPU.py's lists and init hash, by prefix
WARN_EVERY_SECONDS = 24 * 3600


def _redis_command(address: Any, *words: str) -> Optional[bytes]:
    """One command to the Redis server of a parsed redis:// URL, after its AUTH and SELECT;
    the reply's first line, or None when the server cannot be asked."""
    import socket
    from urllib.parse import unquote

    def request(*items: str) -> bytes:
        out = b"*%d\r\n" % len(items)
        for item in items:
            data = item.encode()
            out += b"$%d\r\n%s\r\n" % (len(data), data)
        return out

    password = unquote(address.password) if address.password else os.environ.get(
        "GPULOCK_REDIS_PASSWORD")
    commands = []
    if password:
        user = unquote(address.username) if address.username else None
        commands.append(request("AUTH", *([user, password] if user else [password])))
    database = (address.path or "/0").strip("/") or "0"
    commands += [request("SELECT", database), request(*words)]
    try:
        with socket.create_connection((address.hostname or "localhost", address.port or 6379),
                                      timeout=1.0) as connection:
            connection.sendall(b"".join(commands))
            replies = b""
            while replies.count(b"\r\n") < len(commands):
                chunk = connection.recv(4096)
                if not chunk:
                    return None
                replies += chunk
    except (OSError, ValueError):
        return None
    lines = replies.split(b"\r\n")
    if any(line.startswith(b"-") for line in lines[:len(commands)]):
        return None
    return lines[len(commands) - 1]


def warn_of_gpu_py_keys(prefix: str) -> None:
    """On a Redis backend that also holds GPU.py's keys (GPU.py still in use there): a warning
    on stderr, at most once a day per server and prefix (remembered under XDG_STATE_HOME)."""
    url = os.environ.get("GPULOCK_BACKEND", "")
    if not url.startswith("redis://"):
        return
    from urllib.parse import urlsplit

    try:
        address = urlsplit(url)
        address.port  # raises ValueError for a malformed port
    except ValueError:
        return
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", "%s_%s_%s_%s" % (
        address.hostname, address.port or 6379, (address.path or "/0").strip("/"), prefix))
    stamp = os.path.join(state, "gpulock", "gpu-py-keys-" + key)
    try:
        if time.time() - os.stat(stamp).st_mtime < WARN_EVERY_SECONDS:
            return
    except OSError:
        pass
    reply = _redis_command(address, "EXISTS", *(k % prefix for k in GPU_PY_KEYS))
    if reply is None or not reply.startswith(b":") or reply == b":0":
        return
    shown = url.split("@")[-1] if "@" in url else url[len("redis://"):]
    print("gpulock-gpu: warning: redis://%s also holds GPU.py's keys (%s): GPU.py and "
          "gpulock-gpu do not see each other's GPUs, so one GPU can go to a job of each. Move "
          "every user of this server to gpulock-gpu at once (docs/migration.md, \"GPU.py on "
          "Redis\")." % (shown, ", ".join(k % prefix for k in GPU_PY_KEYS)), file=sys.stderr)
    try:
        os.makedirs(os.path.dirname(stamp), exist_ok=True)
        with open(stamp, "w"):
            pass
    except OSError:
        pass


def run(args: argparse.Namespace) -> int:
    """Does what GPU.py does for ``args``, in GPU.py's order of precedence."""
    _select_backend(args)
    warn_of_gpu_py_keys(args.redis_prefix or "GPU")
    if args.gpu_count:
        import gpulock

        print(len([g for g in gpulock.gpus() if g.mig_index is None]))
        return 0
    # GPU.py pinged Redis here; the status is read once, when a command needs it (--get and
    # --release read what they need themselves: every task of a sweep runs both).
    seen: List[Any] = []

    def status() -> Any:
        if not seen:
            seen.append(_status())
        return seen[0]

    if args.managed_gpu_count:
        print(len(_managed(status())))
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
        print(len(_managed(status())))  # nothing to initialise: leases need no set-up
        return 0
    if args.get:
        return _get()
    if args.release is not None:
        return _release(args.release)
    if not args.log:
        status()  # GPU.py's ping: every other command says so when Redis cannot be reached
    if args.log:
        _log()
        return 0
    if args.idle:
        ids = _ids(_idle(status()))
        print("There is %d IDDLE GPUs, IDs: %s" % (len(ids), ",".join(ids)))
        return 0
    if args.managed:
        ids = _ids(_managed(status()))
        print("There is %d MANAGED GPUs, IDs: %s" % (len(ids), ",".join(ids)))
        return 0
    if args.info:
        total, managed = len(_whole_gpus(status())), len(_managed(status()))
        if managed == 0:
            print("GPU total:%d no managed" % total)
        else:
            print("GPU total:%d managed:%d idle:%d" % (total, managed, len(_idle(status()))))
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
