"""The machine's fair queue (issue 3): order between users, priorities, reservations for big
requests and backfill, limits and exclusions from the administrator's config file, the queue's
views, and the live waiting line.

Every request here is a real `gpulock run` process. Order is observed from outside: each job
appends "<name> start <CUDA_VISIBLE_DEVICES>" to a log (O_APPEND) when its command starts and
then holds its GPUs until the test creates "release-<name>", so the test alone decides when a
GPU frees up, and at most one waiter can be served per release. Arrival order is enforced by
waiting for each waiter to be listed by `gpulock queue --json` before starting the next.
Every timeout is only a hang guard.
"""

import json
import os
import re
import signal
import subprocess

import pytest

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, HANG, Terminal, sim_uuid, wait_until

EX_CONFIG = 78

# $1 = job name, $2 = log file, $3 = directory where release-<name> appears.
JOB = ('echo "$1 start ${CUDA_VISIBLE_DEVICES}" >> "$2"; '
       'while [ ! -e "$3/release-$1" ]; do sleep 0.01; done; '
       'echo "$1 end" >> "$2"')


class Jobs:
    """Jobs of one test, all run through `gpulock run` with the same environment (the same
    simulated GPUs, lock directory and config file), optionally as one of the test users."""

    def __init__(self, harness, env):
        self.h = harness
        self.env = env
        self.dir = harness.tmp / "jobs"
        self.dir.mkdir()
        os.chmod(self.dir, 0o777)  # not sticky: test users append to a root-owned log
        self.log = self.dir / "log"
        self.log.write_text("")
        os.chmod(self.log, 0o666)
        self.procs = {}

    # -- starting -----------------------------------------------------------------------
    def spawn(self, name, *selection, user=None):
        assert name not in self.procs
        bg = self.h.spawn("run", *selection, "--", "sh", "-c", JOB, "job", name, self.log,
                          self.dir, env=self.env, prefix=user.prefix() if user else ())
        self.procs[name] = bg
        return bg

    def holder(self, name, *selection, user=None):
        """Starts a job that must get its GPUs at once; waits until its command runs."""
        bg = self.spawn(name, *selection, user=user)
        self.wait_started(name)
        return bg

    def waiter(self, name, *selection, user=None):
        """Starts a job that must wait; returns once the queue lists it."""
        bg = self.spawn(name, *selection, user=user)
        self.wait_queued(name)
        return bg

    # -- observing ----------------------------------------------------------------------
    def queue(self):
        result = self.h.run("queue", "--json", env=self.env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def status(self):
        return self.h.status(env=self.env)

    def name_of(self, entry):
        for name, bg in self.procs.items():
            if bg.pid == entry["pid"]:
                return name
        return "pid-%d" % entry["pid"]

    def order(self, doc=None):
        """The names of the waiting jobs in serving order."""
        doc = doc or self.queue()
        entries = sorted(doc["waiting"], key=lambda e: e["position"])
        assert [e["position"] for e in entries] == list(range(1, len(entries) + 1)), doc
        return [self.name_of(e) for e in entries]

    def entry(self, name, doc=None):
        doc = doc or self.queue()
        pid = self.procs[name].pid
        found = [e for e in doc["waiting"] if e["pid"] == pid]
        assert len(found) <= 1, doc
        return found[0] if found else None

    def wait_queued(self, name):
        bg = self.procs[name]

        def queued():
            if self.entry(name):
                return True
            if not bg.alive():
                raise AssertionError("%s exited instead of waiting: %s" % (name, bg.describe()))
            if name in self.starts():
                raise AssertionError("%s was served at once instead of waiting" % name)
            return False
        wait_until(queued, timeout=HANG, what="%s to be listed in the queue" % name)

    def lines(self):
        return [line.split() for line in self.log.read_text().splitlines() if line.strip()]

    def starts(self):
        return [parts[0] for parts in self.lines() if parts[1] == "start"]

    def gpus_of(self, name):
        """The CUDA_VISIBLE_DEVICES the job's command saw, as a list of indices."""
        for parts in self.lines():
            if parts[0] == name and parts[1] == "start":
                return parts[2].split(",") if len(parts) > 2 else []
        raise AssertionError("%s has not started" % name)

    def wait_started(self, name):
        bg = self.procs[name]

        def started():
            if name in self.starts():
                return True
            if not bg.alive():
                raise AssertionError("%s exited before its command started: %s"
                                     % (name, bg.describe()))
            return False
        wait_until(started, timeout=HANG, interval=0.01, what="%s to start" % name)

    # -- releasing ----------------------------------------------------------------------
    def release(self, name):
        """Lets the job's command end and waits until its gpulock has exited (lease ended)."""
        (self.dir / ("release-" + name)).touch()
        status = self.procs[name].wait(timeout=HANG)
        assert status == 0, self.procs[name].describe()

    def release_and_next(self, name, served=1):
        """Releases `name`, then waits until `served` more jobs have started; returns them."""
        before = len(self.starts())
        self.release(name)
        wait_until(lambda: len(self.starts()) >= before + served, timeout=HANG, interval=0.01,
                   what="%d job(s) to be served after %s ended (log: %s)"
                   % (served, name, self.starts()))
        return self.starts()[before:]


def write_config(harness, text, name="config.toml"):
    path = harness.tmp / name
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


# -- 1. fairness between users ------------------------------------------------------------

A_REQUESTS = 30


def queue_thirty_then_one(mu, jobs):
    """User A holds both GPUs and queues A_REQUESTS requests, then B queues one."""
    a, b = mu.users
    jobs.holder("hold-1", "-n", "1", user=a)  # A first: A creates the lock directory
    jobs.holder("hold-2", "-n", "1", user=a)
    names = ["a%02d" % i for i in range(A_REQUESTS)]
    for name in names:
        jobs.waiter(name, "-n", "1", user=a)
    jobs.waiter("b", "-n", "1", user=b)
    doc = jobs.queue()
    assert len(doc["waiting"]) == A_REQUESTS + 1
    users = {e["pid"]: e["user"] for e in doc["waiting"]}
    assert users[jobs.procs["b"].pid] == b.name
    assert all(users[jobs.procs[n].pid] == a.name for n in names)
    return names, doc


def test_fair_share_serves_other_user_within_two_releases(mu):
    a, b = mu.users
    jobs = Jobs(mu, mu.env(fake=2))
    names, doc = queue_thirty_then_one(mu, jobs)
    assert doc["policy"] == "fair-share"
    order = jobs.order(doc)
    assert order.index("b") < 2, "B's one request is behind A's sweep: %s" % order
    # Within one user, first come first served.
    assert [n for n in order if n != "b"] == names, order
    assert mu.status(env=jobs.env)["queue"] == {"length": A_REQUESTS + 1, "policy": "fair-share"}

    # Release one GPU at a time: each release serves exactly one waiter.
    served = []
    running = ["hold-1", "hold-2"]
    for _ in range(4):
        new = jobs.release_and_next(running.pop(0))
        assert len(new) == 1, new
        served += new
        running += new
    assert "b" in served[:2], "B was not served within 2 releases: served %s" % served
    # A's requests go on in order of arrival.
    assert [n for n in served if n != "b"] == names[:3], served


def test_fair_share_on_one_gpu_alternates_users(mu):
    """Round-robin between users with waiting requests: on one GPU, when A's lease ends and
    both A and B wait, B (who has not been served) goes next, as `gpulock queue` said while
    A's lease ran; A's earlier arrival must not win every tie, or B waits behind A's sweep."""
    a, b = mu.users
    jobs = Jobs(mu, mu.env(fake=1))
    jobs.holder("h", "-n", "1", user=a)
    sweep = ["a%d" % i for i in range(5)]
    for name in sweep:
        jobs.waiter(name, "-n", "1", user=a)
    jobs.waiter("b", "-n", "1", user=b)
    shown = jobs.order()
    assert shown[0] == "b", shown
    served = serve_one_at_a_time(jobs, "h", 6)
    assert served.index("b") < 2, "B was not served within 2 releases: served %s" % served
    assert served[0] == shown[0], "`gpulock queue` showed %s first, but %s was served" % (
        shown[0], served[0])
    assert [n for n in served if n != "b"] == sweep, served


def test_fifo_policy_serves_other_user_after_all_earlier_requests(mu):
    a, b = mu.users
    config = write_config(mu, 'policy = "fifo"\n')
    jobs = Jobs(mu, mu.env(fake=2, GPULOCK_CONFIG=config))
    names, doc = queue_thirty_then_one(mu, jobs)
    assert doc["policy"] == "fifo" and doc["config"] == str(config)
    assert jobs.order(doc) == names + ["b"]
    assert mu.status(env=jobs.env)["queue"] == {"length": A_REQUESTS + 1, "policy": "fifo"}

    # Release one GPU at a time: each release serves exactly the next request in arrival order.
    served = []
    running = ["hold-1", "hold-2"]
    while len(served) < A_REQUESTS + 1:
        done = running.pop(0)
        new = jobs.release_and_next(done)
        assert len(new) == 1, new
        served += new
        running += new
    assert served == names + ["b"], served


# -- 2. no starvation of a big request; backfill -------------------------------------------

def test_four_gpu_request_not_starved_by_stream_of_small_ones(gl):
    jobs = Jobs(gl, gl.env(fake=4))
    holders = ["h%d" % i for i in range(4)]
    for name in holders:
        jobs.holder(name, "-n", "1")
    jobs.waiter("big", "-n", "4")
    stream = []

    def another_small():
        name = "s%d" % len(stream)
        jobs.waiter(name, "-n", "1")
        stream.append(name)
    another_small()
    another_small()

    freed = []
    for name in holders[:3]:
        freed += jobs.gpus_of(name)
        jobs.release(name)
        another_small()  # the stream keeps coming while GPUs free up one by one
        doc = jobs.queue()
        big = jobs.entry("big", doc)
        assert big["position"] == 1 and big["standing"] == "waiting", doc
        assert sorted(big["reserved_gpus"]) == sorted(sim_uuid(int(i)) for i in freed), doc
        for small in stream:
            entry = jobs.entry(small, doc)
            assert entry["standing"] == "waiting" and entry["reserved_gpus"] == [], doc
            assert "reserved for" in entry["blocked_by"], entry
        status = jobs.status()
        assert status["queue"]["length"] == 1 + len(stream)
        for gpu in status["gpus"]:
            if gpu["display_index"] in freed:
                assert gpu["state"] == "free", gpu
                assert gpu["reserved_for"] is not None, gpu
                assert gpu["reserved_for"]["pid"] == jobs.procs["big"].pid, gpu
                assert gpu["reserved_for"]["gpus_requested"] == 4
            else:
                assert gpu["reserved_for"] is None, gpu
        assert jobs.starts() == holders, "a small request took a GPU reserved for the big one"

    assert jobs.release_and_next(holders[3]) == ["big"]
    assert sorted(jobs.gpus_of("big")) == ["0", "1", "2", "3"]
    assert jobs.starts() == holders + ["big"]
    assert jobs.queue()["waiting"] and jobs.entry("big") is None
    # Then the stream is served, four at once.
    served = jobs.release_and_next("big", served=4)
    assert sorted(served) == sorted(stream[:4])
    assert jobs.starts()[:5] == holders + ["big"]


def test_backfill_uses_gpus_the_reservation_cannot(gl):
    jobs = Jobs(gl, gl.env(fake=5))
    jobs.holder("h", "--gpus", "0")
    jobs.waiter("big", "--gpus", "0,1,2,3")
    big = jobs.entry("big")
    assert big["gpus_named"] == [sim_uuid(i) for i in range(4)]
    assert sorted(big["reserved_gpus"]) == [sim_uuid(i) for i in (1, 2, 3)]
    status = jobs.status()
    reserved = {g["display_index"]: g["reserved_for"] and g["reserved_for"]["pid"]
                for g in status["gpus"]}
    assert reserved == {"0": None, "1": big["pid"], "2": big["pid"], "3": big["pid"], "4": None}

    # A later 1-GPU request gets GPU 4 at once, though the big request arrived earlier.
    result = gl.run("run", "-n", "1", "--no-wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                    env=jobs.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4"
    jobs.holder("small", "-n", "1")
    assert jobs.gpus_of("small") == ["4"]
    # The reserved GPUs stay out of reach of later requests, named or not.
    for selection in (["-n", "1"], ["--gpus", "2"]):
        result = gl.run("run", *selection, "--no-wait", "--", "true", env=jobs.env)
        assert result.returncode == EX_TEMPFAIL, (selection, result.stderr)
    assert jobs.entry("big")["position"] == 1

    assert jobs.release_and_next("h") == ["big"]
    assert jobs.gpus_of("big") == ["0", "1", "2", "3"]


# -- 3. priority -----------------------------------------------------------------------------

def test_low_priority_request_yields_to_later_normal_one(gl):
    jobs = Jobs(gl, gl.env(fake=1))
    jobs.holder("h", "-n", "1")
    jobs.waiter("low", "-n", "1", "--priority", "low")
    jobs.waiter("normal", "-n", "1", "--priority", "normal")
    doc = jobs.queue()
    assert jobs.order(doc) == ["normal", "low"]
    assert jobs.entry("low", doc)["priority"] == "low"
    assert jobs.entry("normal", doc)["priority"] == "normal"
    assert jobs.release_and_next("h") == ["normal"]
    assert jobs.release_and_next("normal") == ["low"]
    assert jobs.starts() == ["h", "normal", "low"]


# -- 4. limits, exclusions and malformed files from the config -----------------------------

def test_max_gpus_per_user(mu):
    a, b = mu.users
    config = write_config(mu, "[limits]\nmax_gpus_per_user = 1\n")
    jobs = Jobs(mu, mu.env(fake=2, GPULOCK_CONFIG=config))
    jobs.holder("a1", "-n", "1", user=a)
    assert jobs.gpus_of("a1") == ["0"]

    # A's second request waits although GPU 1 is free, and reserves nothing.
    jobs.waiter("a2", "-n", "1", user=a)
    entry = jobs.entry("a2")
    assert entry["standing"] == "over-gpu-limit", entry
    assert entry["reserved_gpus"] == []
    assert a.name in entry["blocked_by"] and "at most 1" in entry["blocked_by"], entry
    gpu1 = mu.gpu_status(1, env=jobs.env)
    assert gpu1["state"] == "free" and gpu1["reserved_for"] is None, gpu1

    # More than the limit in one request can never be served: 69 at once, not a wait.
    result = mu.run("run", "-n", "2", "--", "true", env=jobs.env, prefix=a.prefix())
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "at most 1" in result.stderr, result.stderr

    # B gets the free GPU at once.
    jobs.holder("b1", "-n", "1", user=b)
    assert jobs.gpus_of("b1") == ["1"]
    assert jobs.entry("a2")["standing"] == "over-gpu-limit"
    # When A's first lease ends, A's second request is served.
    assert jobs.release_and_next("a1") == ["a2"]
    assert jobs.gpus_of("a2") == ["0"]


def test_max_waiting_per_user(gl):
    config = write_config(gl, "[limits]\nmax_waiting_per_user = 2\n")
    jobs = Jobs(gl, gl.env(fake=1, GPULOCK_CONFIG=config))
    jobs.holder("h", "-n", "1")
    for name in ("r1", "r2", "r3"):
        jobs.waiter(name, "-n", "1")
    doc = jobs.queue()
    assert jobs.order(doc) == ["r1", "r2", "r3"], doc
    standings = [jobs.entry(n, doc)["standing"] for n in ("r1", "r2", "r3")]
    assert standings == ["waiting", "waiting", "over-waiting-limit"], doc
    assert "at most 2" in jobs.entry("r3", doc)["blocked_by"]
    served = serve_one_at_a_time(jobs, "h", 3)
    assert served == ["r1", "r2", "r3"]


def serve_one_at_a_time(jobs, running, count):
    """On a machine with one GPU: releases the running job, `count` times in a row; returns
    who was served each time."""
    served = []
    for _ in range(count):
        new = jobs.release_and_next(running)
        assert len(new) == 1, new
        served += new
        running = new[0]
    return served


def test_max_waiting_limit_keeps_a_flood_from_delaying_others_under_fifo(mu):
    """What max_waiting_per_user is for: a user flooding the queue delays others by at most
    that many requests. Under fifo with max 2, A's a3..a5 are held back when B arrives, so B
    comes after a1 and a2 (the queue shows it so) and must not be overtaken by a3..a5 when they
    later take part."""
    a, b = mu.users
    config = write_config(mu, 'policy = "fifo"\n[limits]\nmax_waiting_per_user = 2\n')
    jobs = Jobs(mu, mu.env(fake=1, GPULOCK_CONFIG=config))
    jobs.holder("h", "-n", "1", user=a)
    flood = ["a1", "a2", "a3", "a4", "a5"]
    for name in flood:
        jobs.waiter(name, "-n", "1", user=a)
    jobs.waiter("b", "-n", "1", user=b)
    doc = jobs.queue()
    assert jobs.order(doc) == ["a1", "a2", "b", "a3", "a4", "a5"], doc
    assert [e["standing"] for e in sorted(doc["waiting"], key=lambda e: e["position"])] == \
        ["waiting"] * 3 + ["over-waiting-limit"] * 3, doc
    served = serve_one_at_a_time(jobs, "h", 6)
    assert served.index("b") <= 2, "B waited behind A's whole flood: served %s" % served
    assert [n for n in served if n != "b"] == flood, served


def test_excluded_gpus_by_index_and_uuid(gl):
    config = write_config(gl, 'exclude_gpus = ["1", "%s"]\n' % sim_uuid(2))
    env = gl.env(fake=4, GPULOCK_CONFIG=config)
    doc = gl.status(env=env)
    states = {g["display_index"]: g["state"] for g in doc["gpus"]}
    assert states == {"0": "free", "1": "excluded", "2": "excluded", "3": "free"}, doc
    for index in ("1", "2"):
        assert str(config) in gl.gpu_status(index, doc=doc)["note"]

    # Naming an excluded GPU, by index or UUID, can never be served.
    for named in ("1", "2", sim_uuid(1), sim_uuid(2)):
        result = gl.run("run", "--gpus", named, "--", "true", env=env)
        assert result.returncode == EX_UNAVAILABLE, (named, result.stderr)
        assert "excluded" in result.stderr, result.stderr
    result = gl.run("run", "-n", "3", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr

    jobs = Jobs(gl, env)
    jobs.holder("two", "-n", "2")
    assert sorted(jobs.gpus_of("two")) == ["0", "3"]
    result = gl.run("run", "-n", "1", "--no-wait", "--", "true", env=env)
    assert result.returncode == EX_TEMPFAIL, result.stderr
    jobs.waiter("one", "-n", "1")
    assert jobs.release_and_next("two") == ["one"]
    assert jobs.gpus_of("one")[0] in ("0", "3")


MALFORMED = {
    # name: (file text, line of the error)
    "bad-toml": ('# gpulock config\n\npolicy = "fifo\n', 3),
    "bad-toml-table": ('policy = "fifo"\n[limits\nmax_gpus_per_user = 2\n', 2),
    "unknown-key": ('# comment\npolicy = "fifo"\n[limits]\nmax_gpu_per_user = 2\n', 4),
    "unknown-user-key": ('[limits]\nmax_gpus_per_user = 2\n\n[limits.users.alice]\n'
                         'max_gpu = 3\n', 5),
    "wrong-type": ('policy = "fifo"\n[limits]\n\nmax_gpus_per_user = "two"\n', 4),
    "wrong-type-policy": ('\n\npolicy = 3\n', 3),
    "bad-value": ('exclude_gpus = []\npolicy = "lifo"\n', 2),
    "out-of-range": ('[limits]\nmax_waiting_per_user = 5\nmax_gpus_per_user = 0\n', 3),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_config_is_refused_with_file_and_line(gl, case):
    text, line = MALFORMED[case]
    config = write_config(gl, text, name="gpulock-%s.toml" % case)
    env = gl.env(fake=2, GPULOCK_CONFIG=config)
    marker = gl.tmp / "ran"
    for args in (["run", "-n", "1", "--", "touch", marker], ["status"], ["status", "--json"],
                 ["queue"], ["queue", "--json"]):
        result = gl.run(*args, env=env)
        assert result.returncode == EX_CONFIG, (args, result.returncode, result.stderr)
        assert re.search(r"%s:%d(:|\b)" % (re.escape(str(config)), line), result.stderr), \
            (args, result.stderr)
    assert not marker.exists()


# -- 5. views ----------------------------------------------------------------------------------

def test_queue_views_and_killed_waiter(mu):
    a, b = mu.users
    jobs = Jobs(mu, mu.env(fake=1))
    holder = mu.spawn("run", "-n", "1", "--label", "sweep-holder", "--", "sh", "-c", JOB, "job",
                      "h", jobs.log, jobs.dir, env=jobs.env, prefix=a.prefix())
    jobs.procs["h"] = holder
    jobs.wait_started("h")
    lease = mu.gpu_status(0, env=jobs.env)["lease_id"]
    assert lease

    before = mu.status(env=jobs.env)["taken_at"]
    jobs.waiter("a1", "-n", "1", user=a)
    jobs.waiter("a2", "-n", "1", "--label", "second-of-a", user=a)
    jobs.waiter("b1", "-n", "1", user=b)

    # Fair share: B holds nothing, A holds a GPU and has queued before: B goes first.
    doc = jobs.queue()
    assert jobs.order(doc) == ["b1", "a1", "a2"], doc
    now = mu.status(env=jobs.env)["taken_at"]
    entries = {jobs.name_of(e): e for e in doc["waiting"]}
    for name, user in (("a1", a), ("a2", a), ("b1", b)):
        e = entries[name]
        assert e["user"] == user.name and e["uid"] == user.uid, e
        assert e["gpus_requested"] == 1 and e["gpus_named"] == []
        assert e["standing"] == "waiting"
        assert before - 1 <= e["waiting_since"] <= now + 1, (e, before, now)
        assert lease in e["blocked_by"] and a.name in e["blocked_by"], e
        assert e["command"].startswith("sh"), e
    assert entries["a2"]["label"] == "second-of-a"
    assert entries["a1"]["waiting_since"] <= entries["a2"]["waiting_since"] \
        <= entries["b1"]["waiting_since"]

    # The table lists the same, in the same order.
    result = mu.run("queue", env=jobs.env)
    assert result.returncode == 0, result.stderr
    assert "3 requests waiting" in result.stdout, result.stdout
    rows = [line.split() for line in result.stdout.splitlines()
            if re.match(r"\s*\d+\s", line)]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("1", b.name, str(jobs.procs["b1"].pid)),
        ("2", a.name, str(jobs.procs["a1"].pid)),
        ("3", a.name, str(jobs.procs["a2"].pid))], result.stdout
    for line in result.stdout.splitlines():
        if re.match(r"\s*\d+\s", line):
            assert lease in line, line
    assert "second-of-a" in result.stdout

    result = mu.run("status", env=jobs.env)
    assert result.returncode == 0, result.stderr
    assert "queue: 3 requests waiting" in result.stdout, result.stdout

    # A waiter killed with SIGKILL leaves no stale entry.
    victim = jobs.procs["a1"]
    victim.kill_group(signal.SIGKILL)
    victim.wait()
    doc = jobs.queue()
    assert jobs.order(doc) == ["b1", "a2"], doc
    assert jobs.entry("a1", doc) is None
    result = mu.run("status", env=jobs.env)
    assert "queue: 2 requests waiting" in result.stdout, result.stdout
    assert mu.status(env=jobs.env)["queue"]["length"] == 2

    # Nobody behind it is stuck: one release, one served, until the queue is empty. (Which of
    # the two goes first is the fairness tests' business.)
    first = jobs.release_and_next("h")
    assert len(first) == 1 and first[0] in ("b1", "a2"), first
    second = jobs.release_and_next(first[0])
    assert sorted(first + second) == ["a2", "b1"], second
    jobs.release(second[0])
    assert jobs.queue()["waiting"] == []
    assert "queue: 0 requests waiting" in mu.run("status", env=jobs.env).stdout
    # And the dead waiter's files are gone, not just ignored.
    queue_dir = mu.lock_dir / "queue"
    # Nothing is left of the waiters but each user's "served-<uid>" turn marker and the index.
    leftovers = [n for n in os.listdir(queue_dir)
                 if not n.startswith("served-") and n != "index"] \
        if queue_dir.exists() else []
    assert leftovers == [], leftovers


# -- 6. the live line and the log line -------------------------------------------------------

def test_waiting_line_on_terminal(gl):
    env = gl.env(fake=1)
    holder, lease = gl.hold("--gpus", "0", env=env)
    line = re.compile(r"waiting \S+ for 1 GPU, position 1 of 1: [^\r\n]*%s" % lease)
    with Terminal(gl.cmd("run", "-n", "1", "--", "true"), env, gl.tmp) as terminal:
        proc = terminal.proc
        wait_until(lambda: line.search(terminal.text()) or proc.poll() is not None,
                   timeout=HANG, what="the live waiting line")
        text = terminal.text()
        assert proc.poll() is None, text
        assert line.search(text), text
        assert "\r\033[K" in text, text  # redrawn in place, not scrolled
        holder.kill_group()
        assert proc.wait(timeout=HANG) == 0, bytes(terminal.output)


def test_waiting_log_line_when_not_a_terminal(gl):
    env = gl.env(fake=1)
    holder, lease = gl.hold("--gpus", "0", env=env)
    waiter = gl.spawn("run", "-n", "1", "--", "true", env=env)
    waiter.wait_for_stderr("waiting for 1 GPU, position 1 of 1", timeout=HANG)
    lines = [l for l in waiter.stderr().splitlines() if "waiting for 1 GPU" in l]
    assert lines and lease in lines[0], waiter.stderr()
    assert "\r" not in waiter.stderr() and "\033" not in waiter.stderr()
    holder.kill_group()
    assert waiter.wait(timeout=HANG) == 0, waiter.describe()


def test_a_planted_departures_file_is_reported_and_the_queue_still_serves(gl):
    """Waiters announce their departures through <lock dir>/.queue.departures. A symlink planted
    there is not followed: `doctor` says departures go unannounced, and waiters are served."""
    env = gl.env(fake=1)
    doctor = gl.run("doctor", env=env)
    line = [l for l in doctor.stdout.splitlines() if "queue departures" in l]
    assert len(line) == 1 and line[0].startswith("ok"), doctor.stdout
    planted_target = gl.tmp / "not-ours"
    planted_target.write_text("someone's file\n")
    (gl.lock_dir / ".queue.departures").symlink_to(planted_target)
    doctor = gl.run("doctor", env=env)
    line = [l for l in doctor.stdout.splitlines() if "queue departures" in l]
    assert len(line) == 1 and line[0].startswith("warning"), doctor.stdout
    assert "symbolic link" in line[0], line[0]

    holder, _ = gl.hold("-n", "1", env=env)
    waiter = gl.spawn("run", "-n", "1", "--", "true", env=env)
    wait_until(lambda: json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"],
               what="the waiter to queue")
    os.kill(holder.pid, signal.SIGTERM)
    assert waiter.wait(HANG) == 0, waiter.describe()
    assert planted_target.read_text() == "someone's file\n"
