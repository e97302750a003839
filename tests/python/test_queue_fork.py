"""A waiting process that forks without exec (multiprocessing's default on Linux, a daemonising
library, os.fork() in a thread pool), and is then killed, must leave the queue like any waiter
that dies (issue 12).

The child inherits every descriptor of the waiter. Were the ticket's open-file-description lock
on a descriptor the child keeps, the lock would outlive the waiter, and the queue would keep a
phantom request that nobody takes: the GPUs the plan gives it would stay idle while the child
lives, and every request behind it would wait. The same goes for the machine-wide acquire
mutex: a waiter killed while it holds it must not leave it held by its child, or every request
of the machine is refused (75) for as long as the child lives."""

import fcntl
import json
import os
import shutil
import signal
import struct

import pytest

from conftest import HANG, SHORT_HANG, wait_until

# A Python waiter: leases what argv[2] (JSON keyword arguments) asks for in a thread (it waits,
# the GIL released); when told, the main thread forks a child that only sleeps (no exec) and
# reports the child's pid.
WAITER = r'''
import threading

def wait():
    try:
        lease = gpulock.lease(timeout=600, **json.loads(sys.argv[2]))
        report("leased", lease_info(lease))
    except BaseException as e:
        report("failed", repr(e))

threading.Thread(target=wait, daemon=True).start()
wait_for("fork")
child = os.fork()
if child == 0:
    time.sleep(1000)  # holds every inherited descriptor; never execs
    os._exit(0)
report("forked", {"child": child, "pid": os.getpid()})
wait_for("exit")
'''


def test_forked_child_does_not_keep_ticket(gl):
    """One GPU, held. W (Python) waits for it, forks a child that sleeps, and is SIGKILLed (not
    the child). The queue stops listing W, and once the holder ends, X, which queued after W, is
    served: no phantom request of W's stands in its way."""
    os.environ["GPULOCK_FAKE_GPUS"] = "1"  # restored by the `isolated` fixture's monkeypatch
    holder, _, _ = gl.hold("-n", "1")
    w = gl.python(WAITER, json.dumps({"count": 1}))
    gl.wait_queued(w)
    w.tell("fork")
    child = w.wait_json("forked")["child"]
    x = gl.spawn_cli("run", "-n", "1", "--", "true")
    gl.wait_queued(x)
    assert [e["pid"] for e in gl.queue()["waiting"]] == [w.pid, x.pid]

    w.kill(signal.SIGKILL)
    assert w.wait() == -signal.SIGKILL
    assert os.path.exists("/proc/%d" % child), "the forked child lives on"

    def w_gone():
        return gl.queue_entry(w.pid) is None
    try:
        wait_until(w_gone, SHORT_HANG, interval=0.1, what="the killed waiter to leave the queue")
    except AssertionError:
        raise AssertionError("the killed waiter %d is still listed while its forked child %d "
                             "lives: %s" % (w.pid, child, json.dumps(gl.queue()["waiting"])))
    assert [e["pid"] for e in gl.queue()["waiting"]] == [x.pid]

    holder.kill_group()
    holder.wait()
    assert x.wait(timeout=HANG) == 0, x.describe()
    assert gl.queue()["waiting"] == []
    assert os.path.exists("/proc/%d" % child)  # served while the forked child still lives


# A Python waiter whose progress callback (run by the waiting thread, as the wait starts) forks
# a child that only sleeps, then kills the waiter on the spot.
FORK_AND_DIE = r'''
import signal

def forked_and_died(progress):
    child = os.fork()
    if child == 0:
        time.sleep(1000)
        os._exit(0)
    report("forked", {"child": child})
    os.kill(os.getpid(), signal.SIGKILL)

gpulock.lease(count=1, timeout=600, on_wait=forked_and_died)
'''


def test_waiter_forking_in_its_wait_and_killed_at_once(gl):
    """The same from inside the wait: the waiting thread itself forks (from the on_wait
    callback) and the waiter is killed at that moment. No phantom request is left, and the
    queue goes on: X, queued behind it, is served once the holder ends."""
    os.environ["GPULOCK_FAKE_GPUS"] = "1"
    holder, _, _ = gl.hold("-n", "1")
    w = gl.python(FORK_AND_DIE)
    child = w.wait_json("forked")["child"]
    assert w.wait() == -signal.SIGKILL, w.describe()
    assert os.path.exists("/proc/%d" % child)
    x = gl.spawn_cli("run", "-n", "1", "--", "true")
    gl.wait_queued(x)
    wait_until(lambda: [e["pid"] for e in gl.queue()["waiting"]] == [x.pid], SHORT_HANG,
               interval=0.1, what="only X to be listed in the queue")
    holder.kill_group()
    assert x.wait(timeout=HANG) == 0, x.describe()
    assert gl.queue()["waiting"] == []


# How long strace holds the waiter inside the acquire mutex (microseconds): the test forks and
# kills it meanwhile.
DELAY_US = 5000000


def locked_by_someone(path):
    """Whether any process holds a lock on `path` (F_GETLK sees OFD locks as well)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        query = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        return struct.unpack("hh4xqqi4x", answer)[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def all_threads_gone(pid):
    """Whether every thread of process `pid` has ended. A killed process's leader can be a
    zombie while another of its threads still runs (here: one that strace holds in a delayed
    system call), and that thread keeps the process's descriptors, and so its locks."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except (FileNotFoundError, ProcessLookupError):
        return True
    return all(gone_task(pid, tid) for tid in tasks)


def gone_task(pid, tid):
    try:
        with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def gone(pid):
    """Whether process `pid` has ended (a zombie counts as ended)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_forked_child_does_not_keep_the_acquire_mutex(gl):
    """Two GPUs, GPU 0 held. W waits for GPU 0 and registers in the queue under the
    machine-wide acquire mutex, where strace holds it (a delay before it creates its wake FIFO,
    as a preemption would). Meanwhile W's main thread forks a child that only sleeps, and W is
    SIGKILLed. The mutex must go with W: a request for the free GPU 1 is served, not refused
    after waiting for the mutex (75), for as long as the child lives."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace (syscall delay injection)")
    os.environ["GPULOCK_FAKE_GPUS"] = "2"
    holder, _, _ = gl.hold("--gpus", "0")
    mutex = gl.lock_dir / ".acquire.lock"
    assert not locked_by_someone(mutex)
    strace = ["strace", "-f", "-o", "/dev/null",
              "-e", "inject=mknodat:delay_enter=%d:when=1" % DELAY_US]
    w = gl.python(WAITER, json.dumps({"gpus": 0}), prefix=strace)
    try:
        wait_until(lambda: locked_by_someone(mutex), DELAY_US / 1e6, interval=0.01,
                   what="W to hold the acquire mutex")
    except AssertionError:
        assert w.alive(), w.describe()
        pytest.skip("W was not caught inside the acquire mutex (no mknodat under it?)")
    w.tell("fork")
    forked = w.wait_json("forked")
    child, waiter = forked["child"], forked["pid"]  # w.pid is strace's
    os.kill(waiter, signal.SIGKILL)
    # Every thread of W: the one inside the mutex ends only when strace lets it go.
    wait_until(lambda: all_threads_gone(waiter), DELAY_US / 1e6 + HANG, what="W to die")
    assert not gone(child), "the forked child lives on"
    result = gl.cli("run", "--gpus", "1", "--no-wait", "--", "true", timeout=HANG)
    assert result.returncode == 0, (
        "with W killed inside the acquire mutex, its forked child %d keeps the mutex: a "
        "request for a free GPU failed (%d): %s" % (child, result.returncode, result.stderr))
    assert not locked_by_someone(mutex)
