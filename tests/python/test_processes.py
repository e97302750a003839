"""Leases from Python among real processes: a Python lease excludes `gpulock run` and vice
versa, Python leases and waiters are seen by `gpulock status` and `gpulock queue`, Python and
CLI waiters share one queue (order of arrival, priorities), a Python process killed with
SIGKILL frees its GPUs and its queue ticket, forked children share the lease while programs
started with subprocess do not, and a mixed crowd of Python and CLI jobs never shares a GPU
(independent audit)."""

import json
import os
import pwd
import random
import shlex
import signal

import pytest

import gpulock
from conftest import EX_TEMPFAIL, HANG, PYTHON, sim_uuid, wait_until

# A Python child that leases what argv[2] (JSON keyword arguments) asks for, reports the lease,
# releases it when told, reports that, and exits when told.
HOLDER = r'''
kwargs = json.loads(sys.argv[2])
lease = gpulock.lease(**kwargs)
report("leased", lease_info(lease))
wait_for("release")
lease.release()
report("released")
wait_for("exit")
'''


def python_holder(gl, **kwargs):
    child = gl.python(HOLDER, json.dumps(kwargs))
    return child, child.wait_json("leased")


# -- exclusion between Python and the CLI -----------------------------------------------

def test_python_lease_blocks_gpulock_run_until_released(gl):
    child, info = python_holder(gl, gpus=0)
    assert info["indices"] == [0] and info["cvd"] == "0"
    assert gl.no_wait_run("0") == EX_TEMPFAIL
    result = gl.cli("run", "--no-wait", "--gpus", "0", "--", "true")
    assert result.returncode == EX_TEMPFAIL and result.stderr  # and says why

    started = gl.tmp / "run-started"
    run = gl.spawn_cli("run", "--gpus", "0", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES" > "$1"',
                       "cmd", started)
    gl.wait_queued(run)
    assert not started.exists() and run.alive()

    # release() in Python (the process lives on) lets the CLI waiter in.
    child.tell("release")
    child.wait_file("released")
    assert run.wait() == 0, run.describe()
    assert started.read_text().strip() == "0"
    assert child.alive()
    child.tell("exit")
    assert child.wait() == 0, child.describe()


def test_gpulock_run_blocks_python_lease(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    with pytest.raises(gpulock.Unavailable):
        gpulock.lease(gpus=0, wait=False)

    child = gl.python(HOLDER, json.dumps({"gpus": 0}))
    gl.wait_queued(child)
    assert not child.reported("leased")
    assert gl.gpu_status(0)["lease_id"] == lease_id
    holder.kill_group()
    holder.wait()
    info = child.wait_json("leased")
    assert info["indices"] == [0]
    assert gl.gpu_status(0)["holder"]["pid"] == child.pid
    child.tell("release")
    child.tell("exit")
    assert child.wait() == 0, child.describe()


def test_python_lease_seen_by_gpulock_status(gl):
    child, info = python_holder(gl, count=2, label="py-job")
    doc = gl.status()
    leased = [g for g in doc["gpus"] if g["state"] == "leased"]
    assert [g["display_index"] for g in leased] == ["0", "1"]
    for gpu in leased:
        assert gpu["lease_id"] == info["id"]
        holder = gpu["holder"]
        assert holder["kind"] == "process"
        assert holder["pid"] == child.pid
        assert holder["pid_alive"] is True
        assert holder["label"] == "py-job"
        assert holder["user"] == pwd.getpwuid(os.getuid()).pw_name
        assert holder["gpus"] == [sim_uuid(0), sim_uuid(1)]
        script = child.popen.args[1]
        assert holder["command"] == shlex.join([os.path.basename(PYTHON), script,
                                                child.popen.args[2], child.popen.args[3]])
    # gpulock.status() in this process sees the same.
    seen = gpulock.status()
    assert [g.state for g in seen.gpus] == ["leased", "leased", "free", "free"]
    assert seen.gpus[0].holder.pid == child.pid and seen.gpus[0].holder.kind == "process"
    child.tell("release")
    child.wait_file("released")
    assert gl.states() == {"0": "free", "1": "free", "2": "free", "3": "free"}


def test_python_waiter_seen_by_gpulock_queue(gl):
    holder, _, _ = gl.hold("-n", "4")
    child = gl.python(HOLDER, json.dumps({"count": 2, "label": "waiting-job"}))
    entry = gl.wait_queued(child)
    assert entry["position"] == 1
    assert entry["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert entry["uid"] == os.getuid()
    assert entry["gpus_requested"] == 2
    assert entry["gpus_named"] == []
    assert entry["priority"] == "normal"
    assert entry["label"] == "waiting-job"
    assert entry["command"].startswith(os.path.basename(PYTHON) + " ")
    assert gl.status()["queue"]["length"] == 1
    # gpulock.queue() in this process sees it too.
    waiting = gpulock.queue().waiting
    assert [(e.pid, e.gpus_requested, e.label) for e in waiting] == [(child.pid, 2, "waiting-job")]

    child2 = gl.python(HOLDER, json.dumps({"gpus": "3,1", "priority": "low"}))
    entry2 = gl.wait_queued(child2)
    assert entry2["gpus_named"] == [sim_uuid(3), sim_uuid(1)]
    assert entry2["gpus_requested"] == 2
    assert entry2["priority"] == "low"
    assert entry2["position"] == 2

    holder.kill_group()
    holder.wait()
    child.wait_json("leased")
    child.tell("release")
    child2.wait_json("leased")
    assert gl.queue()["waiting"] == []
    for c in (child, child2):
        c.tell("release")
        c.tell("exit")
        assert c.wait() == 0, c.describe()


# -- one queue for Python and CLI waiters ---------------------------------------------------

# $1 = job name, $2 = log file, $3 = directory where release-<name> appears.
CLI_JOB = ('echo "$1 start ${CUDA_VISIBLE_DEVICES}" >> "$2"; '
           'while [ ! -e "$3/release-$1" ]; do sleep 0.01; done')

PY_JOB = r'''
name, log, where, kwargs = sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4]), json.loads(sys.argv[5])
with gpulock.lease(**kwargs) as lease:
    with open(log, "a") as f:
        f.write("%s start %s\n" % (name, os.environ["CUDA_VISIBLE_DEVICES"]))
    while not (where / ("release-" + name)).exists():
        time.sleep(0.01)
'''


class Jobs:
    """Jobs that log when they get their GPUs and hold them until the test releases them:
    `gpulock run` jobs and Python jobs, in one log."""

    def __init__(self, gl):
        self.gl = gl
        self.dir = gl.tmp / "jobs"
        self.dir.mkdir()
        self.log = self.dir / "log"
        self.log.write_text("")
        self.procs = {}

    def cli(self, name, *selection):
        self.procs[name] = self.gl.spawn_cli("run", *selection, "--", "sh", "-c", CLI_JOB,
                                             "job", name, self.log, self.dir)
        return self.procs[name]

    def python(self, name, **kwargs):
        self.procs[name] = self.gl.python(PY_JOB, name, self.log, self.dir, json.dumps(kwargs))
        return self.procs[name]

    def starts(self):
        return [line.split()[0] for line in self.log.read_text().splitlines()
                if line.split()[1:2] == ["start"]]

    def queued(self, name):
        """Waits until `name` waits in the queue (and has not been served)."""
        self.gl.wait_queued(self.procs[name])
        assert name not in self.starts()

    def started(self, name):
        bg = self.procs[name]

        def up():
            if name in self.starts():
                return True
            if not bg.alive():
                raise AssertionError("%s exited before starting: %s" % (name, bg.describe()))
            return False
        wait_until(up, HANG, what="%s to start" % name)

    def release(self, name):
        (self.dir / ("release-" + name)).touch()
        assert self.procs[name].wait() == 0, self.procs[name].describe()

    def release_and_next(self, name):
        """Releases `name` and returns the one job served next (waiting until there is one)."""
        before = len(self.starts())
        self.release(name)
        wait_until(lambda: len(self.starts()) > before, HANG,
                   what="a job to be served after %s" % name)
        new = self.starts()[before:]
        assert len(new) == 1, new
        return new[0]

    def order(self):
        doc = self.gl.queue()
        pids = {bg.pid: name for name, bg in self.procs.items()}
        return [pids.get(e["pid"], "?") for e in sorted(doc["waiting"],
                                                        key=lambda e: e["position"])]


@pytest.mark.parametrize("first", ["cli", "python"])
def test_cli_and_python_waiters_served_in_order_of_arrival(gl, first):
    os.environ["GPULOCK_FAKE_GPUS"] = "1"
    jobs = Jobs(gl)
    jobs.cli("holder", "-n", "1")
    jobs.started("holder")
    start = {"cli": lambda name: jobs.cli(name, "-n", "1"),
             "python": lambda name: jobs.python(name)}
    second = "python" if first == "cli" else "cli"
    start[first]("a-" + first)
    jobs.queued("a-" + first)
    start[second]("b-" + second)
    jobs.queued("b-" + second)
    start[first]("c-" + first)
    jobs.queued("c-" + first)
    assert jobs.order() == ["a-" + first, "b-" + second, "c-" + first]

    assert jobs.release_and_next("holder") == "a-" + first
    assert jobs.release_and_next("a-" + first) == "b-" + second
    assert jobs.release_and_next("b-" + second) == "c-" + first
    jobs.release("c-" + first)
    assert gl.queue()["waiting"] == []


def test_low_priority_python_waiter_yields_to_later_cli_waiter(gl):
    os.environ["GPULOCK_FAKE_GPUS"] = "1"
    jobs = Jobs(gl)
    jobs.cli("holder", "-n", "1")
    jobs.started("holder")
    jobs.python("sweep", priority="low")
    jobs.queued("sweep")
    jobs.cli("urgent", "-n", "1")
    jobs.queued("urgent")
    assert jobs.order() == ["urgent", "sweep"]
    assert jobs.release_and_next("holder") == "urgent"
    assert jobs.release_and_next("urgent") == "sweep"
    jobs.release("sweep")


def test_python_multi_gpu_waiter_reserves_gpus_against_cli_backfill(gl):
    """A Python request for 2 GPUs waits in the same queue as the CLI's: a GPU that frees up
    is held back for it (status shows it reserved), not taken by a later 1-GPU CLI request."""
    os.environ["GPULOCK_FAKE_GPUS"] = "2"
    jobs = Jobs(gl)
    jobs.cli("h0", "--gpus", "0")
    jobs.started("h0")  # before h1 starts: the two would otherwise log in either order
    jobs.cli("h1", "--gpus", "1")
    jobs.started("h1")
    jobs.python("big", count=2)
    jobs.queued("big")
    jobs.cli("small", "-n", "1")
    jobs.queued("small")
    jobs.release("h0")
    gpu0 = wait_until(lambda: (lambda g: g if g["reserved_for"] else None)(gl.gpu_status(0)),
                      HANG, what="GPU 0 to be reserved for the Python request")
    assert gpu0["state"] == "free"
    assert gpu0["reserved_for"]["pid"] == jobs.procs["big"].pid
    assert jobs.starts() == ["h0", "h1"]
    assert jobs.release_and_next("h1") == "big"
    assert jobs.release_and_next("big") == "small"
    jobs.release("small")


# -- the end of a process ends its lease --------------------------------------------------

def test_sigkill_of_python_holder_frees_its_gpus(gl):
    child, info = python_holder(gl, count=2)
    assert sorted(info["indices"]) == [0, 1]
    assert gl.no_wait_run("0") == EX_TEMPFAIL
    assert gl.no_wait_run("1") == EX_TEMPFAIL
    child.kill(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    # The process is gone, so are its locks: both GPUs can be taken at once.
    assert gl.no_wait_run("0,1") == 0
    assert gl.states() == {"0": "free", "1": "free", "2": "free", "3": "free"}


def test_python_holder_exiting_without_release_frees_gpu(gl):
    child = gl.python('''
        lease = gpulock.lease(gpus=2)
        report("leased", lease_info(lease))
        wait_for("exit")
        os._exit(0)  # no release, no finalisers
    ''')
    child.wait_json("leased")
    assert gl.no_wait_run("2") == EX_TEMPFAIL
    child.tell("exit")
    assert child.wait() == 0
    assert gl.no_wait_run("2") == 0


def test_sigkill_of_python_waiter_leaves_queue(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    child = gl.python(HOLDER, json.dumps({"gpus": "0,1"}))
    gl.wait_queued(child)
    child.kill(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    assert gl.queue()["waiting"] == []
    assert gl.states() == {"0": "leased", "1": "free", "2": "free", "3": "free"}
    assert gl.gpu_status(0)["lease_id"] == lease_id


def test_forked_child_keeps_lease_after_parent_releases(gl):
    child = gl.python('''
        import multiprocessing

        def worker(here):
            # A fork of a lease holder holds the lease too; it can also take its own lease.
            own = gpulock.lease(respect_visible_devices=False, set_env=False)
            report("worker-own", own.indices)  # atomically: the test reads it at once
            while not (here / "worker-exit").exists():
                time.sleep(0.01)

        lease = gpulock.lease(gpus=[1, 2])
        worker_process = multiprocessing.get_context("fork").Process(target=worker, args=(HERE,))
        worker_process.start()
        report("forked", {"worker": worker_process.pid})
        wait_for("release")
        lease.release()
        report("released")
        worker_process.join()
        report("worker-gone", str(worker_process.exitcode))
        wait_for("exit")
    ''')
    worker = child.wait_json("forked")["worker"]
    assert json.loads(child.wait_file("worker-own")) == [0]
    child.tell("release")
    child.wait_file("released")
    # The parent released; the forked worker still holds the lease.
    assert gl.no_wait_run("1") == EX_TEMPFAIL
    assert gl.no_wait_run("2") == EX_TEMPFAIL
    assert gl.gpu_status(1)["state"] == "leased"
    child.tell("worker-exit")
    assert child.wait_file("worker-gone") == "0"
    # The last holder is gone: free, while the parent still runs.
    assert child.alive()
    assert gl.no_wait_run("0,1,2") == 0
    child.tell("exit")
    assert child.wait() == 0, child.describe()
    assert worker != child.pid


def test_forked_child_releasing_its_share_keeps_parents_lease(gl):
    """A forked child that calls release() and exits normally (finalisers run) gives up only
    its own share: the parent's lease stays."""
    child = gl.python('''
        lease = gpulock.lease(gpus=0)
        pid = os.fork()
        if pid == 0:
            lease.release()
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        report("child-done", {"status": status, "active": lease.active,
                              "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")})
        wait_for("exit")
    ''')
    assert child.wait_json("child-done") == {"status": 0, "active": True, "cvd": "0"}
    assert gl.no_wait_run("0") == EX_TEMPFAIL
    assert gl.gpu_status(0)["holder"]["pid"] == child.pid
    child.tell("exit")
    assert child.wait() == 0, child.describe()
    assert gl.no_wait_run("0") == 0


def test_program_started_with_subprocess_does_not_hold_lease(gl):
    child = gl.python('''
        import subprocess
        lease = gpulock.lease(gpus=3)
        sleeper = subprocess.Popen(["sleep", "1000"])
        report("started", {"sleeper": sleeper.pid})
        wait_for("release")
        lease.release()
        report("released")
        wait_for("exit")
        sleeper.kill()
        sleeper.wait()
    ''')
    sleeper = child.wait_json("started")["sleeper"]
    assert gl.no_wait_run("3") == EX_TEMPFAIL
    child.tell("release")
    child.wait_file("released")
    assert os.path.exists("/proc/%d" % sleeper)
    assert gl.no_wait_run("3") == 0
    child.tell("exit")
    assert child.wait() == 0


# -- a crowd never shares a GPU --------------------------------------------------------------

# Marks each leased GPU with an O_EXCL file in the audit directory while it is held: a marker
# that already exists means two holders at once. Used by both kinds of jobs.
AUDIT = r'''
def audit(audit_dir, uuids, name):
    made, overlaps = [], []
    for uuid in uuids:
        try:
            os.close(os.open(os.path.join(audit_dir, uuid), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            made.append(uuid)
        except FileExistsError:
            overlaps.append(uuid)
    time.sleep(random.uniform(0, 0.02))
    for uuid in made:
        os.unlink(os.path.join(audit_dir, uuid))
    with open(os.path.join(audit_dir, "log"), "a") as f:
        f.write(json.dumps({"name": name, "gpus": uuids, "overlaps": overlaps}) + "\n")
'''

PY_CROWD = AUDIT + r'''
import random
audit_dir, name, rounds, seed = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
wait_for("go")
for i in range(rounds):
    with gpulock.lease(count=rng.choice([1, 2])) as lease:
        assert os.environ["GPULOCK_GPUS"].split(",") == lease.gpus
        audit(audit_dir, lease.gpus, "%s-%d" % (name, i))
'''

CLI_CROWD = "import json, os, random, sys, time\n" + AUDIT + r'''
audit(sys.argv[1], os.environ["GPULOCK_GPUS"].split(","), sys.argv[2])
'''


@pytest.mark.hang_guard(300)
def test_python_and_cli_jobs_never_share_a_gpu(gl):
    os.environ["GPULOCK_FAKE_GPUS"] = "3"
    audit_dir = gl.tmp / "audit"
    audit_dir.mkdir()
    (audit_dir / "log").write_text("")
    rounds, workers = 10, 3
    pythons = [gl.python(PY_CROWD, audit_dir, "py%d" % w, rounds, 1000 + w)
               for w in range(workers)]
    rng = random.Random(7)
    clis = []
    for child in pythons:
        child.tell("go")
    for i in range(20):
        clis.append(gl.spawn_cli("run", "-n", rng.choice(["1", "2"]), "--", PYTHON, "-S", "-c",
                                 CLI_CROWD, audit_dir, "cli%d" % i))
    for bg in pythons + clis:
        assert bg.wait(timeout=240) == 0, bg.describe()
    records = [json.loads(line) for line in (audit_dir / "log").read_text().splitlines()]
    assert len(records) == workers * rounds + len(clis)
    overlaps = [r for r in records if r["overlaps"]]
    assert overlaps == [], "GPUs held by two jobs at once: %s" % overlaps
    assert gl.queue()["waiting"] == []
    assert gl.states() == {"0": "free", "1": "free", "2": "free"}
