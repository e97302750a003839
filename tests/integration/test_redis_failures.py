"""The Redis backend when things go wrong: wrong password or address (exit 69, password masked,
no fallback to local locks), a SIGKILLed holder (its GPUs come back when Redis expires its keys),
Redis stopped, restarted empty or paused (CLIENT PAUSE) past the lease TTL with
--on-lease-loss=warn|kill, an outage between running a waiter's entry and answering it (a proxy
cuts it), and garbage in the pool's keys (never a crash, never a GPU twice).

TTLs are short (2 s, or 4 s where a restart must fit in one). No assertion depends on how fast
this machine is: where the order of events matters, the test checks it with Redis itself (a key
still there, a server still paused) rather than with a stopwatch; timeouts are hang guards.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, HANG, wait_until
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import (  # noqa: E402
    DEFAULT_TTL_SECONDS, RedisWorld, assert_no_crash, closed_port, read_env_output)
from redis_server import RespConnection  # noqa: E402
from tcp_proxy import TcpProxy  # noqa: E402

SIGTERM_STATUS = 128 + signal.SIGTERM

# The fixtures redis_server, redis_servers and rw.
pytest_plugins = ["conftest_redis"]


def local_lock_files(rw, host="node-a"):
    lock_dir = rw.tmp / ("locks-" + host)
    if not lock_dir.exists():
        return []
    return [p for p in os.listdir(lock_dir) if p.endswith(".lock")]


def server_paused(server, probe=0.3):
    """True if the server does not answer PING within `probe` seconds (a CLIENT PAUSE is on)."""
    conn = RespConnection(server.port, timeout=probe)
    try:
        if server.password is not None:
            conn.send("AUTH", server.password)
        conn.send("PING")
        try:
            if server.password is not None:
                conn.read_reply()
            conn.read_reply()
            return False
        except socket.timeout:
            return True
    finally:
        conn.close()


def wait_unpaused(server):
    wait_until(lambda: not server_paused(server, probe=1.0), timeout=HANG, interval=0.1,
               what="the CLIENT PAUSE to end")


# -- cannot connect -------------------------------------------------------------------------------

COMMANDS = (("run", "--no-wait", "--", "true"), ("run", "--", "true"),
            ("acquire", "-n", "1", "--for-pid", "1"), ("status", "--json"),
            ("status", "--pool", "--json"), ("queue", "--json"), ("doctor",))


def check_refused(rw, url, shown, hidden=None, commands=COMMANDS):
    for args in commands:
        result = rw.run(*args, env=rw.env(url=url))
        assert_no_crash(result, " ".join(args))
        if args[0] in ("run", "acquire", "doctor"):
            assert result.returncode == EX_UNAVAILABLE, (args, result.returncode, result.stderr)
        else:
            assert result.returncode != 0, (args, result.stdout)
        # doctor prints its checks (the failed one too) on stdout
        said = result.stderr + (result.stdout if args[0] == "doctor" else "")
        assert shown in said, (args, shown, result.stdout, result.stderr)
        if hidden is not None:
            assert hidden not in result.stderr + result.stdout, (args, result.stderr)
    assert local_lock_files(rw) == [], "fell back to local lock files"


def test_wrong_password_exit_69_password_masked(gl, redis_servers):
    password = "right-" + os.urandom(8).hex()
    server = redis_servers(password=password)
    world = RedisWorld(gl, server)
    wrong = "wrong-" + os.urandom(8).hex()
    check_refused(world, server.url(password=wrong), "127.0.0.1:%d" % server.port, hidden=wrong)
    # No password at all for a server that requires one.
    check_refused(world, server.url(), "127.0.0.1:%d" % server.port,
                  commands=COMMANDS[:1] + COMMANDS[-1:])
    # The right one works, and nothing was left behind by the refused attempts.
    result = world.run("run", "--no-wait", "--", "true",
                       env=world.env(url=server.url(password=password)))
    assert result.returncode == 0, result.stderr
    assert [k for k in world.pool_keys() if ":lock:" in k or ":lease:" in k] == []


def test_wrong_port_exit_69_no_fallback(rw):
    port = closed_port()
    check_refused(rw, "redis://127.0.0.1:%d/0" % port, "127.0.0.1:%d" % port)
    # With a password in the URL, the password is masked.
    secret = "s3cr3t-" + os.urandom(8).hex()
    check_refused(rw, "redis://someone:%s@127.0.0.1:%d/0" % (secret, port), str(port),
                  hidden=secret, commands=COMMANDS[:1] + COMMANDS[-1:])


def test_unknown_host_exit_69(rw):
    url = "redis://no-such-host.invalid:6379/0"
    check_refused(rw, url, "no-such-host.invalid", commands=COMMANDS[:1] + COMMANDS[-1:])


# -- a server that accepts connections but never answers --------------------------------------

# Each call to a silent server otherwise waits 5 s: a request that took well under that beyond
# what the same request against a closed port takes (process start and exit, measured just
# before, since under ASan on a loaded machine they alone can take seconds) kept its own deadline.
SILENT_BOUND = 3.5


@pytest.mark.parametrize("waiting", [["--timeout", "1s"], ["--no-wait"]],
                         ids=["timeout", "no-wait"])
def test_a_silent_server_cannot_hold_a_request_past_its_deadline(rw, waiting):
    def timed_run(url):
        started = time.monotonic()
        result = rw.run("run", *waiting, "--", "true", env=rw.env(url=url))
        return result, time.monotonic() - started

    with socket.socket() as silent:  # the kernel completes connections; nobody reads them
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = "redis://127.0.0.1:%d/0" % silent.getsockname()[1]
        beyond = []
        for _ in range(3):  # a load spike rarely repeats; a missed deadline does, every time
            refused, baseline = timed_run("redis://127.0.0.1:%d/0" % closed_port())
            assert refused.returncode == EX_UNAVAILABLE, refused.stderr
            result, took = timed_run(url)
            assert result.returncode == EX_UNAVAILABLE, result.stderr
            assert "no answer in time" in result.stderr, result.stderr
            beyond.append(took - baseline)
            if beyond[-1] < SILENT_BOUND:
                break
    assert beyond[-1] < SILENT_BOUND, "took %s s more than refused: %s" % (
        ["%.1f" % b for b in beyond], result.stderr)


# -- a last look at the pool, at the deadline, that gets no answer --------------------------------

def blocked_in_blpop(server):
    """Whether a client of the server is blocked in BLPOP (a waiter asleep on its wake list)."""
    clients = server.command("CLIENT", "LIST")
    return any("cmd=blpop" in line and "flags=b" in line for line in clients.splitlines())


def test_a_waiter_whose_last_look_at_its_deadline_is_not_answered_timed_out(rw):
    """A waiter's --timeout ends; its last look at the pool, made then, gets no answer in the
    little time left. The server answered all along, and the last answered look left the request
    waiting: it was not served within its timeout (exit 75, saying what the last look met), not
    refused by an unavailable server (69). CI met this under ASan on a loaded machine, where a
    call given the last millisecond of a deadline is not answered in time. Here the server is
    paused (CLIENT PAUSE) once the waiter sleeps in BLPOP (which, blocked before the pause, is
    still answered when its time is up) until well past the deadline; the deadline, 1.5 s, comes
    before the waiter's first heartbeat (2 s), so the last look is the first call that fails."""
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1", env=rw.env(ttl="120s"))  # no lease loss during the pause
    outcomes = []
    for _ in range(3):  # a load spike that delays the pause past the deadline rarely repeats
        # An earlier try's ticket (its leave was sent during the pause, and dropped) is gone once
        # its key has expired and a snapshot (gpulock queue) has seen it so.
        wait_until(lambda: rw.run("queue", "--json").returncode == 0 and
                   rw.server.command("ZCARD", rw.key("queue")) == 0, timeout=HANG,
                   interval=0.5, what="an earlier waiter's ticket to leave")
        waiter = rw.spawn("run", "--timeout", "1.5s", "--", "true")
        wait_until(lambda: blocked_in_blpop(rw.server) or not waiter.alive(), timeout=HANG,
                   interval=0.01, what="the waiter to sleep in the queue")
        rw.server.pause(4_000)  # past the deadline and the last look's 251 ms of BLPOP margin
        status = waiter.wait(timeout=HANG)
        wait_unpaused(rw.server)
        outcomes.append(waiter.describe())
        assert status == EX_TEMPFAIL, outcomes
        if "last look at the pool" in waiter.stderr():
            break
    assert "last look at the pool, at the deadline, failed" in outcomes[-1], outcomes
    assert "no GPU became available within the timeout" in outcomes[-1], outcomes
    assert holder.finish() == 0, holder.bg.describe()


# -- a SIGKILLed holder ---------------------------------------------------------------------------

def test_sigkilled_holder_gpus_return_when_the_ttl_ends(rw):
    uuids = rw.register("node-a", gpus=2)
    holder = rw.hold("--gpus", "0")
    lock = rw.lock_key(uuids[0])
    before = holder.token
    holder.bg.kill_group(signal.SIGKILL)  # gpulock run and its command, at once
    holder.bg.wait()
    killed_at = time.monotonic()

    # The kill released nothing: the lease is still in Redis, for at most one TTL.
    assert rw.server.command("GET", lock) == holder.lease_id
    remaining_ms = rw.server.command("PTTL", lock)
    assert 0 < remaining_ms <= DEFAULT_TTL_SECONDS * 1000, remaining_ms
    # While the key is there, nobody gets the GPU (checked after the attempt: the key was
    # there for the whole attempt).
    attempts = 0
    while True:
        result = rw.run_no_wait("--gpus", "0")
        assert_no_crash(result, "run --no-wait")
        if rw.server.command("GET", lock) != holder.lease_id:
            break
        assert result.returncode == EX_TEMPFAIL, result.stderr
        attempts += 1
        time.sleep(0.05)
        if time.monotonic() - killed_at > HANG:
            raise AssertionError("the dead holder's lock key never expired")
    # Redis expired it (its TTL was at most one lease TTL); the GPU is free at once.
    got = read_env_output(rw.run("run", "--gpus", "0", "--no-wait", "--", "env").stdout)
    assert got.get("GPULOCK_GPUS") == uuids[0], got
    assert int(got["GPULOCK_FENCING_TOKEN"]) > before
    assert rw.server.command("EXISTS", rw.lease_key(holder.lease_id)) == 0
    elapsed = time.monotonic() - killed_at
    print("dead holder's GPU free again %.2fs after SIGKILL (TTL %ss, %d refused attempts)"
          % (elapsed, DEFAULT_TTL_SECONDS, attempts))


# -- Redis restarted or stopped mid-lease ---------------------------------------------------------

def test_restart_empty_mid_lease_holder_recreates_its_lease(rw):
    env = rw.env(ttl="4s")
    uuids = rw.register("node-a", gpus=2)
    holder = rw.hold("--gpus", "0", "--on-lease-loss", "kill", env=env)
    lock = rw.lock_key(uuids[0])
    assert rw.server.command("GET", lock) == holder.lease_id

    rw.server.command("SET", rw.key("sentinel"), "1")
    rw.server.restart()  # SHUTDOWN NOSAVE + start on the same port: every key is lost
    assert rw.server.command("EXISTS", rw.key("sentinel")) == 0
    # The holder's next renewal re-creates its lease (no one else holds the GPU).
    wait_until(lambda: rw.server.command("GET", lock) == holder.lease_id, timeout=HANG,
               interval=0.05, what="the holder to re-create its lock key")
    wait_until(lambda: rw.server.command("EXISTS", rw.lease_key(holder.lease_id)) == 1,
               timeout=HANG, what="the holder to re-create its lease record")
    assert holder.alive(), "lease counted as lost: " + holder.bg.describe()
    entry = rw.gpu_entry(rw.status(env=env), uuids[0])
    assert entry["state"] == "leased" and entry["holder"]["lease_id"] == holder.lease_id
    assert rw.run_no_wait("--gpus", "0", env=env).returncode == EX_TEMPFAIL

    # A lease after the restart gets a larger token than the one before it.
    got = read_env_output(rw.run("run", "--gpus", "1", "--no-wait", "--", "env", env=env).stdout)
    assert int(got["GPULOCK_FENCING_TOKEN"]) > holder.token, (got, holder.token)
    assert holder.alive()
    assert holder.finish() == 0, holder.bg.describe()
    assert rw.server.command("GET", lock) is None


def test_restart_while_another_took_the_gpu_reports_loss(rw):
    """After an empty restart, if someone else leased the GPU before the holder renewed, the
    holder must not steal it back: it reports the loss (kill: the command is stopped)."""
    uuids = rw.register("node-a", gpus=1, ttl="30s")
    # After register(): its processes then have node-a's one GPU, not the default 4.
    env = rw.env(ttl="30s")  # the holder renews only every 10 s: time to take its GPU first
    holder = rw.hold("-n", "1", "--on-lease-loss", "kill", env=env)
    rw.wait_for_command_in_record(holder)
    rw.server.restart()
    intruder = rw.hold("-n", "1", env=env)
    assert intruder.gpus == uuids
    # The holder finds its GPU taken at its next renewal: loss, never a steal.
    status = holder.bg.wait(timeout=HANG)
    assert status == SIGTERM_STATUS, holder.bg.describe()
    assert rw.server.command("GET", rw.lock_key(uuids[0])) == intruder.lease_id
    assert intruder.finish() == 0


def test_redis_stopped_warn_keeps_the_command_running(rw):
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1")  # --on-lease-loss=warn is the default
    rw.server.stop()
    wait_until(lambda: "lost" in holder.bg.stderr() or not holder.alive(), timeout=HANG,
               what="a lease-loss warning")
    assert holder.alive(), holder.bg.describe()
    assert "lost" in holder.bg.stderr()
    rw.server.start()
    assert holder.finish() == 0, holder.bg.describe()


def test_redis_stopped_kill_stops_the_command(rw):
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1", "--on-lease-loss", "kill")
    rw.server.stop()
    assert holder.bg.wait(timeout=HANG) == SIGTERM_STATUS, holder.bg.describe()
    assert "lost" in holder.bg.stderr()


# -- an outage between running a request and answering it -----------------------------------------

def test_a_waiter_whose_entry_ran_but_was_never_answered_waits_out_the_outage(rw):
    """The server runs a waiter's entry into the queue and goes away before answering (it
    died, or restarted). The waiter is in the queue: it must wait out the outage as any waiter
    does, not fail as a request that could not reach the server at all would (exit 69). A proxy
    cuts every connection and stops listening right after the entry ran."""
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1")
    proxy = TcpProxy(rw.server.port)
    try:
        proxy.cut_after(b'"enqueued_at"')  # only a ticket carries it: the entry's request
        served = rw.tmp / "served"
        waiter = rw.spawn("run", "-n", "1", "--", "sh", "-c", 'touch "$1"', "waiter", served,
                          env=rw.env(url=proxy.url()))
        wait_until(lambda: proxy.cut.is_set() or not waiter.alive(), timeout=HANG,
                   what="the entry to run and be cut off")
        assert proxy.cut.is_set(), waiter.describe()
        assert rw.server.command("ZCARD", rw.key("queue")) == 1, "the entry did not run"
        # The waiter finds the server gone: it must say it keeps waiting, and keep waiting.
        wait_until(lambda: "still waiting" in waiter.stderr() or not waiter.alive(),
                   timeout=HANG, what="the waiter to meet the outage")
        assert waiter.alive(), waiter.describe()
        proxy.resume()
        assert holder.finish() == 0, holder.bg.describe()
        assert waiter.wait() == 0, waiter.describe()
        assert served.exists(), waiter.describe()
        assert "answers again" in waiter.stderr(), waiter.describe()
    finally:
        proxy.close()


@pytest.mark.parametrize("request_args", [("-n", "1"), ("--mem", "10G")],
                         ids=["whole-gpu", "shared"])
def test_an_acquire_whose_answer_was_lost_in_an_outage_is_taken_when_the_server_answers(
        rw, request_args):
    """The server runs an acquire (the GPU is free: the request never waits) and goes away
    before answering, for longer than the client's one immediate retry. The request must wait
    out the outage and then take the lease its acquire made, with that acquire's token. Before,
    it failed at once with exit 69, and the lease it had made locked the GPU (or its memory),
    held by nobody, until its TTL ended."""
    rw.register("node-a", gpus=1)
    assert rw.run_no_wait("-n", "1").returncode == 0  # the pool's first token is set
    token_before = int(rw.server.command("GET", rw.key("token")))
    proxy = TcpProxy(rw.server.port)
    try:
        proxy.cut_after(b"lost-acquire")  # in the acquire's holder record: its request alone
        report = rw.tmp / "lease"
        # A TTL far longer than the test: the lease the acquire made outlives the outage.
        job = rw.spawn("run", *request_args, "--label", "lost-acquire", "--", "sh", "-c",
                       'echo "$GPULOCK_LEASE_ID $GPULOCK_FENCING_TOKEN" > "$1"', "job", report,
                       env=rw.env(url=proxy.url(), ttl="120s"))
        wait_until(lambda: proxy.cut.is_set() or not job.alive(), timeout=HANG,
                   what="the acquire to run and be cut off")
        assert proxy.cut.is_set(), job.describe()
        made = int(rw.server.command("GET", rw.key("token")))
        assert made > token_before, "the acquire did not run"
        wait_until(lambda: "still waiting" in job.stderr() or not job.alive(), timeout=HANG,
                   what="the request to meet the outage")
        assert job.alive(), job.describe()
        proxy.resume()
        assert job.wait() == 0, job.describe()
        lease_id, token = report.read_text().split()
        # The lease is the one the lost acquire made: no other acquire ran.
        assert int(token) == made, job.describe()
        assert int(rw.server.command("GET", rw.key("token"))) == made
        # Its release found its own lease: nothing is left locked.
        assert rw.server.command("EXISTS", rw.key("lease:" + lease_id)) == 0
        assert not [k for k in rw.pool_keys() if ":lock:" in k or ":lease:" in k]
    finally:
        proxy.close()


@pytest.mark.parametrize("request_args", [("-n", "1"), ("--mem", "10G")],
                         ids=["whole-gpu", "shared"])
def test_an_acquire_cut_off_before_it_ran_is_planned_again_when_the_server_answers(
        rw, request_args):
    """The other side of the test above: the server went away just before the acquire reached
    it. When it answers again, the acquire sent again finds no lease of its own and is refused
    (the whole-GPU one carries a version no pool has; the shared one offers no room), and the
    request plans again and takes the GPU with a new acquire."""
    rw.register("node-a", gpus=1)
    assert rw.run_no_wait("-n", "1").returncode == 0  # the pool's first token is set
    token_before = int(rw.server.command("GET", rw.key("token")))
    proxy = TcpProxy(rw.server.port)
    try:
        proxy.cut_before(b"unsent-acquire")
        report = rw.tmp / "lease"
        job = rw.spawn("run", *request_args, "--label", "unsent-acquire", "--", "sh", "-c",
                       'echo "$GPULOCK_LEASE_ID $GPULOCK_FENCING_TOKEN" > "$1"', "job", report,
                       env=rw.env(url=proxy.url(), ttl="120s"))
        wait_until(lambda: "still waiting" in job.stderr() or not job.alive(), timeout=HANG,
                   what="the request to meet the outage")
        assert proxy.cut.is_set() and job.alive(), job.describe()
        assert int(rw.server.command("GET", rw.key("token"))) == token_before, "it ran"
        proxy.resume()
        assert job.wait() == 0, job.describe()
        lease_id, token = report.read_text().split()
        assert int(token) > token_before, job.describe()
        assert int(rw.server.command("GET", rw.key("token"))) == int(token)
        assert rw.server.command("EXISTS", rw.key("lease:" + lease_id)) == 0
        assert not [k for k in rw.pool_keys() if ":lock:" in k or ":lease:" in k]
    finally:
        proxy.close()


def test_a_shared_request_waiting_for_memory_waits_out_an_outage(rw):
    """A shared request waits (the GPU is held whole) when it loses Redis: it must keep waiting
    and be served once Redis answers again and the holder ends, as a whole-GPU request is.
    Before, it failed with exit 69 as soon as the server stopped answering. The waiter reaches
    Redis through a proxy, so that the holder keeps its lease through the waiter's outage."""
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1", env=rw.env(ttl="120s"))
    proxy = TcpProxy(rw.server.port)
    try:
        served = rw.tmp / "served"
        waiter = rw.spawn("run", "--mem", "10G", "--", "sh", "-c", 'touch "$1"', "waiter",
                          served, env=rw.env(url=proxy.url()))
        wait_until(lambda: "waiting for" in waiter.stderr() or not waiter.alive(),
                   timeout=HANG, what="the shared request to wait")
        assert waiter.alive(), waiter.describe()
        proxy.cut_now()
        wait_until(lambda: "still waiting" in waiter.stderr() or not waiter.alive(),
                   timeout=HANG, what="the shared request to meet the outage")
        assert waiter.alive(), waiter.describe()
        proxy.resume()
        wait_until(lambda: "answers again" in waiter.stderr() or not waiter.alive(),
                   timeout=HANG, what="the shared request to reach Redis again")
        assert waiter.alive() and not served.exists(), waiter.describe()  # the GPU is held
        assert holder.finish() == 0, holder.bg.describe()
        assert waiter.wait() == 0, waiter.describe()
        assert served.exists(), waiter.describe()
    finally:
        proxy.close()


def test_an_acquire_sent_again_after_its_answer_was_lost_is_answered_as_the_first_time(rw):
    """The server runs an acquire and drops the connection before answering; the client's
    connection connects again and sends it again. The acquire must be answered as its first
    run was (the same lease and token), not refused as busy with the GPU locked by its own first
    run until that lease's TTL ends (a --no-wait request then failed, exit 75)."""
    rw.register("node-a", gpus=1)
    assert rw.run_no_wait("-n", "1").returncode == 0  # the pool's first token is set
    token_before = int(rw.server.command("GET", rw.key("token")))
    proxy = TcpProxy(rw.server.port)
    try:
        # The label is in the acquire's holder record: with the GPU free, it is the first
        # request that carries it.
        proxy.cut_after(b"resent-acquire", only_that_connection=True)
        report = rw.tmp / "lease"
        result = rw.run("run", "-n", "1", "--no-wait", "--label", "resent-acquire", "--", "sh",
                        "-c", 'echo "$GPULOCK_LEASE_ID $GPULOCK_FENCING_TOKEN" > "$1"', "job",
                        report, env=rw.env(url=proxy.url()))
        assert proxy.cut.is_set(), "the acquire was not cut: " + result.stderr
        assert result.returncode == 0, result.stderr
        lease_id, token = report.read_text().split()
        # The run's token is the last one given: no other acquire ran after the first.
        assert int(rw.server.command("GET", rw.key("token"))) == int(token) > token_before
        # Its release found its own lease: nothing is left locked.
        assert rw.server.command("EXISTS", rw.key("lease:" + lease_id)) == 0
        assert rw.pool_keys() and not [k for k in rw.pool_keys() if ":lock:" in k]
    finally:
        proxy.close()


# -- CLIENT PAUSE past the TTL --------------------------------------------------------------------

PAUSE_MS = 8_000  # 4 TTLs: the loss must be seen while the server is still paused


def test_client_pause_past_ttl_kill(rw):
    uuids = rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1", "--on-lease-loss", "kill")
    rw.server.pause(PAUSE_MS)
    wait_until(lambda: not holder.command_alive(), timeout=HANG, interval=0.05,
               what="the command to be stopped")
    # Stopped because of the pause (Redis still paused), not after it.
    assert server_paused(rw.server), "the command was stopped only after the pause ended"
    assert holder.bg.wait(timeout=HANG) == SIGTERM_STATUS, holder.bg.describe()
    assert "lost" in holder.bg.stderr(), holder.bg.stderr()
    wait_unpaused(rw.server)
    # The lost lease's keys are gone (released or expired): the GPU can be leased again.
    wait_until(lambda: rw.run_no_wait().returncode == 0, timeout=HANG, interval=0.2,
               what="the GPU to be free after the lost lease")
    assert rw.server.command("GET", rw.lock_key(uuids[0])) is None


def test_client_pause_past_ttl_warn(rw):
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1")
    rw.server.pause(PAUSE_MS)
    wait_until(lambda: "lost" in holder.bg.stderr() or not holder.alive(), timeout=HANG,
               what="a lease-loss warning")
    assert server_paused(rw.server), "the loss was seen only after the pause ended"
    assert holder.alive(), holder.bg.describe()
    wait_unpaused(rw.server)
    assert holder.alive()
    assert holder.finish() == 0, holder.bg.describe()


# -- the holder itself paused (SIGSTOP) past the TTL ---------------------------------------------

def stopped_past_the_ttl_while_another_lease_used_the_gpu(rw, holder, uuid, stop_command):
    """SIGSTOPs `gpulock run` (and its command, if asked) until its lock key has expired and
    another lease has held the GPU and ended, then continues them (the command first)."""
    targets = [holder.pid] + ([holder.command_pid] if stop_command else [])
    for pid in targets:
        os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: rw.server.command("GET", rw.lock_key(uuid)) is None, timeout=HANG,
               interval=0.05, what="the paused holder's lock key to expire")
    other = rw.run_no_wait("-n", "1")
    assert other.returncode == 0, "the GPU was not free once the key expired: %r" % (other,)
    for pid in reversed(targets):
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("stop_command", [True, False], ids=["with-command", "alone"])
def test_run_stopped_past_ttl_kill_stops_the_command_when_it_continues(rw, stop_command):
    # The lease was lost the moment its TTL passed, however the renewal that follows the pause
    # ends (here the script finds the GPU free again and would restore the lease): `gpulock run`
    # applies --on-lease-loss=kill as soon as it runs again.
    uuids = rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1", "--on-lease-loss", "kill")
    stopped_past_the_ttl_while_another_lease_used_the_gpu(rw, holder, uuids[0], stop_command)
    assert holder.bg.wait(timeout=HANG) == SIGTERM_STATUS, holder.bg.describe()
    assert "lost" in holder.bg.stderr(), holder.bg.stderr()
    # Its keys are not left behind, restored: the GPU can be leased again.
    assert rw.run_no_wait("-n", "1").returncode == 0


def test_a_c_api_holder_stopped_past_its_ttl_knows_at_once_that_its_lease_is_lost(rw):
    # The C API's equivalent of the Python package's test: SIGSTOP until Redis has dropped the
    # lease's key and another lease has used the GPU, then SIGCONT with the question already
    # waiting on stdin. The first answer, given before the lease's renewal thread need have
    # run, must be "lost" (by the lease's own clock); gpulock_lease_verify() then says
    # GPULOCK_NOT_FOUND. Several times over, to catch the race.
    build = os.environ.get("GPULOCK_BUILD_DIR", "")
    program = os.path.join(build, "tests", "capi_paused_holder")
    if not os.access(program, os.X_OK):
        pytest.fail("no %s: build the capi_paused_holder target" % program)
    uuids = rw.register("node-a", gpus=1)
    for attempt in range(3):
        holder = subprocess.Popen([program], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True,
                                  env=rw.env(host="node-a"))
        try:
            first = holder.stdout.readline().split()
            assert first == ["held", uuids[0]], first
            os.kill(holder.pid, signal.SIGSTOP)
            wait_until(lambda: rw.server.command("GET", rw.lock_key(uuids[0])) is None,
                       timeout=HANG, interval=0.05, what="the stopped holder's lock to expire")
            other = rw.run_no_wait("-n", "1")
            assert other.returncode == 0, "the GPU was not free: %r" % (other,)
            holder.stdin.write("check\nverify\n")
            holder.stdin.flush()
            os.kill(holder.pid, signal.SIGCONT)
            assert holder.stdout.readline().strip() == "lost", "attempt %d" % attempt
            assert holder.stdout.readline().strip() == "verify 5", "attempt %d" % attempt
        finally:
            holder.kill()
            holder.wait()


def test_short_pause_does_not_lose_the_lease(rw):
    uuids = rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1", "--on-lease-loss", "kill")
    rw.server.pause(int(DEFAULT_TTL_SECONDS * 1000 / 4))
    wait_unpaused(rw.server)
    # Two renewal periods after the pause the lease is still there and still renewed.
    lock = rw.lock_key(uuids[0])
    for _ in range(2):
        rw.wait_renewal(lock, holder)
    assert holder.alive(), holder.bg.describe()
    assert rw.server.command("GET", lock) == holder.lease_id
    assert holder.finish() == 0


# -- garbage in the pool's keys -------------------------------------------------------------------

def never_granted(rw, uuid, count, host="node-a"):
    """Neither a named request nor a count request taking every GPU gets `uuid`; no crash."""
    result = rw.run_no_wait("--gpus", uuid, host=host)
    assert_no_crash(result, "run --gpus <garbage GPU>")
    assert result.returncode != 0, "granted a GPU whose key holds garbage"
    result = rw.run_no_wait("-n", str(count), host=host)
    assert_no_crash(result, "run -n all")
    assert result.returncode != 0, "granted a GPU whose key holds garbage"


def views_do_not_crash(rw, host="node-a"):
    for args in (("status", "--json"), ("status", "--pool", "--json"), ("status",),
                 ("queue", "--json"), ("doctor",)):
        result = rw.run(*args, host=host)
        assert_no_crash(result, " ".join(args))
    return rw.run("status", "--json", host=host)


def test_garbage_lock_value_is_never_free(rw):
    uuids = rw.register("node-a", gpus=2)
    lock = rw.lock_key(uuids[0])
    garbage = b"not a lease \x00\xff\xfe" + b"x" * 300
    rw.server.command("SET", lock, garbage)
    never_granted(rw, uuids[0], 2)
    result = views_do_not_crash(rw)
    if result.returncode == 0:
        assert rw.gpu_entry(json.loads(result.stdout), uuids[0])["state"] != "free"
    # The other GPU is still usable, once.
    holder = rw.hold("-n", "1")
    assert holder.gpus == [uuids[1]]
    assert rw.run_no_wait("-n", "1").returncode == EX_TEMPFAIL
    assert rw.server.command("GET", lock, raw=True) == garbage, "someone overwrote the key"
    assert holder.finish() == 0


def test_garbage_wrong_type_lock_key(rw):
    uuids = rw.register("node-a", gpus=2)
    rw.server.command("HSET", rw.lock_key(uuids[0]), "lease", "0123456789abcdef")
    rw.server.command("SADD", rw.lock_key(uuids[1]), "0123456789abcdef")
    never_granted(rw, uuids[0], 1)
    never_granted(rw, uuids[1], 1)
    views_do_not_crash(rw)
    assert rw.server.command("TYPE", rw.lock_key(uuids[0])) == "hash"
    assert rw.server.command("TYPE", rw.lock_key(uuids[1])) == "set"


def test_garbage_lease_record(rw):
    uuids = rw.register("node-a", gpus=2)
    holder = rw.hold("--gpus", "0")
    record = rw.lease_key(holder.lease_id)
    for damage in (("SET", record, "{not json \x00"),
                   ("HSET", record, "record", '{"user": 5, "gpus": [[[', "user", "\x00\x01" * 50,
                    "gpus", "[[[", "token", "abc", "started_at", "yesterday", "pid", "-7",
                    "host", ""),
                   ("HSET", record, "record", "[]", "token", "-1")):
        rw.server.command("DEL", record)
        rw.server.command(*damage)
        result = views_do_not_crash(rw)
        if result.returncode == 0:
            assert rw.gpu_entry(json.loads(result.stdout), uuids[0])["state"] != "free"
        result = rw.run_no_wait("--gpus", "0")
        assert_no_crash(result, "run --gpus 0")
        assert result.returncode != 0, "granted a leased GPU whose record is garbage"
        assert rw.server.command("GET", rw.lock_key(uuids[0])) == holder.lease_id
    assert holder.finish() == 0, holder.bg.describe()
    wait_until(lambda: rw.run_no_wait("--gpus", "0").returncode == 0, timeout=HANG,
               interval=0.2, what="GPU 0 to be free after its holder ended")


def lease_token(rw):
    """Runs a one-GPU lease to its end; its GPULOCK_FENCING_TOKEN, exactly (an int)."""
    result = rw.run("run", "-n", "1", "--no-wait", "--", "env")
    assert_no_crash(result, "run -- env")
    assert result.returncode == 0, result.stderr
    text = read_env_output(result.stdout)["GPULOCK_FENCING_TOKEN"]
    assert re.fullmatch(r"[1-9][0-9]*", text), text
    return int(text)


@pytest.mark.parametrize("start", [2 ** 53, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 64 - 2])
def test_tokens_are_exact_over_the_whole_64_bit_range(rw, start):
    # The acquire script counted with Lua numbers (doubles): from 2^53 on, two leases could get
    # the same token, and 2^63 - 1 gave 9223372036854775808 twice.
    rw.register("node-a", gpus=1)
    rw.server.command("SET", rw.key("token"), str(start))
    last = lease_token(rw)
    assert last == start + 1
    if last < 2 ** 64 - 1:
        last = lease_token(rw)
        assert last == start + 2
    doctor = rw.run("doctor")
    if last < 2 ** 64 - 1:
        assert re.search(rf"ok\s+fencing tokens: the last one given out is {last}\n",
                         doctor.stdout), doctor.stdout
    else:
        assert re.search(r"failed\s+fencing tokens: .*largest 64-bit token", doctor.stdout), \
            doctor.stdout


@pytest.mark.parametrize("damage", [("SET", "99999999999999999999"),
                                    ("SET", "18446744073709551616"), ("SET", "not-a-number"),
                                    ("SET", "-1"), ("RPUSH", "a-list"), ("HSET", "a", "hash")])
def test_a_damaged_token_key_is_recovered_from_without_a_token_twice(rw, damage):
    # Such a key made every acquire fail with "internal error: stoull" (exit 70) and left the
    # GPU's lock key written until its TTL ended; one that is not a count let tokens start again
    # from the server's time, below tokens already given out.
    uuids = rw.register("node-a", gpus=1)
    rw.server.command("SET", rw.key("token"), str(2 ** 62))  # far above the server's time
    issued = lease_token(rw)
    assert issued == 2 ** 62 + 1
    rw.server.command("DEL", rw.key("token"))
    rw.server.command(damage[0], rw.key("token"), *damage[1:])
    doctor = rw.run("doctor")
    assert doctor.returncode != 0, doctor.stdout
    assert re.search(r"failed\s+fencing tokens: .*token holds", doctor.stdout), doctor.stdout
    assert lease_token(rw) == issued + 1
    assert rw.server.command("GET", rw.lock_key(uuids[0])) is None, "a lock key was left behind"
    # The acquire repaired the key.
    assert rw.server.command("GET", rw.key("token")) == str(issued + 1)
    assert rw.run("doctor").returncode == 0


def test_no_token_after_the_last_64_bit_one(rw):
    uuids = rw.register("node-a", gpus=1)
    rw.server.command("SET", rw.key("token"), str(2 ** 64 - 1))
    for args in (("--no-wait",), ("--timeout", "2s")):
        result = rw.run("run", "-n", "1", *args, "--", "true")
        assert result.returncode == EX_UNAVAILABLE, result.stderr
        assert "fencing-token counter" in result.stderr and "internal error" not in \
            result.stderr, result.stderr
        assert rw.server.command("GET", rw.lock_key(uuids[0])) is None, \
            "a lock key was left behind"
    doctor = rw.run("doctor")
    assert doctor.returncode != 0, doctor.stdout
    assert re.search(r"failed\s+fencing tokens: .*largest 64-bit token", doctor.stdout), \
        doctor.stdout


def test_doctor_reports_a_garbage_token_key(rw):
    rw.register("node-a", gpus=1)
    for value, words in (("not-a-number", "not a count"), (str(2 ** 64), "not a count")):
        rw.server.command("SET", rw.key("token"), value)
        doctor = rw.run("doctor")
        assert doctor.returncode != 0, doctor.stdout
        assert words in doctor.stdout, doctor.stdout
    rw.server.command("DEL", rw.key("token"))
    rw.server.command("RPUSH", rw.key("token"), "a-list")
    doctor = rw.run("doctor")
    assert "wrong type" in doctor.stdout, doctor.stdout
    rw.server.command("DEL", rw.key("token"))
    rw.server.command("SET", rw.key("token"), str(2 ** 53))  # counted exactly now
    doctor = rw.run("doctor")
    assert re.search(r"ok\s+fencing tokens", doctor.stdout), doctor.stdout


def test_garbage_in_token_and_registry_keys(rw):
    uuids = rw.register("node-a", gpus=2)
    rw.register("node-b", gpus=2)
    rw.server.command("SET", rw.key("token"), "not-a-number")
    result = rw.run("run", "-n", "1", "--no-wait", "--", "env")
    assert_no_crash(result, "run with a garbage token")
    if result.returncode == 0:
        assert re.fullmatch(r"[0-9]+", read_env_output(result.stdout)["GPULOCK_FENCING_TOKEN"])
    else:
        assert result.returncode == EX_UNAVAILABLE, result.stderr
    rw.server.command("DEL", rw.key("token"))

    for name, kind in (("hosts", "string"), ("queue", "string"), ("gpus:node-b", "string"),
                       ("gpu:" + uuids[0], "list"), ("host:node-b", "string")):
        key = rw.key(name)
        rw.server.command("DEL", key)
        if kind == "string":
            rw.server.command("SET", key, b"\xff\x00garbage")
        else:
            rw.server.command("RPUSH", key, "garbage")
    rw.server.command("SET", rw.key("zzz-unknown"), b"\x00\xff")
    rw.server.command("SET", rw.key("lease:not-hex"), "x")
    rw.server.command("SET", rw.key("ticket:0000000000000000"), "x")
    for host in ("node-a", "node-b"):
        views_do_not_crash(rw, host=host)
        for args in (("run", "--no-wait", "--", "true"),
                     ("run", "--host", "any", "--no-wait", "--", "true"),
                     ("run", "--timeout", "1s", "--", "true")):
            result = rw.run(*args, host=host)
            assert_no_crash(result, " ".join(args))


def test_3_a_waiter_says_redis_answers_again_only_once_it_has_answered(rw):
    """Issue 41, defect 3: in an outage a waiter said `Redis at … answers again` while the
    server was dead. Here, during the outage, something accepts connections on the server's
    port and never answers (a server paused or shutting down): a connection is made, but no
    reply comes, and the waiter must keep saying nothing until a real server answers."""
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1")
    proxy = TcpProxy(rw.server.port)
    silent = None
    try:
        waiter = rw.spawn("run", "-n", "1", "--", "true", env=rw.env(url=proxy.url()))
        wait_until(lambda: rw.server.command("ZCARD", rw.key("queue")) == 1, timeout=HANG,
                   what="the waiter to queue")
        proxy.cut_now()
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", proxy.port))
        silent.listen(64)  # the kernel completes connections; nobody reads them
        wait_until(lambda: "still waiting" in waiter.stderr() or not waiter.alive(),
                   timeout=HANG, what="the waiter to meet the outage")
        time.sleep(4)  # several retries against the silent listener
        assert waiter.alive(), waiter.describe()
        assert "answers again" not in waiter.stderr(), waiter.describe()
        silent.close()
        silent = None
        proxy.resume()
        assert holder.finish() == 0, holder.bg.describe()
        assert waiter.wait() == 0, waiter.describe()
        assert waiter.stderr().count("answers again") == 1, waiter.describe()
    finally:
        if silent is not None:
            silent.close()
        proxy.close()
