"""Several users share one lock directory: modes that ignore the umask, leases of one user
blocking another, and who may release what. Runs as root, switching to two test users."""

import os
import stat
import subprocess

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, sim_uuid, wait_until


def test_lock_dir_shared_by_two_users(mu):
    a, b = mu.users
    assert not mu.lock_dir.exists()
    holder, lease = mu.hold("--gpus", "0", prefix=user_umask_prefix(a))

    # The lock directory and files have shared modes whatever A's umask.
    st = os.stat(mu.lock_dir)
    assert st.st_uid == a.uid
    assert stat.S_IMODE(st.st_mode) == 0o1777
    names = os.listdir(mu.lock_dir)
    assert "gpu-%s.lock" % sim_uuid(0) in names
    for name in names:
        fst = os.stat(mu.lock_dir / name)
        # The queue's directory (made once someone waits) and the usage journal are shared like
        # the lock directory.
        assert stat.S_IMODE(fst.st_mode) == (0o1777 if name in ("queue", "journal") else 0o666), name
        assert fst.st_uid == a.uid

    gpu = mu.gpu_status(0)
    assert gpu["lease_id"] == lease
    assert gpu["holder"]["user"] == a.name and gpu["holder"]["uid"] == a.uid
    # Everyone can see who holds what.
    assert mu.gpu_status(0, doc=mu.status(prefix=b.prefix()))["lease_id"] == lease

    # B is refused GPU 0 but can lease another one, also under umask 077.
    result = mu.run("run", "--gpus", "0", "--no-wait", "--", "true", prefix=user_umask_prefix(b))
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert a.name in result.stderr
    result = mu.run("run", "-n", "1", "--no-wait", "--", "sh", "-c",
                    "echo $CUDA_VISIBLE_DEVICES; id -u", prefix=user_umask_prefix(b))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", str(b.uid)]
    st1 = os.stat(mu.lock_dir / ("gpu-%s.lock" % sim_uuid(1)))
    assert st1.st_uid == b.uid and stat.S_IMODE(st1.st_mode) == 0o666

    # B holding GPU 1 blocks A there too: the files B created are lockable by A.
    holder_b, lease_b = mu.hold("--gpus", "1", prefix=user_umask_prefix(b))
    result = mu.run("run", "-n", "2", "--no-wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                    prefix=a.prefix())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2,3"
    result = mu.run("run", "--gpus", "1", "--no-wait", "--", "true", prefix=a.prefix())
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert mu.gpu_status(1)["holder"]["user"] == b.name
    assert holder.alive() and holder_b.alive()


def user_umask_prefix(user):
    """Prefix for Harness.run/spawn/hold (which append the binary and its arguments)."""
    return user.prefix() + ["sh", "-c", 'umask 077; exec "$@"', "sh"]


def detached_lease_of(mu, user, gpu):
    """User `user` takes GPU `gpu` with `gpulock acquire --for-pid` of a shell that stays alive.
    Returns (the shell's Background, lease id)."""
    report = mu.tmp / ("lease-%s-%s" % (user.name, gpu))
    script = ('umask 077; eval "$("$0" acquire --gpus %s --for-pid $$)" || exit 1; '
              'echo "$GPULOCK_LEASE_ID" > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 1000' % gpu)
    shell = mu.spawn_argv(user.prefix() + ["sh", "-c", script, mu.binary, report])

    def ready():
        if report.exists():
            return True
        if not shell.alive():
            raise AssertionError("acquire failed: " + shell.describe())
        return False
    wait_until(ready, what="user %s's detached lease" % user.name)
    return shell, report.read_text().strip()


def test_release_only_by_owner_or_root(mu):
    a, b = mu.users
    shell_a, lease_a = detached_lease_of(mu, a, 0)
    gpu = mu.gpu_status(0)
    assert gpu["lease_id"] == lease_a and gpu["holder"]["kind"] == "detached"
    assert gpu["holder"]["user"] == a.name

    # B may not release A's lease.
    result = mu.run("release", lease_a, prefix=b.prefix())
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert a.name in result.stderr and lease_a in result.stderr
    assert mu.gpu_status(0)["lease_id"] == lease_a

    # A may.
    result = mu.run("release", lease_a, prefix=a.prefix())
    assert result.returncode == 0, result.stderr
    assert mu.gpu_status(0)["state"] == "free"
    assert shell_a.alive()  # release ends the lease, not the shell

    # Root may release anyone's.
    shell_b, lease_b = detached_lease_of(mu, b, 1)
    assert mu.gpu_status(1)["holder"]["user"] == b.name
    result = mu.run("release", lease_b)
    assert result.returncode == 0, result.stderr
    assert mu.gpu_status(1)["state"] == "free"


def test_detached_lease_of_user_ends_with_its_shell(mu):
    a, b = mu.users
    shell_a, lease_a = detached_lease_of(mu, a, 2)
    result = mu.run("run", "--gpus", "2", "--no-wait", "--", "true", prefix=b.prefix())
    assert result.returncode == EX_TEMPFAIL, result.stderr
    shell_a.kill_group()
    shell_a.wait()
    mu.wait_state(2, "free")
    result = mu.run("run", "--gpus", "2", "--no-wait", "--", "true", prefix=b.prefix())
    assert result.returncode == 0, result.stderr


def test_user_cannot_release_run_lease_of_other(mu):
    a, b = mu.users
    _, lease = mu.hold("--gpus", "3", prefix=a.prefix())
    result = mu.run("release", lease, prefix=b.prefix())
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    result = mu.run("release", lease, prefix=a.prefix())
    assert result.returncode != 0 and "stop" in result.stderr
    assert mu.gpu_status(3)["lease_id"] == lease


def test_init_as_root_stops_users_deleting_lock_files(mu):
    """In a sticky directory, a file's owner and the directory's owner may delete it; deleting a
    held lock file would let a second job lease that GPU. `gpulock init` as root makes the
    directory and every lock file root-owned."""
    a, b = mu.users
    assert mu.run("status", prefix=a.prefix()).returncode == 0  # A creates the directory
    advice = mu.status(prefix=b.prefix())["warnings"]
    assert any("owned by %s" % a.name in w for w in advice), advice
    holder, _ = mu.hold("--gpus", "0", prefix=b.prefix())
    result = mu.run("init")  # as root
    assert result.returncode == 0, result.stderr
    assert os.stat(mu.lock_dir).st_uid == 0
    for name in os.listdir(mu.lock_dir):
        assert os.stat(mu.lock_dir / name).st_uid == 0, name
    # The job store too: root's, sticky and open to all, so no user can remove others' jobs.
    store = os.stat(mu.lock_dir / "jobs")
    assert store.st_uid == 0 and store.st_mode & 0o7777 == 0o1777
    assert "job store: %s, root-owned" % (mu.lock_dir / "jobs") in result.stdout
    assert mu.status(prefix=b.prefix())["warnings"] == []
    path = mu.lock_dir / ("gpu-%s.lock" % sim_uuid(0))
    result = subprocess.run(a.prefix() + ["rm", "-f", str(path)], capture_output=True, text=True)
    assert result.returncode != 0 and path.exists(), "user A could delete a root-owned lock file"
    result = mu.run("run", "--gpus", "0", "--no-wait", "--", "true", prefix=a.prefix())
    assert result.returncode == EX_TEMPFAIL, result.stderr
    holder.kill_group()
