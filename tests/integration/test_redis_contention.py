"""Contention across fake hosts on one Redis pool, with an independent audit.

4 fake hosts x 2 simulated GPUs, 32 `gpulock run --host any` processes (8 started from each
host) wait while every GPU is held, then all are let go at once. Each command appends its
interval (CLOCK_MONOTONIC, shared by all processes of this machine), host, GPUs, lease id and
fencing token to one log under flock, and also claims an O_EXCL marker file per GPU while it
runs. The audit, independent of gpulock: every request was served exactly once, on one host of
the pool, with GPUs of that host; no two intervals on one GPU overlap; no marker was ever found
taken; and on each GPU the fencing tokens increase in the order the leases ran.

Also: two users' waiters whose snapshots read different hosts serve in one fair-share order.
"""

import json
import os
import random

import pytest

from conftest import HANG, PYTHON, wait_until
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import RedisWorld, assert_no_crash  # noqa: E402

# The fixtures redis_server, redis_servers and rw.
pytest_plugins = ["conftest_redis"]

HOSTS = ("node-a", "node-b", "node-c", "node-d")
GPUS_PER_HOST = 2
PER_HOST = 8  # 32 processes in all

AUDIT_JOB = r"""
import fcntl, json, os, random, sys, time
log, markers, name = sys.argv[1], sys.argv[2], sys.argv[3]
gpus = os.environ["GPULOCK_GPUS"].split(",")
entered = time.monotonic()
made, overlaps = [], []
for uuid in gpus:
    try:
        os.close(os.open(os.path.join(markers, uuid), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        made.append(uuid)
    except FileExistsError:
        overlaps.append(uuid)
time.sleep(random.uniform(0.0, 0.04))
for uuid in made:
    os.unlink(os.path.join(markers, uuid))
left = time.monotonic()
record = {"job": name, "entered": entered, "left": left, "gpus": gpus, "overlaps": overlaps,
          "host": os.environ.get("GPULOCK_LEASE_HOST"), "lease": os.environ.get("GPULOCK_LEASE_ID"),
          "token": os.environ.get("GPULOCK_FENCING_TOKEN"), "pid": os.getpid()}
with open(log, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps(record) + "\n")
    f.flush()
    fcntl.flock(f, fcntl.LOCK_UN)
sys.exit(99 if overlaps else 0)
"""


def test_32_processes_on_4_fake_hosts_never_share_a_gpu(rw):
    uuids = {h: rw.register(h, gpus=GPUS_PER_HOST) for h in HOSTS}
    host_of = {u: h for h, us in uuids.items() for u in us}
    assert len(host_of) == len(HOSTS) * GPUS_PER_HOST, "simulated UUIDs collide: %s" % uuids

    job = rw.tmp / "audit_job.py"
    job.write_text(AUDIT_JOB)
    log = rw.tmp / "audit.log"
    log.touch()
    markers = rw.tmp / "markers"
    markers.mkdir()

    # Every GPU of the pool held, so that all 32 requests really wait and contend.
    holders = [rw.hold("-n", str(GPUS_PER_HOST), host=h) for h in HOSTS]
    rng = random.Random(20240605)
    jobs = {}
    for i in range(PER_HOST * len(HOSTS)):
        host = HOSTS[i % len(HOSTS)]
        name = "job-%02d" % i
        count = rng.choice((1, 1, 1, 2))
        jobs[name] = (count, rw.spawn("run", "--host", "any", "-n", str(count), "--", PYTHON,
                                      "-S", job, log, markers, name, host=host))

    def all_waiting():
        result = rw.run("queue", "--json", host="node-a")
        assert_no_crash(result, "queue --json")
        assert result.returncode == 0, result.stderr
        waiting = json.loads(result.stdout)["waiting"]
        for name, (_, bg) in jobs.items():
            if not bg.alive():
                raise AssertionError("%s ended while every GPU was held: %s"
                                     % (name, bg.describe()))
        return len(waiting) == len(jobs)
    wait_until(all_waiting, timeout=10 * HANG, interval=0.2, what="all 32 requests to wait")

    for holder in holders:
        holder.finish_path.touch()
    for holder in holders:
        assert holder.bg.wait() == 0, holder.bg.describe()

    failures = []
    for name, (_, bg) in jobs.items():
        status = bg.wait(timeout=240)
        if status != 0:
            failures.append("%s exited %s: %s" % (name, status, bg.stderr()))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r for r in records if r["overlaps"]] == [], "a GPU was held by two commands at once"
    assert failures == [], "\n".join(failures)

    # Every request served exactly once, as asked, on one host of the pool.
    assert sorted(r["job"] for r in records) == sorted(jobs)
    assert len({r["lease"] for r in records}) == len(records)
    assert len({r["token"] for r in records}) == len(records)
    for r in records:
        count, _ = jobs[r["job"]]
        assert len(r["gpus"]) == count == len(set(r["gpus"])), r
        assert r["host"] in HOSTS and all(host_of.get(u) == r["host"] for u in r["gpus"]), r
        assert r["token"].isdigit(), r

    # The independent audit: intervals on one GPU never intersect, and tokens increase with time.
    spans = {u: [] for u in host_of}
    for r in records:
        for u in r["gpus"]:
            spans[u].append((r["entered"], r["left"], int(r["token"]), r["job"]))
    used_hosts = set()
    for uuid, runs in spans.items():
        runs.sort()
        for (_, left_a, token_a, a), (entered_b, _, token_b, b) in zip(runs, runs[1:]):
            assert left_a <= entered_b, "%s and %s overlapped on %s" % (a, b, uuid)
            assert token_a < token_b, "fencing tokens went back on %s: %s (%d) then %s (%d)" % (
                uuid, a, token_a, b, token_b)
        if runs:
            used_hosts.add(host_of[uuid])
    assert len(used_hosts) >= 2, "--host any used only %s" % used_hosts
    assert os.listdir(markers) == []

    # Nothing left: every GPU of the pool is free again, and no one waits.
    doc = rw.pool_status()
    assert {g["state"] for g in doc["gpus"]} == {"free"}, doc
    assert len(doc["gpus"]) == len(host_of)
    result = rw.run("queue", "--json")
    assert json.loads(result.stdout)["waiting"] == []


ORDER_JOB = 'echo "$1" >> "$2"'


def test_waiters_whose_snapshots_read_different_hosts_agree_on_whom_fair_share_serves(
        mu, redis_server):
    """Fair share orders the queue alike in every waiter's plan, whichever hosts its snapshot
    reads. User A holds two quarter-GPU shared leases on node-b and waits for a GPU on node-a
    (its snapshot reads node-a); user B holds a GPU of node-a and waits for one there from
    node-b (its snapshot reads both hosts). When node-a's other GPU comes free, A goes first
    (half a GPU held, against B's whole one), then B. Before the fix A's plan counted A's
    shared leases as two whole GPUs (they were outside its scope) and put B first while B's
    plan put A first: each woke the other for ever, with the GPU free, and neither ran."""
    rw = RedisWorld(mu, redis_server)
    user_a, user_b = mu.users
    rw.register("node-a", gpus=2)
    rw.register("node-b", gpus=1)
    blocker = rw.hold("--gpus", "0", host="node-a")  # root's
    b_holds = rw.hold("--gpus", "1", host="node-a", prefix=user_b.prefix())
    a_shares = [rw.hold("--mem", "20G", host="node-b", prefix=user_a.prefix())
                for _ in range(2)]
    log = rw.tmp / "order"
    log.write_text("")
    os.chmod(log, 0o666)
    a_waits = mu.spawn("run", "-n", "1", "--", "sh", "-c", ORDER_JOB, "job", "A", log,
                       env=rw.env(host="node-a"), prefix=user_a.prefix())
    a_waits.wait_for_stderr("waiting", timeout=HANG)
    b_waits = mu.spawn("run", "-n", "1", "--host", "node-a", "--", "sh", "-c", ORDER_JOB, "job",
                       "B", log, env=rw.env(host="node-b"), prefix=user_b.prefix())
    b_waits.wait_for_stderr("waiting", timeout=HANG)
    assert blocker.finish() == 0
    for name, bg in (("A", a_waits), ("B", b_waits)):
        status = bg.wait(timeout=HANG)
        assert status == 0, "%s exited %s: %s" % (name, status, bg.stderr())
    assert log.read_text().split() == ["A", "B"]
    for holder in [b_holds] + a_shares:
        assert holder.finish() == 0


def test_waiters_agree_on_health_when_readings_change_after_registration(rw):
    """Waiters on other hosts judge a host's GPUs by its registered readings; a waiter on the
    host judges them live. X (node-a, --min-free-mem 20G) and then Y (node-b, --host node-a)
    wait for node-a's only GPU; after both registered, a job outside gpulock takes 70 GB of its
    80. When the GPU is released, X cannot use it (10 GB free) and Y must run. Before the fix
    X's plan (live: X cannot use it) gave it to Y, and Y's (registered: X can) gave it to X:
    the GPU stayed free while both waited, until some other gpulock process on node-a
    registered again. Once the memory is back, X runs."""
    uuid = "GPU-11111111-0000-4000-8000-00000000000a"
    fake = rw.tmp / "node-a-gpus.json"

    def node_a_memory_used(used):
        rw.gl.write_fake_gpus([{"uuid": uuid, "memory_total": "80G", "memory_used": used}],
                              path=fake)
    node_a_memory_used("0G")
    env_a = rw.env(host="node-a", gpus=str(fake))
    rw.status(env=env_a)
    rw.register("node-b", gpus=1)
    blocker = rw.hold("--gpus", "0", env=env_a)
    log = rw.tmp / "order"
    log.write_text("")
    x_waits = rw.gl.spawn("run", "-n", "1", "--min-free-mem", "20G", "--", "sh", "-c",
                          ORDER_JOB, "job", "X", log, env=env_a)
    x_waits.wait_for_stderr("waiting", timeout=HANG)
    y_waits = rw.gl.spawn("run", "-n", "1", "--host", "node-a", "--", "sh", "-c", ORDER_JOB,
                          "job", "Y", log, env=rw.env(host="node-b"))
    y_waits.wait_for_stderr("waiting", timeout=HANG)
    node_a_memory_used("70G")
    assert blocker.finish() == 0
    status = y_waits.wait(timeout=HANG)
    assert status == 0, "Y exited %s: %s\nX: %s" % (status, y_waits.stderr(), x_waits.stderr())
    assert x_waits.alive(), x_waits.describe()
    node_a_memory_used("0G")
    assert x_waits.wait(timeout=HANG) == 0, x_waits.describe()
    assert log.read_text().split() == ["Y", "X"]
