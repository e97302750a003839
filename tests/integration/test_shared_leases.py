"""Shared GPU leases by memory (issue 15): exclusion against an independent audit, SIGKILL,
no starvation of whole-GPU requests. Real processes, real locks, simulated 80 GiB GPUs."""

import json
import os
import random
import re
import signal
import time

from conftest import EX_TEMPFAIL, HANG, PYTHON, sim_uuid, wait_until
from test_queue import Jobs

GIB = 1 << 30
GPU_MEMORY = 80 * GIB

# The audited job. Inside its lease it enters a ledger kept by the audit itself (a JSON file per
# GPU, updated under the audit's own flock, which gpulock knows nothing of): on entry it adds its
# reservation (or marks the GPU exclusive) and checks that the GPU's reservations fit its memory
# and that no shared job meets an exclusive one; on exit it removes itself. Entry and exit lie
# inside the lease, so any overlap the ledger sees is a real one.
AUDIT_JOB = r"""
import fcntl, json, os, random, sys, time
audit, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])  # size 0: exclusive
limit = int(sys.argv[4])
uuids = os.environ["GPULOCK_GPUS"].split(",")
def update(change):
    with open(os.path.join(audit, "ledger.lock"), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        problems = []
        for uuid in uuids:
            path = os.path.join(audit, uuid + ".json")
            ledger = json.load(open(path)) if os.path.exists(path) else {}
            problems += change(uuid, ledger)
            with open(path + ".tmp", "w") as f:
                json.dump(ledger, f)
            os.replace(path + ".tmp", path)
        return problems
def enter(uuid, ledger):
    problems = []
    if size == 0 and ledger:
        problems.append("exclusive %s met %s on %s" % (name, sorted(ledger), uuid))
    if size > 0 and any(v == 0 for v in ledger.values()):
        problems.append("shared %s met an exclusive job on %s: %s" % (name, uuid, ledger))
    ledger[name] = size
    total = sum(v for v in ledger.values() if v > 0)
    if total > limit:
        problems.append("%d bytes reserved on %s: %s" % (total, uuid, ledger))
    return problems
def leave(uuid, ledger):
    ledger.pop(name, None)
    return []
problems = update(enter)
time.sleep(random.uniform(0.01, 0.08))
update(leave)
if problems:
    with open(os.path.join(audit, "violations", name), "w") as f:
        f.write("\n".join(problems))
    sys.exit(99)
"""


def audit_dir(harness):
    """A fresh audit directory for AUDIT_JOB under the harness's tmp."""
    audit = harness.tmp / "audit"
    (audit / "violations").mkdir(parents=True)
    return audit


def violations(audit):
    """What AUDIT_JOB found wrong: {job name: problems}."""
    return {v: (audit / "violations" / v).read_text() for v in os.listdir(audit / "violations")}


def mixed_jobs(rng, count):
    """`count` jobs drawn from `rng`, a quarter exclusive (1 or 2 GPUs), the others shared of
    5 to 40 GiB: [(name, gpulock run arguments, AUDIT_JOB size)]."""
    jobs = []
    for i in range(count):
        if rng.random() < 0.25:
            args, size = ["-n", str(rng.choice([1, 1, 2]))], 0
        else:
            gib = rng.choice([5, 10, 10, 20, 30, 40])
            args, size = ["--mem", "%dG" % gib], gib * GIB
        jobs.append(("job-%02d" % i, args, size))
    return jobs


def test_mixed_exclusive_and_shared_never_overcommit(gl):
    """64 processes, exclusive and shared of random sizes, on 4 simulated 80 GiB GPUs."""
    audit = audit_dir(gl)
    holder, _ = gl.hold("-n", "4")  # so that all of them really contend
    rng = random.Random(15)
    procs = {}
    for name, args, size in mixed_jobs(rng, 64):
        procs[name] = gl.spawn("run", *args, "--", PYTHON, "-S", "-c", AUDIT_JOB, audit, name,
                               size, GPU_MEMORY)
    for bg in procs.values():
        bg.wait_for_stderr("waiting", timeout=HANG)
    holder.kill_group()
    holder.wait()
    failures = []
    for name, bg in procs.items():
        status = bg.wait(timeout=240)
        if status != 0:
            failures.append("%s exited %s: %s" % (name, status, bg.stderr()))
    assert violations(audit) == {}
    assert failures == []


def test_sigkill_of_a_shared_holder_frees_exactly_its_memory(gl):
    env = gl.env(fake="1")
    a, _ = gl.hold("--mem", "40G", env=env)
    b, _ = gl.hold("--mem", "30G", env=env)
    # 10 GiB are left: 20G does not fit now.
    late = gl.run("run", "--mem", "20G", "--no-wait", "--", "true", env=env)
    assert late.returncode == EX_TEMPFAIL, late.stderr
    a.kill_group(signal.SIGKILL)
    a.wait()
    # A's 40 GiB are free at once (no clean-up needed); B's 30 GiB are still held, so 60G never
    # fits while B lives.
    wait_until(lambda: gl.run("run", "--mem", "50G", "--no-wait", "--", "true",
                              env=env).returncode == 0, what="A's memory to be free")
    over = gl.run("run", "--mem", "60G", "--no-wait", "--", "true", env=env)
    assert over.returncode == EX_TEMPFAIL, over.stderr
    excl = gl.run("run", "--no-wait", "--", "true", env=env)
    assert excl.returncode == EX_TEMPFAIL, excl.stderr
    assert b.alive()
    b.kill_group(signal.SIGKILL)
    b.wait()
    wait_until(lambda: gl.run("run", "--no-wait", "--", "true", env=env).returncode == 0,
               what="the whole GPU to be free")


def assert_whole_gpu_not_starved(spawn, audit):
    """Keeps four small shared jobs running or waiting on the only GPU, and asks for it whole
    (an audited job) once one runs: the whole-GPU request is served while the stream goes on.
    `spawn` is the harness's, bound to its environment. Returns the stream.

    A stream job says it started by creating a file: a status poll can miss every 0.3 s job
    where one status outlasts them (under ASan on a loaded machine no poll saw one in 30 s)."""
    stream = []
    started = audit / "stream-started"
    started.mkdir()
    job = ': > "$1/$$"; sleep 0.3'

    def keep_the_stream_going_while(waiting):
        """Tops the stream up to four jobs while waiting() holds, for at most HANG seconds."""
        deadline = time.monotonic() + HANG
        while waiting() and time.monotonic() < deadline:
            live = [p for p in stream if p.alive()]
            for _ in range(4 - len(live)):
                stream.append(spawn("run", "--mem", "10G", "--", "sh", "-c", job, "job", started))
            time.sleep(0.05)
    keep_the_stream_going_while(lambda: not os.listdir(started))
    assert os.listdir(started), "no shared job started: " + "; ".join(
        p.describe() for p in stream)
    whole = spawn("run", "--", PYTHON, "-S", "-c", AUDIT_JOB, audit, "whole", 0, GPU_MEMORY)
    keep_the_stream_going_while(whole.alive)
    assert not whole.alive(), "the exclusive request was starved: " + whole.describe()
    assert whole.wait() == 0, whole.describe()
    return stream


def test_exclusive_request_is_not_starved_by_a_stream_of_shared_jobs(gl):
    env = gl.env(fake="1")
    audit = audit_dir(gl)
    assert_whole_gpu_not_starved(lambda *args: gl.spawn(*args, env=env), audit)
    assert os.listdir(audit / "violations") == []


def test_shared_lease_environment(gl):
    env = gl.env(fake="1")
    out = gl.tmp / "env.json"
    script = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    result = gl.run("run", "--mem", "10G", "--", PYTHON, "-S", "-c", script, out, env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["GPULOCK_MEMORY_LIMIT_BYTES"] == str(10 * GIB)
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"
    assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert seen["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert seen["CUDA_VISIBLE_DEVICES"] == "0"
    assert seen["GPULOCK_GPUS"] == sim_uuid(0)


def test_bad_shared_requests_get_clear_errors(gl):
    env = gl.env(fake="1")
    too_big = gl.run("run", "--mem", "81G", "--", "true", env=env)
    assert too_big.returncode == 69 and "80.0 GiB" in too_big.stderr, too_big.stderr
    bad = gl.run("run", "--mem", "lots", "--", "true", env=env)
    assert bad.returncode == 64, bad.stderr


def over_memory_setup(gl, tmp_name):
    """A simulated 80 GiB GPU read from a file, and a command under a 10 GiB shared lease that
    writes its pid and waits; returns (env, pid file)."""
    fake = gl.write_fake_gpus([{"memory_total": "80G"}])
    env = gl.env(fake=fake)
    pid_file = gl.tmp / tmp_name
    return env, pid_file


def start_job(gl, env, pid_file, *extra):
    script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000'
    # `exec` keeps the pid: the process the simulated readings name is the command itself.
    bg = gl.spawn("run", "--mem", "10G", *extra, "--", "sh", "-c", script, "job", pid_file,
                  env=env)
    wait_until(lambda: pid_file.exists() or not bg.alive(), what="the job to start")
    assert bg.alive(), bg.describe()
    return bg, int(pid_file.read_text())


def test_over_reservation_is_reported_in_status(gl):
    env, pid_file = over_memory_setup(gl, "job.pid")
    bg, pid = start_job(gl, env, pid_file, "--on-over-memory", "warn")
    shared = gl.gpu_status(0, env=env)["shared"]
    assert shared["jobs"] == 1 and shared["reserved_bytes"] == 10 * GIB
    [lease] = shared["leases"]
    assert lease["memory_bytes"] == 10 * GIB and lease["over_reservation"] is False
    # The driver (simulated) now reports the job using 12 GiB: over its 10 GiB.
    gl.write_fake_gpus([{"memory_total": "80G",
                         "processes": [{"pid": pid, "used_memory": "12G"}]}])
    gpu = gl.gpu_status(0, env=env)
    [lease] = gpu["shared"]["leases"]
    assert lease["over_reservation"] is True and lease["memory_used_bytes"] == 12 * GIB
    assert [p["foreign"] for p in gpu["processes"]] == [False]
    text = gl.run("status", env=env).stdout
    assert "OVER" in text, text
    bg.wait_for_stderr("more than the 10.0 GiB it reserved", timeout=HANG)
    assert bg.alive()  # warn only


def test_over_reservation_terminates_with_term(gl):
    env, pid_file = over_memory_setup(gl, "job.pid")
    bg, pid = start_job(gl, env, pid_file, "--on-over-memory", "term")
    gl.write_fake_gpus([{"memory_total": "80G",
                         "processes": [{"pid": pid, "used_memory": "11G"}]}])
    assert bg.wait(timeout=HANG) == 128 + signal.SIGTERM, bg.describe()
    assert "stopping the command" in bg.stderr()


def test_memory_used_outside_gpulock_counts(gl):
    sleeper = gl.sleeper()
    fake = gl.write_fake_gpus([{"memory_total": "80G",
                                "processes": [{"pid": sleeper.pid, "used_memory": "50G"}]}])
    env = gl.env(fake=fake)
    # 80 GiB less the sleeper's 50 GiB leaves 30 GiB.
    assert gl.run("run", "--mem", "31G", "--no-wait", "--", "true",
                  env=env).returncode == EX_TEMPFAIL
    assert gl.run("run", "--mem", "30G", "--no-wait", "--", "true", env=env).returncode == 0


def test_a_killed_whole_gpu_waiter_does_not_hold_shared_requests_back(gl):
    env = gl.env(fake="1")
    holder, _ = gl.hold("--mem", "10G", env=env)
    waiter = gl.spawn("run", "--", "true", env=env)
    waiter.wait_for_stderr("waiting", timeout=HANG)
    # While it waits for the GPU, no new shared lease starts there (it drains for the waiter).
    blocked = gl.run("run", "--mem", "10G", "--no-wait", "--", "true", env=env)
    assert blocked.returncode == EX_TEMPFAIL, blocked.stderr
    waiter.kill_group(signal.SIGKILL)
    waiter.wait()
    # Its slot in the queue's index stays until someone finds it dead: a shared request does.
    result = gl.run("run", "--mem", "10G", "--timeout", "%ds" % HANG, "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    assert holder.alive()


def test_a_whole_gpu_waiter_does_not_stop_shared_leases_on_other_gpus(gl):
    """Backfill: a request waiting for GPU 0 holds only GPU 0 back; shared leases start on the
    other GPUs, also partly used ones."""
    env = gl.env(fake="3")
    holder, _ = gl.hold("--gpus", "0", env=env)
    waiter = gl.spawn("run", "--gpus", "0", "--", "true", env=env)
    waiter.wait_for_stderr("waiting", timeout=HANG)
    first = gl.run("run", "--mem", "10G", "--no-wait", "--", "true", env=env)
    assert first.returncode == 0, first.stderr
    kept, index = gpu_of(gl, env, "--mem", "30G", "--no-wait")
    assert index in (1, 2)
    packed, same = gpu_of(gl, env, "--mem", "30G", "--no-wait")
    assert same == index  # packed beside it, not on the GPU the waiter wants
    assert waiter.alive()
    holder.kill_group()
    assert waiter.wait(timeout=HANG) == 0, waiter.describe()


def test_an_exclusive_waiter_holds_a_gpu_in_shared_use_back_and_gets_it(gl):
    """A whole-GPU request waiting while every GPU is in shared use: one GPU stops taking new
    shared leases (it drains), the others still take them, and the request gets the drained
    GPU when its leases end."""
    env = gl.env(fake="2")
    a, _ = gl.hold("--mem", "10G", env=env)
    b, _ = gl.hold("--mem", "10G", "--spread", env=env)
    assert {sim_index(a.gpus[0]), sim_index(b.gpus[0])} == {0, 1}
    waiter = gl.spawn("run", "--", "true", env=env)
    waiter.wait_for_stderr("waiting", timeout=HANG)
    # One GPU is held back for the waiter: exactly one more shared lease fits, on the other.
    extra, index = gpu_of(gl, env, "--mem", "10G", "--no-wait")
    held_back = 1 - index
    refused = gl.run("run", "--gpus", str(held_back), "--mem", "10G", "--no-wait", "--", "true",
                     env=env)
    assert refused.returncode == EX_TEMPFAIL, refused.stderr
    again, same = gpu_of(gl, env, "--mem", "10G", "--no-wait")
    assert same == index
    drained = a if sim_index(a.gpus[0]) == held_back else b
    drained.kill_group()
    drained.wait()
    assert waiter.wait(timeout=HANG) == 0, waiter.describe()


def test_waiting_shared_requests_are_listed_in_the_queue(gl):
    env = gl.env(fake="1")
    holder, _ = gl.hold("-n", "1", env=env)
    waiters = [gl.spawn("run", "--mem", "10G", "--label", "s%d" % i, "--", "true", env=env)
               for i in range(3)]
    for w in waiters:
        w.wait_for_stderr("waiting", timeout=HANG)
    doc = json.loads(gl.run("queue", "--json", env=env).stdout)
    assert sorted(e["label"] for e in doc["waiting"]) == ["s0", "s1", "s2"]
    holder.kill_group()
    for w in waiters:
        assert w.wait(timeout=HANG) == 0, w.describe()


def gpu_of(gl, env, *args):
    """The GPU index a `gpulock run ARGS -- ...` held in the background got."""
    bg, _ = gl.hold(*args, env=env)
    return bg, sim_index(bg.gpus[0])


def sim_index(uuid):
    return int(uuid.rsplit("-", 1)[1], 16)


def test_placement_packs_by_default_and_spreads_on_request(gl):
    env = gl.env(fake="4")
    held = [gpu_of(gl, env, "--mem", "10G") for _ in range(3)]
    assert [index for _, index in held] == [0, 0, 0]  # partly used GPUs fill up first
    spread = [gpu_of(gl, env, "--mem", "10G", "--spread") for _ in range(3)]
    assert sorted(index for _, index in spread) == [1, 2, 3]  # the emptiest first


def test_slots_cap_the_jobs_on_a_gpu(gl):
    env = gl.env(fake="1")
    for _ in range(2):
        gl.hold("--mem", "1G", "--slots", "2", env=env)
    third = gl.run("run", "--mem", "1G", "--slots", "2", "--no-wait", "--", "true", env=env)
    assert third.returncode == EX_TEMPFAIL, third.stderr
    # Without a cap of its own a request still fits (the cap is the request's, or the config's).
    assert gl.run("run", "--mem", "1G", "--no-wait", "--", "true", env=env).returncode == 0
    # Without --mem, a request takes 1/slots of the GPU.
    fresh = gl.env(fake="1", lock_dir=gl.tmp / "other-locks")
    quarter, _ = gl.hold("--slots", "4", env=fresh)
    assert gl.gpu_status(0, env=fresh)["shared"]["reserved_bytes"] == 20 * GIB


def test_config_caps_jobs_and_keeps_a_reserve(gl):
    config = gl.tmp / "config.toml"
    config.write_text('max_jobs_per_gpu = 2\nshared_memory_reserve = "20G"\n')
    env = gl.env(fake="1", GPULOCK_CONFIG=config)
    too_big = gl.run("run", "--mem", "61G", "--", "true", env=env)
    assert too_big.returncode == 69, too_big.stderr  # 80 GiB less the 20 GiB reserve
    gl.hold("--mem", "30G", env=env)
    assert gl.run("run", "--mem", "31G", "--no-wait", "--", "true",
                  env=env).returncode == EX_TEMPFAIL
    gl.hold("--mem", "30G", env=env)
    assert gl.run("run", "--mem", "1G", "--no-wait", "--", "true",
                  env=env).returncode == EX_TEMPFAIL  # two jobs already
    doc = gl.gpu_status(0, env=env)["shared"]
    assert doc["jobs"] == 2 and doc["admin_reserve_bytes"] == 20 * GIB
    assert doc["unreserved_bytes"] == 0


def test_detached_shared_lease_is_shown_and_released(gl):
    env = gl.env(fake="1")
    watched = gl.sleeper()
    result = gl.run("acquire", "--mem", "10G", "--label", "notebook", "--for-pid", watched.pid,
                    env=env)
    assert result.returncode == 0, result.stderr
    exports = dict(re.findall(r"^export ([A-Z_]+)='([^']*)'$", result.stdout, re.M))
    lease = exports["GPULOCK_LEASE_ID"]
    [shown] = gl.gpu_status(0, env=env)["shared"]["leases"]
    assert shown["lease_id"] == lease and shown["kind"] == "detached"
    assert shown["label"] == "notebook" and shown["memory_bytes"] == 10 * GIB
    text = gl.run("status", env=env).stdout
    assert "shared by 1 lease: 10.0 GiB reserved, 70.0 GiB unreserved" in text, text
    assert gl.run("release", lease, env=env).returncode == 0
    assert gl.gpu_status(0, env=env)["shared"] is None
    assert watched.alive()


def test_a_big_shared_request_is_not_overtaken_by_smaller_ones_behind_it(gl):
    """Queued in order A (50G), B (40G), C (10G) behind a whole-GPU holder: when it ends, A
    starts; B does not fit beside A and reserves the GPU it waits on, so C, which would fit, waits
    behind B instead of taking that memory: it starts only once A has ended (then B and C start
    together)."""
    env = gl.env(fake="1")
    log = gl.tmp / "log"
    log.touch()
    holder, _ = gl.hold("-n", "1", env=env)
    jobs = []
    for name, mem, hold in (("A", "50G", "1.5"), ("B", "40G", "0"), ("C", "10G", "0")):
        bg = gl.spawn("run", "--mem", mem, "--", "sh", "-c",
                      'echo "$1" >> "$2"; sleep "$3"; echo "$1-end" >> "$2"', "job", name,
                      str(log), hold, env=env)
        bg.wait_for_stderr("waiting", timeout=HANG)
        jobs.append(bg)
    holder.kill_group()
    for bg in jobs:
        assert bg.wait(timeout=HANG) == 0, bg.describe()
    events = log.read_text().split()
    assert events[:2] == ["A", "A-end"], events
    assert sorted(events[2:]) == ["B", "B-end", "C", "C-end"], events


def test_fair_share_between_users_counts_shared_requests_by_memory(mu):
    """User A holds the only GPU whole and queues ten 40 GiB shared jobs; user B then queues
    one. B, holding nothing, goes first; when A's lease ends, B's job starts among the first
    two (two fit at once), and `gpulock queue` shows the shared requests' memory."""
    a, b = mu.users
    jobs = Jobs(mu, mu.env(fake="1"))
    jobs.holder("hold", "-n", "1", user=a)
    names = ["a%02d" % i for i in range(10)]
    for name in names:
        jobs.waiter(name, "--mem", "40G", user=a)
    jobs.waiter("b", "--mem", "40G", user=b)
    doc = jobs.queue()
    assert jobs.order(doc)[0] == "b", jobs.order(doc)
    assert {e["memory_bytes"] for e in doc["waiting"]} == {40 * GIB}
    served = jobs.release_and_next("hold", served=2)
    assert "b" in served, served
