"""Shared GPU leases on a Redis pool (issue 15, "both backends"): real `gpulock run` processes
against a real redis-server started by the test, on simulated 80 GiB GPUs.

The audit is independent of gpulock: each job enters a ledger of its own (test_shared_leases's
AUDIT_JOB: a JSON file per GPU under the audit's flock) and checks, at the moment it holds its
lease, that the reservations on its GPUs fit their memory and that no shared job meets an
exclusive one. SIGKILL of a shared holder frees its memory once its TTL has passed (Redis has no
kernel to notice the death), and a whole-GPU request behind a stream of small jobs is served.
Nothing depends on wall-clock speed: every timeout is only a hang guard.
"""

import json
import random
import re
import signal

import pytest

from conftest import EX_TEMPFAIL, HANG, PYTHON, wait_until
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import assert_no_crash  # noqa: E402
from test_shared_leases import (  # noqa: E402
    AUDIT_JOB, GIB, GPU_MEMORY, assert_whole_gpu_not_starved, audit_dir, mixed_jobs, violations)

# The fixtures redis_server, redis_servers and rw.
pytest_plugins = ["conftest_redis"]


# The audited job, which also notes, under the ledger's lock, how many shared jobs each GPU
# carried as it entered: so the test can tell that shared leases really coexisted.
COUNTING_JOB = AUDIT_JOB.replace(
    "    ledger[name] = size\n",
    "    ledger[name] = size\n"
    "    with open(os.path.join(audit, 'shared-counts'), 'a') as counts:\n"
    "        counts.write('%d\\n' % sum(1 for v in ledger.values() if v > 0))\n")
assert COUNTING_JOB != AUDIT_JOB


def test_mixed_exclusive_and_shared_never_overcommit(rw):
    """64 processes, exclusive and shared of random sizes, on 4 simulated 80 GiB GPUs."""
    audit = audit_dir(rw)
    holder = rw.hold("-n", "4")  # so that all of them really contend
    rng = random.Random(15)
    procs = {}
    for name, args, size in mixed_jobs(rng, 64):
        procs[name] = rw.spawn("run", *args, "--", PYTHON, "-S", "-c", COUNTING_JOB, audit,
                               name, size, GPU_MEMORY)
    for bg in procs.values():
        bg.wait_for_stderr("waiting", timeout=HANG)
    assert holder.finish() == 0
    failures = []
    for name, bg in procs.items():
        status = bg.wait(timeout=HANG)
        if status != 0:
            failures.append("%s exited %s: %s" % (name, status, bg.stderr()))
    assert violations(audit) == {}
    assert failures == []
    # Shared leases did share a GPU at some moment (else the test would prove little).
    counts = [int(n) for n in (audit / "shared-counts").read_text().split()]
    assert max(counts) >= 2, counts
    # Every reservation went with its lease: no GPU is marked shared any more.
    for uuid in rw.register():
        assert rw.server.command("GET", rw.lock_key(uuid)) is None


def test_shared_leases_show_in_status_and_release_exactly_their_memory(rw):
    [gpu] = rw.register(gpus=1)
    a = rw.hold("--mem", "40G", "--gpus", "0")
    b = rw.hold("--mem", "30G")
    assert a.gpus == [gpu] and b.gpus == [gpu]
    assert a.token != b.token  # each shared lease has a fencing token of its own
    assert rw.server.command("GET", rw.lock_key(gpu)) == "=shared"
    # Another host sees the pool's view; this host the GPU's shared use.
    for doc in (rw.status(), rw.pool_status(host="node-b")):
        shared = rw.gpu_entry(doc, gpu)["shared"]
        assert shared["jobs"] == 2 and shared["reserved_bytes"] == 70 * GIB, shared
        assert sorted(h["lease_id"] for h in shared["leases"]) == sorted([a.lease_id,
                                                                          b.lease_id])
    assert rw.run_no_wait("--mem", "11G").returncode == EX_TEMPFAIL
    whole = rw.run_no_wait()
    assert whole.returncode == EX_TEMPFAIL, whole.stderr
    assert a.finish() == 0
    # A's 40 GiB are free again, B's 30 GiB still held: 50 GiB are free.
    assert rw.run_no_wait("--mem", "51G").returncode == EX_TEMPFAIL
    fits = rw.run_no_wait("--mem", "50G")
    assert fits.returncode == 0, fits.stderr
    assert b.finish() == 0
    assert rw.server.command("GET", rw.lock_key(gpu)) is None
    assert rw.run_no_wait().returncode == 0


def test_sigkill_of_a_shared_holder_frees_exactly_its_memory_after_its_ttl(rw):
    rw.register(gpus=1)
    a = rw.hold("--mem", "40G")
    b = rw.hold("--mem", "30G")
    a.bg.kill_group(signal.SIGKILL)
    a.bg.wait()
    # Nobody releases A's reservation: it expires with its TTL (2 s), then its 40 GiB are
    # free; B's 30 GiB stay, renewed by B.
    result = rw.run("run", "--mem", "50G", "--timeout", "%ds" % HANG, "--", "true")
    assert result.returncode == 0, result.stderr
    assert rw.run_no_wait("--mem", "51G").returncode == EX_TEMPFAIL
    assert rw.run_no_wait().returncode == EX_TEMPFAIL
    assert b.alive()
    doc = rw.status()
    [lease] = doc["gpus"][0]["shared"]["leases"]
    assert lease["lease_id"] == b.lease_id


def test_exclusive_request_is_not_starved_by_a_stream_of_shared_jobs(rw):
    rw.register(gpus=1)
    audit = audit_dir(rw)
    stream = assert_whole_gpu_not_starved(rw.spawn, audit)
    for p in stream:
        p.wait(timeout=HANG)
    assert violations(audit) == {}


def test_shared_requests_on_redis_place_cap_and_refuse_clearly(rw):
    rw.register(gpus=2)
    first = rw.hold("--mem", "10G")
    packed = rw.hold("--mem", "10G")
    assert packed.gpus == first.gpus  # the partly used GPU first
    spread = rw.hold("--mem", "10G", "--spread")
    assert spread.gpus != first.gpus
    slots = [rw.hold("--slots", "2", "--gpus", spread.gpus[0])]
    # That GPU carries two jobs now (`spread` and a slot of 40 GiB): 30 GiB are free, but with
    # --slots 2 a GPU takes at most two jobs, so a third is refused.
    capped = rw.run_no_wait("--slots", "2", "--gpus", spread.gpus[0])
    assert capped.returncode == EX_TEMPFAIL, capped.stderr
    too_big = rw.run("run", "--mem", "81G", "--", "true")
    assert too_big.returncode == 69 and "80.0 GiB" in too_big.stderr, too_big.stderr
    for holder in [first, packed, spread] + slots:
        assert holder.finish() == 0


def test_shared_lease_environment_and_journal_on_redis(rw):
    rw.register(gpus=1)
    out = rw.tmp / "env.json"
    script = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    result = rw.run("run", "--mem", "10G", "--", PYTHON, "-S", "-c", script, out)
    assert_no_crash(result)
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["GPULOCK_MEMORY_LIMIT_BYTES"] == str(10 * GIB)
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"
    assert int(seen["GPULOCK_FENCING_TOKEN"]) > 0
    lease = seen["GPULOCK_LEASE_ID"]
    # The pool's usage journal (a Redis stream) has its start and its end.
    entries = rw.server.command("XRANGE", rw.key("journal"), "-", "+")
    text = json.dumps(entries)
    assert text.count(lease) >= 2, text[:2000]


def test_over_reservation_is_reported_and_warned_on_redis(rw):
    fake = rw.gl.write_fake_gpus([{"memory_total": "80G"}])
    env = rw.env(gpus=fake)
    pid_file = rw.tmp / "job.pid"
    script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000'
    # `exec` keeps the pid: the process the simulated readings name is the command itself.
    bg = rw.gl.spawn("run", "--mem", "10G", "--on-over-memory", "warn", "--", "sh", "-c", script,
                     "job", pid_file, env=env)
    try:
        wait_until(lambda: pid_file.exists() or not bg.alive(), what="the job to start")
        assert bg.alive(), bg.describe()
        pid = int(pid_file.read_text())
        rw.gl.write_fake_gpus([{"memory_total": "80G",
                                "processes": [{"pid": pid, "used_memory": "12G"}]}])
        gpu = rw.status(env=env)["gpus"][0]
        [lease] = gpu["shared"]["leases"]
        assert lease["over_reservation"] is True and lease["memory_used_bytes"] == 12 * GIB
        assert [p["foreign"] for p in gpu["processes"]] == [False]
        bg.wait_for_stderr("more than the 10.0 GiB it reserved", timeout=HANG)
        assert bg.alive()  # warn only
    finally:
        bg.kill_group()
        bg.wait()


def test_detached_shared_lease_is_shown_and_released_on_redis(rw):
    [gpu] = rw.register(gpus=1)
    watched = rw.gl.sleeper()
    result = rw.run("acquire", "--mem", "10G", "--label", "notebook", "--for-pid", watched.pid)
    assert result.returncode == 0, result.stderr
    exports = dict(re.findall(r"^export ([A-Z_]+)='([^']*)'$", result.stdout, re.M))
    lease = exports["GPULOCK_LEASE_ID"]
    [shown] = rw.gpu_entry(rw.status(), gpu)["shared"]["leases"]
    assert shown["lease_id"] == lease and shown["kind"] == "detached"
    assert shown["label"] == "notebook" and shown["memory_bytes"] == 10 * GIB
    text = rw.run("status").stdout
    assert "shared by 1 lease: 10.0 GiB reserved, 70.0 GiB unreserved" in text, text
    released = rw.run("release", lease)
    assert released.returncode == 0, released.stderr
    assert rw.gpu_entry(rw.status(), gpu)["shared"] is None
    assert rw.server.command("GET", rw.lock_key(gpu)) is None
    assert watched.alive()
