"""The Redis pool at scale and under load (issue 13, items 5 and 6), with a real redis-server.

- 300 fake hosts x 8 GPUs: `status --pool` lists every GPU, and `run --host any` finds the one
  free GPU among 2,400 (the others are taken by lock keys written straight into Redis, so that
  what is held does not come from gpulock itself).
- 64 `gpulock run -n 1` processes wait for the 4 GPUs of one host while they are held, then are
  let go; 4 more waiters are killed while they wait (their tickets stay until their TTL, as a
  crashed waiter's would). Hand-offs go from the releaser to the next waiter directly (wake
  lists). The audit, independent of gpulock: each live job ran exactly once, no two intervals on
  one GPU overlap, no O_EXCL marker was ever found taken, and tokens increase on each GPU.
"""

import json
import os
import signal

import pytest

from conftest import HANG, PYTHON, sanitized_build, wait_until
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import assert_no_crash  # noqa: E402
from test_redis_contention import AUDIT_JOB  # noqa: E402

pytest_plugins = ["conftest_redis"]

# The size a lab pool reaches; 100 on a sanitizer build, which looks for memory errors (the
# normal build shows the scale) and registers each host several times slower.
HOSTS = 100 if sanitized_build() else 300
GPUS_PER_HOST = 8


def test_300_hosts_status_lists_all_and_host_any_finds_the_one_free_gpu(rw):
    names = ["host-%03d" % i for i in range(HOSTS)]
    uuids = {}
    for name in names:
        uuids[name] = rw.register(name, gpus=GPUS_PER_HOST)
    every = [u for name in names for u in uuids[name]]
    assert len(set(every)) == HOSTS * GPUS_PER_HOST

    # Every GPU but one (on a host in the middle) taken by a lease id nobody holds.
    middle = names[HOSTS // 2]
    free = uuids[middle][5]
    for i, uuid in enumerate(every):
        if uuid != free:
            assert rw.server.command("SET", rw.lock_key(uuid), "%016x" % (0xabc000 + i),
                                     "PX", "600000") == "OK"

    doc = rw.pool_status(host="host-000")
    assert len(doc["gpus"]) == HOSTS * GPUS_PER_HOST
    assert {g["uuid"] for g in doc["gpus"]} == set(every)
    states = {g["uuid"]: g["state"] for g in doc["gpus"]}
    assert states[free] == "free"
    assert sum(1 for s in states.values() if s == "free") == 1

    # This host's request sees that none of its GPUs is free.
    result = rw.run("run", "-n", "1", "--no-wait", "--", "true", host="host-000")
    assert_no_crash(result, "run --no-wait on host-000")
    assert result.returncode != 0, result.stdout + result.stderr

    result = rw.run("run", "--host", "any", "-n", "1", "--no-wait", "--", "sh", "-c",
                    'echo "$GPULOCK_GPUS $GPULOCK_LEASE_HOST"', host="host-000")
    assert_no_crash(result, "run --host any")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [free, middle]


def test_64_waiters_on_4_gpus_of_one_host_each_served_once(rw):
    uuids = rw.register("node-a", gpus=4)
    job = rw.tmp / "audit_job.py"
    job.write_text(AUDIT_JOB)
    log = rw.tmp / "audit.log"
    log.touch()
    markers = rw.tmp / "markers"
    markers.mkdir()

    holder = rw.hold("-n", "4", host="node-a")
    jobs = {}
    doomed = []
    for i in range(68):
        name = "job-%02d" % i
        bg = rw.spawn("run", "-n", "1", "--", PYTHON, "-S", job, log, markers, name,
                      host="node-a")
        if i % 17 == 3:
            doomed.append(bg)  # killed while it waits
        else:
            jobs[name] = bg

    def all_waiting():
        result = rw.run("queue", "--json", host="node-a")
        assert_no_crash(result, "queue --json")
        assert result.returncode == 0, result.stderr
        for name, bg in jobs.items():
            if not bg.alive():
                raise AssertionError("%s ended while every GPU was held: %s"
                                     % (name, bg.describe()))
        return len(json.loads(result.stdout)["waiting"]) == len(jobs) + len(doomed)
    wait_until(all_waiting, timeout=10 * HANG, interval=0.2, what="all 68 requests to wait")
    for bg in doomed:
        os.kill(bg.pid, signal.SIGKILL)
        bg.wait(timeout=HANG)

    holder.finish_path.touch()
    assert holder.bg.wait() == 0, holder.bg.describe()
    failures = []
    for name, bg in jobs.items():
        status = bg.wait(timeout=240)
        if status != 0:
            failures.append("%s exited %s: %s" % (name, status, bg.stderr()))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r for r in records if r["overlaps"]] == [], "a GPU was held by two commands at once"
    assert failures == [], "\n".join(failures)
    assert sorted(r["job"] for r in records) == sorted(jobs)
    assert len({r["lease"] for r in records}) == len(records)
    spans = {u: [] for u in uuids}
    for r in records:
        assert len(r["gpus"]) == 1 and r["gpus"][0] in spans, r
        spans[r["gpus"][0]].append((r["entered"], r["left"], int(r["token"]), r["job"]))
    for uuid, runs in spans.items():
        runs.sort()
        for (_, left_a, token_a, a), (entered_b, _, token_b, b) in zip(runs, runs[1:]):
            assert left_a <= entered_b, "%s and %s overlapped on %s" % (a, b, uuid)
            assert token_a < token_b, "tokens went back on %s: %s then %s" % (uuid, a, b)
    assert os.listdir(markers) == []
    doc = rw.pool_status()
    assert {g["state"] for g in doc["gpus"]} == {"free"}, doc
