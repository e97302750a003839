"""A whole sweep started at once (issue 39): thousands of `gpulock run` launched together on one
GPU must all be served, one at a time, on tmpfs and on ext4 lock directories.

A sweep launched in one go (`for i in $(seq 4000); do gpulock run ... & done`, or a scheduler
starting an array) sends every request to the queue within seconds, before any has registered.
These tests start such a storm with a posix_spawn loop, every process in one process group that
the test kills whatever happens (a failed run must not leave thousands of processes behind),
and check it with an audit independent of gpulock: each job is `audit_task` (tests/support/
audit_task.c), which takes an O_EXCL marker for its GPU and logs its start and end in one
append-only log; a GPU given to two jobs at once shows as a clash or as two starts in a row.

They assert that all are served and none overlapped, never how fast: the timeouts are hang
guards (the storm's figures are bench/storm_bench's, in docs/benchmarks.md).

Environment:
  GPULOCK_STORM_N   jobs per storm (default 1000; 200 on a sanitizer build, whose every process
                    costs about 0.25 s of CPU to start). The issue's size is 4000: run
                    `GPULOCK_STORM_N=4000 pytest tests/integration/test_storm.py` (about 5 min on
                    2 cores, 2.5 min per storm); in the whole suite it would push the test
                    command past its 30 minutes (495 s beside the other suites on this VM).
"""

import os
import pathlib
import shutil
import signal
import tempfile
import time

import pytest

from conftest import EX_TEMPFAIL, HANG, sanitized_build, wait_until
from test_queue_scale import ensure_room_for

# 1,000 at once; 100 on a sanitizer build, which looks for memory errors and races (the normal
# build shows the scale) and starts each process several times slower.
N = int(os.environ.get("GPULOCK_STORM_N", "100" if sanitized_build() else "1000"))
STORM_HANG = 1800  # 4,000 drain in about 150 s on a slow 2-core VM; a cliff never does


def mount_type(path):
    """The filesystem type of the mount that holds `path` (from /proc/self/mounts)."""
    path = os.path.realpath(path)
    best, kind = "", None
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def scratch_on(kind, tmp_path):
    """A fresh directory on a `kind` filesystem (tmpfs or ext4), or None if none is at hand."""
    candidates = {"tmpfs": ["/dev/shm", "/run", str(tmp_path)],
                  "ext4": [str(tmp_path), "/var/tmp", "/tmp"]}[kind]
    for place in candidates:
        if os.path.isdir(place) and os.access(place, os.W_OK) and mount_type(place) == kind:
            return pathlib.Path(tempfile.mkdtemp(prefix="gpulock-storm-", dir=place))
    return None


@pytest.fixture(params=["tmpfs", "ext4"])
def storm_dir(request, tmp_path):
    place = scratch_on(request.param, tmp_path)
    if place is None:
        pytest.skip("no writable %s directory here" % request.param)
    yield place
    shutil.rmtree(place, ignore_errors=True)


def audit_task():
    build = os.environ.get("GPULOCK_BUILD_DIR", "")
    program = os.path.join(build, "tests", "audit_task")
    if not os.access(program, os.X_OK):
        pytest.fail("no %s: build the audit_task target (GPULOCK_BUILD_DIR)" % program)
    return program


class Storm:
    """`count` processes of argv spawned back to back in one new process group; killed (the
    whole group) by kill(), which the tests call whatever happens."""

    def __init__(self, argv, env, count):
        self.pids = []
        self.group = 0
        self.statuses = {}
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
                       (os.POSIX_SPAWN_DUP2, devnull, 2)]
            for _ in range(count):
                pid = os.posix_spawn(argv[0], argv, env, file_actions=actions,
                                     setpgroup=self.group)
                if not self.group:
                    self.group = pid
                self.pids.append(pid)
        finally:
            os.close(devnull)

    def reap(self, timeout):
        """Waits for every process; returns {pid: exit status}. Raises on the hang guard."""
        deadline = time.monotonic() + timeout
        pending = set(self.pids) - set(self.statuses)
        while pending:
            pid, status = os.waitpid(-self.group, os.WNOHANG)
            if pid:
                self.statuses[pid] = os.waitstatus_to_exitcode(status)
                pending.discard(pid)
                continue
            if time.monotonic() > deadline:
                raise AssertionError("hang guard (%d s): %d of %d processes of the storm still "
                                     "running" % (timeout, len(pending), len(self.pids)))
            time.sleep(0.05)
        return self.statuses

    def kill(self):
        if not self.group:
            return
        try:
            os.killpg(self.group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in set(self.pids) - set(self.statuses):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def check_log(audit):
    """The audit log: every start followed by its own end before the next start (one GPU)."""
    lines = (audit / "log").read_text().splitlines() if (audit / "log").exists() else []
    running = None
    starts = 0
    for number, line in enumerate(lines, 1):
        what, gpu, pid = line.split()
        if what == "start":
            assert running is None, ("line %d: job %s started on GPU %s while job %s ran there"
                                     % (number, pid, gpu, running))
            running = pid
            starts += 1
        else:
            assert running == pid, "line %d: job %s ended but %s was running" % (
                number, pid, running)
            running = None
    return starts


def test_a_storm_of_jobs_started_at_once_is_served_one_at_a_time(gl, storm_dir):
    ensure_room_for(N)
    audit = storm_dir / "audit"
    audit.mkdir()
    env = gl.env(fake="1", lock_dir=storm_dir / "locks")
    # The lock directory's first use, outside the storm (its race has a test of its own).
    assert gl.run("run", "-n", "1", "--", "true", env=env).returncode == 0
    storm = Storm(gl.cmd("run", "-n", "1", "--", audit_task(), audit), env, N)
    try:
        statuses = storm.reap(STORM_HANG)
    finally:
        storm.kill()
    errors = (audit / "errors").read_text() if (audit / "errors").exists() else ""
    assert errors == "", errors[:2000]
    failed = {pid: code for pid, code in statuses.items() if code != 0}
    assert failed == {}, "%d of %d jobs failed, e.g. %s" % (
        len(failed), N, sorted(failed.items())[:10])
    assert check_log(audit) == N
    assert len((audit / "done").read_text().split()) == N
    assert not list(audit.glob("gpu-*")), "a job's marker was left behind"
    queue = storm_dir / "locks" / "queue"
    leftovers = [p.name for p in queue.iterdir() if p.name.endswith((".ticket", ".wake"))] \
        if queue.exists() else []
    assert leftovers == [], "the storm left %d files in the queue, e.g. %s" % (
        len(leftovers), leftovers[:10])


def test_no_wait_and_timeout_answer_in_time_during_a_storm(gl, tmp_path):
    """With the only GPU held, a storm of waiters arriving: `--no-wait` and `--timeout 2s` each
    answer 75 well within their bounds while the storm is still coming in."""
    place = scratch_on("tmpfs", tmp_path) or tmp_path
    count = min(N, 1000)
    ensure_room_for(count)
    env = gl.env(fake="1", lock_dir=place / "locks")
    holder, _ = gl.hold("-n", "1", env=env)
    storm = Storm(gl.cmd("run", "-n", "1", "--", "true"), env, count)
    try:
        # Some of the storm waits already: the queue is busy with arrivals.
        wait_until(lambda: len(list((place / "locks" / "queue").glob("*.ticket"))) >= 50, HANG,
                   what="50 of the storm in the queue")
        for request, bound in ((("--no-wait",), 30), (("--timeout", "2s"), 30)):
            started = time.monotonic()
            result = gl.run("run", *request, "-n", "1", "--", "true", env=env, timeout=bound)
            took = time.monotonic() - started
            print("%s answered in %.2f s" % (" ".join(request), took))
            assert result.returncode == EX_TEMPFAIL, result.stderr
            assert result.stderr, "it says why"
        assert holder.alive()
    finally:
        storm.kill()
        if place != tmp_path:
            shutil.rmtree(place, ignore_errors=True)
