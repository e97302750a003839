"""A real `redis-server` for tests, and a tiny RESP client to talk to it.

    with RedisServer(password="s3cret", acl_user=("alice", "pw")) as server:
        server.url(user="alice", password="pw")    # redis://alice:pw@127.0.0.1:PORT/0
        server.command("SET", "k", "v")            # "OK"
        server.stop()                              # SHUTDOWN NOSAVE: every key is lost
        server.start()                             # again, on the same port, empty

The server listens on 127.0.0.1 only, on a free port, with no persistence (`--save ""
--appendonly no`), in a temporary directory of its own with a log file there. It runs in a
session of its own and dies with the test process (PR_SET_PDEATHSIG), and every server still
running when the interpreter exits is killed (atexit), so no test leaves a server behind.

A plain module: the standard library only, no pytest fixtures (tests/integration/conftest_redis.py
has them). Nothing here depends on wall-clock speed: every timeout is only a hang guard.
"""

import atexit
import ctypes
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REDIS_SERVER = "/usr/bin/redis-server"

# Hang guards (seconds).
START_HANG = 30
STOP_HANG = 10
COMMAND_HANG = 30

# Every started server, killed at interpreter exit if a test did not stop it.
_LIVE = set()


def _kill_all_live():
    for server in list(_LIVE):
        server.kill()


atexit.register(_kill_all_live)


class RedisMissing(RuntimeError):
    """redis-server is not installed: tests must fail with this message, not skip."""


class RedisError(Exception):
    """An error reply (`-ERR ...`, `-WRONGTYPE ...`) from the server."""


def redis_server_binary():
    """The redis-server executable; RedisMissing (with how to install it) when there is none."""
    for candidate in (os.environ.get("GPULOCK_REDIS_SERVER"), REDIS_SERVER,
                      shutil.which("redis-server")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise RedisMissing("redis-server is not installed (apt-get install redis-server; "
                       "scripts/install-deps installs it): the Redis backend tests need a real "
                       "server and do not skip without one")


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port():
    """A loopback port on which nothing listens (for 'wrong address' tests)."""
    return free_port()


# -- RESP ---------------------------------------------------------------------------------------

def _encode(args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, (int, float)):
            data = str(arg).encode()
        else:
            raise TypeError("cannot send %r to redis" % (arg,))
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RespConnection:
    """One connection speaking RESP2. `command(*args)` returns the decoded reply: str for
    simple and bulk strings (bytes when `raw`, or when not UTF-8), int, None for nil, lists for
    arrays; an error reply raises RedisError. Socket errors (ConnectionError, OSError) pass."""

    def __init__(self, port, host="127.0.0.1", timeout=COMMAND_HANG):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, *args):
        self.sock.sendall(_encode(args))

    def command(self, *args, raw=False):
        self.send(*args)
        return self.read_reply(raw=raw)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buffer += chunk

    def _line(self):
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buffer) < n + 2:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n + 2:]
        return data

    def read_reply(self, raw=False):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest if raw else rest.decode(errors="replace")
        if kind == b"-":
            raise RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._exact(n)
            if raw:
                return data
            try:
                return data.decode()
            except UnicodeDecodeError:
                return data
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self.read_reply(raw=raw) for _ in range(n)]
        raise ConnectionError("unexpected RESP reply %r" % line)


# -- the server ---------------------------------------------------------------------------------

def _die_with_parent():
    """preexec_fn: the server gets SIGKILL when the test process dies, however it dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class RedisServer:
    """A redis-server on 127.0.0.1:PORT. `password`: requirepass for the default user.
    `acl_user`: (name, password) of an ACL user allowed everything on `gpulock:*` keys and
    channels; `extra_users`: more (name, password, [ACL rules…]) users, e.g. a restricted one.
    Users and the password are set again by every start(), so a restart keeps them."""

    def __init__(self, password=None, acl_user=None, extra_users=(), port=None, start=True,
                 extra_args=()):
        self.binary = redis_server_binary()
        self.password = password
        self.acl_user = acl_user
        self.extra_users = list(extra_users)
        self.extra_args = list(extra_args)
        self.port = port
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="gpulock-redis-"))
        self.log_path = self.dir / "redis.log"
        self.proc = None
        self._conn = None
        self.starts = 0
        if start:
            self.start()

    # -- lifetime ------------------------------------------------------------------------------
    def start(self):
        """Starts the server (again, on the same port after the first start) and returns once
        it answers PING and its users are set. A port taken by someone else between choosing
        and binding it is retried with another port, but only for the first start."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("redis-server already running on port %d" % self.port)
        attempts = 5 if self.port is None else 1
        last = None
        for _ in range(attempts):
            port = self.port if self.port is not None else free_port()
            try:
                self._start_on(port)
                self.port = port
                self.starts += 1
                return self
            except _PortTaken as e:
                last = e
        raise RuntimeError("could not start redis-server: %s" % last)

    def _argv(self, port):
        argv = [self.binary, "--port", str(port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                "--logfile", str(self.log_path), "--daemonize", "no",
                "--protected-mode", "no", "--unixsocket", "", "--loglevel", "notice"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        return argv + self.extra_args

    def _start_on(self, port):
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = subprocess.Popen(self._argv(port), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=str(self.dir), start_new_session=True,
                                     preexec_fn=_die_with_parent)
        _LIVE.add(self)
        deadline = time.monotonic() + START_HANG
        while True:
            if self.proc.poll() is not None:
                log = self.log_tail(offset=log_offset)
                self.proc = None
                _LIVE.discard(self)
                if "Address already in use" in log:
                    raise _PortTaken("port %d: %s" % (port, log.strip()[-300:]))
                raise RuntimeError("redis-server exited at start on port %d:\n%s" % (port, log))
            try:
                self._drop_connection()
                conn = RespConnection(port, timeout=2)
                if self.password is not None:
                    conn.command("AUTH", self.password)
                if conn.command("PING") == "PONG":
                    self._conn = conn
                    break
                conn.close()
            except (OSError, ConnectionError, RedisError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("redis-server on port %d did not answer PING within %ss "
                                   "(hang guard)\n%s" % (port, START_HANG, self.log_tail()))
            time.sleep(0.02)
        self._conn.sock.settimeout(COMMAND_HANG)
        users = []
        if self.acl_user is not None:
            name, pw = self.acl_user
            users.append((name, pw, ["~gpulock:*", "&gpulock:*", "+@all"]))
        users += self.extra_users
        for name, pw, rules in users:
            self._conn.command("ACL", "SETUSER", name, "reset", "on", ">" + pw, *rules)

    def stop(self):
        """SHUTDOWN NOSAVE (every key is lost), then waits for the process; SIGKILL if it does
        not exit within the hang guard (e.g. while a CLIENT PAUSE blocks the shutdown)."""
        if self.proc is None:
            return
        try:
            conn = RespConnection(self.port, timeout=STOP_HANG)
            try:
                if self.password is not None:
                    conn.command("AUTH", self.password)
                conn.send("SHUTDOWN", "NOSAVE")
                try:
                    conn.read_reply()
                except (OSError, ConnectionError, RedisError):
                    pass  # the server closes the connection as it exits
            finally:
                conn.close()
        except (OSError, ConnectionError, RedisError):
            pass
        try:
            self.proc.wait(timeout=STOP_HANG)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self):
        """SIGKILL (no shutdown at all), and reaps it."""
        self._drop_connection()
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
        try:
            proc.wait(timeout=STOP_HANG)
        except subprocess.TimeoutExpired:
            pass

    def restart(self):
        """stop() then start() on the same port: an empty server, as after a crash without
        persistence."""
        self.stop()
        return self.start()

    def close(self):
        """kill() and removes the temporary directory."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- talking to it -------------------------------------------------------------------------
    def url(self, user=None, password=None, db=0, host="127.0.0.1", port=None):
        """redis://[user:password@]host:port/db; `password` alone gives redis://:password@…"""
        auth = ""
        if user is not None or password is not None:
            auth = "%s:%s@" % (user or "", password or "") if password is not None \
                else "%s@" % user
        return "redis://%s%s:%d/%d" % (auth, host, port if port is not None else self.port, db)

    def connect(self, timeout=COMMAND_HANG):
        """A new authenticated connection (the caller closes it)."""
        conn = RespConnection(self.port, timeout=timeout)
        if self.password is not None:
            conn.command("AUTH", self.password)
        return conn

    def _drop_connection(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def command(self, *args, raw=False):
        """Runs one command as the default user and returns its decoded reply (RespConnection).
        Reconnects once if the connection was lost (e.g. after a restart)."""
        for attempt in range(2):
            try:
                if self._conn is None:
                    self._conn = self.connect()
                return self._conn.command(*args, raw=raw)
            except (OSError, ConnectionError):
                self._drop_connection()
                if attempt == 1:
                    raise

    def pause(self, ms, mode="ALL"):
        """CLIENT PAUSE ms ALL from a connection of its own: every client (this object's too,
        and CLIENT UNPAUSE) blocks until the pause ends; key expiry is paused as well."""
        conn = self.connect()
        try:
            return conn.command("CLIENT", "PAUSE", str(int(ms)), mode)
        finally:
            conn.close()

    def keys(self, pattern="*"):
        return sorted(self.command("KEYS", pattern))

    def log_tail(self, offset=0, limit=4000):
        try:
            data = self.log_path.read_bytes()[offset:]
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")


class _PortTaken(Exception):
    pass
