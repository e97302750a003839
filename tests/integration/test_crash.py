"""Leases never go stale: SIGKILL of holders, of gpulock alone, and of detached holders."""

import os
import signal

from conftest import EX_TEMPFAIL, HANG, wait_until


def test_sigkill_of_whole_holder_group_frees_gpu(gl):
    holder = gl.spawn("run", "--gpus", "0", "--", "sleep", "1000")
    gl.wait_state(0, "leased")
    assert gl.run("run", "--gpus", "0", "--no-wait", "--", "true").returncode == EX_TEMPFAIL
    holder.kill_group(signal.SIGKILL)
    assert holder.wait() == -signal.SIGKILL
    # The kernel drops the lock when the last descriptor closes; wait for every process of the
    # group to be gone (no assumption on how fast).
    gl.wait_state(0, "free")
    status = gl.gpu_status(0)
    assert status["lease_id"] is None and status["holder"] is None
    result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true")
    assert result.returncode == 0, result.stderr


def test_sigkill_of_gpulock_alone_keeps_lease_until_command_exits(gl):
    started = gl.tmp / "started"
    finish = gl.tmp / "finish"
    script = 'echo "$GPULOCK_LEASE_ID" > "$1"; while [ ! -e "$2" ]; do sleep 0.05; done'
    holder = gl.spawn("run", "--gpus", "0", "--", "sh", "-c", script, "cmd", started, finish)
    wait_until(lambda: started.exists() and started.read_text().strip(),
               what="the command to start")
    lease = started.read_text().strip()
    os.kill(holder.pid, signal.SIGKILL)  # gpulock only: the command keeps running
    assert holder.wait() == -signal.SIGKILL

    # The command still holds the lease's descriptors: the GPU stays leased.
    result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    status = gl.gpu_status(0)
    assert status["state"] == "leased"
    assert status["lease_id"] == lease
    assert status["holder"]["pid_alive"] is False  # gpulock is gone, its command is not

    finish.touch()
    gl.wait_state(0, "free")
    result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true")
    assert result.returncode == 0, result.stderr


def test_background_grandchild_keeps_lease(gl):
    """The lease lasts while any process of the command's tree holds it."""
    finish = gl.tmp / "finish"
    script = '(while [ ! -e "$1" ]; do sleep 0.05; done) >/dev/null 2>&1 & exit 0'
    result = gl.run("run", "--gpus", "1", "--", "sh", "-c", script, "cmd", finish)
    assert result.returncode == 0, result.stderr
    assert gl.gpu_status(1)["state"] == "leased"
    assert gl.run("run", "--gpus", "1", "--no-wait", "--", "true").returncode == EX_TEMPFAIL
    finish.touch()
    gl.wait_state(1, "free")


def test_sigkill_of_detached_holder_frees_gpu(gl):
    watched = gl.sleeper()
    result = gl.run("acquire", "--gpus", "2", "--for-pid", watched.pid)
    assert result.returncode == 0, result.stderr
    status = gl.gpu_status(2)
    assert status["state"] == "leased" and status["holder"]["kind"] == "detached"
    holder_pid = status["holder"]["pid"]
    with open("/proc/%d/comm" % holder_pid) as f:
        assert f.read().strip() == "gpulock"
    os.kill(holder_pid, signal.SIGKILL)
    gl.wait_state(2, "free")
    assert watched.alive()


def test_waiter_killed_while_waiting_leaves_nothing_behind(gl):
    holder, lease = gl.hold("--gpus", "0")
    waiter = gl.spawn("run", "--gpus", "0,1", "--", "true")
    waiter.wait_for_stderr("waiting for")
    waiter.kill_group(signal.SIGKILL)
    waiter.wait()
    # GPU 1 was never taken by the waiter (all or nothing), GPU 0 is still the holder's.
    assert gl.states() == {"0": "leased", "1": "free", "2": "free", "3": "free"}
    assert gl.gpu_status(0)["lease_id"] == lease
    holder.kill_group()
    gl.wait_state(0, "free")
    result = gl.run("run", "--gpus", "0,1", "--no-wait", "--", "true", timeout=HANG)
    assert result.returncode == 0, result.stderr
