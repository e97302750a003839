"""The lease counters of `gpulock metrics` and of `gpulock serve`'s /metrics (issue 16):
gpulock_leases_started_total{user} and gpulock_leases_ended_total{user,how}, from the usage
journal. The test counts what it ran itself (jobs that ended normally, a job SIGKILLed whole)
and checks the counters against that, parsed with prometheus_client's text parser. serve keeps
its counts from what the journal gained since its last reading: rotated files must not be
counted twice, and an end written after serve inferred it must not count again. On Redis, a
lease whose lock was taken from it counts as "lost"."""

import http.client
import os
import pwd
import re
import signal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulock_testing import HANG, wait_until
pytest.register_assert_rewrite("conftest_redis")
from conftest_redis import RedisWorld  # noqa: E402,F401

pytest_plugins = ["conftest_redis"]

ME = pwd.getpwuid(os.geteuid()).pw_name
COUNTERS = ("gpulock_leases_started_total", "gpulock_leases_ended_total")


def parse(text):
    """({(sample name, frozenset(labels)): value}, {family name: type})."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return values, types


def counts(values, user=ME):
    """(started, {how: ended}) of one user; 0 where a sample is absent."""
    started = values.get(("gpulock_leases_started_total", frozenset({("user", user)})), 0)
    ended = {how: values.get(("gpulock_leases_ended_total",
                              frozenset({("user", user), ("how", how)})), 0)
             for how in ("released", "holder_died", "lost")}
    return started, ended


def cli_metrics(gl, env):
    result = gl.run("metrics", env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_jobs(gl, env, n):
    for _ in range(n):
        result = gl.run("run", "-n", "1", "--", "true", env=env)
        assert result.returncode == 0, result.stderr


def kill_a_job_whole(gl, env):
    holder, _ = gl.hold("--gpus", "0", env=env)
    os.killpg(holder.popen.pid, signal.SIGKILL)  # nobody writes the end
    holder.popen.wait(timeout=HANG)
    gl.wait_state(0, "free", env=env)


def start_serve(gl, env):
    server = gl.spawn("serve", "--listen", "127.0.0.1:0", env=env)
    server.wait_for_stderr("listening on http://")
    server.port = int(re.search(r"listening on http://[^ ]*:(\d+)/", server.stderr()).group(1))
    return server


def served_metrics(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        connection.close()


def wait_for_counts(server, started, ended):
    """Waits until serve's counters reach (started, ended), then checks they are exactly that:
    counters never go down, so anything counted twice on the way would show."""
    seen = {}

    def reached():
        seen["values"] = counts(parse(served_metrics(server))[0])
        s, e = seen["values"]
        return s >= started and all(e[how] >= n for how, n in ended.items())
    wait_until(reached, timeout=HANG, interval=0.5, what="serve's lease counters")
    s, e = seen["values"]
    assert s == started, seen
    assert {how: e[how] for how in ended} == ended, seen


def test_gpulock_metrics_counts_what_the_test_ran(gl):
    env = gl.env(fake="2")
    run_jobs(gl, env, 2)
    kill_a_job_whole(gl, env)

    values, types = parse(cli_metrics(gl, env))
    assert types["gpulock_leases_started"] == "counter"  # the parser drops "_total"
    assert types["gpulock_leases_ended"] == "counter"
    assert values[("gpulock_journal_up", frozenset())] == 1
    assert counts(values) == (3, {"released": 2, "holder_died": 1, "lost": 0})

    # The inferred end was written by that reading: the next one counts it once, not again.
    run_jobs(gl, env, 1)
    assert counts(parse(cli_metrics(gl, env))[0]) == (
        4, {"released": 3, "holder_died": 1, "lost": 0})


def test_a_journal_that_cannot_be_read_leaves_the_other_metrics(gl):
    not_a_directory = gl.tmp / "journal-file"
    not_a_directory.write_text("")
    for journal in ("off", str(not_a_directory)):
        env = gl.env(fake="2", GPULOCK_JOURNAL_DIR=journal)
        text = cli_metrics(gl, env)
        values, _ = parse(text)
        assert values[("gpulock_journal_up", frozenset())] == 0
        assert not any(name in COUNTERS for name, _ in values), text
        assert "# gpulock: no lease counters:" in text
        assert ("gpulock_queue_length", frozenset()) in values


def test_serve_counts_incrementally_across_rotation_and_a_killed_job(gl):
    config = gl.tmp / "config.toml"
    config.write_text('journal_file_size = "4K"\n')
    env = gl.env(fake="2", GPULOCK_CONFIG=config)
    run_jobs(gl, env, 2)  # before serve starts: its first reading takes the whole journal
    server = start_serve(gl, env)
    wait_for_counts(server, 2, {"released": 2})

    # Enough leases with long labels to rotate the files several times while serve follows.
    for _ in range(20):
        result = gl.run("run", "-n", "1", "--label", "x" * 100, "--", "true", env=env)
        assert result.returncode == 0, result.stderr
    rotated = [n for n in os.listdir(gl.lock_dir / "journal")
               if n.startswith("usage-%d-" % os.geteuid())]
    assert len(rotated) >= 2
    wait_for_counts(server, 22, {"released": 22})

    # A job SIGKILLed whole: serve infers its end itself (it writes nothing).
    kill_a_job_whole(gl, env)
    wait_for_counts(server, 23, {"released": 22, "holder_died": 1})
    # A reader of the journal now writes the inferred end; serve must not count it again.
    assert gl.run("log", env=env).returncode == 0
    run_jobs(gl, env, 1)
    wait_for_counts(server, 24, {"released": 23, "holder_died": 1})
    # And it agrees with the one-shot count of the whole journal.
    assert counts(parse(cli_metrics(gl, env))[0]) == (
        24, {"released": 23, "holder_died": 1, "lost": 0})
    assert server.alive()


def test_redis_released_and_lost_leases_are_counted_by_metrics_and_serve(rw):
    gl = rw.gl
    rw.register("node-a", gpus=1, ttl="30s")
    # Made after register(), so that its processes have node-a's one GPU (the default is 4:
    # the intruder could then take another GPU and leave the holder's lease alone).
    env = rw.env(ttl="30s")  # renewals every 10 s: time to take the holder's GPU first
    ok = rw.run("run", "-n", "1", "--", "true", env=env)
    assert ok.returncode == 0, ok.stderr
    server = start_serve(gl, env)
    holder = rw.hold("-n", "1", env=env)
    rw.wait_for_command_in_record(holder)
    # Its lock key goes and another lease takes the GPU: the holder finds its lease lost.
    rw.server.command("DEL", rw.lock_key(holder.gpus[0]))
    intruder = rw.hold("-n", "1", env=env)
    wait_until(lambda: "lost" in holder.bg.stderr(), timeout=HANG, what="the loss warning")
    holder.finish()
    intruder.finish()

    expected = (3, {"released": 2, "holder_died": 0, "lost": 1})
    assert counts(parse(cli_metrics(gl, env))[0]) == expected
    wait_for_counts(server, 3, {"released": 2, "lost": 1})
    assert counts(parse(served_metrics(server))[0]) == expected
