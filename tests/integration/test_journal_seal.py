"""The usage journal sealed append-only by root (issue 16: "that any user's gpulock can append
to and nobody can rewrite"; docs/operations.md, "Sealing the journal").

As root, `gpulock init` and `gpulock journal seal` set Linux's append-only inode flag on the
journal's files. Then another user's gpulock still records leases in their own file, but that
user can no longer truncate it, open it for writing without O_APPEND, rename or delete it.
The user's own size rotation is refused, silently; root's `journal seal` rotates instead, and
every record stays readable by `gpulock log` and `gpulock usage`. `gpulock doctor` names the
files not yet sealed, and a file system without the flag is reported, never fatal.

The flag is read by the test itself (the ioctl of lsattr), not asked of gpulock. Skipped unless
root, and unless the test directory's file system lets a probe file be sealed.
"""

import fcntl
import json
import os
import stat
import struct
import subprocess

import pytest

from conftest import HANG, wait_until

FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long) on 64-bit Linux; the argument is an int
FS_IOC_SETFLAGS = 0x40086602
FS_APPEND_FL = 0x20


def inode_flags(path):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0)))[0]
    finally:
        os.close(fd)


def set_append_only(path, on):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0)))[0]
        flags = (flags | FS_APPEND_FL) if on else (flags & ~FS_APPEND_FL)
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags))
    finally:
        os.close(fd)


def is_sealed(path):
    return bool(inode_flags(path) & FS_APPEND_FL)


def can_seal_in(directory):
    probe = os.path.join(directory, ".seal-probe")
    with open(probe, "w"):
        pass
    try:
        set_append_only(probe, True)
        set_append_only(probe, False)
        return True
    except OSError:
        return False
    finally:
        os.unlink(probe)


@pytest.fixture
def sealed_world(mu):
    """The multi-user harness, skipped where sealing cannot work. (Its teardown unseals the
    journal's files before removing them: gpulock_testing.unseal_tree.)"""
    if os.geteuid() != 0:
        pytest.skip("sealing needs root")
    if not can_seal_in(str(mu.tmp)):
        pytest.skip("the file system of %s has no append-only flag" % mu.tmp)
    return mu


def journal_file(h, user):
    return h.lock_dir / "journal" / ("usage-%d.log" % user.uid)


def run_leases(h, user, count, label, env=None):
    for _ in range(count):
        result = h.run("run", "-n", "1", "--label", label, "--", "true", env=env,
                       prefix=user.prefix())
        assert result.returncode == 0, result.stderr
        assert "warning" not in result.stderr, result.stderr


def records_of(h, user, env=None):
    """`gpulock log --json` read by `user`: (starts, ends) of the given user's leases."""
    result = h.run("log", "--json", env=env, prefix=user.prefix())
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["warnings"] == [], doc["warnings"]
    starts = [r for r in doc["records"] if r["event"] == "start"]
    ids = {r["lease_id"] for r in starts}
    ends = [r for r in doc["records"] if r["event"] == "end" and r["lease_id"] in ids]
    return starts, ends


# What a user tries against a sealed file of their own, each in a fresh process as that user;
# prints the errno names (or "ok") as JSON.
ATTEMPTS = r"""
import errno, json, os, sys
path = sys.argv[1]
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def open_close(flags):
    os.close(os.open(path, flags))
print(json.dumps({
    "truncate": attempt(lambda: os.truncate(path, 0)),
    "open_write": attempt(lambda: open_close(os.O_WRONLY)),
    "open_read_write": attempt(lambda: open_close(os.O_RDWR)),
    "open_truncate": attempt(lambda: open_close(os.O_WRONLY | os.O_APPEND | os.O_TRUNC)),
    "rename": attempt(lambda: os.rename(path, path + ".moved")),
    "unlink": attempt(lambda: os.unlink(path)),
    "chmod": attempt(lambda: os.chmod(path, 0o600)),
    "open_append": attempt(lambda: open_close(os.O_WRONLY | os.O_APPEND)),
}))
"""


def test_a_sealed_file_takes_leases_but_not_rewrites(sealed_world):
    h = sealed_world
    a, b = h.users
    assert h.run("init").returncode == 0
    run_leases(h, a, 1, "before")
    own = journal_file(h, a)
    assert not is_sealed(own)  # a user's first file is theirs until root seals it

    result = h.run("journal", "seal")
    assert result.returncode == 0, result.stderr
    assert "sealed usage-%d.log" % a.uid in result.stdout
    assert is_sealed(own)
    st = os.stat(own)
    assert st.st_uid == a.uid and stat.S_IMODE(st.st_mode) == 0o644

    run_leases(h, a, 2, "after")  # still recorded through gpulock
    before = own.read_bytes()
    tried = subprocess.run(a.prefix() + ["/usr/bin/python3", "-c", ATTEMPTS, str(own)],
                           capture_output=True, text=True, timeout=HANG, cwd=h.tmp)
    assert tried.returncode == 0, tried.stderr
    outcome = json.loads(tried.stdout)
    assert outcome == {"truncate": "EPERM", "open_write": "EPERM", "open_read_write": "EPERM",
                       "open_truncate": "EPERM", "rename": "EPERM", "unlink": "EPERM",
                       "chmod": "EPERM", "open_append": "ok"}, outcome
    assert own.read_bytes() == before and is_sealed(own)

    starts, ends = records_of(h, b)  # readable by everyone
    mine = [r for r in starts if r["user"] == a.name]
    assert sorted(r["label"] for r in mine) == ["after", "after", "before"]
    assert len([e for e in ends if e["how"] == "released"]) == 3

    # A second pass has nothing left to do.
    again = h.run("journal", "seal")
    assert again.returncode == 0 and "0 files sealed now, 1 already sealed" in again.stdout


def test_root_rotates_sealed_files_and_every_record_stays_readable(sealed_world):
    h = sealed_world
    a, b = h.users
    config = h.tmp / "config.toml"
    config.write_text('journal_file_size = "4K"\n')
    os.chmod(config, 0o644)
    env = h.env(GPULOCK_CONFIG=config)
    assert h.run("init", env=env).returncode == 0
    label = "x" * 100
    run_leases(h, a, 1, label, env=env)
    assert h.run("journal", "seal", env=env).returncode == 0
    own = journal_file(h, a)
    assert is_sealed(own)

    # Past the size limit a's gpulock cannot rename its sealed file: it goes on appending to it
    # without a word (run_leases checks that no warning was printed).
    run_leases(h, a, 12, label, env=env)
    assert os.path.getsize(own) > 4096
    assert sorted(os.listdir(own.parent)) == [own.name]

    result = h.run("journal", "seal", env=env)
    assert result.returncode == 0, result.stderr
    assert "1 rotated" in result.stdout, result.stdout
    names = sorted(os.listdir(own.parent))
    rotated = [n for n in names if n.startswith("usage-%d-" % a.uid)]
    assert len(rotated) == 1 and own.name in names, names
    for name in (rotated[0], own.name):
        path = own.parent / name
        st = os.stat(path)
        assert is_sealed(path), name
        assert st.st_uid == a.uid and stat.S_IMODE(st.st_mode) == 0o644, name
    assert os.path.getsize(own) == 0
    assert os.path.getsize(own.parent / rotated[0]) > 4096

    run_leases(h, a, 3, label, env=env)
    assert os.path.getsize(own) > 0 and is_sealed(own)

    starts, ends = records_of(h, b, env=env)
    assert len([r for r in starts if r["user"] == a.name]) == 16
    assert len(ends) == 16 and len({r["lease_id"] for r in starts}) == 16
    usage = h.run("usage", "--since", "1d", "--json", env=env, prefix=b.prefix())
    assert usage.returncode == 0, usage.stderr
    assert json.loads(usage.stdout)["total"]["leases"] == 16


def test_doctor_names_unsealed_files(sealed_world):
    h = sealed_world
    a, _ = h.users
    assert h.run("init").returncode == 0
    run_leases(h, a, 1, "x")
    doctor = h.run("doctor")
    line = [l for l in doctor.stdout.splitlines() if "journal seal" in l]
    assert len(line) == 1 and line[0].startswith("warning"), doctor.stdout
    assert "usage-%d.log" % a.uid in line[0] and "gpulock journal seal" in line[0]

    assert h.run("journal", "seal").returncode == 0
    doctor = h.run("doctor", prefix=a.prefix())  # any user can look
    line = [l for l in doctor.stdout.splitlines() if "journal seal" in l]
    assert len(line) == 1 and line[0].startswith("ok"), doctor.stdout
    assert "1 file sealed append-only" in line[0]


def test_a_descriptor_opened_before_the_seal_is_reported(sealed_world):
    """The flag binds opens, not descriptors already open: one that a's process opened for
    writing without O_APPEND before the seal could still overwrite the file, so `journal seal`
    names the process and fails until it is gone."""
    h = sealed_world
    a, _ = h.users
    assert h.run("init").returncode == 0
    run_leases(h, a, 1, "x")
    own = journal_file(h, a)
    marker = h.tmp / "opened"
    keeper = subprocess.Popen(
        a.prefix() + ["/usr/bin/python3", "-c",
                      "import os, sys, time\n"
                      "fd = os.open(sys.argv[1], os.O_RDWR)\n"
                      "open(sys.argv[2], 'w').close()\n"
                      "time.sleep(1000)\n", str(own), str(marker)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, cwd=h.tmp)
    try:
        wait_until(marker.exists, what="the descriptor to be opened")
        result = h.run("journal", "seal")
        assert result.returncode == 69, result.stderr
        assert "pid %d (uid %d) holds it open for writing without O_APPEND" % (
            keeper.pid, a.uid) in result.stderr, result.stderr
        assert is_sealed(own)  # sealed all the same: new opens are bound
    finally:
        keeper.kill()
        keeper.wait()
    assert h.run("journal", "seal").returncode == 0


def test_a_planted_file_is_left_alone(sealed_world):
    h = sealed_world
    a, b = h.users
    assert h.run("init").returncode == 0
    # b takes a's file name first: sealing it would make b's file permanent under a's name.
    planted = journal_file(h, a)
    subprocess.run(b.prefix() + ["sh", "-c", ': > "$0"', str(planted)], check=True,
                   timeout=HANG)
    result = h.run("journal", "seal")
    assert result.returncode == 69
    assert "owned by uid %d, not %d: left alone" % (b.uid, a.uid) in result.stderr
    assert not is_sealed(planted)
    # a's leases work all the same (with one warning: a cannot write to b's file).
    result = h.run("run", "-n", "1", "--", "true", prefix=a.prefix())
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("warning") == 1 and "usage-%d.log" % a.uid in result.stderr


def test_only_root_seals(mu):
    a, _ = mu.users
    assert mu.run("init").returncode == 0
    result = mu.run("journal", "seal", prefix=a.prefix())
    assert result.returncode == 69
    assert "only root can seal" in result.stderr
    off = mu.run("journal", "seal", env=mu.env(GPULOCK_JOURNAL_DIR="off"))
    assert off.returncode == 69 and "journal is off" in off.stderr
    bare = mu.run("journal")
    assert bare.returncode == 64


def test_a_file_system_without_the_flag_warns_and_records(gl):
    """ramfs has no inode flags: leases are recorded, `journal seal` and `doctor` say that the
    files cannot be sealed."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    mnt = gl.tmp / "ramfs"
    mnt.mkdir()
    script = ('mount -t ramfs ramfs "$1" || exit 99; mkdir -m 1777 "$1/j"; '
              '"$2" run -n 1 -- true || exit 98; '
              '"$2" journal seal; echo "seal=$?"; "$2" doctor; '
              'echo LOG-FOLLOWS; "$2" log --json')
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(mnt),
            gl.binary]
    result = subprocess.run(argv, env=gl.env(GPULOCK_JOURNAL_DIR=mnt / "j"),
                            capture_output=True, text=True, timeout=HANG)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip("cannot mount a ramfs here: " + result.stderr)
    assert result.returncode == 0, result.stderr
    assert "seal=69" in result.stdout, result.stdout
    assert "cannot seal files append-only" in result.stderr, result.stderr
    seal_line = [l for l in result.stdout.splitlines() if "journal seal" in l]
    assert len(seal_line) == 1 and seal_line[0].startswith("warning"), result.stdout
    assert "cannot seal files append-only" in seal_line[0]
    doc = json.loads(result.stdout.split("LOG-FOLLOWS\n", 1)[1])
    assert len(doc["records"]) == 2
