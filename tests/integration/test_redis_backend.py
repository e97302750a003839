"""The Redis backend (issue 5) against a real redis-server: backend selection (flag, environment,
config file), pools and fake hosts on one machine, leases in Redis and in the views, `--host`,
the queue of the whole pool, `acquire --for-pid` / `release`, `doctor`, ACL users, and fencing
tokens. Failures (lost servers, pauses, garbage) are in test_redis_failures.py, the contention
audit in test_redis_contention.py.

Every test has a server of its own and a pool name of its own; fake hosts are GPULOCK_HOST with
simulated GPUs, each with its own GPULOCK_DIR. Timeouts are hang guards only.
"""

import json
import os
import pwd
import re
import time

import pytest

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, HANG, wait_until
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import (  # noqa: E402
    DEFAULT_TTL_SECONDS, LEASE_ID, RedisWorld, assert_no_crash, closed_port, read_env_output,
    unique_pool)

# The fixtures redis_server, redis_servers and rw.
pytest_plugins = ["conftest_redis"]


def me():
    return pwd.getpwuid(os.getuid()).pw_name


def lock_keys(rw, pool=None):
    return [k for k in rw.pool_keys(pool) if ":lock:" in k]


def lease_keys(rw, pool=None):
    return [k for k in rw.pool_keys(pool) if ":lease:" in k]


def run_env(rw, *selection, host="node-a", env=None):
    """`gpulock run SELECTION -- env` on `host`: the command's environment as a dict."""
    result = rw.run("run", *selection, "--", "env", host=host, env=env)
    assert result.returncode == 0, "run %s: %d\n%s" % (selection, result.returncode,
                                                       result.stderr)
    return read_env_output(result.stdout)


# -- a lease on Redis -----------------------------------------------------------------------------

def test_run_exports_lease_variables_and_releases_keys(rw):
    uuids = rw.register("node-a", gpus=4)
    got = run_env(rw, "-n", "2")
    assert LEASE_ID.fullmatch(got["GPULOCK_LEASE_ID"]), got
    gpus = got["GPULOCK_GPUS"].split(",")
    assert len(gpus) == 2 == len(set(gpus)) and set(gpus) <= set(uuids), (gpus, uuids)
    assert got["CUDA_VISIBLE_DEVICES"] == ",".join(str(uuids.index(u)) for u in gpus)
    assert got["GPULOCK_LEASE_HOST"] == "node-a"
    assert re.fullmatch(r"[0-9]+", got["GPULOCK_FENCING_TOKEN"]), got
    assert int(got["GPULOCK_FENCING_TOKEN"]) > 0
    # Released when the command ended: no lock or lease key is left.
    assert lock_keys(rw) == [] and lease_keys(rw) == [], rw.pool_keys()


def test_lease_lives_in_redis_is_renewed_and_shows_in_status(rw):
    uuids = rw.register("node-a", gpus=2)
    started = time.monotonic()
    holder = rw.hold("--gpus", "1")
    assert holder.gpus == [uuids[1]] and holder.host == "node-a" and holder.cvd == "1"
    lock = rw.lock_key(uuids[1])
    assert rw.server.command("GET", lock) == holder.lease_id
    assert 0 < rw.server.command("PTTL", lock) <= DEFAULT_TTL_SECONDS * 1000
    assert rw.server.command("EXISTS", rw.lease_key(holder.lease_id)) == 1
    assert 0 < rw.server.command("PTTL", rw.lease_key(holder.lease_id)) \
        <= DEFAULT_TTL_SECONDS * 1000
    assert rw.server.command("GET", rw.lock_key(uuids[0])) is None

    doc = rw.status()
    assert doc["backend"] == "redis" and doc["pool"] == rw.pool, doc
    leased = rw.gpu_entry(doc, uuids[1])
    assert leased["state"] == "leased" and leased["host"] == "node-a", leased
    assert leased["holder"]["lease_id"] == holder.lease_id
    assert leased["holder"]["user"] == me()
    assert rw.gpu_entry(doc, uuids[0])["state"] == "free"

    # Renewed by the holder: the TTL goes up again, and the lease outlives its TTL.
    rw.wait_renewal(lock, holder)
    while time.monotonic() - started < 2 * DEFAULT_TTL_SECONDS:
        assert rw.server.command("GET", lock) == holder.lease_id, "lease expired while renewed"
        time.sleep(0.1)
    assert holder.alive()
    assert rw.run_no_wait("--gpus", "1").returncode == EX_TEMPFAIL

    assert holder.finish() == 0, holder.bg.describe()
    assert rw.server.command("GET", lock) is None
    assert lease_keys(rw) == []
    assert rw.gpu_entry(rw.status(), uuids[1])["state"] == "free"


def test_busy_no_wait_and_timeout_exit_75(rw):
    rw.register("node-a", gpus=2)
    holder = rw.hold("-n", "2")
    result = rw.run_no_wait()
    assert result.returncode == EX_TEMPFAIL, result.stderr
    result = rw.run("run", "--timeout", "1s", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    result = rw.run("run", "--gpus", "0", "--timeout", "250ms", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert holder.alive()
    assert holder.finish() == 0
    assert rw.run_no_wait("-n", "2").returncode == 0


# -- selecting the backend ------------------------------------------------------------------------

def write_config(rw, name, url):
    path = rw.tmp / name
    path.write_text('backend = "%s"\n' % url)
    return str(path)


def test_file_backend_is_the_default(rw):
    doc = rw.status(env=rw.env(backend=False))
    assert doc["backend"] == "file", doc
    doc = rw.status(env=rw.env(url="file"))
    assert doc["backend"] == "file", doc
    result = rw.run("run", "--no-wait", "--", "true", env=rw.env(backend=False))
    assert result.returncode == 0, result.stderr
    assert rw.pool_keys() == [], "the file backend wrote to Redis"


def test_backend_flag_beats_environment_beats_config(rw):
    good = rw.server.url()
    dead = "redis://127.0.0.1:%d/0" % closed_port()

    # The flag beats a dead URL in the environment and in the config file.
    env = rw.env(url=dead, GPULOCK_CONFIG=write_config(rw, "dead.toml", dead))
    result = rw.run("run", "--backend", good, "--no-wait", "--", "env", env=env)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"[0-9]+", read_env_output(result.stdout)["GPULOCK_FENCING_TOKEN"])
    result = rw.run("status", "--backend", good, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["backend"] == "redis"
    # Without the flag, the environment's dead URL is used: no fallback.
    result = rw.run("run", "--no-wait", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr

    # The environment beats the config file.
    env = rw.env(url=good, GPULOCK_CONFIG=write_config(rw, "dead2.toml", dead))
    result = rw.run("run", "--no-wait", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    # GPULOCK_BACKEND=file beats a Redis URL in the config file.
    env = rw.env(url="file", GPULOCK_CONFIG=write_config(rw, "good.toml", good))
    assert rw.status(env=env)["backend"] == "file"

    # The config file alone selects Redis.
    env = rw.env(backend=False, GPULOCK_CONFIG=write_config(rw, "good2.toml", good))
    doc = rw.status(env=env)
    assert doc["backend"] == "redis" and doc["pool"] == rw.pool, doc
    holder = rw.hold("-n", "1", env=env)
    assert rw.server.command("GET", rw.lock_key(holder.gpus[0])) == holder.lease_id
    assert holder.finish() == 0


# -- pools and hosts ------------------------------------------------------------------------------

def test_pools_on_one_server_are_independent(rw):
    other = unique_pool()
    uuids = rw.register("node-a", gpus=2)
    other_uuids = rw.register("node-a", gpus=2, pool=other)
    holder = rw.hold("-n", "2")
    assert rw.run_no_wait().returncode == EX_TEMPFAIL
    # The same host name in another pool: its GPUs are free.
    got = run_env(rw, "-n", "2", env=rw.env(pool=other))
    assert set(got["GPULOCK_GPUS"].split(",")) == set(other_uuids)
    doc = rw.pool_status(env=rw.env(pool=other))
    assert doc["pool"] == other
    assert {g["state"] for g in doc["gpus"]} == {"free"}, doc
    assert set(lock_keys(rw)) == {rw.lock_key(u) for u in uuids}
    assert lock_keys(rw, pool=other) == []
    assert all(k.startswith("gpulock:{%s}:" % rw.pool) for k in rw.pool_keys())
    assert holder.finish() == 0


def test_fake_hosts_and_the_pool_view(rw):
    counts = {"node-a": 2, "node-b": 3, "node-c": 1}
    uuids = {host: rw.register(host, gpus=n) for host, n in counts.items()}
    every = [u for host in counts for u in uuids[host]]
    assert len(set(every)) == len(every), "simulated UUIDs collide across hosts: %s" % uuids

    holder = rw.hold("-n", "1", host="node-b")
    assert holder.host == "node-b" and holder.gpus[0] in uuids["node-b"]

    doc = rw.pool_status(host="node-c")
    assert doc["backend"] == "redis" and doc["pool"] == rw.pool
    by_host = {}
    for gpu in doc["gpus"]:
        by_host.setdefault(gpu["host"], set()).add(gpu["uuid"])
    assert by_host == {h: set(u) for h, u in uuids.items()}, doc
    for gpu in doc["gpus"]:
        if gpu["uuid"] == holder.gpus[0]:
            assert gpu["state"] == "leased" and gpu["holder"]["lease_id"] == holder.lease_id
        else:
            assert gpu["state"] == "free", gpu
    result = rw.run("status", "--pool", host="node-c")  # the table, too
    assert result.returncode == 0, result.stderr
    assert all(h in result.stdout for h in counts), result.stdout

    # Plain status: this host's GPUs only.
    doc = rw.status(host="node-a")
    assert [g["uuid"] for g in doc["gpus"]] == uuids["node-a"]
    assert {g["host"] for g in doc["gpus"]} == {"node-a"}
    assert holder.finish() == 0


def test_host_selection(rw):
    uuids = {h: rw.register(h, gpus=2) for h in ("node-a", "node-b", "node-c")}
    local = rw.hold("-n", "2", host="node-a")
    # Default: this host only, even though other hosts have free GPUs.
    assert rw.run_no_wait(host="node-a").returncode == EX_TEMPFAIL

    # A named host: a reservation there; the command runs here and is told the host.
    got = run_env(rw, "--host", "node-b", "-n", "1", "--no-wait", host="node-a")
    assert got["GPULOCK_LEASE_HOST"] == "node-b"
    assert got["GPULOCK_GPUS"] in uuids["node-b"]
    # GPULOCK_HOST still names the host the command runs on (gpulock there registers as it).
    assert got["GPULOCK_HOST"] == "node-a"

    # Named GPUs must be on one host.
    mixed = rw.run("run", "--host", "any", "--gpus", "%s,%s" % (uuids["node-b"][1],
                                                               uuids["node-c"][1]),
                   "--no-wait", "--", "true", host="node-a")
    assert mixed.returncode == EX_USAGE and "one host" in mixed.stderr, mixed.stderr

    # Any host: a multi-GPU lease stays on one host.
    got = run_env(rw, "--host", "any", "-n", "2", "--no-wait", host="node-a")
    assert got["GPULOCK_LEASE_HOST"] in ("node-b", "node-c")
    assert set(got["GPULOCK_GPUS"].split(",")) == set(uuids[got["GPULOCK_LEASE_HOST"]])

    # A list of hosts: node-b is full, so node-c.
    remote = rw.hold("--host", "node-b", "-n", "2", host="node-a")
    assert remote.host == "node-b" and set(remote.gpus) == set(uuids["node-b"])
    got = run_env(rw, "--host", "node-b,node-c", "-n", "1", "--no-wait", host="node-a")
    assert got["GPULOCK_LEASE_HOST"] == "node-c" and got["GPULOCK_GPUS"] in uuids["node-c"]
    result = rw.run("run", "--host", "node-a,node-b", "--no-wait", "--", "true", host="node-c")
    assert result.returncode == EX_TEMPFAIL, result.stderr

    doc = rw.pool_status(host="node-c")
    for gpu in doc["gpus"]:
        expected = "free" if gpu["host"] == "node-c" else "leased"
        assert gpu["state"] == expected, gpu
    assert local.finish() == 0 and remote.finish() == 0


# -- the queue, acquire and release ---------------------------------------------------------------

def test_queue_lists_waiters_of_the_whole_pool(rw):
    rw.register("node-a", gpus=1)
    rw.register("node-b", gpus=1)
    holder = rw.hold("-n", "1", host="node-a")
    waiter_a = rw.spawn("run", "-n", "1", "--", "true", host="node-a")
    waiter_b = rw.spawn("run", "--host", "node-a", "-n", "1", "--", "true", host="node-b")

    def waiting():
        result = rw.run("queue", "--json", host="node-b")
        assert_no_crash(result, "queue --json")
        assert result.returncode == 0, result.stderr
        entries = json.loads(result.stdout)["waiting"]
        return entries if len(entries) == 2 else None
    entries = wait_until(waiting, timeout=HANG, interval=0.1, what="two waiters in the queue")
    assert {e["pid"] for e in entries} == {waiter_a.pid, waiter_b.pid}, entries
    assert [e["position"] for e in entries] == [1, 2]
    assert all(e["user"] == me() for e in entries)
    result = rw.run("queue", host="node-a")
    assert result.returncode == 0, result.stderr
    assert waiter_a.alive() and waiter_b.alive()

    assert holder.finish() == 0
    assert waiter_a.wait(timeout=HANG) == 0, waiter_a.describe()
    assert waiter_b.wait(timeout=HANG) == 0, waiter_b.describe()
    result = rw.run("queue", "--json")
    assert json.loads(result.stdout)["waiting"] == []


def test_acquire_for_pid_and_release(rw):
    uuids = rw.register("node-a", gpus=2)
    watched = rw.gl.sleeper()
    result = rw.run("acquire", "-n", "1", "--for-pid", watched.pid)
    assert result.returncode == 0, result.stderr
    exports = dict(re.findall(r"^export ([A-Z_]+)='([^']*)'$", result.stdout, re.M))
    lease = exports["GPULOCK_LEASE_ID"]
    assert LEASE_ID.fullmatch(lease)
    assert exports["GPULOCK_GPUS"] == uuids[0]
    if "GPULOCK_FENCING_TOKEN" in exports:
        assert re.fullmatch(r"[0-9]+", exports["GPULOCK_FENCING_TOKEN"])
    assert rw.server.command("GET", rw.lock_key(uuids[0])) == lease
    entry = rw.gpu_entry(rw.status(), uuids[0])
    assert entry["state"] == "leased" and entry["holder"]["lease_id"] == lease
    assert entry["holder"]["kind"] == "detached"
    assert rw.run_no_wait("--gpus", "0").returncode == EX_TEMPFAIL

    result = rw.run("release", lease)
    assert result.returncode == 0, result.stderr
    assert rw.server.command("GET", rw.lock_key(uuids[0])) is None
    assert rw.gpu_entry(rw.status(), uuids[0])["state"] == "free"
    result = rw.run("release", lease)
    assert result.returncode == EX_UNAVAILABLE, result.stderr

    # A detached lease also ends when the watched process exits.
    result = rw.run("acquire", "-n", "1", "--for-pid", watched.pid)
    assert result.returncode == 0, result.stderr
    assert rw.server.command("GET", rw.lock_key(uuids[0])) is not None
    watched.kill_group()
    watched.wait()
    wait_until(lambda: rw.server.command("GET", rw.lock_key(uuids[0])) is None, timeout=HANG,
               what="the detached lease to end with its process")


# -- doctor ---------------------------------------------------------------------------------------

def test_doctor_healthy_redis_and_file_backend(rw):
    result = rw.run("doctor")
    assert result.returncode == 0, "doctor: %d\n%s\n%s" % (result.returncode, result.stdout,
                                                           result.stderr)
    assert len(result.stdout.strip().splitlines()) >= 2, result.stdout
    file_env = rw.env(backend=False)
    assert rw.run("run", "--", "true", env=file_env).returncode == 0  # makes the lock directory
    result = rw.run("doctor", env=file_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "doctor printed nothing"


# -- ACL users ------------------------------------------------------------------------------------

def test_acl_user_and_password(gl, redis_servers):
    admin = "adm-" + os.urandom(6).hex()
    secret = "pw-" + os.urandom(6).hex()
    stranger = "st-" + os.urandom(6).hex()
    server = redis_servers(password=admin, acl_user=("gpulock-user", secret),
                           extra_users=[("stranger", stranger, ["~other:*", "&other:*",
                                                                "+@all"]),
                                        ("mute", secret, ["~gpulock:*", "resetchannels",
                                                          "+@all"])])
    world = RedisWorld(gl, server)
    url = server.url(user="gpulock-user", password=secret)
    env = world.env(url=url)
    assert world.status(env=env)["backend"] == "redis"
    uuids = world.register("node-a", gpus=4, url=url)
    holder = world.hold("-n", "1", env=env)
    assert server.command("GET", world.lock_key(holder.gpus[0])) == holder.lease_id
    assert world.gpu_entry(world.status(env=env), holder.gpus[0])["state"] == "leased"
    result = gl.run("run", "-n", "1", "--no-wait", "--", "env", env=env)
    assert result.returncode == 0, result.stderr
    assert read_env_output(result.stdout)["GPULOCK_GPUS"] in uuids
    result = gl.run("doctor", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^ok +notifications: PUBLISH and SUBSCRIBE", result.stdout, re.M), \
        result.stdout

    # A user who may use the pool's keys but not its channel: the scripts (which publish) are
    # refused, so nothing works (exit 69, never local locks), and doctor names the channel.
    mute = server.url(user="mute", password=secret)
    result = gl.run("doctor", env=world.env(url=mute))
    assert result.returncode == EX_UNAVAILABLE, result.stdout + result.stderr
    assert re.search(r"^failed +notifications: .*events", result.stdout, re.M), result.stdout
    result = gl.run("run", "-n", "1", "--no-wait", "--", "true", env=world.env(url=mute))
    assert result.returncode == EX_UNAVAILABLE and "publish" in result.stderr, result.stderr

    # The default user's password works too.
    result = gl.run("run", "-n", "1", "--no-wait", "--", "true",
                    env=world.env(url=server.url(password=admin)))
    assert result.returncode == 0, result.stderr

    # A wrong password for the user: 69, the URL named, the password never shown.
    wrong = "wrong-" + os.urandom(6).hex()
    for args in (("run", "--no-wait", "--", "true"), ("status", "--json"), ("doctor",)):
        result = gl.run(*args, env=world.env(url=server.url(user="gpulock-user",
                                                              password=wrong)))
        assert_no_crash(result, args[0])
        assert result.returncode == EX_UNAVAILABLE, (args, result.stdout, result.stderr)
        assert wrong not in result.stderr + result.stdout
        assert str(server.port) in result.stderr + result.stdout, result.stderr  # doctor: stdout

    # A user that may not touch the pool's keys: refused, never a crash, never a lease.
    env = world.env(url=server.url(user="stranger", password=stranger))
    result = gl.run("run", "--no-wait", "--", "true", env=env)
    assert_no_crash(result, "run as a user without access")
    assert result.returncode != 0, result.stdout
    assert stranger not in result.stderr + result.stdout
    result = gl.run("doctor", env=env)
    assert_no_crash(result, "doctor as a user without access")
    assert result.returncode != 0, result.stdout
    assert holder.finish() == 0


# -- fencing tokens -------------------------------------------------------------------------------

def token_of_run(rw, *selection, host="node-a", env=None):
    return int(run_env(rw, *selection, host=host, env=env)["GPULOCK_FENCING_TOKEN"])


def test_fencing_tokens_strictly_increase_across_leases_hosts_and_restarts(rw):
    rw.register("node-a", gpus=2)
    rw.register("node-b", gpus=2)
    tokens = []
    for i in range(4):
        tokens.append(token_of_run(rw, "-n", str(1 + i % 2), host=("node-a", "node-b")[i % 2]))
    # Concurrent leases: distinct, and above all earlier ones.
    first = rw.hold("-n", "1", host="node-a")
    second = rw.hold("-n", "1", host="node-b")
    tokens += sorted([first.token, second.token])
    assert first.token != second.token
    tokens.append(token_of_run(rw, "--host", "any", "-n", "1"))
    assert first.finish() == 0 and second.finish() == 0
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens

    # Restarted empty (SHUTDOWN NOSAVE): the token key is gone, yet tokens keep increasing.
    for _ in range(2):
        rw.server.restart()
        assert rw.pool_keys() == []
        tokens.append(token_of_run(rw, "-n", "1", host="node-a"))
        tokens.append(token_of_run(rw, "-n", "1", host="node-a"))
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    # Another pool has tokens of its own, but the same rule holds there.
    other = unique_pool()
    a = token_of_run(rw, "-n", "1", env=rw.env(pool=other))
    b = token_of_run(rw, "-n", "1", env=rw.env(pool=other))
    assert a < b
