"""The machine's queue at scale (issue 12): a thousand waiting jobs of one user on one GPU.

With one inotify instance per waiter, fs.inotify.max_user_instances (128 by default) runs out
beyond about 128 waiters of one user, and the rest used to poll every 100 ms: idle waiters then
burn CPU and the queue drains slowly or not at all. These tests hold the queue to what it
promises at any size:

  - every queued job is served, exactly once, one at a time (an independent audit: each job
    takes an atomic `mkdir` marker, logs its number, and removes the marker);
  - waiters that wait use no CPU;
  - fair share still puts another user's single job ahead of a flood of 1000;
  - a waiter that forked (without exec) and was killed leaves no phantom ticket
    (tests/python/test_queue_fork.py: it needs the Python package);
  - first uses of a fresh lock directory, many at once, never warn about its mode;
  - `--no-wait` and `--timeout` answer promptly with hundreds waiting;
  - SIGKILL of random waiters and of the dispatchers (the oldest waiters) in the middle of a
    drain: the queue heals and serves every survivor.

They run in the normal suite. Every timeout is only a hang guard; nothing asserts speed, except
the CPU bound of test_drain_1000_after_idling_at_no_cpu, which is set to catch polling, not to
measure. Waiters are started in batches, each batch waiting in the queue before the next starts, so that
a 2-core machine copes.

Environment:
  GPULOCK_SCALE_N       jobs queued by the 1000-scale tests (default 1000)
  GPULOCK_SCALE_BATCH   how many are started at once (default 50)
"""

import fcntl
import json
import os
import random
import resource
import signal
import stat
import struct
import subprocess
import time

import pytest

from conftest import EX_TEMPFAIL, HANG, wait_until

N = int(os.environ.get("GPULOCK_SCALE_N", "1000"))
BATCH = int(os.environ.get("GPULOCK_SCALE_BATCH", "50"))

# Hang guards (seconds), generous: 1000 processes on a loaded 2-core machine, maybe under ASan.
REGISTER_HANG = 600  # all N registered in the queue
DRAIN_HANG = 600  # all N served after the release

# The audited job: argv[1] the audit directory, argv[2] the job's number. `mkdir` is atomic: a
# marker that exists already means another job runs at the same time (an error file). The log
# gets one line per job, in the order the jobs started (there is one GPU).
JOB = ('d=$1; n=$2; '
       'if mkdir "$d/running" 2>/dev/null; then echo "$n" >> "$d/log"; rmdir "$d/running"; '
       'else echo "$n" >> "$d/log"; : > "$d/error-$n"; exit 3; fi')

CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- limits ---------------------------------------------------------------------------------------

def ensure_room_for(processes):
    """Room for `processes` more processes (each waiter is a process, and its job one more for a
    moment): raises the soft RLIMIT_NPROC to the hard one if needed (inherited by setpriv'd
    users too), and skips if the hard limit or kernel.pid_max cannot take them. Also raises the
    soft RLIMIT_NOFILE to its hard limit (at most 65536): harmless, and the children inherit
    it. The inotify limits are left as they are on purpose: that is what the tests are about."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    running = sum(1 for e in os.listdir("/proc") if e.isdigit())
    needed = running + 2 * processes + 100
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip("RLIMIT_NPROC (ulimit -u) hard limit %d is below the %d processes this "
                        "test needs" % (hard, needed))
        resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    if pid_max < needed:
        pytest.skip("kernel.pid_max %d is below the %d processes this test needs"
                    % (pid_max, needed))


# -- the audit ------------------------------------------------------------------------------------

class Audit:
    """The directory the jobs of one test write to (shared by every user: mode 1777)."""

    def __init__(self, root):
        self.root = root
        root.mkdir()
        os.chmod(root, 0o1777)
        self.log = root / "log"
        self.log.touch()
        os.chmod(self.log, 0o666)  # jobs of several users append to it

    def job(self, name):
        return ["--", "/bin/sh", "-c", JOB, "job", str(self.root), name]

    def started(self):
        """Job numbers in the order they started."""
        return self.log.read_text().split()

    def errors(self):
        return sorted(p.name for p in self.root.iterdir() if p.name.startswith("error-"))

    def check(self, names):
        """Every job of `names` ran exactly once, none beside another, nothing left over."""
        errors = self.errors()
        assert errors == [], "jobs ran at the same time on the only GPU: %s" % errors[:20]
        assert not (self.root / "running").exists(), "a job's marker was left behind"
        started = self.started()
        counts = {}
        for name in started:
            counts[name] = counts.get(name, 0) + 1
        missing = [n for n in names if n not in counts]
        twice = sorted(n for n, c in counts.items() if c > 1)
        strangers = sorted(set(counts) - set(names))
        assert (missing, twice, strangers) == ([], [], []), (
            "%d jobs never ran (e.g. %s); %d ran twice (e.g. %s); unknown: %s"
            % (len(missing), missing[:10], len(twice), twice[:10], strangers[:10]))


# -- queueing and draining ------------------------------------------------------------------------

def queue_jobs(harness, audit, names, env, prefix=(), request=("-n", "1")):
    """Starts `gpulock run REQUEST -- JOB` for each name, BATCH at a time: each batch waits in
    the queue (its 'waiting for' line on stderr) before the next is started. Returns
    {name: bg}."""
    procs = {}
    deadline = time.monotonic() + REGISTER_HANG
    for first in range(0, len(names), BATCH):
        batch = names[first:first + BATCH]
        for name in batch:
            procs[name] = harness.spawn("run", *request, *audit.job(name), env=env,
                                        prefix=prefix)
        pending = set(batch)
        while pending:
            for name in list(pending):
                bg = procs[name]
                if "waiting for" in bg.stderr():
                    pending.discard(name)
                elif not bg.alive():
                    raise AssertionError("job %s did not wait in the queue: %s"
                                         % (name, bg.describe()))
            if pending and time.monotonic() > deadline:
                raise AssertionError(
                    "hang guard (%ss): %d of %d jobs started, %d of the last batch not yet "
                    "waiting" % (REGISTER_HANG, len(procs), len(names), len(pending)))
            if pending:
                time.sleep(0.05)
        if first == 0:
            ensure_memory_for(len(names), [procs[n].pid for n in batch])
    return procs


def ensure_memory_for(count, sample):
    """Skips unless `count` waiters like those of `sample` (pids, already waiting) fit in the
    available memory with room to spare: a sanitizer build's waiters are many times larger."""
    pss = []
    for pid in sample:
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                pss += [int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")]
        except OSError:
            pass
    with open("/proc/meminfo") as f:
        available = [int(line.split()[1]) * 1024 for line in f
                     if line.startswith("MemAvailable:")]
    if not pss or not available:
        return
    projected = 2 * count * sum(pss) / len(pss)  # the jobs' own processes, and to spare
    if projected > available[0]:
        pytest.skip("%d waiters of %.1f MiB each (PSS) need more memory than the %.0f MiB "
                    "available" % (count, sum(pss) / len(pss) / 2**20, available[0] / 2**20))


def queue_doc(harness, env, prefix=()):
    result = harness.run("queue", "--json", env=env, prefix=prefix, timeout=HANG)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_queue_length(harness, count, env, timeout=REGISTER_HANG):
    """Waits until `gpulock queue --json` lists exactly `count` waiting requests."""
    seen = []

    def listed():
        doc = queue_doc(harness, env)
        seen[:] = [len(doc["waiting"])]
        return len(doc["waiting"]) == count
    wait_until(listed, timeout, interval=0.5,
               what="%d requests in the queue (last seen: %s)" % (count, seen))


def summary(harness, env, procs):
    """A short account of a queue that did not drain, for failure messages."""
    running = [n for n, bg in procs.items() if bg.alive()]
    doc = queue_doc(harness, env)
    standings = {}
    for entry in doc["waiting"]:
        standings[entry["standing"]] = standings.get(entry["standing"], 0) + 1
    head = [(e["pid"], e["standing"], e["blocked_by"]) for e in doc["waiting"][:3]]
    return ("%d of %d jobs still running or waiting (e.g. %s); queue: %d waiting %s, head %s"
            % (len(running), len(procs), running[:5], len(doc["waiting"]), standings, head))


def wait_drained(harness, env, procs, timeout=DRAIN_HANG):
    """Waits for every process of `procs`; returns {name: exit status}."""
    deadline = time.monotonic() + timeout
    for bg in procs.values():
        try:
            bg.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError("hang guard (%ss): the queue did not drain: %s"
                                 % (timeout, summary(harness, env, procs))) from None
    return {name: bg.popen.returncode for name, bg in procs.items()}


def live_tickets(harness):
    """Ticket files in the queue directory, and those of them still locked (a live waiter)."""
    queue_dir = harness.lock_dir / "queue"
    tickets = sorted(n for n in os.listdir(queue_dir) if n.endswith(".ticket"))
    live = []
    for name in tickets:
        try:
            fd = os.open(queue_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone meanwhile
        try:
            if locked_by_someone(fd):
                live.append(name)
        finally:
            os.close(fd)
    return tickets, live


def locked_by_someone(fd):
    """Whether any process holds a lock on the file (F_GETLK sees OFD locks as well)."""
    query = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    return struct.unpack("hh4xqqi4x", answer)[0] != fcntl.F_UNLCK


def assert_all_served(harness, env, audit, procs):
    statuses = wait_drained(harness, env, procs)
    failed = {n: (s, procs[n].stderr()[-300:]) for n, s in statuses.items() if s != 0}
    assert failed == {}, "%d jobs failed, e.g. %s" % (len(failed), list(failed.items())[:5])
    audit.check(list(procs))
    doc = queue_doc(harness, env)
    assert doc["waiting"] == [], "still listed as waiting: %s" % doc["waiting"][:5]
    tickets, live = live_tickets(harness)
    assert live == [], "tickets still locked after every waiter left: %s" % live[:10]
    assert tickets == [], "tickets left behind by waiters that were served: %s" % tickets[:10]


def names_for(count, prefix="j"):
    return ["%s%04d" % (prefix, i) for i in range(count)]


def cpu_seconds(pid):
    """utime + stime of process `pid` (all its threads), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def jobs_behind_held_gpu(gl, count, audit_class=Audit, queue=queue_jobs):
    """The machine's one GPU held whole, and `count` jobs (started by `queue`, audited by an
    `audit_class`) waiting in the queue behind it. Returns (env, audit, holder, {name: bg})."""
    ensure_room_for(count)
    env = gl.env(fake="1")
    audit = audit_class(gl.tmp / "audit")
    holder, _ = gl.hold("-n", "1", env=env)
    procs = queue(gl, audit, names_for(count), env)
    wait_queue_length(gl, count, env)
    return env, audit, holder, procs


def kill_while_draining(harness, env, holder, procs, rng, pending_random, per_round):
    """Ends `holder` and, while the queue drains, SIGKILLs the gpulock processes of waiters:
    `per_round` a round from the end of `pending_random` (names), and in each of
    DISPATCHER_VICTIMS rounds one of the three oldest still waiting (the dispatchers, which
    follow releases and plan for everyone), drawn from `rng`, as are the pauses between rounds.
    Returns (the victims' names, how many dispatchers were killed, when the holder ended)."""
    by_pid = {bg.pid: name for name, bg in procs.items()}
    victims = set()

    def kill(name):
        victims.add(name)
        try:
            os.kill(procs[name].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    holder.kill_group()
    released = time.monotonic()
    dispatchers_killed = 0
    while pending_random or dispatchers_killed < DISPATCHER_VICTIMS:
        assert time.monotonic() - released < DRAIN_HANG, summary(harness, env, procs)
        if dispatchers_killed < DISPATCHER_VICTIMS:
            waiting = [e["pid"] for e in queue_doc(harness, env)["waiting"]]
            head = [by_pid[p] for p in waiting[:3] if p in by_pid]
            if not head:
                break  # drained already: nothing left to kill
            kill(rng.choice(head))
            dispatchers_killed += 1
        for _ in range(min(len(pending_random), per_round)):
            kill(pending_random.pop())
        time.sleep(rng.uniform(0, 0.05))
    return victims, dispatchers_killed, released


def wait_survivors(harness, env, procs, victims):
    """Waits for the waiters not in `victims` to be served and end, each with status 0, and for
    the victims' gpulock processes to be reaped. Returns the survivors {name: bg}."""
    survivors = {n: bg for n, bg in procs.items() if n not in victims}
    statuses = wait_drained(harness, env, survivors)
    failed = {n: (s, survivors[n].stderr()[-300:]) for n, s in statuses.items() if s != 0}
    assert failed == {}, "%d survivors failed, e.g. %s" % (len(failed), list(failed.items())[:5])
    for name in victims:
        procs[name].popen.wait(timeout=HANG)
    return survivors


def assert_served_once(audit, survivors):
    """Every survivor's job ran, and no job ran twice, as the audit's log says. Returns
    {name: times run} of the jobs that ran."""
    counts = {}
    for name in audit.started():
        counts[name] = counts.get(name, 0) + 1
    missing = sorted(n for n in survivors if n not in counts)
    twice = sorted(n for n, c in counts.items() if c > 1)
    assert (missing, twice) == ([], []), (
        "%d survivors never ran (e.g. %s); %d jobs ran twice (e.g. %s)"
        % (len(missing), missing[:10], len(twice), twice[:10]))
    return counts


# -- the tests ------------------------------------------------------------------------------------

# Total CPU time N idle waiters may use in IDLE_WINDOW seconds. The aim is well below 0.1 s;
# the bound only has to catch polling (1000 waiters polling every 100 ms use far more), and to
# allow for the waiters' occasional safety re-plans on a slow machine.
IDLE_WINDOW = 10.0
IDLE_CPU_BOUND = 2.0


def assert_idle(procs, what):
    """Lets the waiters `procs` ({name: bg}) settle, then asserts that over IDLE_WINDOW seconds
    (in which nothing happens) all of them together use less than IDLE_CPU_BOUND CPU seconds,
    and that none ends. `what` names them in messages ("waiters")."""
    time.sleep(1.0)  # the last arrivals' wake-ups settle
    pids = [bg.pid for bg in procs.values()]
    before = {pid: cpu_seconds(pid) for pid in pids}
    time.sleep(IDLE_WINDOW)
    used = {}
    for pid in pids:
        try:
            used[pid] = cpu_seconds(pid) - before[pid]
        except FileNotFoundError:
            raise AssertionError("waiter %d ended while the GPU stayed held" % pid) from None
    total = sum(used.values())
    busiest = sorted(used.items(), key=lambda item: -item[1])[:5]
    print("%d idle %s used %.2f CPU-s in %.0f s" % (len(pids), what, total, IDLE_WINDOW))
    assert total < IDLE_CPU_BOUND, (
        "%d idle %s used %.2f CPU-s in %.0f s (bound %.1f): polling? busiest %s"
        % (len(pids), what, total, IDLE_WINDOW, IDLE_CPU_BOUND, busiest))


def test_drain_1000_after_idling_at_no_cpu(gl):
    """One GPU, held; N jobs of one user queue behind it. Over 10 s in which nothing happens,
    all the waiters together use (next to) no CPU. Then the holder ends: every job runs exactly
    once, never two at a time, and nothing is left in the queue. (One test for both: queueing
    a thousand processes is most of the time either takes on a 2-core machine.)"""
    env, audit, holder, procs = jobs_behind_held_gpu(gl, N)
    assert_idle(procs, "waiters")
    assert len(queue_doc(gl, env)["waiting"]) == N
    holder.kill_group()
    released = time.monotonic()
    assert_all_served(gl, env, audit, procs)
    print("%d jobs drained in %.1f s after the release" % (N, time.monotonic() - released))


# SIGKILLs during the drain of test_sigkill_during_drain_1000: random waiters, and the oldest
# waiters (the dispatchers, which follow releases and plan for everyone).
RANDOM_VICTIMS = max(1, N // 10)
DISPATCHER_VICTIMS = 30


def test_sigkill_during_drain_1000(gl):
    """As test_drain_1000_after_idling_at_no_cpu, but while the queue drains a killer SIGKILLs a tenth of the waiters
    at random and, again and again, the oldest waiters still waiting (the dispatchers). Only the
    gpulock process is killed: a victim that was served in that instant keeps its lease through
    its command, which inherited it, so the audit still sees one job at a time. Every survivor
    is served exactly once, no victim runs twice, and nothing is left in the queue."""
    rng = random.Random(12)
    env, audit, holder, procs = jobs_behind_held_gpu(gl, N)
    pending_random = sorted(rng.sample(list(procs), RANDOM_VICTIMS))
    rng.shuffle(pending_random)
    victims, dispatchers_killed, released = kill_while_draining(
        gl, env, holder, procs, rng, pending_random, RANDOM_VICTIMS // DISPATCHER_VICTIMS + 1)
    survivors = wait_survivors(gl, env, procs, victims)
    # A victim served just before its SIGKILL still runs its command: wait for those to end.
    wait_until(lambda: not (audit.root / "running").exists(), HANG,
               what="the last victim's command to end")

    errors = audit.errors()
    assert errors == [], "jobs ran at the same time on the only GPU: %s" % errors[:20]
    counts = assert_served_once(audit, survivors)
    print("%d killed (%d of them dispatchers), %d of them served first; %d survivors served "
          "in %.1f s" % (len(victims), dispatchers_killed, sum(1 for v in victims if v in counts),
                         len(survivors), time.monotonic() - released))

    # Nothing stale: no live ticket, and the queue, once a run of the user sweeps it, is empty.
    _, live = live_tickets(gl)
    assert live == [], "tickets still locked after every waiter left: %s" % live[:10]
    result = gl.run("run", "-n", "1", "--timeout", "60s", "--", "true", env=env, timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert queue_doc(gl, env)["waiting"] == []


def test_fairness_1000_then_other_user(mu):
    """One GPU, held by root. User A queues N jobs, then user B queues one. Under fair share B
    goes ahead of all but (at most) A's first: B's job is among the first two to run."""
    ensure_room_for(N)
    a, b = mu.users
    env = mu.env(fake="1")
    assert mu.run("status", env=env, prefix=a.prefix()).returncode == 0  # A creates the dir
    audit = Audit(mu.tmp / "audit")
    holder, _ = mu.hold("-n", "1", env=env)
    flood = queue_jobs(mu, audit, names_for(N, "a"), env, prefix=a.prefix())
    single = queue_jobs(mu, audit, ["b0000"], env, prefix=b.prefix())
    wait_queue_length(mu, N + 1, env)
    doc = queue_doc(mu, env)
    assert doc["policy"] == "fair-share", doc["policy"]
    holder.kill_group()
    status = wait_drained(mu, env, single)
    assert status == {"b0000": 0}, single["b0000"].describe()
    started = audit.started()
    assert "b0000" in started[:2], (
        "B's job started as number %d, after %s" % (started.index("b0000") + 1, started[:5]))
    # A's flood is not drained: teardown ends it. What ran so far ran one at a time.
    assert audit.errors() == []
    assert all(flood[n].popen.poll() in (None, 0) for n in flood)


def test_first_use_race_mode_message(gl):
    """16 gpulock processes start at once on a lock directory that does not exist yet, 20 times
    over: whichever creates the directory (and the queue directory), none of the others warns
    about its mode in the moment before it is made 1777, and both end up 1777."""
    processes, rounds = 16, 20
    fifo = gl.tmp / "start"
    os.mkfifo(fifo)
    # Each waits, blocked in open(), until the test opens the FIFO: then all go at once.
    barrier = ["/bin/sh", "-c", ': < "$0"; exec "$@"', str(fifo)]
    for round_ in range(rounds):
        lock_dir = gl.tmp / ("fresh-%02d" % round_)
        env = gl.env(fake="4", lock_dir=lock_dir)
        commands = [("status",), ("run", "-n", "1", "--no-wait", "--", "true")]
        procs = [gl.spawn(*commands[i % 2], env=env, prefix=barrier) for i in range(processes)]

        def all_at_barrier():
            for bg in procs:
                try:
                    with open("/proc/%d/wchan" % bg.pid) as f:
                        if f.read() != "wait_for_partner":
                            return False
                except FileNotFoundError:
                    raise AssertionError("exited before the start: " + bg.describe())
            return True
        wait_until(all_at_barrier, what="16 processes waiting to start")
        writer = os.open(fifo, os.O_WRONLY)
        try:
            statuses = [bg.wait(timeout=HANG) for bg in procs]
        finally:
            os.close(writer)
        for i, (bg, status) in enumerate(zip(procs, statuses)):
            text = bg.stdout() + bg.stderr()
            assert "has mode" not in text and "need mode" not in text, (
                "round %d: a first use warned about the directory's mode:\n%s"
                % (round_, bg.describe()))
            allowed = (0,) if i % 2 == 0 else (0, EX_TEMPFAIL)
            assert status in allowed, "round %d: %s" % (round_, bg.describe())
        assert stat.S_IMODE(os.stat(lock_dir).st_mode) == 0o1777, round_
        queue_dir = lock_dir / "queue"
        if queue_dir.exists():
            assert stat.S_IMODE(os.stat(queue_dir).st_mode) == 0o1777, round_


def test_no_wait_answers_under_load(gl):
    """200 waiters queued on the only GPU, which stays held: `--no-wait` fails at once (75),
    `--timeout 1s` gives up (75), and neither leaves anything in the queue."""
    count = min(200, N)
    ensure_room_for(count)
    env = gl.env(fake="1")
    audit = Audit(gl.tmp / "audit")
    holder, _ = gl.hold("-n", "1", env=env)
    queue_jobs(gl, audit, names_for(count), env)
    wait_queue_length(gl, count, env)

    started = time.monotonic()
    result = gl.run("run", "--no-wait", "-n", "1", "--", "true", env=env, timeout=HANG)
    print("--no-wait answered in %.2f s" % (time.monotonic() - started))
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert result.stderr, "--no-wait says why it failed"

    started = time.monotonic()
    result = gl.run("run", "--timeout", "1s", "-n", "1", "--", "true", env=env, timeout=30)
    print("--timeout 1s answered in %.2f s" % (time.monotonic() - started))
    assert result.returncode == EX_TEMPFAIL, result.stderr

    assert len(queue_doc(gl, env)["waiting"]) == count
    assert holder.alive()
    assert audit.started() == []
