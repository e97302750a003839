"""The Python package on the Redis backend (GPULOCK_BACKEND=redis://...): the same API as on
lock files, plus the lease's fencing token, host and loss, against a real redis-server that each
test starts on a free loopback port (tests/support/redis_server.py).

What Redis holds is checked independently with raw RESP commands (GET of the lock keys), and
exclusion with the real `gpulock` binary, never by asking the package under test.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import gpulock
from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, wait_until
from redis_server import RedisMissing, RedisServer, closed_port


@pytest.fixture
def redis(monkeypatch):
    """A redis-server, and this test's process pointed at it as fake host 'py-a' with a pool of
    its own and a 2 s lease TTL."""
    try:
        server = RedisServer()
    except RedisMissing as e:
        pytest.fail(str(e))  # CI installs redis-server: never skip
    try:
        monkeypatch.setenv("GPULOCK_BACKEND", server.url())
        monkeypatch.setenv("GPULOCK_POOL", "pytest")
        monkeypatch.setenv("GPULOCK_HOST", "py-a")
        monkeypatch.setenv("GPULOCK_LEASE_TTL", "2s")
        yield server
    finally:
        server.close()


def lock_holder(server, uuid):
    """The lease id Redis says holds a GPU, or None (read without the package under test)."""
    return server.command("GET", "gpulock:{pytest}:lock:" + uuid)


def test_a_lease_lives_in_redis_with_a_token_and_a_host(redis):
    with gpulock.lease() as lease:
        assert lease.fencing_token > 0
        assert lease.host == "py-a"
        assert lock_holder(redis, lease.gpus[0]) == lease.id
        env = lease.environment
        assert env["GPULOCK_FENCING_TOKEN"] == str(lease.fencing_token)
        assert env["GPULOCK_LEASE_HOST"] == "py-a"
        assert not lease.lost
    assert lock_holder(redis, lease.gpus[0]) is None  # released: the key is gone


def test_fencing_tokens_increase_across_leases(redis):
    tokens = []
    for _ in range(5):
        with gpulock.lease(count=2) as lease:
            tokens.append(lease.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_a_python_lease_excludes_the_cli_and_the_reverse(gl, redis):
    with gpulock.lease(count=4):  # all four simulated GPUs of py-a
        busy = gl.cli("run", "--no-wait", "--", "true")
        assert busy.returncode == EX_TEMPFAIL, busy.stderr
    free = gl.cli("run", "--no-wait", "--", "true")
    assert free.returncode == 0, free.stderr

    holder, lease_id, uuids = gl.hold("-n", "4")
    try:
        with pytest.raises(gpulock.Unavailable):
            gpulock.lease(wait=False)
    finally:
        holder.kill()


def test_another_hosts_gpu_is_a_reservation_there(gl, redis):
    # Host py-b registers its GPUs by running gpulock there; then py-a takes one of them.
    registered = gl.cli("status", env=gl.env(GPULOCK_HOST="py-b"))
    assert registered.returncode == 0, registered.stderr
    with gpulock.lease(count=4):  # py-a's own GPUs are all taken
        with gpulock.lease(host="any", wait=False) as remote:
            assert remote.host == "py-b"
            assert lock_holder(redis, remote.gpus[0]) == remote.id
        with gpulock.lease(host=["py-b"], wait=False) as named:
            assert named.host == "py-b"


def test_verify_returns_the_token_and_finds_a_taken_gpu_at_once(redis, monkeypatch):
    monkeypatch.setenv("GPULOCK_LEASE_TTL", "60s")  # no renewal asks before verify() does
    with gpulock.lease(count=2) as lease:
        assert lease.verify() == lease.fencing_token
        other = "0123456789abcdef"
        redis.command("SET", "gpulock:{pytest}:lock:" + lease.gpus[1], other)
        assert not lease.lost  # nothing has asked yet
        with pytest.raises(gpulock.NotFound, match=other):
            lease.verify()
        assert lease.lost
    with gpulock.lease() as local_view:
        local_view.release()
        with pytest.raises(gpulock.InvalidRequest):
            local_view.verify()


def test_a_lease_not_renewed_for_its_ttl_is_reported_lost(redis):
    lease = gpulock.lease()
    try:
        redis.pause(4000)  # longer than the 2 s TTL: no renewal can get through
        wait_until(lambda: lease.lost, timeout=30, what="the lease to count as lost")
    finally:
        lease.release()


# A holder process: takes a lease, says "held", then answers each line on stdin with its
# lease's `lost`, at once.
PAUSED_HOLDER = textwrap.dedent("""
    import sys
    import gpulock
    with gpulock.lease() as lease:
        print("held", lease.gpus[0], flush=True)
        for line in sys.stdin:
            print("lost" if lease.lost else "held", flush=True)
""")


def test_a_holder_stopped_past_its_ttl_knows_at_once_that_its_lease_is_lost(redis):
    # SIGSTOP until Redis has dropped the lease's key, then SIGCONT with the question already
    # waiting on stdin: the first answer, given before the lease's renewal thread need have run,
    # must be "lost" (by the lease's own clock), several times over to catch the race.
    for attempt in range(3):
        holder = subprocess.Popen([sys.executable, "-c", PAUSED_HOLDER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        try:
            first = holder.stdout.readline().split()
            assert first[:1] == ["held"], first
            holder.send_signal(signal.SIGSTOP)
            wait_until(lambda: lock_holder(redis, first[1]) is None, timeout=30,
                       what="the stopped holder's lock key to expire")
            holder.stdin.write("check\n")
            holder.stdin.flush()
            holder.send_signal(signal.SIGCONT)
            assert holder.stdout.readline().strip() == "lost", "attempt %d" % attempt
        finally:
            holder.kill()
            holder.wait()


def test_unreachable_redis_is_a_setup_error_without_the_password(monkeypatch, redis):
    monkeypatch.setenv("GPULOCK_BACKEND",
                       "redis://alice:hunter2@127.0.0.1:%d/0" % closed_port())
    with pytest.raises(gpulock.SetupError) as caught:
        gpulock.lease()
    assert caught.value.exit_status == EX_UNAVAILABLE
    assert "hunter2" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


def test_a_wrong_password_is_refused(monkeypatch):
    try:
        server = RedisServer(password="right")
    except RedisMissing as e:
        pytest.fail(str(e))
    try:
        monkeypatch.setenv("GPULOCK_BACKEND", server.url(password="wrong"))
        monkeypatch.setenv("GPULOCK_POOL", "pytest")
        with pytest.raises(gpulock.SetupError) as caught:
            gpulock.lease()
        assert "wrong" not in str(caught.value)
        monkeypatch.setenv("GPULOCK_BACKEND", server.url(password="right"))
        with gpulock.lease() as lease:
            assert lease.fencing_token > 0
    finally:
        server.close()


def test_a_forked_child_leaves_the_lease_to_its_parent(redis):
    lease = gpulock.lease()
    try:
        pid = os.fork()
        if pid == 0:
            # The child's copy of the lease has no renewal thread: dropping it must neither end
            # the parent's lease nor hang waiting for a thread that does not exist here.
            code = 1
            try:
                lease.release()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert lock_holder(redis, lease.gpus[0]) == lease.id
        assert not lease.lost
    finally:
        lease.release()
    assert lock_holder(redis, lease.gpus[0]) is None


def test_a_shared_lease_is_a_reservation_in_redis(gl, redis):
    gib = 1 << 30
    with gpulock.lease(mem="50G", gpus="0") as lease:
        assert lease.memory_bytes == 50 * gib
        assert lease.fencing_token > 0
        assert os.environ["GPULOCK_MEMORY_LIMIT_BYTES"] == str(50 * gib)
        uuid = lease.gpus[0]
        assert lock_holder(redis, uuid) == "=shared"
        assert redis.command("ZSCORE", "gpulock:{pytest}:shares:" + uuid, lease.id) is not None
        # Checked with the real binary: 30 GiB are left, and the whole GPU is not free.
        left = gl.cli("run", "--gpus", "0", "--mem", "31G", "--no-wait", "--", "true")
        assert left.returncode == EX_TEMPFAIL, left.stderr
        fits = gl.cli("run", "--gpus", "0", "--mem", "30G", "--no-wait", "--", "true")
        assert fits.returncode == 0, fits.stderr
        whole = gl.cli("run", "--gpus", "0", "--no-wait", "--", "true")
        assert whole.returncode == EX_TEMPFAIL, whole.stderr
    assert lock_holder(redis, uuid) is None
