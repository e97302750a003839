"""Bad input: damaged lock files and records, planted files, unusable lock directories,
nonsense options and broken simulated-GPU descriptions. gpulock must answer with a clear error
(or carry on where it safely can), never crash or hang, and never lose an existing lease."""

import json
import os
import random
import shutil
import stat
import subprocess
import tempfile

import pytest

from conftest import (EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, HANG, PYTHON,
                      lock_file_name, sim_uuid)

HELD = 3  # every test here keeps GPU 3 leased by another process and checks it stays so


@pytest.fixture
def held(gl):
    holder, lease = gl.hold("--gpus", str(HELD), label="keep-me")
    return holder, lease


def assert_still_held(gl, held, record_intact=True, try_to_take=True):
    holder, lease = held
    assert holder.alive(), holder.describe()
    gpu = gl.gpu_status(HELD)
    assert gpu["state"] == "leased"
    if record_intact:
        assert gpu["lease_id"] == lease
        assert gpu["holder"]["label"] == "keep-me"
    if try_to_take:
        result = gl.run("run", "--gpus", str(HELD), "--no-wait", "--", "true")
        assert result.returncode == EX_TEMPFAIL, result.stderr


def assert_no_crash(result):
    # Error statuses are 64/69/70/75 or the command's; never a signal (negative) or abort.
    assert result.returncode >= 0, "killed by signal %d" % -result.returncode
    assert result.returncode != EX_SOFTWARE, result.stderr
    assert "internal error" not in result.stderr


def lock_path(gl, index):
    return gl.lock_dir / lock_file_name(sim_uuid(index))


def real_record(gl):
    return lock_path(gl, HELD).read_bytes()


def damaged_records(record):
    rng = random.Random(1234)
    valid = json.loads(record.decode())
    other = dict(valid, gpus=[sim_uuid(0)])
    return {
        "empty": b"",
        "truncated": record[:57],
        "garbage": bytes(rng.randrange(256) for _ in range(4096)),
        "nul-bytes": b"\0" * 4096,
        "not-an-object": b"[1, 2, 3]",
        "wrong-schema": json.dumps(dict(valid, schema=2)).encode(),
        "wrong-types": json.dumps(dict(valid, uid="root", members="all", started_at="now",
                                       holder={"pid": -1, "start": "x"})).encode(),
        "bad-lease-id": json.dumps(dict(valid, lease_id="../../etc/passwd")).encode(),
        "infinite-time": record.replace(b'"started_at":', b'"started_at":1e999,"x":'),
        "invalid-utf8": json.dumps(dict(valid, label="x")).encode().replace(b'"x"',
                                                                            b'"\xff\xfe"'),
        "deep-nesting": b"[" * 4096,
        "names-other-gpu": json.dumps(other).encode(),
        "huge": b'{"schema":1,"lease_id":"' + b"a" * (4 << 20) + b'"}',
    }


def write_over(path, data):
    # By hand, like any user could: truncate and write, ignoring (advisory) locks.
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


@pytest.mark.parametrize("case", sorted(damaged_records(b'{"started_at":1}').keys()))
def test_damaged_record_while_held(gl, held, case):
    record = real_record(gl)
    write_over(lock_path(gl, HELD), damaged_records(record)[case])
    result = gl.run("status")
    assert result.returncode == 0, result.stderr
    assert_no_crash(result)
    gpu = gl.gpu_status(HELD)
    assert gpu["state"] == "leased"  # the kernel lock is the truth, not the record
    assert gpu["lease_id"] is None and gpu["holder"] is None
    assert "unavailable" in gpu["note"]
    assert_still_held(gl, held, record_intact=False)
    # Waiting requests still explain themselves and time out normally.
    result = gl.run("run", "--gpus", str(HELD), "--timeout", "200ms", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    held[0].kill_group()
    gl.wait_state(HELD, "free")


@pytest.mark.parametrize("case", sorted(damaged_records(b'{"started_at":1}').keys()))
def test_damaged_record_while_free(gl, held, case):
    assert gl.run("run", "--gpus", "0", "--", "true").returncode == 0  # creates the lock file
    write_over(lock_path(gl, 0), damaged_records(real_record(gl))[case])
    result = gl.run("status")
    assert result.returncode == 0, result.stderr
    gpu = gl.gpu_status(0)
    assert gpu["state"] == "free" and gpu["holder"] is None and gpu["lease_id"] is None
    # The next lease of the GPU writes a fresh record that status reads back.
    holder, lease = gl.hold("--gpus", "0", "--no-wait", label="next")
    gpu = gl.gpu_status(0)
    assert gpu["state"] == "leased" and gpu["lease_id"] == lease
    assert gpu["holder"]["label"] == "next"
    holder.kill_group()
    gl.wait_state(0, "free")
    assert_still_held(gl, held)


def test_stale_valid_record_of_free_gpu_is_ignored(gl, held):
    """A complete record left in the file of a free GPU does not make it look leased."""
    assert gl.run("run", "--gpus", "1", "--", "true").returncode == 0
    write_over(lock_path(gl, 1), real_record(gl).replace(sim_uuid(HELD).encode(),
                                                         sim_uuid(1).encode()))
    gpu = gl.gpu_status(1)
    assert gpu["state"] == "free" and gpu["holder"] is None
    assert gl.run("run", "--gpus", "1", "--no-wait", "--", "true").returncode == 0
    assert_still_held(gl, held)


# -- planted files in the lock directory ----------------------------------------------------

def snapshot(path):
    st = os.lstat(path)
    return (path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size)


def test_symlink_planted_as_lock_file(gl, held):
    target = gl.tmp / "precious.txt"
    target.write_text("do not touch\n")
    os.chmod(target, 0o600)
    before = snapshot(target)
    os.symlink(target, lock_path(gl, 0))

    result = gl.run("run", "--gpus", "0", "--", "true")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "symbolic link" in result.stderr
    assert str(lock_path(gl, 0)) in result.stderr

    result = gl.run("status")
    assert result.returncode == 0, result.stderr
    gpu = gl.gpu_status(0)
    assert gpu["state"] == "excluded" and "symbolic link" in gpu["note"]

    # A request for any GPU goes elsewhere; one that needs GPU 0 can never be served.
    result = gl.run("run", "-n", "1", "--no-wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    result = gl.run("run", "-n", "4", "--", "true")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "symbolic link" in result.stderr

    assert snapshot(target) == before
    assert os.path.islink(lock_path(gl, 0))
    assert_still_held(gl, held)


def test_dangling_symlink_is_not_followed(gl, held):
    target = gl.tmp / "does-not-exist"
    os.symlink(target, lock_path(gl, 1))
    result = gl.run("run", "--gpus", "1", "--", "true")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "symbolic link" in result.stderr
    assert gl.run("status").returncode == 0
    assert not os.path.lexists(target)
    assert_still_held(gl, held)


def test_symlink_planted_as_acquire_mutex(gl, held):
    target = gl.tmp / "precious.txt"
    target.write_text("do not touch\n")
    before = snapshot(target)
    os.unlink(gl.lock_dir / ".acquire.lock")
    os.symlink(target, gl.lock_dir / ".acquire.lock")
    result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "symbolic link" in result.stderr
    assert snapshot(target) == before
    assert gl.run("status").returncode == 0
    # (Every acquisition now fails on the planted mutex, so only status can check the lease.)
    assert_still_held(gl, held, try_to_take=False)


def test_fifo_planted_as_lock_file(gl, held):
    os.mkfifo(lock_path(gl, 0))
    result = gl.run("run", "--gpus", "0", "--", "true", timeout=HANG)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "not a regular file" in result.stderr
    result = gl.run("status", timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert gl.gpu_status(0)["state"] == "excluded"
    result = gl.run("run", "-n", "1", "--no-wait", "--", "true", timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(lock_path(gl, 0)).st_mode)
    assert_still_held(gl, held)


def test_fifo_planted_as_acquire_mutex(gl, held):
    os.unlink(gl.lock_dir / ".acquire.lock")
    os.mkfifo(gl.lock_dir / ".acquire.lock")
    result = gl.run("run", "--gpus", "0", "--", "true", timeout=HANG)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "not a regular file" in result.stderr
    assert stat.S_ISFIFO(os.lstat(gl.lock_dir / ".acquire.lock").st_mode)
    assert_still_held(gl, held, try_to_take=False)


def test_hard_linked_lock_file_is_locked_but_never_written(gl, held):
    # A world-writable file hard-linked in under a lock file's name (or a lock file someone
    # linked elsewhere) still serves as that GPU's lock, but gpulock writes no record into it.
    path = lock_path(gl, 2)
    other = gl.tmp / "someones-file"
    other.write_text("mine\n")
    os.chmod(other, 0o666)
    os.link(other, path)
    bg, _ = gl.hold("--gpus", "2")
    assert gl.gpu_status(2)["state"] == "leased"
    assert gl.run("run", "--gpus", "2", "--no-wait", "--", "true").returncode == EX_TEMPFAIL
    bg.kill_group()
    gl.wait_state(2, "free")
    assert other.read_text() == "mine\n"
    assert_still_held(gl, held)


@pytest.mark.parametrize("kind", ["directory", "private hard link", "socket"])
def test_other_planted_files(gl, held, kind):
    path = lock_path(gl, 2)
    if kind == "directory":
        os.mkdir(path)
    elif kind == "private hard link":
        other = gl.tmp / "someones-file"
        other.write_text("mine\n")
        os.chmod(other, 0o644)
        os.link(other, path)
    else:  # bound from inside the directory: the full path is too long for AF_UNIX
        subprocess.run([PYTHON, "-S", "-c", "import socket, sys; "
                        "socket.socket(socket.AF_UNIX).bind(sys.argv[1])", path.name],
                       cwd=gl.lock_dir, check=True, timeout=HANG)
    result = gl.run("run", "--gpus", "2", "--", "true", timeout=HANG)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert_no_crash(result)
    assert str(path) in result.stderr
    result = gl.run("status", timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert gl.gpu_status(2)["state"] == "excluded"
    if kind == "private hard link":
        assert (gl.tmp / "someones-file").read_text() == "mine\n"
    assert_still_held(gl, held)


# -- the lock directory itself ------------------------------------------------------------

def test_missing_lock_dir_is_created_shared_whatever_the_umask(gl, held):
    new_dir = gl.tmp / "fresh-locks"
    env = gl.env(lock_dir=new_dir)
    result = subprocess.run(["sh", "-c", 'umask 077; exec "$0" run --gpus 0 -- true', gl.binary],
                            env=env, capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(new_dir).st_mode) == 0o1777
    for name in os.listdir(new_dir):
        # The queue's directory is shared like the lock directory; lock files are 0666.
        expected = 0o1777 if name in ("queue", "journal") else 0o666
        assert stat.S_IMODE(os.stat(new_dir / name).st_mode) == expected, name
    assert_still_held(gl, held)


def test_missing_lock_dir_parent(gl, held):
    env = gl.env(lock_dir=gl.tmp / "no-such-parent" / "locks")
    for args in (["status"], ["run", "--", "true"], ["release", "0123456789abcdef"]):
        result = gl.run(*args, env=env)
        assert result.returncode == EX_UNAVAILABLE, result.stderr
        assert "does not exist" in result.stderr
    assert not (gl.tmp / "no-such-parent").exists()
    assert_still_held(gl, held)


def test_lock_dir_is_a_symlink(gl, held):
    link = gl.tmp / "link-to-locks"
    os.symlink(gl.lock_dir, link)
    result = gl.run("run", "-n", "1", "--", "true", env=gl.env(lock_dir=link))
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "symlink" in result.stderr or "symbolic link" in result.stderr
    assert_still_held(gl, held)


def test_lock_dir_symlink_message_says_symbolic_link(gl, held):
    link = gl.tmp / "link-to-locks"
    os.symlink(gl.lock_dir, link)
    result = gl.run("status", env=gl.env(lock_dir=link))
    assert result.returncode == EX_UNAVAILABLE
    assert "is a symbolic link" in result.stderr, result.stderr


def test_lock_dir_is_a_file(gl, held):
    path = gl.tmp / "a-file"
    path.write_text("x")
    result = gl.run("run", "-n", "1", "--", "true", env=gl.env(lock_dir=path))
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "not a directory" in result.stderr
    assert path.read_text() == "x"
    assert_still_held(gl, held)


def test_read_only_lock_dir_for_other_user(gl, held, test_users, shared_binary):
    """A lock directory another user cannot write: a clear error, no crash. (Permissions do
    not stop root, so this runs as a test user.)"""
    user = test_users[1]
    base = tempfile.mkdtemp(prefix="gpulock-itest-ro-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        ro = os.path.join(base, "locks")
        os.mkdir(ro)
        os.chmod(ro, 0o555)  # owned by root: read-only for the test user
        env = gl.env(lock_dir=ro)
        run_as = user.prefix() + [shared_binary]
        for args in (["run", "-n", "1", "--no-wait", "--", "true"],
                     ["run", "--gpus", "0", "--", "true"],
                     ["acquire", "-n", "1", "--for-pid", str(held[0].pid)]):
            result = subprocess.run(run_as + args, env=env, capture_output=True, text=True,
                                    timeout=HANG, cwd="/")
            assert result.returncode == EX_UNAVAILABLE, result.stderr
            assert_no_crash(result)
            assert "Permission denied" in result.stderr and "1777" in result.stderr
        result = subprocess.run(run_as + ["status"], env=env, capture_output=True, text=True,
                                timeout=HANG, cwd="/")
        assert result.returncode == 0, result.stderr
        assert "mode 0555" in result.stdout  # warns that others cannot lease here
        assert os.listdir(ro) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert_still_held(gl, held)


# -- options ----------------------------------------------------------------------------------

USAGE_ERRORS = [
    ["run", "--frobnicate", "--", "true"],
    ["run", "-n", "-1", "--", "true"],
    ["run", "-n", "abc", "--", "true"],
    ["run", "-n", "1.5", "--", "true"],
    ["run", "-n", "0", "--", "true"],
    ["run", "--min-free-mem", "20", "--", "true"],
    ["run", "--min-free-mem", "20Q", "--", "true"],
    ["run", "--max-util", "150", "--", "true"],
    ["run", "--max-power", "-5", "--", "true"],
    ["run", "--timeout", "5x", "--", "true"],
    ["run", "--timeout", "1s", "--no-wait", "--", "true"],
    ["run", "--gpus", ",", "--", "true"],
    ["run", "--gpus", "0,,1", "--", "true"],
    ["run", "--gpus", "0,0", "--", "true"],
    ["run", "--visible", "foo", "--", "true"],
    ["run", "-n", "2", "--gpus", "0", "--", "true"],
    ["run", "--gpus", "0"],  # no command
    ["run"],
    ["acquire", "--for-pid", "1", "-n", "0"],
    ["frobnicate"],
    ["status", "--json", "extra"],
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=" ".join)
def test_usage_errors(gl, held, args):
    result = gl.run(*args)
    assert result.returncode == EX_USAGE, result.stderr
    assert result.stderr.startswith("gpulock: ")
    assert_still_held(gl, held)


@pytest.mark.parametrize("args", [["run", "-n", "99", "--", "true"],
                                  ["run", "-n", "5", "--", "true"],
                                  ["run", "--gpus", "7", "--", "true"],
                                  ["run", "--gpus", "0,7", "--", "true"],
                                  ["run", "--gpus", "GPU-ffff", "--", "true"],
                                  ["run", "-n", "100000", "--", "true"]], ids=" ".join)
def test_never_servable(gl, held, args):
    result = gl.run(*args, timeout=HANG)  # no timeout given: must fail, not wait forever
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert_still_held(gl, held)
    assert gl.states() == {"0": "free", "1": "free", "2": "free", "3": "leased"}


@pytest.mark.parametrize("flag", ["--gpus", "--timeout", "--min-free-mem", "--max-util",
                                  "--max-power"])
def test_empty_option_value_is_usage_error(gl, held, flag):
    result = gl.run("run", flag, "", "--no-wait", "--", "true") if flag != "--timeout" else \
        gl.run("run", flag, "", "--", "true")
    assert result.returncode == EX_USAGE, result.stderr


# -- broken simulated-GPU descriptions ---------------------------------------------------------

@pytest.mark.parametrize("value", ["garbage", "-1", "4x", "99999", " ", "1e3"])
def test_fake_gpus_garbage(gl, held, value):
    for args in (["status"], ["run", "--", "true"]):
        result = gl.run(*args, env=gl.env(fake=value))
        assert result.returncode == EX_USAGE, result.stderr
        assert "GPULOCK_FAKE_GPUS" in result.stderr
    assert_still_held(gl, held)


BROKEN_FILES = {
    "not-json": '{"gpus": [',
    "empty": "",
    "not-an-object": "[]",
    "no-gpus": '{"comment": "x"}',
    "gpus-not-a-list": '{"gpus": {}}',
    "unknown-field": '{"gpus": [{"memroy_total": "80G"}]}',
    "bad-size": '{"gpus": [{"memory_total": "lots"}]}',
    "used-over-total": '{"gpus": [{"memory_total": "8G", "memory_used": "9G"}]}',
    "util-out-of-range": '{"gpus": [{"utilization": 150}]}',
    "negative-power": '{"gpus": [{"power_draw": -1}]}',
    "bad-compute-mode": '{"gpus": [{"compute_mode": "turbo"}]}',
    "duplicate-uuid": '{"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-a"}]}',
    "process-without-pid": '{"gpus": [{"processes": [{"used_memory": "1G"}]}]}',
    "pid-not-a-number": '{"gpus": [{"processes": [{"pid": "1"}]}]}',
    "mig-not-a-list": '{"gpus": [{"mig": 3}]}',
    "uuid-not-a-string": '{"gpus": [{"uuid": 7}]}',
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
def test_malformed_fake_gpu_file(gl, held, case):
    path = gl.tmp / ("broken-%s.json" % case)
    path.write_text(BROKEN_FILES[case])
    env = gl.env(fake=path)
    for args in (["status"], ["gpus"], ["run", "--", "true"]):
        result = gl.run(*args, env=env)
        assert result.returncode == EX_USAGE, (args, result.stderr)
        assert str(path) in result.stderr, result.stderr
        assert_no_crash(result)
    assert_still_held(gl, held)


def test_missing_fake_gpu_file(gl, held):
    path = gl.tmp / "missing.json"
    result = gl.run("status", env=gl.env(fake=path))
    assert result.returncode == EX_USAGE, result.stderr
    assert str(path) in result.stderr
    assert_still_held(gl, held)


def test_unwritable_lock_file_of_other_user_is_skipped(mu, test_users):
    a, b = test_users
    # User A creates the lock directory, then a lock file for GPU 0 with a restrictive mode.
    result = mu.run("status", prefix=a.prefix())
    assert result.returncode == 0, result.stderr
    planted = mu.lock_dir / lock_file_name(sim_uuid(0))
    subprocess.run(a.prefix() + ["sh", "-c", 'umask 022; : > "$0"', str(planted)], check=True,
                   timeout=HANG)
    assert stat.S_IMODE(os.stat(planted).st_mode) == 0o644
    result = mu.run("run", "--gpus", "0", "--", "true", prefix=b.prefix())
    assert result.returncode == EX_UNAVAILABLE and "chmod 666" in result.stderr, result.stderr
    # Any GPU will do: user B must get one of the three others.
    result = mu.run("run", "-n", "1", "--no-wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                    prefix=b.prefix())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("1", "2", "3")


def test_planted_queue_symlink_is_an_error_not_a_crash(gl, held):
    # Planted before anyone made the queue's directory (after a reboot, before `gpulock init`):
    # every acquisition refuses it with a clear error; none may abort.
    locks = gl.tmp / "locks-with-planted-queue"
    locks.mkdir()
    os.chmod(locks, 0o1777)
    elsewhere = gl.tmp / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, locks / "queue")
    for args in (["run", "-n", "1", "--", "true"], ["run", "-n", "1", "--no-wait", "--", "true"]):
        result = gl.run(*args, env=gl.env(lock_dir=locks))
        assert result.returncode == EX_UNAVAILABLE, (result.returncode, result.stderr)
        assert "symbolic link" in result.stderr, result.stderr
    assert os.listdir(elsewhere) == []
    assert_still_held(gl, held)
