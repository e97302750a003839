"""The Redis test harness itself (tests/support/redis_server.py), without gpulock: a real
redis-server on a free loopback port, restarts on the same port, passwords and ACL users,
CLIENT PAUSE, and no process left behind. Fails (never skips) when redis-server is missing."""

import os
import socket
import time

import pytest

from conftest import HANG
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import RedisServer, new_server  # noqa: E402
from redis_server import RedisError, RespConnection  # noqa: E402

# The fixtures redis_server, redis_servers and rw.
pytest_plugins = ["conftest_redis"]


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_server_answers_and_restarts_empty_on_the_same_port(redis_server):
    port = redis_server.port
    assert redis_server.url() == "redis://127.0.0.1:%d/0" % port
    assert redis_server.command("PING") == "PONG"
    assert redis_server.command("SET", "gpulock:{p}:k", b"\x00\xff") == "OK"
    assert redis_server.command("GET", "gpulock:{p}:k", raw=True) == b"\x00\xff"
    assert redis_server.command("CONFIG", "GET", "save") == ["save", ""]
    assert redis_server.command("CONFIG", "GET", "appendonly") == ["appendonly", "no"]
    assert redis_server.command("CONFIG", "GET", "bind")[1] == "127.0.0.1"
    with pytest.raises(RedisError):
        redis_server.command("HGET", "gpulock:{p}:k", "field")  # WRONGTYPE
    pid = redis_server.proc.pid
    redis_server.stop()
    assert not alive(pid) and not redis_server.running()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    redis_server.start()
    assert redis_server.port == port and redis_server.command("KEYS", "*") == []
    pid = redis_server.proc.pid
    redis_server.kill()
    assert not alive(pid)


def test_password_and_acl_users(redis_servers):
    server = redis_servers(password="adm", acl_user=("alice", "apw"),
                           extra_users=[("bob", "bpw", ["~other:*", "+@all"])])
    assert server.url(password="adm", db=3) == "redis://:adm@127.0.0.1:%d/3" % server.port
    assert server.url(user="alice", password="apw") == \
        "redis://alice:apw@127.0.0.1:%d/0" % server.port
    for _ in range(2):  # users survive a restart
        conn = RespConnection(server.port)
        with pytest.raises(RedisError):
            conn.command("SET", "x", "1")  # NOAUTH
        assert conn.command("AUTH", "alice", "apw") == "OK"
        assert conn.command("SET", "gpulock:{p}:x", "1") == "OK"
        with pytest.raises(RedisError):
            conn.command("SET", "other:x", "1")  # NOPERM
        conn.close()
        conn = RespConnection(server.port)
        assert conn.command("AUTH", "bob", "bpw") == "OK"
        with pytest.raises(RedisError):
            conn.command("GET", "gpulock:{p}:x")
        with pytest.raises(RedisError):
            conn.command("AUTH", "alice", "wrong")
        conn.close()
        server.restart()


def test_pause_blocks_every_client_until_it_ends(redis_server):
    started = time.monotonic()  # before the pause: a stall of this process cannot shorten it
    redis_server.pause(600)
    assert redis_server.command("PING") == "PONG"
    assert time.monotonic() - started > 0.5  # the pause lasted 600 ms


def test_no_process_left_behind():
    with new_server() as server:
        pid = server.proc.pid
        server.pause(HANG * 1000)  # even a paused server is stopped at exit
    assert not alive(pid)
    server = RedisServer(start=False)
    try:
        assert server.proc is None
        server.start()
        assert alive(server.proc.pid)
    finally:
        server.close()
    assert not os.path.exists(server.dir)
