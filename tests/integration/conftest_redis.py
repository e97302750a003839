"""Fixtures and helpers for the Redis backend's integration tests (test_redis_*.py).

Not a conftest.py of its own (pytest would load it for every test): the Redis test modules
load it as a plugin, for its fixtures, and import its helpers:

    pytest_plugins = ["conftest_redis"]
    from conftest_redis import RedisWorld, assert_no_crash

`redis_server` is a real redis-server (tests/support/redis_server.py) on a free loopback port,
stopped at teardown. `rw` is a RedisWorld: the integration harness (`gl`, conftest.py) plus that
server, a pool name of its own, and helpers to play several hosts of the pool on this machine
(GPULOCK_HOST, simulated GPUs, a lock directory per fake host so that nothing can coordinate
through local lock files by accident).

If redis-server is not installed the tests fail (they never skip): CI installs it.
Nothing here depends on wall-clock speed: every timeout is only a hang guard.
"""

import json
import re
import secrets

import pytest

from conftest import HANG, wait_until  # conftest also puts tests/support on sys.path
from redis_server import RedisMissing, RedisServer, closed_port  # noqa: F401 (re-exported)

DEFAULT_TTL = "2s"
DEFAULT_TTL_SECONDS = 2.0
LEASE_ID = re.compile(r"[0-9a-f]{16}")


def new_server(**options):
    """A started RedisServer; fails the test (never skips) if redis-server is missing."""
    try:
        return RedisServer(**options)
    except RedisMissing as e:
        pytest.fail(str(e))


@pytest.fixture
def redis_server():
    server = new_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_servers():
    """A factory: redis_servers(password=…, acl_user=…) starts one more server, every one
    stopped at teardown."""
    started = []

    def make(**options):
        server = new_server(**options)
        started.append(server)
        return server
    try:
        yield make
    finally:
        for server in started:
            server.close()


def unique_pool(prefix="itest"):
    return "%s-%s" % (prefix, secrets.token_hex(5))


class Holder:
    """A `gpulock run … -- sh` whose command reported its lease and waits for finish()."""

    def __init__(self, bg, report, finish_path):
        self.bg = bg
        self.pid = bg.pid
        self.lease_id = report["lease"]
        self.gpus = report["gpus"].split(",") if report["gpus"] else []
        self.token = int(report["token"]) if report["token"].isdigit() else report["token"]
        self.host = report["host"]
        self.cvd = report["cvd"]
        self.command_pid = report["pid"]  # the command (sh), a child of `gpulock run`
        self.finish_path = finish_path

    def finish(self):
        """Lets the command exit 0; returns gpulock's exit status."""
        self.finish_path.touch()
        return self.bg.wait()

    def alive(self):
        return self.bg.alive()

    def command_alive(self):
        """Whether the command still runs (a zombie not yet reaped by gpulock counts as
        ended)."""
        return process_running(self.command_pid)


def process_running(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# The holder's command: reports its lease variables as JSON, then waits for a file (a finish
# request) or for a signal. $1: report path, $2: finish path.
HOLD_SCRIPT = (
    'printf \'{"lease":"%s","gpus":"%s","token":"%s","host":"%s","cvd":"%s","pid":%s}\\n\' '
    '"$GPULOCK_LEASE_ID" "$GPULOCK_GPUS" "$GPULOCK_FENCING_TOKEN" "$GPULOCK_LEASE_HOST" '
    '"$CUDA_VISIBLE_DEVICES" "$$" > "$1.tmp" && mv "$1.tmp" "$1"; '
    'while [ ! -e "$2" ]; do sleep 0.05; done')


class RedisWorld:
    """One test's Redis world: the harness `gl`, a server, a pool, and fake hosts."""

    def __init__(self, gl, server, pool=None):
        self.gl = gl
        self.server = server
        self.pool = pool or unique_pool()
        self.tmp = gl.tmp
        self._holds = 0
        self.host_gpus = {}  # (pool, host) -> simulated GPUs, as register() set them

    # -- environment ---------------------------------------------------------------------------
    def env(self, host="node-a", gpus=None, pool=None, ttl=DEFAULT_TTL, url=None, backend=True,
            **extra):
        """The environment of a gpulock process on fake host `host` with `gpus` simulated GPUs
        (default: as many as register() gave that host, else 4) in pool `pool` (this world's by
        default). `url`: GPULOCK_BACKEND (the server's plain URL by default); backend=False
        leaves GPULOCK_BACKEND unset."""
        if gpus is None:
            gpus = self.host_gpus.get((pool or self.pool, host), 4)
        values = {"GPULOCK_HOST": host, "GPULOCK_POOL": pool or self.pool}
        if backend:
            values["GPULOCK_BACKEND"] = url if url is not None else self.server.url()
        if ttl is not None:
            values["GPULOCK_LEASE_TTL"] = ttl
        values.update(extra)
        # A lock directory per fake host: local locks can never stand in for Redis.
        return self.gl.env(fake=gpus, lock_dir=self.tmp / ("locks-" + host), **values)

    def key(self, name, pool=None):
        return "gpulock:{%s}:%s" % (pool or self.pool, name)

    def lock_key(self, uuid, pool=None):
        return self.key("lock:" + uuid, pool)

    def lease_key(self, lease_id, pool=None):
        return self.key("lease:" + lease_id, pool)

    def wait_renewal(self, key, holder=None):
        """Waits until `key`'s TTL goes up (a renewal: between renewals it only goes down); fails
        if the key is gone or `holder` ended first."""
        last = [self.server.command("PTTL", key)]

        def renewed():
            if holder is not None and not holder.alive():
                raise AssertionError("the holder ended: " + holder.bg.describe())
            now = self.server.command("PTTL", key)
            if now < 0:
                raise AssertionError("%s is gone (PTTL %d) while its holder lives%s" % (
                    key, now, "\n" + holder.bg.describe() if holder is not None else ""))
            went_up, last[0] = now > last[0], now
            return went_up
        wait_until(renewed, timeout=HANG, interval=0.01, what="a renewal of " + key)

    def pool_keys(self, pool=None):
        return self.server.keys("gpulock:{%s}:*" % (pool or self.pool))

    # -- running gpulock -----------------------------------------------------------------------
    def run(self, *args, host="node-a", env=None, **kwargs):
        return self.gl.run(*args, env=env if env is not None else self.env(host=host), **kwargs)

    def spawn(self, *args, host="node-a", env=None):
        return self.gl.spawn(*args, env=env if env is not None else self.env(host=host))

    def status(self, host="node-a", env=None, pool_view=False):
        args = ["status", "--json"] + (["--pool"] if pool_view else [])
        result = self.run(*args, host=host, env=env)
        assert result.returncode == 0, "status %s failed (%d): %s" % (
            args, result.returncode, result.stderr)
        doc = json.loads(result.stdout)
        assert doc["schema_version"] == 1
        return doc

    def pool_status(self, host="node-a", env=None):
        return self.status(host=host, env=env, pool_view=True)

    def register(self, host="node-a", gpus=4, **env_options):
        """Runs `gpulock status` on fake host `host` (which registers its GPUs in the pool) and
        returns the UUIDs of its GPUs in display order."""
        self.host_gpus[(env_options.get("pool") or self.pool, host)] = gpus
        doc = self.status(env=self.env(host=host, gpus=gpus, **env_options))
        uuids = [g["uuid"] for g in doc["gpus"]]
        assert len(uuids) == gpus, doc
        return uuids

    @staticmethod
    def gpu_entry(doc, uuid):
        for gpu in doc["gpus"]:
            if gpu["uuid"] == uuid:
                return gpu
        raise AssertionError("no GPU %s in status: %s" % (uuid, json.dumps(doc)[:3000]))

    def hold(self, *selection, host="node-a", env=None, prefix=()):
        """Starts `gpulock run SELECTION -- sh …` on fake host `host` (as the user `prefix`
        makes it, on a multi-user harness) and waits until the command runs (the lease is
        taken). Returns a Holder; finish() ends it normally."""
        self._holds += 1
        report = self.tmp / ("redis-held-%d.json" % self._holds)
        finish = self.tmp / ("redis-finish-%d" % self._holds)
        bg = self.gl.spawn("run", *selection, "--", "sh", "-c", HOLD_SCRIPT, "holder",
                           report, finish,
                           env=env if env is not None else self.env(host=host), prefix=prefix)

        def started():
            if report.exists():
                return True
            if not bg.alive():
                raise AssertionError("holder exited early: " + bg.describe())
            return False
        wait_until(started, timeout=HANG, what="the holder's command to start")
        holder = Holder(bg, json.loads(report.read_text()), finish)
        assert LEASE_ID.fullmatch(holder.lease_id), holder.lease_id
        return holder

    def wait_for_command_in_record(self, holder):
        """Waits until the holder's lease record names its command. `gpulock run` renews at once
        when it adds the command to the record: a test that takes the holder's lock key away
        waits for that renewal first, or the renewal may put the key back."""
        member = '{"pid":%d,' % holder.command_pid
        wait_until(lambda: member in (self.server.command(
            "HGET", self.lease_key(holder.lease_id), "record") or ""),
            timeout=HANG, what="the holder's record naming its command")

    def run_no_wait(self, *selection, host="node-a", env=None):
        """`gpulock run SELECTION --no-wait -- true`: its CompletedProcess."""
        return self.run("run", *selection, "--no-wait", "--", "true", host=host, env=env)


@pytest.fixture
def rw(gl, redis_server):
    return RedisWorld(gl, redis_server)


def assert_no_crash(result, what=""):
    """gpulock neither crashed (killed by a signal) nor reported an internal error (70)."""
    assert result.returncode >= 0, "%s killed by signal %d\nstderr: %s" % (
        what, -result.returncode, result.stderr)
    assert result.returncode != 70, "%s: internal error (70)\nstderr: %s" % (what, result.stderr)
    for marker in ("AddressSanitizer", "runtime error:", "terminate called", "Segmentation"):
        assert marker not in result.stderr, "%s: %s\nstderr: %s" % (what, marker, result.stderr)


def read_env_output(text):
    """Parses `NAME=value` lines (the output of `env`) into a dict."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out[name] = value
    return out
