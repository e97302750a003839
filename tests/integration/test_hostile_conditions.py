"""gpulock under conditions a careless or hostile environment creates: inherited ignored
signals, closed standard descriptors, a held acquire mutex, nested leases, forged records."""

import fcntl
import json
import os
import signal
import struct
import subprocess

import pytest

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, HANG, PYTHON, lock_file_name, \
    sim_uuid, wait_until


def test_run_finishes_when_started_with_sigchld_ignored(gl):
    # With SIGCHLD ignored the kernel reaps children itself and sends no SIGCHLD.
    proc = subprocess.run(gl.cmd("run", "--", "sh", "-c", "exit 7"), env=gl.env(),
                          preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN),
                          capture_output=True, timeout=HANG)
    assert proc.returncode == 7, proc.stderr
    assert gl.gpu_status(0)["state"] == "free"


def test_closed_standard_descriptors_do_not_reach_the_lock_file(gl):
    # Started with stdin, stdout and stderr closed, gpulock must not let a lock file land on
    # fd 0-2, where the command's output would be written into the shared lock file.
    # The output is assembled at run time so it does not appear in the recorded command line.
    script = "printf 'SEC%sRET\\n' X >&2; printf 'SEC%sRET\\n' X; sleep 1000"
    bg = gl.spawn_argv(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh"] +
                       gl.cmd("run", "--gpus", "0", "--", "sh", "-c", script))
    gpu = wait_until(lambda: (lambda g: g if g["state"] == "leased" and g["holder"] else None)(
        gl.gpu_status(0)), what="GPU 0 to be leased with its details")
    assert gpu["holder"]["command"].startswith("sh -c")
    contents = (gl.lock_dir / lock_file_name(sim_uuid(0))).read_bytes()
    assert b"SECXRET" not in contents
    assert gl.run("run", "--gpus", "0", "--no-wait", "--", "true").returncode == EX_TEMPFAIL
    bg.kill_group()


def test_acquire_refuses_a_closed_stdout(gl):
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh"] +
                          gl.cmd("acquire", "--for-pid", str(os.getpid())),
                          env=gl.env(), capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == EX_USAGE, proc.stderr
    assert "standard output is closed" in proc.stderr
    assert gl.gpu_status(0)["state"] == "free"


def test_acquire_whose_output_cannot_be_written_releases_its_lease(gl):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(gl.cmd("acquire", "--for-pid", str(os.getpid())), env=gl.env(),
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=HANG)
    assert proc.returncode == 70, proc.stderr
    assert "released" in proc.stderr
    gl.wait_state(0, "free")


def run_into_a_closed_pipe(gl, args, env):
    """Runs gpulock ARGS with its stdout a pipe whose reader has gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(gl.cmd(*args), env=env, stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=HANG)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [("status",), ("status", "--json")])
def test_output_into_a_closed_pipe_ends_silently_as_a_filter_does(gl, args):
    # `gpulock status | head -1`: the reader is gone. Like any filter, gpulock dies of SIGPIPE
    # and says nothing. 64 GPUs as JSON overflow stdio's buffer, so a write fails while the
    # output is being printed; the table of 4 is written only when it ends.
    proc = run_into_a_closed_pipe(gl, args, gl.env(fake="64"))
    assert proc.returncode == -signal.SIGPIPE, proc.stderr
    assert proc.stderr == ""


def test_output_to_a_full_disk_is_an_error(gl):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(gl.cmd("status", "--json"), env=gl.env(fake="64"), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=HANG)
    assert proc.returncode == 70, proc.stderr
    assert "cannot write output: No space left on device" in proc.stderr
    assert "internal error" not in proc.stderr


def test_acquire_into_a_closed_pipe_releases_its_lease(gl):
    # 128 GPUs' UUIDs are more than stdio's buffer: the write fails while they are printed.
    env = gl.env(fake="128")
    proc = run_into_a_closed_pipe(gl, ("acquire", "-n", "128", "--for-pid", str(os.getpid())),
                                  env)
    assert proc.returncode == 70, proc.stderr
    assert "released" in proc.stderr
    wait_until(lambda: json.loads(gl.run("status", "--json", env=env).stdout)["gpus"][127]
               ["state"] == "free", what="the unreported lease to end")


def test_held_acquire_mutex_times_out_instead_of_hanging(gl):
    assert gl.run("status").returncode == 0  # creates the lock directory
    mutex = gl.lock_dir / ".acquire.lock"
    mutex.touch()
    with open(mutex, "r+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)  # a classic POSIX lock conflicts with OFD locks too
        result = gl.run("run", "--no-wait", "--", "true")
        assert result.returncode == EX_TEMPFAIL, result.stderr
        assert "acquire lock" in result.stderr
        result = gl.run("run", "--timeout", "1s", "--", "true")
        assert result.returncode == EX_TEMPFAIL, result.stderr
    assert gl.run("run", "--no-wait", "--", "true").returncode == 0


def test_nested_request_inside_a_lease_fails_instead_of_waiting_for_itself(gl):
    result = gl.run("run", "-n", "1", "--", *gl.cmd("run", "-n", "1", "--", "true"))
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "GPULOCK_LEASE_ID" in result.stderr


def test_release_refuses_a_forged_record_naming_another_process(gl):
    # A detached lease of ours on GPU 0; on GPU 1, someone locks the file and plants a record
    # with our lease id that names an innocent process as the holder.
    shell = gl.spawn_argv(["sleep", "1000"])
    out = gl.run("acquire", "--gpus", "0", "--for-pid", str(shell.popen.pid))
    assert out.returncode == 0, out.stderr
    lease_id = [l.split("=", 1)[1].strip("'") for l in out.stdout.splitlines()
                if l.startswith("export GPULOCK_LEASE_ID=")][0]
    record = (gl.lock_dir / lock_file_name(sim_uuid(0))).read_bytes()
    doc = json.loads(record)
    innocent = gl.spawn_argv(["sleep", "1000"])
    with open("/proc/%d/stat" % innocent.popen.pid) as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    doc["holder"] = {"pid": innocent.popen.pid, "start": start}
    doc["gpus"] = [sim_uuid(1)]
    forged = json.dumps(doc).encode().ljust(4095) + b"\n"
    path = gl.lock_dir / lock_file_name(sim_uuid(1))
    locker = subprocess.Popen(
        [PYTHON, "-c", "import fcntl,os,sys,struct,time\n"
         "fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o666)\n"
         "fcntl.fcntl(fd,37,struct.pack('hhqqi',1,0,0,0,0))\n"  # F_OFD_SETLK, F_WRLCK
         "os.pwrite(fd,sys.stdin.buffer.read(),0)\n"
         "print('locked',flush=True)\ntime.sleep(1000)", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        locker.stdin.write(forged)
        locker.stdin.close()
        assert locker.stdout.readline().strip() == b"locked"
        result = gl.run("release", lease_id)
        assert result.returncode != 0
        assert innocent.alive(), "release signalled a process that holds no lock"
        assert gl.gpu_status(0)["state"] == "leased"
    finally:
        locker.kill()
        locker.wait()
    # With the forgery gone, the real release works.
    assert gl.run("release", lease_id).returncode == 0
    gl.wait_state(0, "free")


def _index_slot(seq, ticket_id, uid, pid, needed=1):
    """One slot of the queue's index (src/local/queue_index.cc), checksum included."""
    body = struct.pack("=Q16sIiQIBB10x", seq, ticket_id.encode(), uid, pid, 0, needed, 0, 0)
    h = 0x9e3779b97f4a7c15
    for (word,) in struct.iter_unpack("=Q", body):
        h = ((h ^ word) * 0xff51afd7ed558ccd) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 33
    return body + struct.pack("=Q", h | 1)


def test_forged_index_slot_with_a_live_ticket_does_not_stall_acquisitions(gl):
    # Issue 12 review: a slot that names a locked ticket but disagrees with it (here: another
    # uid) was found "gone" at every plan, could not be removed (its ticket is live), and the
    # planner planned again for ever, --no-wait and --timeout included. It must only be skipped.
    env = gl.env(fake="1")
    assert gl.run("status", env=env).returncode == 0  # creates the lock and queue directories
    queue = gl.lock_dir / "queue"
    queue.mkdir(exist_ok=True)
    ticket_id = "0123456789abcdef"
    with open(queue / (ticket_id + ".ticket"), "w+") as ticket:
        ticket.write("{}")
        ticket.flush()
        fcntl.lockf(ticket, fcntl.LOCK_EX)  # live: someone holds it
        header = b"GPULOCKQ" + struct.pack("=IIQ", 1, 64, 2) + bytes(40)
        with open(queue / "index", "wb") as index:
            index.write(header + _index_slot(1, ticket_id, os.getuid() + 1, os.getpid()))
        result = gl.run("run", "--no-wait", "-n", "1", "--", "true", env=env, timeout=30)
        assert result.returncode == 0, result.stderr
        result = gl.run("run", "--timeout", "5s", "-n", "1", "--", "true", env=env, timeout=30)
        assert result.returncode == 0, result.stderr
